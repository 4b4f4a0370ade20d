"""How many SFT steps `reasonrl vlm build` needs: SFT from a build's post-alignment VLM, with greedy accuracy on
held-out `visual_arithmetic` problems at several step counts (JSON lines on stdout).

    reasonrl vlm build --sft-steps 0 --out ALIGNED
    python bench/vlm_sft_steps.py ALIGNED --at 60,80,100,115,130,150 [--problems 100]

The learning rate is constant and the batches are those of the build (same seed), so the model after N steps
here is the model a build with ``--sft-steps N`` makes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from reasonrl.config.commands import VLMBuildRun
from reasonrl.data.loaders import load_examples
from reasonrl.data.prompts import TEMPLATES
from reasonrl.models import vlm_build
from reasonrl.models.forward import autocast_context
from reasonrl.models.load import compute_dtype
from reasonrl.reward.router import program_verifiers


def accuracy(model, processor, problems, batch: int = 25) -> float:
    """Greedy accuracy (32 new tokens, the math verifier) with the build's question form."""
    verify, tokenizer, right = program_verifiers()["math"], processor.tokenizer, 0
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    with torch.no_grad():
        for start in range(0, len(problems), batch):
            part = problems[start : start + batch]
            users = [vlm_build._user(TEMPLATES["answer_line"].format(question=p.question)) for p in part]
            prompts = [processor.apply_chat_template(u, add_generation_prompt=True, tokenize=False) for u in users]
            inputs = processor(text=prompts, images=[[p.images[0]] for p in part], return_tensors="pt", padding=True)
            out = model.generate(**inputs, max_new_tokens=32, do_sample=False)
            replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            right += sum(verify(r, p.answer).correct for p, r in zip(part, replies, strict=True))
    tokenizer.padding_side = side
    model.train()
    return right / len(problems)


def main() -> None:
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("aligned", help="a `reasonrl vlm build --sft-steps 0` output directory")
    parser.add_argument("--at", default="60,80,100,115,130,150", help="step counts to evaluate at")
    parser.add_argument("--problems", type=int, default=100)
    args = parser.parse_args()
    model = Idefics3ForConditionalGeneration.from_pretrained(args.aligned, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(args.aligned)
    settings = VLMBuildRun()  # the default recipe's SFT settings
    examples = load_examples("visual_arithmetic", "train")
    problems = load_examples("visual_arithmetic", "test")[: args.problems]
    language = {id(p): p for p in [*model.model.text_model.parameters(), *model.lm_head.parameters()]}
    new = [*model.model.connector.parameters(), *model.model.vision_model.parameters()]
    groups = [{"params": new, "lr": settings.adapter_lr},
              {"params": list(language.values()), "lr": settings.language_model_lr}]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    checks, started = sorted(map(int, args.at.split(","))), time.perf_counter()
    model.train()
    shuffled = vlm_build.batches(examples, settings.batch_size, settings.seed + 1)  # the build's SFT order
    for step, batch in enumerate(itertools.islice(shuffled, checks[-1]), 1):
        with autocast_context(compute_dtype("auto"), torch.device("cpu")):
            loss = vlm_build.reply_loss(model, vlm_build.supervised_batch(processor, batch, "answer"))
        vlm_build.optimizer_step(loss, optimizer, [p for group in groups for p in group["params"]])
        if step in checks:
            print(json.dumps({"sft_steps": step, "loss": loss.item(), "accuracy": accuracy(model, processor, problems),
                              "seconds": time.perf_counter() - started}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
