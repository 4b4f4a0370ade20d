"""Settings of the commands beside ``reasonrl train``: ``reasonrl eval`` and ``reasonrl rm train``.

Frozen dataclasses with a docstring under every field and ``Literal`` for choices, like the run
schema; the command-line options take their defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from reasonrl.config.schema import Config, FireConfig

STANDALONE_DATASET = "arithmetic"
"""What ``reasonrl eval`` evaluates a model that is not a run directory on, unless told."""

STANDALONE_MAX_NEW_TOKENS = 256
"""``reasonrl eval``'s cap on an answer's tokens for a model that is not a run directory, unless told."""


@dataclass(frozen=True)
class EvalSettings:
    """What ``reasonrl eval`` runs."""

    model: str = "smollm2-135m"
    """The model: a spec as model.name_or_path (a built-in name, a local directory, a .gguf file, a
    hub id) or a run directory (its final model; the settings left unset, None, are then the run's own:
    what its evaluation used, from its config.yaml)."""

    dataset: str | None = None
    """The problems: a built-in set (arithmetic, gsm8k, math500, aime24, humaneval, mbpp, functions) or a jsonl
    with question/answer fields; None = a run directory's held-out problems (data.eval_dataset, else the
    hold-out of data.dataset: the first data.eval_prompts, as its evaluation), else arithmetic."""

    k: int = 1
    """Samples per problem for avg@k, maj@k and pass@k."""

    temperature: float = 1.0
    """Sampling temperature of the k samples (greedy_pass@1 is always greedy)."""

    top_p: float = 1.0
    """Nucleus threshold of the k samples; 1.0 = off."""

    max_new_tokens: int | None = None
    """Cap on generated tokens per answer; None = a run directory's rollout.max_response_tokens, else 256."""

    limit: int | None = None
    """Evaluate the first N problems only; None = all of them (a run's held-out problems: data.eval_prompts)."""

    prompt_template: Literal["answer_line", "boxed", "plain"] | None = None
    """How a math question is asked (as data.prompt_template); None = a run directory's, else answer_line."""

    seed: int = 0
    """Seed of the k samples."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights' dtype for generation (as model.dtype)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model generates (as model.device): auto = a CUDA GPU when one is visible (vLLM where
    installed, else transformers' generate), else the CPU."""

    fire: FireConfig = field(default_factory=FireConfig)
    """FIRE for the k sampled answers (greedy_pass@1 stays greedy); off unless ``fire.enabled``."""

    samples: int | None = None
    """n, the answers sampled per problem (≥ k): pass@k is then the unbiased estimate from n; None = k."""

    system_prompt: str | None = None
    """A system message before every prompt (as data.system_prompt); None = a run directory's, else none
    ("" = none with a run directory too)."""

    question_field: str | None = None
    """Field of a file's rows (or a `datasets` name's) holding the question; None = a run directory's
    data.question_field, else question."""

    answer_field: str | None = None
    """Field of a file's rows holding the final answer (dotted for nested fields); None = a run directory's
    data.answer_field, else answer."""

    protocol: Literal["single", "pag"] = "single"
    """single: one answer per prompt; pag: also PAG's protocol (arXiv 2506.10406): the greedy answer,
    the model's verify turn, and a revision after any verdict but "correct", up to max_attempts
    (acc@t1, acc@final, verifier_accuracy, delta_i_to_c, delta_c_to_i, revision_rate)."""

    max_attempts: int = 2
    """PAG protocol: answers per problem at most (the paper evaluates with 2)."""

    records: str | None = None
    """Also write every greedy answer to this .jsonl: problem id, data source, response, its tokens, score
    and verdict (for breakdowns the summary does not make, e.g. accuracy by response length)."""

    self_verify_bon: bool = False
    """PAG's self-verify best-of-N over the k sampled answers: the model verifies each (greedy verify
    turn) and the answer whose verdict gives "correct" the highest probability is kept:
    ``self_verify_bon@k``, next to ``maj@k``."""

    overrides: tuple[str, ...] = ()
    """`reasonrl train`-style reward.* settings that score the answers (reward.functions, reward.weights,
    reward.routes, reward.workers, reward.timeout_seconds), over a run directory's own."""

    def completed(self, cfg: Config, of_run: bool) -> EvalSettings:
        """These settings with each unset one filled in from ``cfg``'s data and rollout settings: a run
        directory's config (``of_run``: what its evaluation used), else the defaults of a standalone eval."""
        data = cfg.data
        inherited = {
            "max_new_tokens": cfg.rollout.max_response_tokens if of_run else STANDALONE_MAX_NEW_TOKENS,
            "prompt_template": data.prompt_template,
            "system_prompt": data.system_prompt,
            "question_field": data.question_field,
            "answer_field": data.answer_field,
        }
        if not of_run:  # a run's unset dataset stays None: its held-out problems
            inherited["dataset"] = STANDALONE_DATASET
        return replace(self, **{name: value for name, value in inherited.items() if getattr(self, name) is None})

    def check(self) -> None:
        """Refuse settings that cannot be evaluated, before anything loads (ConfigError naming each problem)."""
        from reasonrl.config.errors import ConfigError

        not_reward = [item for item in self.overrides if not item.strip().startswith("reward.")]
        checks = [
            (not not_reward, f"eval takes reward.* settings only as KEY=VALUE (got {', '.join(not_reward)}); "
                             "give the others as options (--dataset, --question-field, --template, ...)"),
            (self.k >= 1, f"--k must be >= 1 (samples per problem), got {self.k}"),
            (self.samples is None or self.samples >= self.k,
             f"--n {self.samples} samples cannot estimate pass@{self.k}; give --n >= --k"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.max_new_tokens is None or self.max_new_tokens >= 1,
             f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0 (of the k samples), got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (self.max_attempts >= 1, f"--max-attempts must be >= 1, got {self.max_attempts}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class RewardModelRun:
    """What ``reasonrl rm train`` runs."""

    kind: Literal["bt", "pairwise", "prm"] = "bt"
    """bt: a scalar Bradley-Terry model (the critic's layout); pairwise: a generative judge (a causal LM);
    prm: a process reward model (the critic's layout) regressed onto the line labels of `prm label`."""

    model: str = "smollm2-135m"
    """The model to start from (a spec as model.name_or_path)."""

    data: str = "hh-rlhf-harmless"
    """Preference pairs: a built-in set or a .jsonl / .jsonl.gz file; kind prm: the labels.jsonl of
    `reasonrl prm label`."""

    out: str = "runs/reward-model"
    """Where the trained model (model/), metrics.jsonl and summary.json go."""

    steps: int = 100
    """Optimiser steps."""

    batch_pairs: int = 8
    """Pairs per optimiser step (a pairwise judge sees each in both orders); kind prm: programs per step."""

    lr: float = 1e-5
    """Learning rate (a BT model's zero-initialised head uses 100×)."""

    held_out: float = 0.2
    """Fraction of the pairs kept out of training for the accuracy measurement; kind prm: of the functions
    under test, with all their programs."""

    eval_pairs: int | None = 200
    """Held-out pairs scored before and after training; None = all of them."""

    max_prompt_tokens: int = 256
    """bt, prm: prompt tokens the model reads (the most recent ones are kept)."""

    max_response_tokens: int = 128
    """bt, prm: response tokens the model reads, EOS included (the first ones are kept; a PRM drops the
    lines beyond); set it to the policy's response cap when the model will score, or initialise the
    critic for, longer answers."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model trains (as model.device): auto = a CUDA GPU when one is visible, else the CPU."""

    seed: int = 0
    """Seed of the split, the shuffling and the initialisation."""


@dataclass(frozen=True)
class PRMLabelRun:
    """What ``reasonrl prm label`` runs (arXiv 2410.17621, Algorithm 1: binary-search line labels)."""

    model: str = "smollm2-135m"
    """The initial policy (a spec as model.name_or_path): it samples the programs and the completions
    with data_policy=initial."""

    dataset: str = "mbpp"
    """Code problems with unit tests: a built-in set (mbpp, humaneval) or a jsonl of code tasks."""

    split: str = "train"
    """The dataset's split (auto: train where there is one, else its only split)."""

    limit: int | None = None
    """Label the programs of the first N prompts only; None = every prompt."""

    programs_per_prompt: int = 4
    """n: programs sampled per prompt and policy."""

    completions: int = 20
    """K: completions sampled from a line prefix to decide whether it is alive (the paper's 20)."""

    max_new_tokens: int = 256
    """Cap on a program's tokens; a completion gets what the cap leaves after its prefix."""

    temperature: float = 1.0
    """Sampling temperature of the programs and the completions."""

    data_policy: str = "initial"
    """Who samples: initial (the model above; no extra run), or an earlier RL run directory whose
    evenly spaced checkpoints do (the paper's choice: 4 checkpoints of the RL baseline run)."""

    checkpoints: int = 4
    """data_policy = a run directory: how many of its checkpoints, evenly spaced, ending at the last."""

    out: str = "runs/prm-labels.jsonl"
    """The labelled programs, one JSON line each; OUT.progress holds the work in flight (resume)."""

    seed: int = 0
    """Seed of the sampling."""

    overrides: tuple[str, ...] = ()
    """`reasonrl train`-style KEY=VALUE settings for the engine and the sandbox (rollout.engine,
    reward.timeout_seconds, reward.workers, ...)."""

    def check(self) -> None:
        """Refuse settings that cannot label anything (ConfigError naming each problem)."""
        from reasonrl.config.errors import ConfigError

        checks = [
            (self.programs_per_prompt >= 1, f"--programs-per-prompt must be >= 1, got {self.programs_per_prompt}"),
            (self.completions >= 1, f"--completions must be >= 1, got {self.completions}"),
            (self.max_new_tokens >= 2, f"--max-new-tokens must be >= 2, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0, got {self.temperature}"),
            (self.checkpoints >= 1, f"--checkpoints must be >= 1, got {self.checkpoints}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
        ]
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class OfflineSampleRun:
    """What ``reasonrl data sample`` runs: the offline dataset of DQO and DPO (``data.offline_path``)."""

    model: str = "smollm2-135m"
    """The behaviour policy that samples the responses (a spec as model.name_or_path)."""

    dataset: str = "arithmetic"
    """The prompts: a built-in set or a jsonl with question/answer fields."""

    split: str = "train"
    """The dataset's split (auto: train where there is one, else its only split)."""

    limit: int | None = None
    """Sample the first N prompts only; None = every prompt."""

    samples_per_prompt: int = 4
    """n: responses sampled per prompt (DPO pairs come from prompts with both a correct and a wrong one)."""

    max_new_tokens: int = 64
    """Cap on a response's tokens."""

    temperature: float = 1.0
    """Sampling temperature; the behaviour log-probs are of the distribution sampled from."""

    out: str = "runs/offline-samples.jsonl"
    """The samples, one JSON line per response; a killed run started again continues it."""

    seed: int = 0
    """Seed of the sampling."""

    overrides: tuple[str, ...] = ()
    """`reasonrl train`-style KEY=VALUE settings for the engine and the scorer (rollout.engine,
    data.prompt_template, reward.*, ...)."""

    def check(self) -> None:
        """Refuse settings that cannot sample anything (ConfigError naming each problem)."""
        from reasonrl.config.errors import ConfigError

        checks = [
            (self.samples_per_prompt >= 1, f"--samples-per-prompt must be >= 1, got {self.samples_per_prompt}"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"--temperature must be > 0 (behaviour log-probs of a greedy policy are 0), "
                                   f"got {self.temperature}"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


AUGMENTATIONS = ("mask", "delete", "reorder")
"""COCA's augmentations of a conversation history (``reasonrl.data.augment``)."""


@dataclass(frozen=True)
class ContrastivePretrainRun:
    """What ``reasonrl rm pretrain --contrastive`` runs: COCA's contrastive pretraining (arXiv 2108.10510)
    of the encoder a reward model or a critic starts from."""

    model: str = "smollm2-135m"
    """The model to start from (a spec as model.name_or_path)."""

    data: str = "hh-rlhf-harmless"
    """Conversations: the prompts and chosen replies of preference pairs (a built-in set or a .jsonl file)."""

    out: str = "runs/contrastive-encoder"
    """Where the pretrained encoder (model/), metrics.jsonl and summary.json go; `rm train --model OUT/model`
    and `critic.init=reward_model critic.path=OUT` start from it."""

    steps: int = 100
    """Optimiser steps."""

    batch_pairs: int = 8
    """Conversations per optimiser step (each gives two views: 2N − 2 negatives per anchor)."""

    lr: float = 1e-5
    """Learning rate (COCA: 5e-5 for BERT-base)."""

    temperature: float = 0.1
    """τ of the InfoNCE loss (COCA's 0.1)."""

    augmentations: str = "mask,delete,reorder"
    """The augmentations a view may use, comma-separated: mask (terms), delete (turns), reorder (exchanges);
    COCA's ablation drops one at a time."""

    mask_rate: float = 0.5
    """Share of each history turn's words masked (COCA's term-deletion rate)."""

    delete_rate: float = 0.5
    """Share of the history's turns deleted (COCA's query/document deletion rate)."""

    held_out: float = 0.2
    """Fraction of the conversations kept out of training for the held-out loss and accuracy."""

    eval_pairs: int | None = 200
    """Held-out conversations scored before and after; None = all of them."""

    max_prompt_tokens: int = 256
    """History tokens the encoder reads (the most recent ones are kept)."""

    max_response_tokens: int = 128
    """Reply tokens the encoder reads (the first ones are kept)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model trains (as model.device): auto = a CUDA GPU when one is visible, else the CPU."""

    seed: int = 0
    """Seed of the split, the views and the shuffling."""

    def check(self) -> None:
        """Refuse settings that cannot train (ConfigError naming each problem)."""
        from reasonrl.config.errors import ConfigError

        names = [n.strip() for n in self.augmentations.split(",") if n.strip()]
        checks = [
            (bool(names) and set(names) <= set(AUGMENTATIONS),
             f"--augmentations must name some of {', '.join(AUGMENTATIONS)}, got {self.augmentations!r}"),
            (names != ["reorder"], "--augmentations reorder needs another one beside it: most histories have fewer "
                                   "than two exchanges to swap"),
            (self.temperature > 0, f"--temperature must be > 0, got {self.temperature}"),
            (0 <= self.mask_rate <= 1 and 0 <= self.delete_rate <= 1,
             "--mask-rate and --delete-rate must be in [0, 1]"),
            (self.batch_pairs >= 2,
             f"--batch-pairs must be >= 2 (the other conversations are the negatives), got {self.batch_pairs}"),
        ]  # fmt: skip
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class VLMBuildRun:
    """What ``reasonrl vlm build`` runs: a small vision-language model assembled in Seed1.5-VL's stages
    (arXiv 2505.07062, §3–4) in miniature — a vision encoder pretrained on rendered images (masked image
    modelling, then image-text contrastive learning), a connector aligned with the language model frozen,
    then supervised fine-tuning on visual questions."""

    language_model: str = "smollm2-135m"
    """The language model the VLM is built on (a spec as model.name_or_path)."""

    out: str | None = None
    """Where the VLM goes (a Hugging Face directory with its processor); None = the reasonrl cache, where
    ``model.name_or_path=smollm2-135m-vlm`` finds it."""

    tasks: str = "visual_arithmetic"
    """The visual tasks (comma-separated) whose train splits supply the images, captions and questions of
    every stage; the default teaches reading the sums (counting, grounding and pointing build too, but no
    recipe has yet made them better than chance: docs/benchmarks.md, "Vision-language RL")."""

    vision_hidden: int = 192
    """Width of the vision encoder (Idefics3's SigLIP-style ViT; 96-pixel images in 16-pixel patches)."""

    vision_layers: int = 4
    """Transformer layers of the vision encoder."""

    encoder_steps: int = 600
    """Stage 2, encoder pretraining: masked image modelling steps (half the patches hidden, every patch's
    pixels predicted), the label-free objective of Seed1.5-VL's first ViT stage."""

    contrastive_steps: int = 400
    """Stage 3, image-text contrastive learning of the encoder on the images' captions (CLIP's loss),
    Seed1.5-VL's second ViT stage."""

    align_steps: int = 200
    """Stage 4, alignment (the language model frozen): steps training the encoder and the connector so that
    each image token is read as the word of its 16-pixel cell (the character written there, the colour of
    the shape centred there, or a space), at ``lr`` with batches of 4 × ``batch_size`` images."""

    sft_steps: int = 120
    """Stage 5, supervised fine-tuning: steps training the whole model on the tasks' visual questions (on
    the default task, 100 steps give 13% of held-out sums, 120 about 38%, 150 70%: RL needs room above;
    ``bench/vlm_sft_steps.py``)."""

    batch_size: int = 8
    """Examples per step of stage 5 (stages 2–4 take 4×: they run no language model)."""

    lr: float = 1e-3
    """Learning rate of the stages that run no language model (2–4) and of the heads they train."""

    adapter_lr: float = 1e-4
    """Learning rate of the vision encoder and the connector in stage 5, where the language model reads
    them."""

    language_model_lr: float = 3e-5
    """Learning rate of the language model's weights in stage 5."""

    seed: int = 0
    """Seed of the initialisation and of the order of examples."""
