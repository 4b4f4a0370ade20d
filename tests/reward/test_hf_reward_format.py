"""The Hugging Face reward-model format both ways: reasonrl's reward models export to
``AutoModelForSequenceClassification`` and come back with identical scores; a sequence classifier
trained elsewhere loads as a reward source and a critic, read the way Hugging Face reads it."""

import pytest
import torch

from reasonrl.models.load import load_tokenizer, resolve_model
from reasonrl.models.value import load_value_model
from reasonrl.reward.bt import RewardModel

PROMPTS = [[{"role": "user", "content": "What is 2+3?"}], [{"role": "user", "content": "Name a colour."}]]
REPLIES = ["The answer is 5.", "Blue, I think"]


def trained_looking_rm(bias: float) -> RewardModel:
    """A tiny-random reward model whose head is not zero (as after training)."""
    torch.manual_seed(0)
    rm = RewardModel.from_policy("tiny-random")
    with torch.no_grad():
        rm.model.head.weight.normal_(0, 0.5)
        rm.model.head.bias.fill_(bias)
    return rm


@pytest.mark.parametrize("bias", [0.0, 0.7])
def test_export_then_import_gives_identical_scores(tmp_path, bias):
    rm = trained_looking_rm(bias)
    rm.export(tmp_path / "hf")
    again = RewardModel.load(tmp_path / "hf")
    assert not again.conversation_end  # our own export is read where it was trained
    assert torch.allclose(
        torch.tensor(again.score(PROMPTS, REPLIES)), torch.tensor(rm.score(PROMPTS, REPLIES)), atol=1e-5
    )


def test_the_export_is_a_plain_hf_reward_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    rm = trained_looking_rm(0.0)
    rm.export(tmp_path / "hf")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", num_labels=1).eval()
    prompt_ids, response_ids = rm.encode(PROMPTS[0], REPLIES[0])
    ids = torch.tensor([prompt_ids + response_ids[:-1]])  # the reply's text, scored at its last token
    with torch.no_grad():
        logit = classifier(ids).logits[0, 0].item()
    assert logit == pytest.approx(rm.score(PROMPTS[:1], REPLIES[:1])[0], abs=1e-4)


def hf_reward_model(directory):
    """A sequence classifier as TRL's reward trainer would leave it: tiny-random's backbone, a random score."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(1)
    classifier = AutoModelForSequenceClassification.from_pretrained(resolve_model("tiny-random"), num_labels=1)
    with torch.no_grad():
        classifier.score.weight.normal_(0, 0.5)
    tokenizer = load_tokenizer("tiny-random")
    classifier.config.pad_token_id = tokenizer.pad_token_id
    classifier.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return classifier.eval(), tokenizer


def test_a_foreign_hf_reward_model_scores_the_whole_conversation_as_hf_does(tmp_path):
    classifier, tokenizer = hf_reward_model(tmp_path / "trl-rm")
    rm = RewardModel.load(tmp_path / "trl-rm")
    assert rm.conversation_end
    expected = []
    for prompt, reply in zip(PROMPTS, REPLIES, strict=True):
        text = tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": reply}], tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected.append(classifier(ids).logits[0, 0].item())
    assert rm.score(PROMPTS, REPLIES) == pytest.approx(expected, abs=1e-4)


def test_a_foreign_hf_reward_model_initialises_a_critic(tmp_path):
    classifier, _ = hf_reward_model(tmp_path / "trl-rm")
    critic = load_value_model(tmp_path / "trl-rm")
    assert torch.equal(critic.head.weight, classifier.score.weight) and critic.head.bias.item() == 0.0
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    values = critic(ids[:, :2], torch.ones(1, 2, dtype=torch.bool), ids[:, 2:], torch.ones(1, 3, dtype=torch.bool))
    with torch.no_grad():
        logits = classifier(ids).logits  # [1, 1] at the last token; per position via the score on hidden states
        hidden = classifier.model(ids).last_hidden_state
    assert torch.allclose(values[0], classifier.score(hidden)[0, 1:4, 0], atol=1e-5)  # V(s_t): the state before token t
    assert logits[0, 0].item() == pytest.approx(classifier.score(hidden)[0, -1, 0].item(), abs=1e-5)


def test_a_causal_lm_is_not_taken_for_a_reward_model():
    from reasonrl.models.load import ModelError
    from reasonrl.models.value import load_sequence_classifier

    with pytest.raises(ModelError, match="not a one-label sequence-classification reward model"):
        load_sequence_classifier(resolve_model("tiny-random"))  # its score layer would be random
