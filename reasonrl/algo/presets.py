"""An algorithm is a preset of orthogonal parts, not a subclass (docs/algorithms.md).

``AlgoSpec`` names every part of the objective: advantage estimator, λ schedule, surrogate clip,
loss aggregation, KL, auxiliary terms, sample filter, reward shaping, rollout truncation.
``PRESETS`` holds the papers' values.  Numbers that depend on scale (batch sizes, lengths,
learning rates) are not here: the YAML run presets in ``reasonrl/config/presets`` scale them.
Tags in comments: [P] the paper, [R] verl or the authors' reference code, [S] a secondary source (a
review, a reading note), [M] unverified.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

AdvantageEstimator = Literal["gae", "egae", "grpo", "rloo", "reinforce_pp"]
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
CRITIC_ESTIMATORS = ("gae", "egae")
GROUP_ESTIMATORS = ("grpo", "rloo")


@dataclass(frozen=True)
class AlgoSpec:
    """The parts of an RL objective.  Defaults are a plain clipped policy gradient; presets set the rest."""

    advantage_estimator: AdvantageEstimator = "grpo"
    """How advantages are computed: gae (critic + GAE), egae (GAE over partial sequences, T-PPO),
    grpo (group-normalised rewards), rloo (leave-one-out baseline), reinforce_pp (REINFORCE++).
    gae and egae train a critic."""

    gamma: float = 1.0
    """Discount γ of GAE and REINFORCE++ returns; 1.0 throughout the Seed papers."""

    lambda_policy: float = 1.0
    """GAE λ for the policy advantages (used when lambda_policy_mode is fixed)."""

    lambda_policy_mode: Literal["fixed", "length_adaptive"] = "fixed"
    """fixed: λ_policy = lambda_policy; length_adaptive: λ = 1 − 1/(length_alpha · response length),
    clamped to [0, 0.9999] (VAPO eq 5)."""

    length_alpha: float = 0.05
    """α of length-adaptive λ; the effective GAE horizon is α × response length (VAPO: 0.05)."""

    lambda_critic: float = 1.0
    """GAE λ for the critic's regression targets (decoupled GAE); 1.0 = Monte-Carlo returns."""

    gae_mask_mode: Literal["skip", "reset"] = "skip"
    """How GAE crosses masked tokens inside a response: skip carries credit through the gap (verl),
    reset makes every segment its own episode (PAG turn-independent GAE)."""

    advantage_norm: Literal["none", "batch_whiten", "role_whiten"] = "none"
    """Advantage normalisation after GAE: none; batch_whiten (mean 0 / std 1 over all valid tokens of
    the rollout batch, as verl does for PPO); role_whiten (PAG's RoleAdvNorm: the same, separately over
    the tokens of each multi-turn role, policy attempts and verify turns)."""

    revision_bonus: float = 1.0
    """Multi-turn (PAG eq 1): α of an attempt's revision bonus, acc_t + α·(acc_t − acc_{t−1}) for t ≥ 2."""

    group_norm_by_std: bool = True
    """Group estimators: divide by the group's reward std (GRPO) or not (Dr. GRPO)."""

    group_std_unbiased: bool = True
    """Group estimators: unbiased (N−1) std as verl, or the population std."""

    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 − eps_low."""

    eps_high: float = 0.2
    """Upper clip range: the ratio is clipped at 1 + eps_high (Clip-Higher: 0.28)."""

    dual_clip: float | None = None
    """Dual-clip constant c > 1 capping the loss of negative-advantage tokens at −c·A; None = off."""

    loss_agg: LossAggregation = "token-mean"
    """How per-token policy losses become one number: token-mean (token-level, DAPO/VAPO),
    seq-mean-token-mean (sample-level, GRPO), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO)."""

    loss_agg_constant: float | None = None
    """The constant C of seq-mean-token-sum-norm; None = the run's maximum response length."""

    entropy_coef: float = 0.0
    """Weight of the entropy bonus subtracted from the actor loss; 0 in all Seed recipes."""

    nll_weight: float = 0.0
    """μ: weight of the positive-example NLL on correct responses (VAPO: 0.1)."""

    kl_placement: Literal["none", "reward", "loss"] = "none"
    """Where a KL(π‖π_ref) term enters: none (no reference model is loaded), reward (r_t −= β·kl_t),
    or loss (+ β·agg(kl))."""

    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator: k1 = d, k2 = d²/2, k3 = exp(−d) + d − 1, with d = log π − log π_ref."""

    kl_coef: float = 0.0
    """β: the KL coefficient (the initial one when kl_controller is adaptive)."""

    kl_controller: Literal["fixed", "adaptive"] = "fixed"
    """fixed β, or the adaptive controller that steers the observed KL towards kl_target."""

    kl_target: float = 0.1
    """Target KL per token of the adaptive controller."""

    kl_horizon: int = 10000
    """Horizon (in samples) of the adaptive KL controller; larger = slower adaptation."""

    value_clip: float | None = 0.5
    """Critic: clip range ε_v of the clipped value loss; None = unclipped squared error."""

    value_pretrain_steps: int = 0
    """Critic-only steps on rollouts of the frozen initial policy before RL starts (VC-PPO, VAPO: 50)."""

    value_pretrain_ev_target: float | None = None
    """Stop value pretraining early once explained variance reaches this value; None = run every step."""

    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose filter metric is constant and regenerate until the
    batch is full."""

    dynamic_sampling_metric: Literal["acc", "reward"] = "acc"
    """The group statistic that must vary for a group to be kept: acc (verifier correctness, DAPO)
    or reward (the shaped reward)."""

    oversample_factor: float = 1.0
    """Prompts generated per generation pass, as a multiple of the rollout prompts (verl DAPO: 3)."""

    max_generation_passes: int = 10
    """Dynamic sampling gives up with an error after this many generation passes; 0 = unlimited."""

    overlong: Literal["none", "filter", "soft"] = "none"
    """Over-long responses: none, filter (truncated responses are masked out of the policy loss) or
    soft (DAPO's soft overlong punishment added to the reward)."""

    overlong_cache_tokens: int | None = None
    """L_cache of the soft overlong punishment: the penalty ramps from 0 to −1 over the last
    L_cache tokens before the cap; None = 20% of the maximum response length (DAPO: 4096 of 20480)."""

    overlong_penalty_factor: float = 1.0
    """Multiplier of the soft overlong punishment (verl's penalty_factor)."""

    rollout_correction: Literal["auto", "none", "decoupled", "tis", "mis"] = "auto"
    """Correction of each token's policy loss for the policy that sampled it (π_behav, the engine's
    rollout log-probs) differing from the trainer's proximal policy (π_prox, its own log-prob pass before
    the update), w = π_prox/π_behav: decoupled (AReaL's decoupled PPO: the loss weighted by w, tokens with
    w above the threshold dropped), tis (truncated IS: weighted by min(w, threshold)), mis (masked IS:
    tokens or sequences with w outside [1/threshold, threshold] dropped, the rest unweighted), none, or
    auto: none when rollout.max_staleness is 0, decoupled when it is ≥ 1 (docs/algorithms.md)."""

    rollout_correction_level: Literal["token", "sequence"] = "token"
    """tis and mis: w per token, or per sequence (the product of its tokens' ratios) for all its tokens."""

    rollout_correction_threshold: float | None = None
    """The correction's cap C > 1; None = decoupled 5.0 (AReaL's behaviour-weight cap), tis and mis 2.0
    (verl's rollout-correction threshold)."""

    window_tokens: int | None = None
    """T-PPO: each step advances every in-flight response by at most this many tokens; unfinished
    responses continue next step.  None = synchronous rollouts (every response runs to the end)."""

    policy_tokens: Literal["window", "all_generated"] = "window"
    """T-PPO: which tokens of a pooled sequence the policy loss sees: window (those generated in
    this step's window, so each token is trained on exactly once) or all_generated (the whole
    response so far, earlier windows with their stored behaviour log-probs; docs/algorithms.md, ambiguity 20)."""

    offline: Literal["none", "dpo", "dqo"] = "none"
    """Train from the offline dataset data.offline_path instead of online rollouts: dpo (arXiv 2305.18290,
    on pairs of a correct and a wrong response to one prompt) or dqo (arXiv 2410.09302, on every
    response); none = online RL.  Each offline step is one optimiser step on train.minibatch_sequences
    responses (DPO: half as many pairs); the rollout and advantage settings do not apply."""

    offline_beta: float = 0.1
    """β of the offline objectives: DPO's implicit-reward scale β·log(π/π_ref), DQO's KL-regularisation
    strength (the soft step reward r − β·log(π/π_ref))."""

    dqo_lambda: float = 1.0
    """λ of DQO's λ-return targets (the paper prefers 1, the Monte-Carlo soft return, over 0.95)."""

    dqo_importance_weights: bool = True
    """DQO: weight the Q and V regressions from the behaviour policy that sampled the data to the current
    policy (the paper's §3.3; without them its DQO falls below DRO)."""

    dqo_weight_clip: float | None = 2.0
    """DQO: cap on each per-decision importance weight, against the variance of long products; None = uncapped."""

    @property
    def uses_critic(self) -> bool:
        """True when the algorithm trains a value model: GAE-style estimators online, DQO's V_φ offline."""
        if self.offline != "none":
            return self.offline == "dqo"
        return self.advantage_estimator in CRITIC_ESTIMATORS

    @property
    def uses_groups(self) -> bool:
        """True when advantages compare the responses of one prompt with each other."""
        return self.advantage_estimator in GROUP_ESTIMATORS


