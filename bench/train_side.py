"""The training side at the sizes users train: log-prob pass and policy update of random-weight 135M–7B
shapes on long-tailed answers, reasonrl (packed and padded) against TRL 1.16's GRPO loss path.

    python bench/train_side.py --profile cpu [--smoke] [--out bench/results]
    python bench/train_side.py --profile gpu [--smoke] [--out DIR]        (scripts/gpu-check.sh runs this)

Models are built from the config dicts in ``SHAPES`` (SmolLM2-135M, Qwen2.5-0.5B/1.5B/7B; random weights,
nothing downloaded).  Each configuration (shape × answer cap × implementation) trains on the same rows:
prompts of 100–200 tokens and answers whose lengths are lognormal (median a quarter of the cap, σ 1)
clipped to the cap, seeded.  Two passes are timed (on the GPU after a warm-up on two rows):

- ``logprob``: the no-grad log-prob pass over micro-batches (behaviour or reference log-probs);
- ``update``: forward + backward of the policy loss over micro-batches and one optimiser step.

reasonrl runs what its trainer runs: ``RolloutBatch`` micro-batches of ``train.microbatch_tokens``,
``TokenLogprobs`` and ``PolicyUpdater`` built by ``build_policy_updater`` from the grpo preset with the
settings ``bench/vs_trl.py`` compares on (no KL, token-mean loss), packed (the default) and, where
``TokenLogprobs`` takes ``packed=``, padded.  TRL runs ``GRPOTrainer``'s own ``compute_loss`` and, for
the log-prob pass, its ``_get_per_token_logps_and_entropies``, with its defaults (loss ``dapo``, β 0,
gradient checkpointing, its fused LM head) but the compute dtype reasonrl uses; rows padded as TRL pads
a generation batch (prompts left, answers right, to the batch's widest) in micro-batches of as many rows
as fit the same token budget; ``trl_liger`` the same with ``use_liger_kernel=True`` (in TRL 1.16: Liger's
RMSNorm, RoPE and SwiGLU kernels beside TRL's own fused LM head; liger-kernel, GPU only).  On the GPU
``reasonrl_varlen`` is reasonrl packed into one sequence [1, N] through torch's variable-length flash attention
(``model.attention=varlen``, docs/packing.md) instead of SDPA's lanes, and ``reasonrl_selective`` reasonrl with
``model.checkpoint_policy=selective`` (the matmuls' and attention's outputs kept, no matmul recomputed);
``reasonrl_liger`` reasonrl with Liger's RMSNorm, RoPE and SwiGLU kernels (``model.kernels=liger``) and
``reasonrl_liger_head`` with Liger's fused linear cross-entropy as its LM head too (``model.logprob_head=liger``).

Reported per pass: real tokens/s (prompt + answer, padding not counted), achieved TFLOP/s and MFU
(2·N per token for the log-prob pass, 6·N for the update, N the matmul parameters, plus causal attention
FLOPs, over the card's dense bf16 peak; null on the CPU), peak memory (GPU: ``max_memory_allocated``;
CPU: the worker's peak RSS, every CPU configuration in its own process), pad fraction (1 − real tokens
÷ tokens the embedding layer saw) and micro-batches.  On the GPU the caps of a shape are tried upward
in one process until one runs out of memory: ``largest_cap_that_fits``.

Under scripts/gpu-check.sh the run keeps within GPU_CHECK_STEP_SECONDS (``--budget-seconds``): work that
cannot start in time is skipped and a worker past it is stopped, its finished caps kept.  Writes
OUT/train_side_PROFILE[_smoke].json after every configuration and a PNG beside it at the end.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import ROOT, child_env
from gpu_step import device_description
from train_side_trl import TrlPasses

# Config dicts of the published checkpoints (their config.json), built with random weights.
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
                       tie_word_embeddings=False, rope_theta=1000000.0),
}  # fmt: skip
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512)  # fmt: skip  # --smoke: each shape's family and tying at this size
IMPLEMENTATIONS = ("reasonrl", "reasonrl_padded", "trl")
# reasonrl packed into one sequence [1, N] through torch's varlen attention (model.attention=varlen; CUDA only)
VARLEN = "reasonrl_varlen"
TRL_LIGER = "trl_liger"  # TRL with use_liger_kernel=True: Liger's layer kernels (liger-kernel; CUDA only)
SELECTIVE = "reasonrl_selective"  # reasonrl with model.checkpoint_policy=selective: no matmul recomputed
LIGER_LAYERS = "reasonrl_liger"  # reasonrl with Liger's RMSNorm, RoPE and SwiGLU kernels (model.kernels=liger)
LIGER_HEAD = "reasonrl_liger_head"  # and Liger's fused linear cross-entropy as the LM head (model.logprob_head=liger)
PROMPT_TOKENS = (100, 200)  # uniform: prompts of about 150 tokens
SMOKE_PROMPT_TOKENS = (8, 16)
SETTINGS = ["algo.kl_placement=none", "algo.loss_agg=token-mean"]  # as bench/vs_trl.py compares


@dataclass(frozen=True)
class Sweep:
    """One shape and implementation, at each of ``caps`` (upward); ``rows`` answers per configuration.
    ``overrides`` are reasonrl settings it asks for (applied where this reasonrl has them)."""

    shape: str
    implementation: str
    caps: tuple[int, ...]
    rows: int
    param_dtype: str = "float32"
    gradient_checkpointing: bool = False
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    """Where it runs, its sweeps in order, and the caps ``--smoke`` runs instead of theirs."""

    device: str
    sweeps: tuple[Sweep, ...]
    process_per_cap: bool  # a fresh process per configuration: the CPU's peak RSS is then its own
    smoke_caps: tuple[int, ...] = (64,)


def _both(shape: str, caps: tuple[int, ...], rows: int, **options) -> tuple[Sweep, ...]:
    return tuple(Sweep(shape, implementation, caps, rows, **options) for implementation in IMPLEMENTATIONS)


BIG = dict(param_dtype="bfloat16", gradient_checkpointing=True, overrides=("train.param_dtype=bfloat16",
           "train.offload_optimizer=true"))  # fmt: skip  # 7B: 16 bytes per parameter do not fit 80 GB
PROFILES = {
    "cpu": Profile("cpu", (*_both("smollm2-135m", (256, 512), 2), *_both("qwen2.5-0.5b", (256,), 2)), True),
    # in order of what matters most, so a run stopped by its budget has the targets (1.5B at 4k, 7B fits)
    "gpu": Profile(
        "cuda",
        (
            *_both("qwen2.5-1.5b", (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),  # as TRL's default
            Sweep("qwen2.5-1.5b", LIGER_LAYERS, (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),
            Sweep("qwen2.5-1.5b", TRL_LIGER, (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),
            Sweep("qwen2.5-1.5b", LIGER_HEAD, (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),
            Sweep("qwen2.5-1.5b", VARLEN, (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),
            Sweep("qwen2.5-1.5b", SELECTIVE, (1024, 4096, 8192, 16384), 16, gradient_checkpointing=True),
            Sweep("qwen2.5-7b", "reasonrl", (4096,), 8, **BIG),
            *_both("qwen2.5-0.5b", (1024, 4096, 16384), 16),
            Sweep("qwen2.5-7b", "trl", (4096,), 8, **BIG),
        ),
        False,
        smoke_caps=(32, 64),
    ),
}


def model_config(shape: str, smoke: bool):
    from transformers import AutoConfig

    values = dict(SHAPES[shape], **(TINY if smoke else {}), max_position_embeddings=32768)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def matmul_parameters(model) -> int:
    """N of the 6·N estimate: every parameter a matmul reads, the LM head included, the embedding lookup not."""
    total = sum(p.numel() for p in model.parameters())
    return total if model.config.tie_word_embeddings else total - model.get_input_embeddings().weight.numel()


def pass_flops(model, lengths: list[int], training: bool) -> float:
    """Model FLOPs of one pass over sequences of ``lengths`` real tokens: 2·N per token and causal attention
    (2·layers·heads·head_dim·s² per sequence) forward, three times that for forward + backward."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = 2 * c.num_hidden_layers * c.num_attention_heads * head_dim * sum(s * s for s in lengths)
    forward = 2 * matmul_parameters(model) * sum(lengths) + attention
    return forward * (3 if training else 1)


