"""Named algorithm presets carry the papers' values (spec sections 2–5)."""

import pytest

from reasonrl.algo.presets import PRESETS, AlgoSpec, get_preset


def test_every_preset_cites_an_arxiv_paper():
    assert set(PRESETS) == {"ppo", "grpo", "dr_grpo", "dapo", "vc_ppo", "vapo", "t_ppo", "pairwise_ppo", "pag"}
    for name, preset in PRESETS.items():
        assert isinstance(preset.spec, AlgoSpec)
        assert "arXiv:" in preset.paper, name
        assert preset.summary, name


def test_dapo_paper_values():
    dapo = get_preset("dapo")
    assert (dapo.eps_low, dapo.eps_high) == (0.2, 0.28)
    assert dapo.advantage_estimator == "grpo" and dapo.loss_agg == "token-mean"
    assert dapo.dynamic_sampling and dapo.dynamic_sampling_metric == "acc"
    assert dapo.overlong == "soft" and dapo.kl_placement == "none" and dapo.dual_clip is None


def test_vapo_and_vc_ppo_paper_values():
    vapo = get_preset("vapo")
    assert vapo.uses_critic and vapo.lambda_critic == 1.0
    assert vapo.lambda_policy_mode == "length_adaptive" and vapo.length_alpha == 0.05
    assert (vapo.eps_low, vapo.eps_high, vapo.nll_weight) == (0.2, 0.28, 0.1)
    assert vapo.loss_agg == "token-mean" and vapo.value_pretrain_steps == 50
    assert not vapo.dynamic_sampling and vapo.overlong == "none"
    vc = get_preset("vc_ppo")
    assert (vc.lambda_policy, vc.lambda_critic, vc.value_pretrain_steps) == (0.95, 1.0, 50)
    ppo = get_preset("ppo")
    assert (ppo.lambda_policy, ppo.lambda_critic, ppo.eps_high) == (0.95, 0.95, 0.2)
    assert ppo.loss_agg == "seq-mean-token-mean"


def test_vapo_without_its_extras_is_dapo_style_clipped_token_mean():
    # VAPO (f): with μ = 0 the actor objective is DAPO's clipped token-mean loss (advantages aside)
    vapo, dapo = get_preset("vapo"), get_preset("dapo")
    for field in ("eps_low", "eps_high", "loss_agg", "dual_clip", "kl_placement", "entropy_coef"):
        assert getattr(vapo, field) == getattr(dapo, field), field


def test_grpo_family_and_t_ppo():
    grpo, dr = get_preset("grpo"), get_preset("dr_grpo")
    assert (grpo.kl_placement, grpo.kl_estimator, grpo.kl_coef) == ("loss", "k3", 0.04)
    assert not dr.group_norm_by_std and dr.loss_agg == "seq-mean-token-sum-norm" and dr.kl_placement == "none"
    t_ppo = get_preset("t_ppo")
    assert t_ppo.advantage_estimator == "egae" and t_ppo.window_tokens == 8192 and t_ppo.lambda_critic == 1.0


def test_unknown_preset_lists_the_names():
    with pytest.raises(KeyError, match="dapo"):
        get_preset("dappo")
