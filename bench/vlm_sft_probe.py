"""Where `reasonrl vlm build` loses the image: its stages 1-3 once, then SFT variants, each probed for image
dependence (JSON lines on stdout).

    python bench/vlm_sft_probe.py align --state STATE.pt
    python bench/vlm_sft_probe.py sft --state STATE.pt [--freeze vision,connector,language] [--caption-every K]
                                      [--warmup-steps N] [--steps 150] [--probe-every 50]

``align`` runs encoder pretraining, the contrastive stage and the connector's alignment with the default
recipe and saves the model's state; ``sft`` loads it and runs supervised fine-tuning with the chosen parts
frozen (optionally a caption batch every K-th step). Each probe, on 48 counting and 16 arithmetic test
problems, gives the caption loss and the answer loss with each problem's own image and with another
problem's, and the teacher-forced accuracy of the count digit on the counting problems: equal numbers
for the true and the other image mean that the model does not read its images.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

import torch

from reasonrl.data.loaders import load_examples
from reasonrl.jobs import vlm_build
from reasonrl.jobs.vlm_build import VLMBuildRun
from reasonrl.models.forward import autocast_context
from reasonrl.models.load import compute_dtype

COUNTING, ARITHMETIC = 48, 16


def probe(model, processor, problems, swapped) -> dict:
    """Caption and answer losses with the true image vs another problem's; count-digit accuracy of both."""
    digits = [processor.tokenizer.convert_tokens_to_ids(str(d)) for d in range(1, 7)]
    model.eval()
    result = {}
    with torch.no_grad():
        for reply in ("caption", "answer"):
            true, other = (vlm_build.reply_loss(model, vlm_build.supervised_batch(processor, batch, reply)).item()
                           for batch in (problems, swapped))  # fmt: skip
            result[f"{reply}_loss"] = {"true": true, "other": other}
        accuracy = {}
        for name, batch in (("true", problems[:COUNTING]), ("other", swapped[:COUNTING])):
            inputs = vlm_build.supervised_batch(processor, batch, "answer")
            labels = inputs.pop("labels")
            logits = model(**inputs).logits  # [B, L, V]
            right = 0
            for row, problem in enumerate(problems[:COUNTING]):
                position = next(j for j in range(labels.shape[1]) if labels[row, j].item() in digits)
                right += logits[row, position - 1, digits].argmax().item() + 1 == int(problem.answer)
            accuracy[name] = right / COUNTING
        result["count_digit_accuracy"] = accuracy
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("align", "sft"))
    parser.add_argument("--state", required=True, help="the saved state after alignment")
    parser.add_argument("--freeze", default="", help="parts frozen in SFT: vision, connector, language")
    parser.add_argument("--caption-every", type=int, default=0, help="a caption batch every K-th SFT step")
    parser.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up in SFT")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--probe-every", type=int, default=50)
    args = parser.parse_args()
    settings = VLMBuildRun()
    examples = [e for task in settings.tasks.split(",") for e in load_examples(task, "train")]
    model, processor = vlm_build.assemble(settings)
    counting, arithmetic = load_examples("visual_counting", "test"), load_examples("visual_arithmetic", "test")
    problems = counting[:COUNTING] + arithmetic[:ARITHMETIC]
    images = [p.images for p in problems]
    random.Random(0).shuffle(images)
    swapped = [dataclasses.replace(p, images=i) for p, i in zip(problems, images, strict=True)]
    report = lambda **keys: print(json.dumps({**keys, **probe(model, processor, problems, swapped)}), flush=True)  # noqa: E731
    if args.mode == "align":
        ignore = lambda n: None  # noqa: E731
        vlm_build.pretrain_encoder(model, processor, examples, settings, ignore)
        vlm_build.contrast_images_and_captions(model, processor, examples, settings, ignore)
        report(after="contrastive")
        vlm_build.align_connector(model, processor, examples, settings, ignore)
        report(after="align")
        torch.save(model.state_dict(), args.state)
        return
    model.load_state_dict(torch.load(args.state))
    report(after="align")
    language = {id(p): p for p in [*model.model.text_model.parameters(), *model.lm_head.parameters()]}
    parts = {"vision": (list(model.model.vision_model.parameters()), settings.adapter_lr),
             "connector": (list(model.model.connector.parameters()), settings.adapter_lr),
             "language": (list(language.values()), settings.language_model_lr)}  # fmt: skip
    frozen = set(filter(None, args.freeze.split(",")))
    groups = [{"params": params, "lr": lr} for name, (params, lr) in parts.items() if name not in frozen]
    trained = {id(p) for group in groups for p in group["params"]}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in trained)
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, args.warmup_steps)))
    questions = vlm_build.batches(examples, settings.batch_size, settings.seed + 1)
    captions = vlm_build.batches(examples, settings.batch_size, settings.seed + 7)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        model.train()
        caption_step = args.caption_every and step % args.caption_every == 0
        batch, reply = (next(captions), "caption") if caption_step else (next(questions), "answer")
        with autocast_context(compute_dtype("auto"), torch.device("cpu")):
            loss = vlm_build.reply_loss(model, vlm_build.supervised_batch(processor, batch, reply))
        vlm_build.optimizer_step(loss, optimizer, [p for group in groups for p in group["params"]])
        warmup.step()
        if step % args.probe_every == 0:
            report(after=f"sft {step}", frozen=sorted(frozen), caption_every=args.caption_every,
                   warmup_steps=args.warmup_steps, seconds=time.perf_counter() - started)  # fmt: skip


if __name__ == "__main__":
    main()
