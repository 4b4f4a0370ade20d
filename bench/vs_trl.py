"""TRL's GRPOTrainer vs reasonrl's grpo on identical work, side by side (one JSON object).

    pip install -e '.[bench]'
    python bench/vs_trl.py [--steps 10] [--prompts 8] [--completions 4] [--max-new-tokens 64] [--lr 1e-5]
                           [--device cpu|cuda] [--rounds 1]

On ``--device cuda`` both trainers keep the policy on the GPU and generate with vLLM colocated on the
same card, in sleep mode, with the same memory share (TRL: ``use_vllm``, ``vllm_mode="colocate"``;
reasonrl: ``model.device=cuda rollout.engine=vllm``). ``--engine hf`` makes both generate with transformers'
``generate`` on the GPU instead (TRL: ``use_vllm=False``; reasonrl: ``rollout.engine=hf``), for a machine
without vLLM; ``--engine paged`` with transformers' continuous batching (TRL: ``use_transformers_paged=True``;
reasonrl: ``rollout.engine=paged``).

Same model (SmolLM2-135M-Instruct, the same converted weights), the same prompts (the first
steps × prompts problems of the arithmetic task, chat-formatted with the same template), the same
number of completions per prompt, max new tokens, learning rate, steps and seed, the same reward
(reasonrl's math verifier: 1 correct, 0 wrong), one optimiser step per generation batch, no KL
(TRL's default β = 0), token-level loss (TRL's default `loss_type="dapo"`), bf16 compute on fp32
weights and no gradient checkpointing for both (TRL's GRPOConfig turns it on by default, reasonrl's auto where a
run does not fit without it: off for both here; runs before 2026-11-29's last one had TRL checkpointing), AdamW
for both (torch's; reasonrl takes its fused kernel).  Each trainer runs in its own subprocess, so peak RSS is its
own.  Reported: median seconds per step, completion tokens per second, peak RSS, and both reward curves;
``speedup_per_step`` = TRL median seconds per step ÷ reasonrl's.  ``--rounds N`` runs each side N times, alternating
which goes first (this 2-core VM's speed drifts by 10% and more within an hour, and a single pair can land on either
side of a drift): the medians pool every round's steps, and ``speedup_per_round`` gives each pair's ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAX_PROMPT_TOKENS = 256
VLLM_MEMORY_SHARE = 0.3  # TRL's default vllm_gpu_memory_utilization


def _prompts(count: int) -> list[tuple[str, str]]:
    from reasonrl.data.arithmetic import ArithmeticTask
    from reasonrl.data.prompts import user_message

    task = ArithmeticTask(seed=0)
    return [(user_message(e.question, "answer_line"), e.answer) for e in map(task.train_example, range(count))]


def run_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reasonrl.models.load import resolve_model
    from reasonrl.reward.math import MathVerifier
    from reasonrl.training.record.metrics import peak_rss_gb

    location = resolve_model("smollm2-135m")
    rows = [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in _prompts(args.steps * args.prompts)]
    verifier = MathVerifier()

    def correctness(completions, answer, **kwargs):
        return [verifier(c[0]["content"], a).score for c, a in zip(completions, answer, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.start = 0.0

        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.start)

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=args.prompts * args.completions,
            num_generations=args.completions,
            max_completion_length=args.max_new_tokens,
            learning_rate=args.lr,
            max_steps=args.steps,
            bf16=True,
            gradient_checkpointing=False,  # as reasonrl here (model.gradient_checkpointing=false): like for like
            use_cpu=args.device == "cpu",
            **(
                {
                    "use_vllm": True,
                    "vllm_mode": "colocate",
                    "vllm_enable_sleep_mode": True,
                    "vllm_gpu_memory_utilization": VLLM_MEMORY_SHARE,
                    "vllm_max_model_length": MAX_PROMPT_TOKENS + args.max_new_tokens,
                }
                if args.engine == "vllm"
                else {"use_transformers_paged": True}
                if args.engine == "paged"
                else {}
            ),
            beta=0.0,
            temperature=1.0,
            logging_steps=1,
            seed=args.seed,
            report_to="none",
            save_strategy="no",
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32),
            processing_class=AutoTokenizer.from_pretrained(location),
            reward_funcs=correctness,
            args=config,
            train_dataset=Dataset.from_list(rows),
            callbacks=[timer],
        )
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    lengths = [entry.get("completions/mean_length", 0.0) for entry in logs]
    return {
        "seconds_per_step": timer.times,
        "rewards": [entry["reward"] for entry in logs],
        "tokens_per_step": [length * args.prompts * args.completions for length in lengths],
        "peak_rss_gb": peak_rss_gb(),
    }


def run_reasonrl(args: argparse.Namespace) -> dict:
    from reasonrl.config import load_config
    from reasonrl.training.loop import fit
    from reasonrl.training.record.metrics import read_metrics

    overrides = [
        f"rollout.rollout_prompts={args.prompts}",
        f"rollout.samples_per_prompt={args.completions}",
        f"rollout.max_response_tokens={args.max_new_tokens}",
        f"rollout.max_prompt_tokens={MAX_PROMPT_TOKENS}",
        f"model.device={args.device}",
        f"rollout.engine={args.engine}",
        *([f"rollout.vllm.gpu_memory_utilization={VLLM_MEMORY_SHARE}"] if args.engine == "vllm" else []),
        f"train.minibatch_sequences={args.prompts * args.completions}",
        f"train.lr={args.lr}",
        f"train.rollout_steps={args.steps}",
        f"run.seed={args.seed}",
        "algo.kl_placement=none",
        "algo.loss_agg=token-mean",
        "model.gradient_checkpointing=false",  # as TRL here (its default would checkpoint)
        "data.eval_prompts=8",
        f"run.eval_every={10**6}",
        f"run.save_every={10**6}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        summary = fit(load_config("grpo", overrides), Path(tmp), preset="grpo", show_progress=False)
        steps = [r for r in read_metrics(Path(tmp) / "metrics.jsonl") if r["step"] > 0]
    # the last step also runs the final evaluation: time it without that
    seconds = [r["perf/step_seconds"] - r.get("perf/eval_seconds", 0.0) for r in steps]
    return {
        "seconds_per_step": seconds,
        "rewards": [r["reward/mean"] for r in steps],
        "tokens_per_step": [r["rollout/tokens_generated"] for r in steps],
        "peak_rss_gb": summary["peak_rss_gb"],
        "overrides": overrides,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each side, alternating which goes first (medians pooled)"
    )
    parser.add_argument(
        "--engine",
        choices=["vllm", "hf", "paged", "fast"],
        default=None,
        help="generation for both trainers on cuda: vllm (colocated), hf (transformers' generate) or paged "
        "(transformers' continuous batching); "
        "default vllm where installed, else hf. On the cpu reasonrl uses fast and TRL transformers' generate",
    )
    parser.add_argument("--worker", choices=["trl", "reasonrl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine is None:
        vllm_installed = importlib.util.find_spec("vllm") is not None
        args.engine = "fast" if args.device == "cpu" else ("vllm" if vllm_installed else "hf")
    if args.engine == "paged" and args.device == "cpu":  # seen 2026-11-29: TRL 1.16 on transformers 5.24
        sys.exit("--engine paged is for --device cuda: TRL's use_transformers_paged gives empty answers on a CPU")
    if args.worker:
        print(json.dumps((run_trl if args.worker == "trl" else run_reasonrl)(args)))
        return
    result: dict = {"work": {k: v for k, v in vars(args).items() if k != "worker"}}
    runs: dict[str, list[dict]] = {"reasonrl": [], "trl": []}
    for round_ in range(args.rounds):  # each round both sides; every other round TRL first, against the VM's drift
        for name in ("reasonrl", "trl") if round_ % 2 == 0 else ("trl", "reasonrl"):
            command = [sys.executable, __file__, "--worker", name, *sys.argv[1:], f"--engine={args.engine}"]
            output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
            runs[name].append(json.loads(output.strip().splitlines()[-1]))
    for name, side in runs.items():
        seconds = [s for run in side for s in run["seconds_per_step"]]
        rates = [t / s for run in side for t, s in zip(run["tokens_per_step"], run["seconds_per_step"], strict=False)]
        rewards = side[0]["rewards"]
        result[name] = {
            "median_seconds_per_step": statistics.median(seconds),  # over every round's steps
            "tokens_per_second": statistics.median(rates),  # each run's steps paired within the run
            "peak_rss_gb": max(run["peak_rss_gb"] for run in side),
            "reward_curve": rewards,  # the first round's
            "mean_reward_first_half": statistics.fmean(rewards[: len(rewards) // 2]),
            "mean_reward_second_half": statistics.fmean(rewards[len(rewards) // 2 :]),
            "seconds_per_step": seconds,
        }
    result["speedup_per_step"] = (
        result["trl"]["median_seconds_per_step"] / result["reasonrl"]["median_seconds_per_step"]
    )
    if args.rounds > 1:
        result["speedup_per_round"] = [
            statistics.median(trl["seconds_per_step"]) / statistics.median(ours["seconds_per_step"])
            for ours, trl in zip(runs["reasonrl"], runs["trl"], strict=True)
        ]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
