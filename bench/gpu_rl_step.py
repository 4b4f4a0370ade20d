"""A whole RL step on one GPU without vLLM, reasonrl against TRL (issue 51): the dapo preset on a random-weight
Qwen2.5-1.5B shape at a 4k-token cap, one step timed warm, against TRL 1.16's ``GRPOTrainer`` with
``use_transformers_paged=True`` and with its default ``generate``.

    python bench/gpu_rl_step.py --profile gpu --out DIR          (scripts/gpu-check.sh runs it)
    python bench/gpu_rl_step.py --profile cpu --smoke --out DIR  (the check tests/bench runs on the CPU)

Each arm runs in its own process on the same saved model (random weights of the shape, the real vocabulary
size, reasonrl's byte-level test tokenizer: nothing downloaded), the same prompts (the arithmetic task's first
problems, chat-formatted by the same template), the same samples per prompt, cap, learning rate, seed and
reward (``bench/rewards.py: response_length``, as a random model solves nothing), bf16 autocast on fp32
weights, gradient checkpointing on (TRL's default) and one optimiser step per generation batch, micro-batches
of about ``train.microbatch_tokens`` tokens for both.  Arms: ``reasonrl_paged`` (``rollout.engine=paged``,
transformers' continuous batching), ``reasonrl_hf`` (``generate``), ``trl_paged`` and ``trl_generate``.

Random weights seldom end an answer, so a stop schedule (``install_stop_schedule``) decides every answer's
length the same way in every arm and engine: the model's generation logits are steered so that an answer is
one letter repeated, the letter drawn uniformly at the first step, and each letter ends the answer at its own
position, taken from one long-tailed schedule (``bench/train_side.py: answer_lengths``, lognormal, median a
quarter of the cap).  Only forwards that carry a KV cache are steered (generation); the trainers' passes are
untouched.  Differences from a dapo run (both arms alike): no dynamic sampling (TRL has none), the reward above.
As TRL runs it: its paged generation casts the policy to bf16 in place (TRL 1.16, ``_generate_single_turn`` with
``bf16=True``), so from its first generation on ``trl_paged`` trains bf16 weights.

Reported per arm: the median over the timed steps (all but the first) of seconds per step and its split into
generation, log-probs (passes without gradients outside generation) and update (the rest: rewards, advantages,
the policy update); generated tokens/s, and generated plus trained (prompt + answer) tokens/s of the step; the
GPU's peak memory.
``speedup_over`` gives each TRL arm's seconds per step ÷ reasonrl_paged's.  Writes OUT/gpu_rl_step_PROFILE
[_smoke].json after every arm.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ modules
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from async_rl import build_random_model
from common import ROOT, child_env
from gpu_step import device_description
from train_side import answer_lengths
from vs_trl import _prompts

PROFILES = {
    "gpu": dict(shape="qwen2.5-1.5b", device="cuda", cap=4096, prompts=4, samples=16, steps=2, microbatch_rows=4,
                arms=("reasonrl_paged", "trl_paged", "trl_generate")),
    "cpu": dict(shape="qwen2.5-0.5b", device="cpu", cap=32, prompts=2, samples=4, steps=2, microbatch_rows=4,
                arms=("reasonrl_paged", "reasonrl_hf", "trl_generate")),  # TRL's paged generation: CUDA only
}  # fmt: skip
LEARNING_RATE = 1e-6
MAX_PROMPT_TOKENS = 256
STEER = 50.0  # added to a steered logit: every other token then has a probability under e^-40


def letter_ends(tokenizer, cap: int, prompts: list[str]) -> dict[int, int]:
    """Each letter's token id and the position at which an answer of that letter ends: the median chat-formatted
    prompt length plus its length in the schedule (the schedule's answers end with the stop token)."""
    letters = [
        tokenizer.encode(c, add_special_tokens=False)[0] for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    ]
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"] for p in prompts]  # fmt: skip
    prompt_tokens = round(statistics.median(map(len, chat)))
    return {t: prompt_tokens + n - 1 for t, n in zip(letters, answer_lengths(cap, len(letters), seed=0), strict=True)}


def install_stop_schedule(model_class, ends: dict[int, int], stop: int) -> None:
    """Steer ``model_class``'s generation: after a token that is not a letter every letter gets +STEER (the
    answer's letter drawn uniformly); after letter t at position p, t again while p + 1 < ends[t], then ``stop``.
    Forwards without a KV cache (the trainers' own passes) are left as they are.  Positions are each answer's own
    (``generate`` builds them from the attention mask, continuous batching per request), so an answer's length
    depends on its prompt's, not on its batch's padding.  No host sync: CUDA graphs of transformers' continuous
    batching capture it."""
    import torch

    original = model_class.forward
    tables: dict = {}

    @functools.wraps(original)  # generate reads the signature: logits_to_keep, position ids from the mask
    def forward(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        cache = kwargs.get("cache") if kwargs.get("past_key_values") is None else kwargs["past_key_values"]
        if cache is None:  # transformers names generation's KV cache `cache` (5.24) or `past_key_values` (5.17)
            return output
        logits, ids = output.logits, kwargs["input_ids"]  # [B, K, V], [B, S]
        positions = kwargs.get("position_ids")
        if positions is None:  # no position ids given: the cache's positions (it now holds this forward's tokens too)
            total = cache.get_seq_length()
            positions = torch.arange(total - ids.shape[1], total, device=ids.device)[None].expand(ids.shape[0], -1)
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, torch.Tensor):  # continuous batching: the positions whose logits are kept
            ids, positions = ids[:, keep], positions.expand(ids.shape[0], -1)[:, keep]
        else:
            ids, positions = ids[:, -logits.shape[1] :], positions[:, -logits.shape[1] :]
        if logits.device not in tables:
            end_of = torch.full((logits.shape[-1],), -1, dtype=torch.long)
            end_of[list(ends)] = torch.tensor(list(ends.values()))
            tables[logits.device] = (end_of.to(logits.device), torch.tensor(list(ends), device=logits.device))
        end_of, letters = tables[logits.device]
        end = end_of[ids]  # [B, K]: −1 after a token that is no letter
        is_letter = end >= 0
        logits[..., letters] += (~is_letter).to(logits.dtype)[..., None] * STEER
        target = torch.where(positions + 1 >= end, stop, ids)  # [B, K]
        logits.scatter_add_(-1, target[..., None], is_letter.to(logits.dtype)[..., None] * STEER)
        return output

    model_class.forward = forward


def steer(model_dir: Path, cap: int, prompts: list[str]) -> None:
    """Install the stop schedule on the class of the causal LM saved in ``model_dir``."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]
    install_stop_schedule(model_class, letter_ends(tokenizer, cap, prompts), tokenizer.eos_token_id)


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_reasonrl(engine: str, model_dir: Path, profile: dict) -> dict:
    from reasonrl.config import load_config
    from reasonrl.training.loop import fit
    from reasonrl.training.record.metrics import read_metrics

    rows = profile["prompts"] * profile["samples"]
    overrides = [
        f"model.name_or_path={model_dir}", f"model.device={profile['device']}", f"rollout.engine={engine}",
        "model.gradient_checkpointing=true", f"rollout.rollout_prompts={profile['prompts']}",
        f"rollout.samples_per_prompt={profile['samples']}", f"rollout.max_response_tokens={profile['cap']}",
        f"rollout.max_prompt_tokens={MAX_PROMPT_TOKENS}", f"train.minibatch_sequences={rows}",
        f"train.lr={LEARNING_RATE}", f"train.rollout_steps={profile['steps']}", "train.warmup_rollout_steps=0",
        "algo.dynamic_sampling=false", "reward.functions=[bench/rewards.py:response_length]", "data.eval_prompts=0",
        f"run.eval_every={10**6}", f"run.save_every={10**6}", "run.seed=0",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        fit(load_config("dapo", overrides), Path(tmp), preset="dapo", show_progress=False)
        records = [r for r in read_metrics(Path(tmp) / "metrics.jsonl") if r["step"] > 0]
    steps = []
    for r in records:
        seconds = r["perf/step_seconds"] - r.get("perf/eval_seconds", 0.0)
        generate, logprob = r.get("perf/generate_seconds", 0.0), r.get("perf/logprob_seconds", 0.0)
        steps.append({"seconds": seconds, "generate": generate, "logprob": logprob,
                      "update": seconds - generate - logprob, "generated_tokens": r["rollout/tokens_generated"],
                      "step_tokens": r["rollout/tokens_generated"] + r["perf/batch_tokens"]})  # fmt: skip
    return {"steps": steps, "overrides": overrides, "peak_gpu_memory_gb": peak_gpu_gb()}


def run_trl(paged: bool, model_dir: Path, profile: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(ROOT / "bench"))
    from rewards import response_length

    rows, per_device = profile["prompts"] * profile["samples"], profile["microbatch_rows"]
    clock: dict = {"generate": 0.0, "logprob": 0.0}

    def timed(function, key: str, only_without_grad: bool = False):
        def wrapper(*args, **kwargs):
            if only_without_grad and torch.is_grad_enabled():
                return function(*args, **kwargs)
            synchronize()
            started = time.perf_counter()
            result = function(*args, **kwargs)
            synchronize()
            clock[key] += time.perf_counter() - started
            return result

        return wrapper

    steps: list[dict] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            synchronize()
            clock.update(generate=0.0, logprob=0.0, started=time.perf_counter())

        def on_step_end(self, *args, **kwargs):
            synchronize()
            seconds = time.perf_counter() - clock["started"]
            steps.append({"seconds": seconds, "generate": clock["generate"], "logprob": clock["logprob"],
                          "update": seconds - clock["generate"] - clock["logprob"]})  # fmt: skip

    prompts = [{"prompt": [{"role": "user", "content": p}]} for p, _ in _prompts(profile["steps"] * profile["prompts"])]
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=per_device, gradient_accumulation_steps=rows // per_device,
            num_generations=profile["samples"], max_completion_length=profile["cap"], learning_rate=LEARNING_RATE,
            max_steps=profile["steps"], bf16=True, gradient_checkpointing=True, use_cpu=profile["device"] == "cpu",
            use_transformers_paged=paged, beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
            temperature=1.0, logging_steps=1, seed=0, report_to="none", save_strategy="no",
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
            processing_class=AutoTokenizer.from_pretrained(model_dir), reward_funcs=response_length, args=config,
            train_dataset=Dataset.from_list(prompts), callbacks=[StepClock()],
        )  # fmt: skip
        trainer._generate_single_turn = timed(trainer._generate_single_turn, "generate")
        logps = trainer._get_per_token_logps_and_entropies
        trainer._get_per_token_logps_and_entropies = timed(logps, "logprob", only_without_grad=True)
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "completions/mean_length" in entry]
    tokens = [entry.get("num_tokens") for entry in logs]
    for step, entry, seen, before in zip(steps, logs, tokens, [0, *tokens], strict=False):
        step["generated_tokens"] = entry["completions/mean_length"] * rows
        step["step_tokens"] = step["generated_tokens"] + seen - before if seen is not None else None
    return {"steps": steps, "peak_gpu_memory_gb": peak_gpu_gb()}


def peak_gpu_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


ARMS = {
    "reasonrl_paged": lambda d, p: run_reasonrl("paged", d, p),
    "reasonrl_hf": lambda d, p: run_reasonrl("hf", d, p),
    "trl_paged": lambda d, p: run_trl(True, d, p),
    "trl_generate": lambda d, p: run_trl(False, d, p),
}


def summarise(run: dict) -> dict:
    """Medians over the timed steps (all but the first, which is the warm-up)."""
    timed = run["steps"][1:] or run["steps"]
    median = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    out = {key: round(median(key), 3) for key in ("seconds", "generate", "logprob", "update")}
    out["generated_tokens_per_second"] = round(median("generated_tokens") / median("seconds"), 1)
    if all(s.get("step_tokens") for s in timed):
        out["step_tokens_per_second"] = round(median("step_tokens") / median("seconds"), 1)
    return {**out, "steps_timed": len(timed), **{k: v for k, v in run.items() if k != "steps"}, "steps": run["steps"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--smoke", action="store_true", help="the shape at a tiny size: the code paths, not figures")
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), help="default: the profile's")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worker", nargs=2, metavar=("ARM", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.worker:
        arm, model_dir = args.worker[0], Path(args.worker[1])
        steer(model_dir, profile["cap"], [p for p, _ in _prompts(profile["steps"] * profile["prompts"])])
        print(json.dumps(ARMS[arm](model_dir, profile)))
        return 0
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", "bench/gpu_rl_step.py", *sys.argv[1:]]),
              **device_description(profile["device"]), "profile": args.profile, "smoke": args.smoke,
              "model": f"random weights, {profile['shape']}'s config{' (smoke size)' * args.smoke}",
              **{k: v for k, v in profile.items() if k != "arms"}, "arms": {}, "skipped": {}}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu_rl_step_{args.profile}{'_smoke' if args.smoke else ''}.json"
    with tempfile.TemporaryDirectory() as models:
        model_dir = build_random_model(profile["shape"], Path(models) / "model", args.smoke, real_vocabulary=True)
        for arm in args.arms or profile["arms"]:
            if arm.startswith("trl") and importlib.util.find_spec("trl") is None:
                result["skipped"][arm] = "TRL is not installed (pip install -e '.[bench]')"
                continue
            command = [sys.executable, __file__, "--profile", args.profile, "--out", str(args.out),
                       "--worker", arm, str(model_dir)]  # fmt: skip
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=child_env())
            lines = done.stdout.strip().splitlines()
            ok = done.returncode == 0 and lines
            result["arms"][arm] = summarise(json.loads(lines[-1])) if ok else {"error": f"exit {done.returncode}"}
            path.write_text(json.dumps(result, indent=2) + "\n")  # partial results survive a stop
    base = result["arms"].get("reasonrl_paged", {}).get("seconds")
    result["speedup_over"] = {arm: round(r["seconds"] / base, 3) for arm, r in result["arms"].items()
                              if base and arm.startswith("trl") and "seconds" in r}  # fmt: skip
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: v for k, v in result.items() if k != "arms"}
            | {"arms": {a: {k: v for k, v in r.items() if k != "steps"} for a, r in result["arms"].items()}},
            indent=2,
        )
    )
    return int(any("error" in r for r in result["arms"].values()))


if __name__ == "__main__":
    raise SystemExit(main())