class AlgoPreset(NamedTuple):
    """A named AlgoSpec and the paper its values come from."""

    spec: AlgoSpec
    paper: str
    summary: str


# Vanilla PPO as VAPO's baseline (VAPO §5.1 table [P]): λ = 0.95 shared by actor and critic,
# sample-level loss, ε = 0.2.  Batch whitening and value clip 0.5 follow verl (docs/algorithms.md, ambiguities 9–10).
_PPO = AlgoSpec(
    advantage_estimator="gae",
    lambda_policy=0.95,
    lambda_critic=0.95,
    advantage_norm="batch_whiten",
    eps_low=0.2,
    eps_high=0.2,
    loss_agg="seq-mean-token-mean",
    value_clip=0.5,
)

# GRPO as published in DeepSeekMath (§4.1–4.2): group-normalised outcome rewards, sample-level loss,
# ε = 0.2, KL in the loss with the k3 estimator and β = 0.04.
_GRPO = AlgoSpec(
    advantage_estimator="grpo",
    loss_agg="seq-mean-token-mean",
    eps_low=0.2,
    eps_high=0.2,
    kl_placement="loss",
    kl_estimator="k3",
    kl_coef=0.04,
)

# Dr. GRPO (Liu et al. 2025): no std division, no length normalisation (constant C), no KL.
_DR_GRPO = replace(
    _GRPO,
    group_norm_by_std=False,
    loss_agg="seq-mean-token-sum-norm",
    kl_placement="none",
    kl_coef=0.0,
)