def answer_lengths(cap: int, rows: int, seed: int) -> list[int]:
    """A long-tailed mix: lognormal with median cap/4 and σ 1, clipped to [1, cap] (the clipped rows are
    the answers the cap truncated)."""
    import math

    rng = random.Random(seed)
    return [max(1, min(cap, round(rng.lognormvariate(math.log(cap / 4), 1.0)))) for _ in range(rows)]


def rollout_rows(cap: int, rows: int, vocab: int, prompt_tokens: tuple[int, int], seed: int = 0):
    """The same rows for every implementation: a RolloutBatch of random tokens, groups of two, ±1 advantages."""
    import torch

    from reasonrl.batch import RolloutBatch, pad_rows

    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt_tokens))] for _ in range(rows)]
    answers = [[rng.randrange(vocab) for _ in range(n)] for n in answer_lengths(cap, rows, seed)]
    p_width, r_width = max(map(len, prompts)), max(map(len, answers))
    response_mask = pad_rows([[1] * len(a) for a in answers], r_width, False, torch.bool)
    rewards = torch.tensor([float(i % 2) for i in range(rows)])
    return RolloutBatch(
        prompt_ids=pad_rows(prompts, p_width, True, torch.long),
        prompt_mask=pad_rows([[1] * len(p) for p in prompts], p_width, True, torch.bool),
        response_ids=pad_rows(answers, r_width, False, torch.long),
        response_mask=response_mask,
        policy_loss_mask=response_mask.clone(),
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=torch.zeros(rows, r_width),
        rewards=rewards,
        correct=rewards > 0,
        truncated=torch.tensor([len(a) == cap for a in answers]),
        group_ids=torch.arange(rows) // 2,
        advantages=(rewards * 2 - 1)[:, None] * response_mask,
    )


