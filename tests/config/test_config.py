"""Typed configuration: docstrings, overrides, errors that say how to fix them, presets, Plan."""

import dataclasses
import re
import typing

import pytest
import yaml

from reasonrl.algo.presets import PRESETS, AlgoSpec
from reasonrl.config import Config, ConfigError, Plan, list_presets, load_config, resolve, to_dict
from reasonrl.config.config_loader import PRESET_DIR, config_keys, parse_overrides
from reasonrl.config.docs import field_docs
from reasonrl.config.render import render_yaml
from reasonrl.jobs.evaluate import EvalSettings
from reasonrl.jobs.reward_model import RewardModelRun


def all_config_classes():
    classes, todo = [Plan], [Config, EvalSettings, RewardModelRun]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        hints = typing.get_type_hints(cls)
        todo.extend(hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name]))
    return classes


@pytest.mark.parametrize("cls", all_config_classes(), ids=lambda c: c.__name__)
def test_every_config_field_has_a_docstring(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


@pytest.mark.parametrize("cls", all_config_classes(), ids=lambda c: c.__name__)
def test_config_classes_are_frozen(cls):
    assert cls.__dataclass_params__.frozen


def test_dotted_overrides_are_typed():
    cfg = load_config(
        "dapo",
        [
            "algo.eps_high=0.3",
            "rollout.top_k=20",
            "algo.dual_clip=null",
            "train.lr=3e-6",
            "algo.dynamic_sampling=false",
            "run.name=exp1",
        ],
    )
    assert cfg.algo.eps_high == 0.3 and cfg.rollout.top_k == 20 and cfg.algo.dual_clip is None
    assert cfg.train.lr == 3e-6 and cfg.algo.dynamic_sampling is False and cfg.run.name == "exp1"
    assert parse_overrides(["algo.eps_high=0.3"]) == {"algo.eps_high": 0.3}


def test_unknown_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'algo\.eps_hgh'; did you mean 'algo\.eps_high'"):
        load_config("dapo", ["algo.eps_hgh=0.3"])
    with pytest.raises(ConfigError, match=re.escape("did you mean 'algo.eps_high'")):
        load_config("dapo", ["rollout.eps_high=0.3"])  # right name, wrong group
    with pytest.raises(ConfigError, match="is a group of settings"):
        load_config("dapo", ["algo=3"])
    with pytest.raises(ConfigError, match="unknown config key 'zzz'"):
        load_config("dapo", ["zzz=1"])


def test_wrong_types_and_choices_are_named():
    with pytest.raises(ConfigError, match=r"algo\.eps_high: expected a number, got 'wide'"):
        load_config("dapo", ["algo.eps_high=wide"])
    with pytest.raises(ConfigError, match=r"algo\.loss_agg: expected one of 'token-mean'"):
        load_config("dapo", ["algo.loss_agg=token-sum"])
    with pytest.raises(ConfigError, match=r"rollout\.rollout_prompts: expected an integer"):
        load_config("dapo", ["rollout.rollout_prompts=2.5"])
    with pytest.raises(ConfigError, match=r"algo\.dynamic_sampling: expected true/false"):
        load_config("dapo", ["algo.dynamic_sampling=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config("dapo", ["algo.eps_high"])


def test_minibatch_that_does_not_divide_the_rollout_is_explained():
    with pytest.raises(ConfigError) as err:
        load_config("dapo", ["train.minibatch_sequences=48"])
    message = str(err.value)
    assert "train.minibatch_sequences=48 does not divide the 64 responses" in message
    assert "rollout.rollout_prompts=8" in message and "rollout.samples_per_prompt=8" in message
    assert "32 or 64" in message


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config("dapo", ["rollout.samples_per_prompt=1", "algo.eps_low=1.5", "train.microbatch_tokens=100"])
    message = str(err.value)
    for fragment in (
        "algo.eps_low must be in [0, 1)",
        "samples_per_prompt=1 leaves every group alone",
        "algo.dynamic_sampling keeps groups",
        "train.microbatch_tokens=100 cannot hold",
    ):
        assert fragment in message


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["algo.lambda_policy_mode=length_adaptive"], "length_adaptive is a GAE setting"),
        (["algo.advantage_estimator=egae"], "egae and algo.window_tokens go together"),
        (["algo.overlong_cache_tokens=500"], "algo.overlong_cache_tokens=500 must be between 1"),
        (["algo.value_pretrain_steps=5"], "value_pretrain_steps=5 trains a critic"),
        (["algo.kl_controller=adaptive"], "kl_controller=adaptive needs"),
        (["critic.init=checkpoint"], "critic.init=checkpoint needs critic.path"),
        (["algo.dual_clip=0.5"], "algo.dual_clip must be > 1"),
        (["rollout.vllm.max_model_len=100"], "rollout.vllm.max_model_len=100 is shorter than the longest sequence"),
        (["rollout.vllm.gpu_memory_utilization=1.5"], "rollout.vllm.gpu_memory_utilization must be in (0, 1]"),
    ],
)
def test_cross_field_problems(overrides, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_config("dapo", overrides)


def test_t_ppo_window_must_fit_under_the_cap():
    expected = "window_tokens=500 must be between 1 and rollout.max_response_tokens=192"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config("t_ppo", ["algo.window_tokens=500"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_run_preset_loads_and_resolves(name):
    cfg = load_config(name)
    plan = resolve(cfg)
    assert plan.sequences_per_rollout == cfg.rollout.rollout_prompts * cfg.rollout.samples_per_prompt
    assert plan.optimizer_steps_per_rollout * cfg.train.minibatch_sequences == (
        plan.sequences_per_rollout * cfg.train.epochs_per_rollout
    )


def test_run_presets_list_description_and_paper():
    presets = {p.name: p for p in list_presets()}
    assert set(PRESETS) <= set(presets)  # every algorithm has a run preset; baselines add their own
    for preset in presets.values():
        assert preset.description and "arXiv:" in preset.paper


@pytest.mark.parametrize("path", sorted(PRESET_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_yaml_presets_hold_only_overrides(path):
    # every key is a valid config key and every value changes what lies beneath it
    data = yaml.safe_load(path.read_text())
    base_tree = to_dict(load_config(data["preset"])) if "preset" in data else to_dict(Config())
    if "algo_preset" in data:
        base_tree["algo"] = to_dict(PRESETS[data["algo_preset"]].spec)
    keys = set(config_keys())
    for group, values in data.items():
        if group in ("preset", "algo_preset", "description", "paper", "status"):
            continue
        for key, value in values.items():
            assert f"{group}.{key}" in keys
            assert base_tree[group][key] != value, f"{path.name}: {group}.{key} restates {value!r}"


def test_preset_values_reach_the_config():
    dapo = load_config("dapo")
    assert dapo.algo == dataclasses.replace(PRESETS["dapo"].spec, oversample_factor=1.0)  # + the YAML override
    assert dapo.reward.incorrect_score == -1.0
    vc = load_config("vc_ppo")  # extends the ppo run preset
    assert vc.rollout.samples_per_prompt == 1 and vc.algo.lambda_critic == 1.0 and vc.algo.value_pretrain_steps == 10


def test_resolve_derives_numbers_without_mutating():
    cfg = load_config("dapo")
    before = to_dict(cfg)
    plan = resolve(cfg)
    assert to_dict(cfg) == before
    assert plan.minibatches_per_rollout == 2 and plan.total_optimizer_steps == 20
    assert plan.warmup_optimizer_steps == 4
    assert plan.prompts_per_generation_pass == 8  # the run preset over-samples 1×
    assert resolve(load_config("dapo", ["algo.oversample_factor=3"])).prompts_per_generation_pass == 24
    assert plan.overlong_cache_tokens == 13  # 20% of 64, as DAPO's 4096 of 20480
    assert not plan.uses_critic and not plan.uses_reference  # DAPO (f): no KL -> no reference model
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algo.eps_high = 0.5


def test_plan_of_critic_and_kl_presets():
    vapo = resolve(load_config("vapo"))
    assert vapo.uses_critic and vapo.critic_lr == pytest.approx(2e-5) and vapo.value_pretrain_steps == 10
    assert resolve(load_config("vapo", ["critic.lr=3e-6"])).critic_lr == 3e-6
    assert resolve(load_config("grpo")).uses_reference
    dr = resolve(load_config("dr_grpo"))
    assert dr.loss_agg_constant == 64.0 and not dr.uses_reference


def test_the_run_presets_keep_vapos_alpha():
    # VAPO eq 5: lambda = 1 - 1/(0.05 l); a scaled alpha is only an ablation (bench/fidelity.yaml, vapo_alpha5)
    for name in ("vapo", "t_ppo"):
        assert load_config(name).algo.length_alpha == 0.05, name


def test_user_file_extends_a_preset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("preset: dapo\nalgo:\n  eps_high: 0.3\ntrain.lr: 1e-6\n")
    cfg = load_config(path)
    assert cfg.algo.eps_high == 0.3 and cfg.train.lr == 1e-6 and cfg.algo.dynamic_sampling
    assert load_config(path, ["algo.eps_high=0.25"]).algo.eps_high == 0.25


def test_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="unknown preset 'dappo'"):
        load_config("dappo")
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"preset: {loop}\n")
    with pytest.raises(ConfigError):
        load_config(loop)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_rendered_yaml_loads_back_to_the_same_config(tmp_path, name):
    cfg = load_config(name)
    path = tmp_path / "full.yaml"
    path.write_text(render_yaml(cfg, comments=True))
    assert load_config(path) == cfg


def test_algo_group_is_the_pure_algo_spec():
    assert typing.get_type_hints(Config)["algo"] is AlgoSpec


def test_plan_says_when_old_logprobs_need_their_own_pass():
    assert resolve(load_config("dapo")).separate_old_logprob_pass  # 2 mini-batches per rollout
    assert not resolve(load_config("dapo", ["train.minibatch_sequences=64"])).separate_old_logprob_pass
    assert resolve(load_config("grpo")).separate_old_logprob_pass  # the KL needs them
    assert resolve(
        load_config("dapo", ["train.minibatch_sequences=64", "train.epochs_per_rollout=2"])
    ).separate_old_logprob_pass


def test_vllm_max_model_len_defaults_to_the_longest_sequence():
    from reasonrl.config.plan import vllm_engine_options

    cfg = load_config("dapo", ["rollout.max_prompt_tokens=200", "rollout.max_response_tokens=50"])
    assert vllm_engine_options(cfg)["max_model_len"] == 250
    assert vllm_engine_options(load_config("dapo", ["rollout.vllm.max_model_len=4096"]))["max_model_len"] == 4096


def test_groups_that_cannot_be_split_evenly_over_the_ranks_fail_before_anything_loads(monkeypatch):
    with pytest.raises(ConfigError, match=r"rollout\.rollout_prompts=8 cannot be split evenly over 3 .*dist\.trainer_"):
        load_config("grpo", ["dist.backend=ray", "dist.trainer_workers=3"])
    monkeypatch.setenv("WORLD_SIZE", "3")  # what torchrun --nproc-per-node 3 sets
    with pytest.raises(ConfigError, match=r"use a multiple of 3"):
        load_config("grpo", [])
    load_config("grpo", ["rollout.rollout_prompts=6", "train.minibatch_sequences=48"])


def test_a_data_parallel_backend_that_does_not_match_the_launch_is_explained(monkeypatch):
    from reasonrl.training.placement.parallel import join_data_parallel

    for variable in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError, match="torchrun --standalone --nproc-per-node N -m reasonrl train"):
        join_data_parallel(load_config("grpo", ["dist.backend=torch"]))
    assert join_data_parallel(load_config("grpo", [])).world_size == 1  # auto, no torchrun: one process
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"set dist\.backend=torch"):
        join_data_parallel(load_config("grpo", ["dist.backend=none"]))


def test_the_micro_batch_budget_defaults_per_device_and_never_below_one_sequence():
    from reasonrl.config.plan import microbatch_token_budget

    default = load_config("grpo")
    assert default.train.microbatch_tokens is None
    assert microbatch_token_budget(default, "cpu") == 768  # the main job's memory on 2 cores
    assert microbatch_token_budget(default, "cuda") == 16384  # verl's per-GPU token budget
    long_answers = load_config("grpo", ["rollout.max_prompt_tokens=512", "rollout.max_response_tokens=1024"])
    assert microbatch_token_budget(long_answers, "cpu") == 1536
    explicit = load_config("grpo", ["train.microbatch_tokens=1000"])
    assert microbatch_token_budget(explicit, "cuda") == 1000


def number_settings(cls=Config, prefix=""):
    """Every float setting of a settings class (groups included), as dotted keys."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from number_settings(hint, f"{prefix}{f.name}.")
        elif hint is float or float in typing.get_args(hint) or typing.get_args(hint) == (float, ...):
            yield f"{prefix}{f.name}"


def test_every_number_setting_refuses_nan_and_infinity():
    """NaN or an infinity means nothing for any setting (``train.lr=inf`` once trained to NaN weights and
    exited 0): each is refused, naming the key, whether it comes from an override or from Python."""
    keys = list(number_settings())
    assert len(keys) >= 40 and "train.lr" in keys and "reward.weights" in keys
    for key in keys:
        for text in ("nan", "inf", "-inf", "1e999"):
            value = f"[{text}]" if key == "reward.weights" else text
            with pytest.raises(ConfigError, match=re.escape(f"{key}") + ".*expected a finite number"):
                load_config("grpo", [f"{key}={value}"])
    group, field = "train", "lr"
    built = dataclasses.replace(Config(), train=dataclasses.replace(Config().train, lr=float("inf")))
    with pytest.raises(ConfigError, match=f"{group}.{field}: expected a finite number"):
        from reasonrl.config.validate import validate

        validate(built)


def test_a_jobs_number_option_refuses_nan(capsys):
    from reasonrl.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--temperature", "nan"])
    assert "expected a finite number, got 'nan'" in capsys.readouterr().err