# DAPO (arXiv 2503.14476, Algorithm 1 and §4.1 [P]; verl recipe [R]): Clip-Higher 0.2/0.28, dynamic
# sampling on accuracy (3× over-sampling, ≤ 10 passes [R]), token-level loss, soft overlong
# punishment (L_cache = 20% of the cap), no KL, no dual-clip in the faithful preset (docs/algorithms.md, ambiguity 11).
_DAPO = AlgoSpec(
    advantage_estimator="grpo",
    eps_low=0.2,
    eps_high=0.28,
    loss_agg="token-mean",
    dynamic_sampling=True,
    dynamic_sampling_metric="acc",
    oversample_factor=3.0,
    max_generation_passes=10,
    overlong="soft",
    overlong_penalty_factor=1.0,
)

# VC-PPO (arXiv 2503.01491; restated in VAPO §3.1/§4.1): value pretraining + decoupled GAE with
# λ_actor = 0.95, λ_critic = 1.0; otherwise the PPO baseline (symmetric ε, sample-level loss).
# 50 pretraining steps follows VAPO (VC-PPO's own count is unverified; docs/algorithms.md, ambiguity 19).
_VC_PPO = replace(_PPO, lambda_policy=0.95, lambda_critic=1.0, value_pretrain_steps=50)

# VAPO (arXiv 2504.05118 §5.1 [P]): value pretraining (50 steps), decoupled GAE (λ_critic = 1),
# length-adaptive λ_policy with α = 0.05, Clip-Higher 0.2/0.28, token-level loss, positive-example
# NLL with μ = 0.1, group sampling (rollout size, set in the run preset).  No dynamic sampling,
# no overlong shaping, no KL (not stated; docs/algorithms.md, ambiguity 18).
_VAPO = replace(
    _PPO,
    lambda_policy_mode="length_adaptive",
    length_alpha=0.05,
    lambda_critic=1.0,
    eps_high=0.28,
    loss_agg="token-mean",
    nll_weight=0.1,
    value_pretrain_steps=50,
)

