"""`reasonrl rm pretrain --contrastive` on tiny-random: a step lowers the InfoNCE loss, the run writes an
encoder that `rm train` and critics start from."""

import json
import random

import torch

from reasonrl.cli import main
from reasonrl.jobs.contrastive_pretrain import ContrastivePretrainRun, contrastive_loss
from reasonrl.models.value import load_value_model
from reasonrl.reward.bt import PreferencePair, RewardModel


def conversations(n):
    pairs = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"question {i} about topic {i * 7 % 5}"},
                  {"role": "assistant", "content": f"answer {i} with detail {i % 3}"},
                  {"role": "user", "content": f"follow-up {i}?"}]  # fmt: skip
        pairs.append(PreferencePair(prompt, f"a kind reply {i}", f"a rude reply {i}"))
    return pairs


def test_a_contrastive_step_lowers_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    rm = RewardModel.from_policy("tiny-random")
    settings = ContrastivePretrainRun(batch_pairs=4)
    batch = [PreferencePair(p.prompt, "the same reply", "") for p in conversations(4)]  # only histories differ
    before, _ = contrastive_loss(rm, batch, settings, random.Random(0))
    optimizer = torch.optim.SGD(rm.model.backbone.parameters(), lr=1e-3)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after, _ = contrastive_loss(rm, batch, settings, random.Random(0))  # the same views
    assert after.item() < before.item() - 1e-3  # measured: 1.965 -> 1.958


def test_rm_pretrain_writes_an_encoder_that_reward_models_and_critics_start_from(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                            for p in conversations(20)))  # fmt: skip
    out = tmp_path / "encoder"
    args = ["rm", "pretrain", "--contrastive", "--model", "tiny-random", "--data", str(data), "--out", str(out)]
    assert main([*args, "--steps", "3", "--batch-pairs", "4", "--lr", "1e-3", "--progress"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert "rm pretrain training: 3/3 steps  loss " in captured.err
    assert summary["held_out_conversations"] == 4 and 0 <= summary["held_out_after"]["accuracy"] <= 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    RewardModel.from_policy(str(out / "model"))  # `rm train --model OUT/model`
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"][0].endswith("ForCausalLM")  # the whole causal LM: a judge can start from it
    critic = load_value_model(out)  # `critic.init=reward_model critic.path=OUT`
    assert critic.head.weight.abs().sum().item() == 0.0
    assert main(["rm", "pretrain", "--model", "tiny-random", "--out", str(out)]) == 2  # --contrastive is required