def takes(function, keyword: str) -> bool:
    return keyword in inspect.signature(function).parameters


class ReasonrlPasses:
    """reasonrl's log-prob pass and policy update, as its trainer composes them (``packed`` where it can)."""

    def __init__(self, model, device, dtype, packed: bool, sweep: Sweep) -> None:
        from reasonrl.training.update.policy import TokenLogprobs

        self.device, self.packed, self.sweep = device, packed, sweep
        options = {"packed": packed} if takes(TokenLogprobs, "packed") else {}
        if sweep.implementation == LIGER_HEAD:
            options["logprob_head"] = "liger"
        self.policy = TokenLogprobs(model, 1.0, dtype, **options)
        self.updater = None

    def configure(self, cap: int, rows: int, prompt_tokens: tuple[int, int]) -> dict:
        """The trainer's settings for ``rows`` answers of at most ``cap`` tokens; returns what it runs with."""
        import dataclasses

        from reasonrl.config import load_config
        from reasonrl.config.plan import microbatch_token_budget, resolve
        from reasonrl.training.backend import SingleProcess
        from reasonrl.training.setup import build_policy_updater

        known = {f.name for f in dataclasses.fields(load_config("grpo", []).train)}
        wanted = [*self.sweep.overrides, *([] if self.packed else ["train.pack_sequences=false"])]
        applied = [o for o in wanted if o.split("=")[0].removeprefix("train.") in known]
        overrides = [
            *SETTINGS,
            f"rollout.rollout_prompts={rows // 2}",
            "rollout.samples_per_prompt=2",
            f"train.minibatch_sequences={rows}",
            f"rollout.max_response_tokens={cap}",
            f"rollout.max_prompt_tokens={prompt_tokens[1]}",
            f"model.device={self.device.type}",
            f"model.gradient_checkpointing={str(self.sweep.gradient_checkpointing).lower()}",
            *applied,
        ]
        cfg = load_config("grpo", overrides)
        self.updater = None  # the previous cap's optimiser states go before the next ones come
        if takes(build_policy_updater, "microbatch_tokens"):  # a reasonrl from before the plan held the budget
            self.budget = microbatch_token_budget(cfg, self.device.type)
            self.updater = build_policy_updater(cfg, resolve(cfg), self.policy, self.budget, SingleProcess())
        else:
            plan = resolve(cfg, self.device.type, 1)
            self.budget = plan.microbatch_tokens
            self.updater = build_policy_updater(cfg, plan, self.policy, SingleProcess())
        return {"microbatch_tokens": self.budget, "overrides": overrides, "not_in_this_reasonrl": sorted(
            set(wanted) - set(applied)), "memory_plan_gib": self.planned_gib(cfg)}  # fmt: skip

    def planned_gib(self, cfg) -> float | None:
        """The memory plan's predicted peak for these settings, less the rollout engine (none runs here) and the
        allocator's headroom (which ``max_memory_allocated`` does not see)."""
        try:
            from reasonrl.models.memory_plan import gib, plan_memory
        except ImportError:  # a reasonrl from before the memory plan
            return None
        plan = plan_memory(cfg, self.policy.model.config, device_type=self.device.type)
        unseen = plan.components.get("rollout engine", 0) + plan.components.get("allocator headroom", 0)
        return round(gib(plan.total - unseen), 3)

    def logprob_pass(self, batch) -> None:
        """As the trainer's log-prob stage runs it: no grad, micro-batches of ``micro_batch_rows``."""
        import torch

        options = {"packed": self.packed} if takes(type(batch).micro_batch_rows, "packed") else {}
        if takes(type(batch).micro_batch_rows, "lanes"):  # as the trainer cuts them for this attention
            options["lanes"] = self.policy.lanes
        with torch.no_grad():
            for rows in batch.micro_batch_rows(self.budget, **options):
                self.policy(batch.select(rows).to(self.device))

    def update(self, batch) -> None:
        self.updater.update(batch, seed=0)


