"""The configuration schema: the one source of truth for every setting of a run.

Frozen dataclasses, a docstring under every field, ``Literal`` for choices.  The ``algo`` group is
the pure ``AlgoSpec`` of ``reasonrl.algo.presets``; the other groups describe the run around it.
Batch sizes are named ``rollout_prompts``, ``samples_per_prompt`` and ``minibatch_sequences``
(docs/algorithms.md, Conventions 6); never an ambiguous "batch size".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from reasonrl.algo.presets import AlgoSpec
from reasonrl.config.rollout_schema import RolloutConfig  # the rollout group (with FIRE and vLLM), in its module


@dataclass(frozen=True)
class ModelConfig:
    """Which policy model to train and how to hold it in memory."""

    name_or_path: str = "smollm2-135m"
    """The policy: the built-in smollm2-135m (SmolLM2-135M-Instruct, shipped offline), a local
    Hugging Face directory, a .gguf file, or a hub id (needs a network)."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights' dtype for the forward passes; auto picks the faster measured choice for the device."""

    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute activations in the backward pass: less memory, about a third more compute.  auto: on where the
    memory plan predicts the run does not fit the device without it (said in the log), off otherwise (and where
    the plan has no figure for the device or the model)."""

    checkpoint_policy: Literal["full", "selective"] = "full"
    """What gradient checkpointing keeps (where it is on): full (transformers' own) keeps each decoder layer's
    input and recomputes the whole layer in the backward pass; selective keeps the matmuls' and attention's outputs
    and recomputes only norms, RoPE, activation functions, residual adds and casts: no matmul twice, for more
    memory than full and a third or so of what no checkpointing keeps (torch's selective activation
    checkpointing; models/checkpointing.py)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the policy, reference, critic and reward models live and train: auto = cuda when a CUDA
    device is visible, else cpu.  cuda on a machine without one is a configuration error."""

    attention: Literal["auto", "eager", "sdpa", "flash_attention_2", "varlen", "lanes"] = "auto"
    """The trainer's attention kernel (transformers' attn_implementation).  auto: on the CPU lanes for packed
    sequences, else eager for sequences up to 512 tokens (its backward is faster there) and sdpa above; on a GPU
    flash_attention_2 when the flash-attn package is installed, else sdpa.  lanes: a packed micro-batch's read
    tokens as one sequence through every op but attention, which places them in lanes as wide as the longest row
    or shared-prompt segment (eager up to 512 tokens wide, sdpa above; docs/packing.md); packed sequences only, and
    a model it cannot run (sliding windows, soft-capping, its own attention classes) gets transformers' default.
    varlen: torch's variable-length flash attention over one packed sequence, no mask built (CUDA, torch >= 2.10,
    packed sequences, bf16 compute; not yet auto's choice: its GPU check has not run)."""

    kernels: Literal["auto", "liger", "torch"] = "auto"
    """The trainer's RMSNorm, RoPE and SwiGLU kernels: liger = Liger's Triton kernels (liger-kernel, the `liger`
    extra; CUDA; the llama, mistral, qwen2 and qwen3 families) in place of transformers' torch ops, over the same
    weights (models/liger_kernels.py; the kernels TRL's use_liger_kernel turns on); torch = transformers' own.
    auto: torch's, until the GPU check has run Liger's (its equality test and bench/train_side.py's reasonrl_liger
    arm)."""

    logprob_head: Literal["auto", "chunked", "liger"] = "auto"
    """How training computes the LM head's log-probs: chunked = reasonrl's chunked head (log-probs and entropy in
    one pass, any device; models/logprob_head.py); liger = Liger's fused linear cross-entropy (CUDA, liger-kernel):
    log-probs only, so no entropy: refused with an entropy bonus (algo.entropy_coef), policy/entropy not logged,
    and not for a vision-language model (its image token is masked out of the distribution).  auto: chunked
    (Liger's head has not yet been measured against it on a GPU)."""

    lora_rank: int = 0
    """LoRA (Hu et al. 2021): train rank-r adapters W + (lora_alpha / r)·B·A on the frozen weights of the
    policy and of the critic's backbone (the value head trains fully), through PEFT; 0 = off (full
    fine-tuning).  Engines serve the merged weights; the export holds the merged model and adapter/."""

    lora_alpha: float = 32.0
    """LoRA's scale numerator: the adapters add (lora_alpha / lora_rank)·B·A (32 is TRL's default, paired
    with its rank 16; the scale changes with the rank, as in PEFT)."""

    lora_target_modules: str | tuple[str, ...] = "all-linear"
    """The layers that get adapters: all-linear (every linear layer but the LM head, as verl defaults to),
    or PEFT target names such as [q_proj, k_proj, v_proj, o_proj]."""


