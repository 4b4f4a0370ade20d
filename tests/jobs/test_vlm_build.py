"""`reasonrl vlm build` on a tiny recipe: the stages learn, the replies alone are targets, and the result
is a VLM that reasonrl loads and generates with (the real recipe's numbers: docs/benchmarks.md)."""

import dataclasses
import json

import pytest
import torch

from reasonrl.cli import main
from reasonrl.data.loaders import load_examples
from reasonrl.data.prompts import PromptEncoder
from reasonrl.jobs import vlm_build
from reasonrl.jobs.vlm_build import (
    IMAGE_TOKENS,
    VLMBuildRun,
    align_connector,
    assemble,
    build_directory,
    cell_targets,
    contrast_images_and_captions,
    match_connector_scale,
    pretrain_encoder,
    reply_loss,
    run_vlm_build,
    supervised_batch,
)
from reasonrl.models.load import BUILT_VLMS, is_vision_language, load_model, load_tokenizer, vision_processor
from reasonrl.rollout import SamplingParams, build_engine

TINY = VLMBuildRun(language_model="tiny-random", tasks="visual_counting", vision_hidden=32, vision_layers=1)


def test_masked_image_modelling_lowers_its_loss():
    model, processor = assemble(TINY)
    examples = load_examples("visual_counting", "train")[:64]
    losses = pretrain_encoder(model, processor, examples, dataclasses.replace(TINY, encoder_steps=30), lambda n: None)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5  # measured: 1.2 -> 0.48 in 20 steps


def test_contrastive_pretraining_matches_images_to_their_captions():
    model, processor = assemble(TINY)
    examples = load_examples("visual_counting", "train")[:64]
    settings = dataclasses.replace(TINY, contrastive_steps=40)
    before = [p.detach().clone() for p in model.model.vision_model.parameters()]
    losses = contrast_images_and_captions(model, processor, examples, settings, lambda n: None)
    assert losses[0] > 0.95 * 3.466  # 32 images, nothing matched yet: ln 32
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0]  # measured: 4.1 -> 0.13 in 40 steps
    assert any(not torch.equal(a, b) for a, b in zip(before, model.model.vision_model.parameters(), strict=True))


def test_the_connector_starts_at_the_text_scale():
    model, processor = assemble(TINY)
    examples = load_examples("visual_counting", "train")[:8]
    match_connector_scale(model, processor, examples)
    pixels = processor.image_processor([[e.images[0]] for e in examples], return_tensors="pt")["pixel_values"][:, 0]
    with torch.no_grad():
        tokens = model.model.connector(model.model.vision_model(pixel_values=pixels).last_hidden_state)
    text = model.model.text_model.get_input_embeddings().weight.norm(dim=-1).mean()
    assert tokens.norm(dim=-1).mean().item() == pytest.approx(text.item(), rel=1e-4)


def test_alignment_makes_each_image_token_read_as_the_word_of_its_cell():
    settings = dataclasses.replace(TINY, vision_hidden=64, vision_layers=2, lr=3e-3, align_steps=150)
    model, processor = assemble(settings)
    examples = load_examples("visual_arithmetic", "train")[:256]
    assert cell_targets(processor.tokenizer, examples[:1]).tolist().count(processor.tokenizer.encode(" ")[0]) == 31

    def nearest_words_right(batch) -> float:
        pixels = processor.image_processor([[e.images[0]] for e in batch], return_tensors="pt")["pixel_values"][:, 0]
        with torch.no_grad():
            tokens = model.model.connector(model.model.vision_model(pixel_values=pixels).last_hidden_state)
        nearest = (tokens @ model.model.text_model.get_input_embeddings().weight.T).argmax(-1).flatten()
        written = cell_targets(processor.tokenizer, batch) != processor.tokenizer.encode(" ")[0]
        return (nearest == cell_targets(processor.tokenizer, batch))[written].float().mean().item()

    held_out = load_examples("visual_arithmetic", "test")[:16]
    before = nearest_words_right(held_out)
    align_connector(model, processor, examples, settings, lambda n: None)
    assert before < 0.2 and nearest_words_right(held_out) > 0.3  # measured 0.44: the characters of unseen sums
    assert all(not p.requires_grad or p.grad is None for p in model.model.text_model.parameters())


def test_only_the_reply_is_a_target():
    model, processor = assemble(TINY)
    (example,) = load_examples("visual_grounding", "train")[:1]
    batch = supervised_batch(processor, [example], "answer")
    targets = batch["labels"][0][batch["labels"][0] != -100]
    x1, y1, x2, y2 = example.answer.split(",")
    assert processor.tokenizer.decode(targets) == f"Answer: [{x1}, {y1}, {x2}, {y2}]<|im_end|>"
    image_token = model.config.image_token_id
    assert (batch["input_ids"][0] == image_token).sum() == IMAGE_TOKENS and image_token not in targets
    caption = supervised_batch(processor, [example], "caption")["labels"][0]
    assert processor.tokenizer.decode(caption[caption != -100]).startswith("The image shows a ")


def test_the_built_vlm_loads_and_generates_from_images(tmp_path, capsys):
    out = tmp_path / "vlm"
    argv = ["vlm", "build", "--language-model", "tiny-random", "--tasks", "visual_counting", "--vision-hidden", "32",
            "--vision-layers", "1", "--encoder-steps", "2", "--contrastive-steps", "2", "--align-steps", "2",
            "--sft-steps", "2", "--batch-size", "2", "--out", str(out), "--progress"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert "vlm build sft: 8/8 steps" in captured.err
    assert [s["steps"] for s in summary["stages"].values()] == [2, 2, 2, 2]
    assert summary == json.loads((out / "build.json").read_text())
    assert is_vision_language(str(out))
    model, tokenizer = load_model(str(out)), load_tokenizer(str(out))
    encoder = PromptEncoder(tokenizer, "answer_line", 4096, processor=vision_processor(str(out)))
    prompts = [encoder(e) for e in load_examples("visual_counting", "test")[:2]]
    completions = build_engine("auto", model, tokenizer, dtype=torch.float32).generate(prompts, SamplingParams(3, 0.0))
    assert [len(c.token_ids) for c in completions] == [3, 3] or all(c.finish_reason == "stop" for c in completions)


def test_the_default_recipe_builds_the_vlm_the_loader_names_smollm2_135m_vlm():
    assert build_directory(VLMBuildRun()).name == BUILT_VLMS["smollm2-135m-vlm"]


def test_a_build_into_the_cache_is_kept_and_is_what_the_loader_finds(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    settings = dataclasses.replace(TINY, encoder_steps=1, contrastive_steps=1, align_steps=1, sft_steps=1, batch_size=2)
    summary = run_vlm_build(settings)
    monkeypatch.setitem(BUILT_VLMS, "smollm2-135m-vlm", build_directory(settings).name)
    assert is_vision_language("smollm2-135m-vlm")
    monkeypatch.setattr(vlm_build, "build_vlm", lambda *args, **kwargs: pytest.fail("built again"))
    assert run_vlm_build(settings) == summary


def test_the_reply_loss_is_hugging_faces_loss():
    model, processor = assemble(TINY)
    inputs = supervised_batch(processor, load_examples("visual_counting", "train")[:3], "answer")
    expected = model(**inputs).loss
    assert torch.allclose(reply_loss(model, dict(inputs)), expected, atol=1e-5)