class TokenCounter:
    """Counts the tokens the model's embedding layer sees, padding included, and its calls (micro-batches)."""

    def __init__(self, model) -> None:
        self.tokens = self.calls = 0
        model.get_input_embeddings().register_forward_hook(self.count)

    def count(self, module, inputs, output) -> None:
        self.tokens += inputs[0].numel()
        self.calls += 1

    def reset(self) -> None:
        self.tokens = self.calls = 0


def timed(run, device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def peak_memory_gb(device) -> float:
    import torch

    from reasonrl.training.record.metrics import peak_rss_gb

    return torch.cuda.max_memory_allocated(device) / 1024**3 if device.type == "cuda" else peak_rss_gb()


def measure(passes, counter: TokenCounter, batch, model, device, peak_flops: float | None, warm_up: bool) -> dict:
    """Both passes over ``batch``, each after a warm-up pass over the same batch if ``warm_up`` (on a GPU,
    where the first calls at a new size set up kernels, grow the allocator's pool and, for the update, make
    the optimiser's states: timed once cold, the 0.5B update ran 2.2x slower than warm on an H100; a CPU pass
    takes tens of seconds, next to which its first-call costs are noise)."""
    import torch

    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    result = {"rows": len(batch), "real_tokens": sum(lengths), "answer_tokens": int(batch.response_mask.sum())}
    for name, run, training in (("logprob", passes.logprob_pass, False), ("update", passes.update, True)):
        if warm_up:
            run(batch)
        counter.reset()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = timed(lambda run=run: run(batch), device)
        flops = pass_flops(model, lengths, training) / seconds
        result[name] = {
            "seconds": seconds,
            "tokens_per_second": sum(lengths) / seconds,
            "tflops": flops / 1e12,
            "mfu": flops / peak_flops if peak_flops else None,
            "peak_memory_gb": peak_memory_gb(device),
            "pad_fraction": 1 - sum(lengths) / counter.tokens,
            "microbatches": counter.calls,
        }
    return result


def checkpoint_layers(model, policy: str) -> None:
    """Gradient checkpointing with ``policy`` as reasonrl's trainer turns it on (a reasonrl from before
    model.checkpoint_policy: transformers' own, full)."""
    try:
        from reasonrl.models.checkpointing import enable_checkpointing
    except ImportError:
        if policy != "full":
            raise
        model.gradient_checkpointing_enable()
        return
    enable_checkpointing(model, policy)


def run_worker(sweep: Sweep, caps: list[int], smoke: bool, device_name: str) -> None:
    """Each of ``caps`` upward for ``sweep`` in this process, one JSON line per cap as it finishes; the first
    cap that runs out of GPU memory ends the sweep."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.config.plan import attention_implementation
    from reasonrl.models.load import compute_dtype
    from reasonrl.models.varlen_attention import transformers_attention

    device = torch.device(device_name)
    prompt_tokens = SMOKE_PROMPT_TOKENS if smoke else PROMPT_TOKENS
    asked = "varlen" if sweep.implementation == VARLEN else "auto"
    attention = attention_implementation(asked, device.type, max(caps) + prompt_tokens[1])
    config = model_config(sweep.shape, smoke)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(
            config,
            dtype=getattr(torch, sweep.param_dtype),
            attn_implementation=transformers_attention(attention, config),
        ).eval()
    trl = sweep.implementation in ("trl", TRL_LIGER)
    if sweep.implementation in (LIGER_LAYERS, LIGER_HEAD):
        from reasonrl.models.liger_kernels import use_liger_layer_kernels

        use_liger_layer_kernels(model)
    if sweep.gradient_checkpointing and not trl:  # TRL: its own default
        checkpoint_layers(model, "selective" if sweep.implementation == SELECTIVE else "full")
    dtype = compute_dtype("auto")  # the trainer's default: bf16 where the hardware has it
    passes_type = TrlPasses if trl else ReasonrlPasses
    passes = passes_type(model, device, dtype, sweep.implementation != "reasonrl_padded", sweep)
    counter = TokenCounter(model)
    peak = device_description(device.type)["peak_bf16_flops"]
    setup = {"parameters": sum(p.numel() for p in model.parameters()), "matmul_parameters": matmul_parameters(model)}
    setup |= {"attention": attention, "compute_dtype": str(dtype).removeprefix("torch.")}
    for cap in caps:
        line = {"shape": sweep.shape, "implementation": sweep.implementation, "cap": cap, **setup}
        try:
            line |= passes.configure(cap, sweep.rows, prompt_tokens)
            batch = rollout_rows(cap, sweep.rows, model.config.vocab_size, prompt_tokens)
            warm_up = device.type == "cuda"
            line |= {"fits": True, **measure(passes, counter, batch, model, device, peak, warm_up)}
        except torch.cuda.OutOfMemoryError as error:
            line |= {"fits": False, "error": str(error).splitlines()[0][:300]}
        print(json.dumps(line), flush=True)
        if not line["fits"]:
            break
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def worker_lines(command: list[str], seconds: float | None) -> tuple[list[dict], str | None]:
    """Run a worker; the JSON lines it printed (also those before a stop) and why it stopped early, if it did."""
    try:
        done = subprocess.run(command, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=seconds)
        output, problem = done.stdout, None if done.returncode == 0 else f"exit status {done.returncode}"
    except subprocess.TimeoutExpired as stopped:
        output, problem = stopped.stdout or "", f"stopped at the time budget ({seconds:.0f} s)"
        output = output.decode() if isinstance(output, bytes) else output
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")], problem


def summary(configurations: list[dict]) -> dict:
    """Per shape and implementation: the largest cap measured that fits; per shape and cap: reasonrl's update
    tokens/s over TRL's (packed and padded)."""
    fits: dict = {}
    for c in configurations:
        entry = fits.setdefault(f"{c['shape']}/{c['implementation']}", {"largest_cap_that_fits": None})
        if c["fits"]:
            entry["largest_cap_that_fits"] = max(entry["largest_cap_that_fits"] or 0, c["cap"])
        else:
            entry["first_cap_that_did_not_fit"] = c["cap"]
    measured = {(c["shape"], c["implementation"], c["cap"]): c for c in configurations if c["fits"]}
    speedups: dict = {"trl": {}, TRL_LIGER: {}}
    for (shape, implementation, cap), c in measured.items():
        for arm, ratios in speedups.items():
            trl = measured.get((shape, arm, cap))
            if implementation.startswith("reasonrl") and trl:
                ratio = c["update"]["tokens_per_second"] / trl["update"]["tokens_per_second"]
                ratios[f"{shape}/{cap}/{implementation}"] = ratio
    return {
        "fits": fits,
        "update_speedup_over_trl": speedups["trl"],
        "update_speedup_over_trl_liger": speedups[TRL_LIGER],
    }


def plot(result: dict, path: Path) -> str | None:
    """Update and log-prob tokens/s against the cap, one line per shape and implementation; a note where
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    lines: dict = {}
    for c in result["configurations"]:
        if c.get("fits"):
            lines.setdefault(f"{c['shape']} {c['implementation']}", []).append(c)
    for ax, name in zip(axes, ("update", "logprob"), strict=True):
        for label, points in lines.items():
            ax.plot([p["cap"] for p in points], [p[name]["tokens_per_second"] for p in points], "o-", label=label)
        ax.set(xscale="log", yscale="log", xlabel="answer cap (tokens)", ylabel="real tokens/s", title=name)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{result['device']} ({result['date']})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny models and caps: the same code paths in seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="only these of the profile's shapes")
    budget = float(os.environ.get("GPU_CHECK_STEP_SECONDS", 0))
    parser.add_argument("--budget-seconds", type=float, default=budget, help="0 = no limit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # JSON: a Sweep
    parser.add_argument("--caps", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(Sweep(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.worker).items()}),
                   args.caps, args.smoke, args.device)  # fmt: skip
        return 0
    return run_profile(args)


def run_profile(args: argparse.Namespace) -> int:
    import importlib.metadata
    import importlib.util

    import torch

    from reasonrl.training.update.policy import TokenLogprobs

    started = time.monotonic()
    profile = PROFILES[args.profile]
    device = profile.device if profile.device == "cpu" or torch.cuda.is_available() else None
    if device is None and not args.smoke:
        sys.exit("the gpu profile needs a CUDA device (--smoke runs its code paths on the CPU)")
    device = device or "cpu"
    stem = f"train_side_{args.profile}{'_smoke' if args.smoke else ''}"
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", "bench/train_side.py", *sys.argv[1:]]),
        **device_description(device),
        "profile": args.profile,
        "smoke": args.smoke,
        "trl": importlib.metadata.version("trl") if importlib.util.find_spec("trl") else None,
        "configurations": [],
        "skipped": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for sweep in (s for s in profile.sweeps if not args.shapes or s.shape in args.shapes):
        caps = list(profile.smoke_caps if args.smoke else sweep.caps)
        liger = sweep.implementation in (TRL_LIGER, LIGER_LAYERS, LIGER_HEAD)
        if liger and (device != "cuda" or importlib.util.find_spec("liger_kernel") is None):
            result["skipped"].append({**asdict(sweep), "why": "Liger's kernels need CUDA and liger-kernel"})
            continue
        if sweep.implementation == LIGER_HEAD and not takes(TokenLogprobs, "logprob_head"):
            result["skipped"].append({**asdict(sweep), "why": "this reasonrl has no Liger head (no logprob_head=)"})
            continue
        if sweep.implementation in ("trl", TRL_LIGER) and result["trl"] is None:
            result["skipped"].append({**asdict(sweep), "why": "TRL is not installed (pip install trl==1.16.0)"})
            continue
        if sweep.implementation == VARLEN and device != "cuda":
            result["skipped"].append({**asdict(sweep), "why": "model.attention=varlen runs on a CUDA device only"})
            continue
        if sweep.implementation == "reasonrl_padded" and not takes(TokenLogprobs, "packed"):
            result["skipped"].append({**asdict(sweep), "why": "this reasonrl has no padded variant (no packed=)"})
            continue
        for group in [[cap] for cap in caps] if profile.process_per_cap else [caps]:
            left = args.budget_seconds - (time.monotonic() - started) - 10 if args.budget_seconds else None
            if left is not None and left < 20:
                result["skipped"].append({**asdict(sweep), "caps": group, "why": "no time left in the budget"})
                continue
            command = [sys.executable, __file__, "--worker", json.dumps(asdict(sweep)), "--device", device, "--caps"]
            lines, problem = worker_lines([*command, *map(str, group), *(["--smoke"] if args.smoke else [])], left)
            result["configurations"].extend(lines)
            if problem:
                result["skipped"].append({**asdict(sweep), "caps": group[len(lines) :], "why": problem})
            (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")  # partial, kept if stopped
    result["summary"] = summary(result["configurations"])
    result["seconds"] = round(time.monotonic() - started, 1)
    note = plot(result, args.out / f"{stem}.png")
    if note:
        result["plot"] = note
    text = json.dumps(result, indent=2)
    (args.out / f"{stem}.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