@dataclass(frozen=True)
class CriticConfig:
    """The value model of critic-based estimators (gae, egae)."""

    init: Literal["policy", "checkpoint", "reward_model", "prm"] = "policy"
    """Initial critic weights: policy (a copy of the policy backbone with a zero scalar head),
    checkpoint (a saved critic at critic.path; value pretraining is skipped), reward_model (a
    scalar reward model at critic.path, then value pretraining as VAPO does) or prm (a process reward
    model at critic.path, else reward.prm_path, its success probability p mapped to the reward scale:
    V = incorrect_score + (correct_score − incorrect_score)·p; arXiv 2410.17621)."""

    path: str | None = None
    """Directory of a saved critic or reward model (init checkpoint / reward_model): a run's
    critic_pretrained/ or checkpoints/step-N/critic/, the output of `reasonrl rm train`, or a Hugging
    Face sequence-classification reward model (a directory or a hub id)."""

    lr: float | None = None
    """Critic learning rate; None = 2 × train.lr (VAPO: "the critic must keep pace", 2e-6 vs 1e-6)."""


@dataclass(frozen=True)
class RewardConfig:
    """How responses are scored."""

    correct_score: float = 1.0
    """Reward of a response the verifier judges correct."""

    incorrect_score: float = 0.0
    """Reward of a wrong (or unparseable) response; DAPO and VC-PPO use −1."""

    format_weight: float = 0.0
    """Weight of the format reward (1 when the final answer is given as \\boxed{} or an "Answer:" line)."""

    timeout_seconds: float = 10.0
    """Per-response scoring time limit; a scorer that exceeds it gets incorrect_score and a warning."""

    workers: int = 2
    """Processes that score responses in parallel (per verifier)."""

    max_error_fraction: float = 1.0
    """Stop the run when a reward function (or the built-in scorer) fails - raises, returns a bad value,
    exceeds timeout_seconds or kills its worker - on at least this fraction of a step's scoring calls,
    rather than train on its zeros: 1.0 = only when every call fails; above 1 = never."""

    routes: tuple[str, ...] = ()
    """Overrides of the reward router's table, as "task_type=source" (sources: math, code,
    genrm_reference, genrm_bon, bt); defaults: math=math, code=code, reference=genrm_reference,
    open=genrm_bon, preference=bt.  Verifiable tasks can only go to a verifier."""

    functions: tuple[str, ...] = ()
    """Custom reward functions, "module:function" or "path/to/file.py:function", in TRL's shape
    score(prompts, completions, **row_fields) -> list[float] or verl's compute_score(data_source,
    solution_str, ground_truth, extra_info); "verifier" stands for the built-in scorer.  When given, a
    response's score is the weighted sum of these terms (the built-in scorer counts only if listed);
    each runs in its own worker pool under timeout_seconds.  Empty = the built-in scorer alone."""

    weights: tuple[float, ...] = ()
    """One weight per reward.functions entry; empty = 1 each."""

    judge_model: str | None = None
    """The GenRM / pairwise judge: any causal LM spec; None = the policy's initial model."""

    reward_model: str | None = None
    """A Bradley-Terry reward model for the bt source: the --out directory of `reasonrl rm train`, or a
    Hugging Face sequence-classification reward model (TRL, OpenRLHF; a directory or a hub id), which
    scores the chat-formatted conversation at its last token as Hugging Face does."""

    prm_path: str | None = None
    """A process reward model for code tasks (the --out directory of `reasonrl rm train --kind prm`,
    arXiv 2410.17621): the source of reward.prm_dense, and of critic.init=prm without critic.path."""

    prm_dense: Literal["off", "paper", "potential"] = "off"
    """Dense line rewards from the PRM on the line-end tokens of code responses, on top of the unit-test
    outcome: paper (λ·PRM(prefix) per line, length-normalised, λ by the outcome), potential
    (prm_coef·(PRM(prefix_ℓ) − PRM(prefix_ℓ−1)): telescopes to prm_coef·(PRM after the last line − PRM
    before the first) whatever the number of lines) or off.  Comments, repeated lines and text outside
    the code block get none.  PRM scores are mapped to [incorrect_score, correct_score] first."""

    prm_coef: float = 1.0
    """prm_dense=potential: c, the scale of the shaped rewards."""

    prm_lambda_failing: float = 0.25
    """prm_dense=paper: λ for a response that fails its tests (the paper's 0.25)."""

    prm_lambda_passing: float = 0.025
    """prm_dense=paper: λ for a response that passes (the paper's 0.025)."""


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from."""

    dataset: str = "arithmetic"
    """Training prompts: a built-in task (arithmetic, gsm8k, math500, aime2024, humaneval, mbpp, functions), a
    local .jsonl or .parquet file (verl's layout included), or a `datasets` name, with its configuration
    after a colon (openai/gsm8k:main); `a+b` mixes several (e.g. gsm8k+mbpp)."""

    eval_dataset: str | None = None
    """Held-out prompts; None = the held-out split of dataset."""

    eval_prompts: int = 200
    """How many held-out prompts the before/after evaluation uses."""

    prompt_template: Literal["answer_line", "boxed", "plain"] = "answer_line"
    """How the question is asked: answer_line ("... Give the final answer on the last line as
    'Answer: <answer>'"), boxed ("... put your final answer within \\boxed{}"), or plain."""

    system_prompt: str | None = None
    """A system message put before every prompt (a chat-format prompt that starts with its own system
    message keeps it); None = none."""

    arithmetic_digits: int = 2
    """Arithmetic task difficulty: digits per operand (2 = two-digit sums; the base model scores 10–60%)."""

    arithmetic_operations: str = "+"
    """Arithmetic task: the operators problems are drawn from, any of '+-*'."""

    question_field: str = "question"
    """Field holding the question in a jsonl/parquet/`datasets` source: a string, or a list of chat
    messages sent as they are; without it, a `prompt` field is used (TRL's and verl's name)."""

    answer_field: str = "answer"
    """Field holding the reference final answer in a jsonl/parquet/`datasets` source (a dotted name
    reaches into a nested field); without it, verl's `reward_model.ground_truth` is used."""

    task_mix: tuple[str, ...] = ()
    """Task-mix schedule: phases "STEP:type=weight,..." or "STEP:natural", e.g. the math/code-first
    curriculum ["0:math=1,code=1", "20:natural"]; empty = the dataset's own order and mix."""

    offline_path: str | None = None
    """The offline dataset of algo.offline (dpo, dqo): a jsonl written by `reasonrl data sample`.  The
    held-out evaluation still uses data.dataset / data.eval_dataset."""


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation schedule."""

    rollout_steps: int = 10
    """Rollout steps (generate, score, update) in the run (10 ≈ six minutes on 2 CPU cores with the
    embedded model).  With algo.offline (dpo, dqo) it counts update steps: one optimiser step each, on
    train.minibatch_sequences responses of the offline dataset.  The one setting besides cadence and
    memory knobs that a resumed run may change."""

    lr: float = 1e-5
    """Actor learning rate (AdamW), constant after warm-up.  The papers use 1e-6 for 32B models;
    small models over tens of steps need more."""

    warmup_rollout_steps: int = 0
    """Linear learning-rate warm-up, counted in rollout steps (DAPO: 20)."""

    weight_decay: float = 0.0
    """AdamW weight decay."""

    grad_clip: float | None = 1.0
    """Clip the gradient's global L2 norm to this value; None = no clipping."""

    epochs_per_rollout: int = 1
    """Passes over each rollout batch (PPO epochs); 1 in every Seed recipe."""

    minibatch_sequences: int = 32
    """Responses per optimiser step; must divide rollout_prompts × samples_per_prompt."""

    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """What the trainer stores the trained weights (policy and critic) in, and computes with.  float32: fp32
    weights, bf16 compute under autocast where the forward passes run in bf16 (model.dtype).  bfloat16: bf16 compute
    end to end (the residual stream, norms and RoPE too: no autocast casts), with an fp32 master copy of each weight
    beside AdamW's two fp32 moments in the optimiser (models/optim.py: MasterWeightAdamW), so updates far below
    bf16's last bit (RL's 1e-6 on weights of 0.02) are learnt, not rounded away, and the micro-batches' gradients
    (and the input embedding's, models/embedding_gradient.py) summed in fp32; with train.offload_optimizer the master,
    the moments and those sums are in CPU memory, which is where bf16 saves device memory (a 7B full fine-tune: its
    14 GB of weights on the card).  A master made from a bf16 weight is dithered within its rounding cell
    (dithered_master), so the bf16 weights move with it from the first step: the main job learns as with fp32
    weights (64.0% against 64.8% over three seeds, docs/benchmarks.md, "bf16 end to end").  Not the default until
    the GPU check has measured it.  Needs bf16 forward passes (model.dtype bfloat16, or auto, which then means bf16);
    with LoRA the frozen base is bf16 and the adapters stay fp32.  Under torchrun FSDP2 all-gathers the weights in
    bf16 and reduces gradients in fp32 whenever the forward passes run in bf16, whatever this setting."""

    offload_optimizer: bool = False
    """Keep AdamW's moments (8 bytes per parameter) in CPU memory and run its step there: on a GPU that
    much device memory is freed, at the cost of copying each weight and gradient to the host and the
    result back at every optimiser step (FSDP2 ranks use CPUOffloadPolicy, which keeps their shards of
    the weights and gradients on the host too).  On a CPU device the moments are in CPU memory
    already, and nothing changes (nor is there anything to warn about).  The same update either way,
    so a resumed run may change it."""

    microbatch_tokens: int | Literal["auto"] | None = None
    """Token budget of one forward/backward micro-batch: the tokens a micro-batch's forward computes (packed: the
    rows' prompts and responses balanced over the fewest micro-batches, and with sdpa or eager attention the lanes'
    padding counted too; padded: rows × padded length), never more unless one sequence alone is; gradients
    accumulate over micro-batches, so it changes speed and memory, not what is learnt.  auto: on a GPU the largest
    budget the memory plan predicts to fit (one full sequence, then powers of two from 1024 up to a mini-batch's
    tokens at the caps; without gradient checkpointing where the device default fits without it, said in the log);
    on the CPU, and where there is no plan, the default below.  null (default): 768 on the
    CPU (activation memory grows about 1 GB per 1k tokens for the 135M model; 768 keeps the main job
    under 6 GB peak RSS) and 16384 on a GPU (verl's default token budget per GPU; at 768 tokens a GPU
    step is bound by kernel launches: docs/benchmarks.md, "One RL step on a GPU"), raised to one full
    sequence (rollout.max_prompt_tokens + rollout.max_response_tokens) where that is longer."""

    pack_sequences: bool = True
    """Run each micro-batch's rows as one sequence without padding (per-row position ids; attention
    never crosses rows: transformers' packed-sequence path, flash-attn's variable-length kernels where
    installed), in every forward of the policy, reference and critic — verl's use_remove_padding, TRL's
    padding_free.  false: pad rows to the longest in their micro-batch (same results, more compute;
    docs/packing.md)."""

    share_prompts: bool = True
    """With train.pack_sequences on the CPU: the rows of a micro-batch that share a prompt (a group's samples)
    read it once, as one sequence [prompt, response 1, response 2, ...] whose responses each attend to the
    prompt and to themselves (a custom attention mask; sdpa and eager attention, architectures without sliding
    windows: others read it per row, said once), and micro-batches keep a group's rows together.  Same results,
    fewer tokens: a group of 4 samples of 37-token answers to a 100-token prompt computes 248 tokens instead of
    548.  false: every row reads its own prompt (docs/packing.md)."""

    memory_check: Literal["refuse", "warn", "skip"] = "refuse"
    """Before any weight loads, the memory plan (reasonrl/models/memory_plan.py, printed by `reasonrl
    config show`) predicts the peak memory per device from the model's config and these settings; refuse:
    a run whose plan exceeds the device's free memory (GPU) or available RAM (CPU) stops with an error
    naming the settings that would fit; warn: it logs that and trains anyway; skip: no check."""

    constant_reward_stop_steps: int = 5
    """Stop a run (one line saying so) once every response has got one and the same reward for this many
    rollout steps in a row: such batches teach nothing (every advantage is zero, and no update is taken),
    and usually the model never solves the task or a reward function returns one value whatever the
    response.  0: train on."""


@dataclass(frozen=True)
class RunConfig:
    """Bookkeeping: where outputs go, seeds, cadence of evaluation and checkpoints."""

    output_dir: str = "runs"
    """Parent directory of run directories."""

    name: str | None = None
    """Run directory name under output_dir; None = `<preset>-<YYYYmmdd-HHMMSS>` (a new directory per run).
    A name that already holds a run continues it, and refuses other settings."""

    seed: int = 0
    """Seed of sampling, data order and initialisation."""

    eval_every: int = 5
    """Evaluate on the held-out prompts every this many rollout steps (and at the start and end)."""

    save_every: int = 10
    """Write a checkpoint every this many rollout steps (and at the end)."""

    keep_checkpoints: int = 2
    """How many most recent checkpoints to keep.  With the 135M model a checkpoint takes about 1.6 GB
    (trainer.pt, AdamW's moments, 1.08 GB); a save holds one more until the new one is complete."""

    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the latest checkpoint in the run directory if there is one."""

    log_samples: int = 2
    """Samples of each RL step written as text to samples.jsonl and the trackers (TRL's log_completions): the
    prompt, the completion (a conversation's turns, tool calls and answers), its reward, verdict and advantage.
    0: none."""

    loggers: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = ("tensorboard",)
    """Experiment trackers that mirror metrics.jsonl (the source of truth): tensorboard, wandb
    (`pip install 'reasonrl[wandb]'`; WANDB_MODE=offline honoured) and mlflow (`reasonrl[mlflow]`;
    MLFLOW_TRACKING_URI, else a local file store mlruns/ beside the run directories)."""

    threads: int | None = None
    """Threads torch computes with in the training process; null = OMP_NUM_THREADS where set, else the cores
    other work leaves free (the usable cores less those busy: the smaller of the 1-minute load average and the
    tasks running now; at least 1), chosen at the first run of a process. Logged: `threads: N of M cores, load L`."""


@dataclass(frozen=True)
class DistConfig:
    """Several processes or machines (docs/distributed.md)."""

    backend: Literal["auto", "none", "torch", "ray"] = "auto"
    """none: one process.  torch: data-parallel ranks launched by torchrun (`torchrun --nproc-per-node N
    -m reasonrl train ...`), each holding an FSDP2 shard of the policy and generating its share of the
    prompts.  ray: one driver with Ray workers for rollout, reward and training (dist.*_workers).
    auto: torch when launched by torchrun with more than one process, else none."""

    rollout_workers: int = 1
    """ray: rollout engines, each a Ray actor generating its share of every batch."""

    trainer_workers: int = 1
    """ray: trainer actors forming one torch.distributed group (FSDP2 inside); the data-parallel size."""

    reward_workers: int = 1
    """ray: scorer actors the responses are split over."""

    gpus_per_rollout_worker: float = 0.0
    """ray: GPUs each rollout actor reserves (placement groups pack them); 0 on CPU clusters."""

    gpus_per_trainer_worker: float = 0.0
    """ray: GPUs each trainer actor reserves; 0 on CPU clusters."""

    address: str | None = None
    """ray: the cluster to join; None = $RAY_ADDRESS, else a local cluster started for the run."""

    worker_timeout_seconds: float = 1800.0
    """ray: a worker call that takes longer is reported as a dead worker; torch: the collectives' timeout."""


@dataclass(frozen=True)
class Config:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""

    algo: AlgoSpec = field(default_factory=AlgoSpec)
    """The RL objective: estimator, clip, aggregation, KL, auxiliary terms, filters, shaping."""

    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (critic-based estimators only)."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring."""

    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation schedule."""

    run: RunConfig = field(default_factory=RunConfig)
    """Outputs, seeds, cadence."""

    dist: DistConfig = field(default_factory=DistConfig)
    """Several processes or machines."""