# T-PPO (arXiv 2506.15050): truncated rollouts with an 8K window [S], EGAE on running responses,
# critic on finished responses only (Monte-Carlo, λ_critic = 1).  λ_policy, clip range and loss
# aggregation are not verified [M]; VAPO's (same authors) are used.  No value warm-up
# (docs/algorithms.md, ambiguity 20).
_T_PPO = replace(_VAPO, advantage_estimator="egae", nll_weight=0.0, value_pretrain_steps=0, window_tokens=8192)

# Pairwise-RL (arXiv 2504.04950): the reward is a pairwise generative judge's position-debiased win
# probability against an anchor response; what else "pairwise PPO" changes is not stated in the
# abstract, so the objective is the PPO baseline's ([M]; docs/algorithms.md, pairwise_ppo difference 1).
_PAIRWISE_PPO = _PPO

# PAG (arXiv 2506.10406, §3 and Table 7 [P]; release script [R]): PPO with a critic, γ = λ = 1 with
# turn-independent GAE (reset at injected turns), RoleAdvNorm, clip 0.2/0.28, no entropy or KL,
# revision bonus α = 1.  Token-level loss and value clip 0.5: the verl version the release builds on.
_PAG = AlgoSpec(
    advantage_estimator="gae",
    gamma=1.0,
    lambda_policy=1.0,
    lambda_critic=1.0,
    gae_mask_mode="reset",
    advantage_norm="role_whiten",
    eps_low=0.2,
    eps_high=0.28,
    loss_agg="token-mean",
    value_clip=0.5,
    revision_bonus=1.0,
)

PRESETS: dict[str, AlgoPreset] = {
    "ppo": AlgoPreset(
        _PPO,
        "Yue et al. 2025, VAPO, arXiv:2504.05118 (§5.1 vanilla-PPO baseline)",
        "vanilla PPO: critic + GAE λ=0.95, sample-level loss, ε=0.2",
    ),
    "grpo": AlgoPreset(
        _GRPO,
        "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300 (§4.1–4.2)",
        "GRPO: group-normalised rewards, sample-level loss, k3 KL loss β=0.04",
    ),
    "dr_grpo": AlgoPreset(
        _DR_GRPO,
        "Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO), arXiv:2503.20783",
        "Dr. GRPO: GRPO without std and length normalisation, no KL",
    ),
    "dapo": AlgoPreset(
        _DAPO,
        "Yu et al. 2025, DAPO, arXiv:2503.14476",
        "DAPO: clip-higher, dynamic sampling, token-level loss, soft overlong punishment",
    ),
    "vc_ppo": AlgoPreset(
        _VC_PPO,
        "Yuan et al. 2025, What's Behind PPO's Collapse in Long-CoT (VC-PPO), arXiv:2503.01491",
        "VC-PPO: value pretraining + decoupled GAE (λ_actor=0.95, λ_critic=1)",
    ),
    "vapo": AlgoPreset(
        _VAPO,
        "Yue et al. 2025, VAPO, arXiv:2504.05118",
        "VAPO: VC-PPO + length-adaptive GAE, clip-higher, token-level loss, positive NLL",
    ),
    "pairwise_ppo": AlgoPreset(
        _PAIRWISE_PPO,
        "Xu et al. 2025, A Unified Pairwise Framework for RLHF (Pairwise-RL), arXiv:2504.04950",
        "Pairwise-RL: PPO on a pairwise generative judge's debiased win rate against an anchor",
    ),
    "pag": AlgoPreset(
        _PAG,
        "Jiang et al. 2025, PAG: Multi-Turn Reinforced LLM Self-Correction with Policy as Generative Verifier, "
        "arXiv:2506.10406",
        "PAG: answer, self-verify, revise only after 'wrong'; turn-independent GAE, RoleAdvNorm, revision bonus",
    ),
    "t_ppo": AlgoPreset(
        _T_PPO,
        "ByteDance Seed 2025, Truncated Proximal Policy Optimization (T-PPO), arXiv:2506.15050",
        "T-PPO: truncated rollouts (window), EGAE, critic on finished responses",
    ),
}


def get_preset(name: str) -> AlgoSpec:
    """The AlgoSpec of a named preset; the error lists the valid names."""
    try:
        return PRESETS[name].spec
    except KeyError:
        raise KeyError(f"unknown algorithm preset {name!r}; choose one of {', '.join(PRESETS)}") from None
