"""How many SFT steps `reasonrl vlm build` needs: SFT from a build's post-alignment VLM, with greedy accuracy on
held-out `visual_arithmetic` problems at several step counts (JSON lines on stdout).

    reasonrl vlm build --sft-steps 0 --out ALIGNED
    python bench/vlm_sft_steps.py ALIGNED --at 60,80,100,115,130,150 [--problems 100]

It runs the build's own SFT stage (constant learning rate, the build's batches), so the model after N steps
here is the model a build with ``--sft-steps N`` makes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from reasonrl.data.loaders import load_examples
from reasonrl.jobs import vlm_build
from reasonrl.jobs.vlm_build import VLMBuildRun
from reasonrl.reward.router import program_verifiers


def accuracy(model, processor, problems, batch: int = 25) -> float:
    """Greedy accuracy (32 new tokens, the math verifier) on the build's own question form."""
    verify, tokenizer, right = program_verifiers()["math"], processor.tokenizer, 0
    was_training = model.training
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    with torch.no_grad():
        for start in range(0, len(problems), batch):
            part = problems[start : start + batch]
            users = [vlm_build.conversation(p, "answer")[0] for p in part]
            prompts = [processor.apply_chat_template(u, add_generation_prompt=True, tokenize=False) for u in users]
            inputs = processor(text=prompts, images=[[p.images[0]] for p in part], return_tensors="pt", padding=True)
            out = model.generate(**inputs, max_new_tokens=32, do_sample=False)
            replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            right += sum(verify(r, p.answer).correct for p, r in zip(part, replies, strict=True))
    tokenizer.padding_side = side
    model.train(was_training)
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
    checks = sorted(map(int, args.at.split(",")))
    settings = dataclasses.replace(VLMBuildRun(), sft_steps=checks[-1])  # the default recipe's SFT
    examples = load_examples("visual_arithmetic", "train")
    problems = load_examples("visual_arithmetic", "test")[: args.problems]
    done, started = [0], time.perf_counter()

    def after_steps(count: int) -> None:  # the build's progress callback, called after every step
        done[0] += count
        if done[0] in checks:
            print(json.dumps({"sft_steps": done[0], "accuracy": accuracy(model, processor, problems),
                              "seconds": time.perf_counter() - started}), flush=True)  # fmt: skip

    vlm_build.supervised_fine_tuning(model, processor, examples, settings, after_steps)


if __name__ == "__main__":
    main()
