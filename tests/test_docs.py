"""The numbers docs/algorithms.md's preset table and the presets' YAML comments quote are the ones
`reasonrl config show` resolves."""

import re
from pathlib import Path

import pytest
import yaml

from reasonrl.algo.presets import PRESETS
from reasonrl.cli import main
from reasonrl.config.config_loader import PRESET_DIR

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d+(?:\.\d+)?)"

# phrase of the table -> the setting(s) it quotes; "plan." keys come from the derived plan
CLAIMS: list[tuple[str, tuple[str, ...]]] = [
    (rf"{NUMBER}(?: prompts)? × {NUMBER}", ("rollout.rollout_prompts", "rollout.samples_per_prompt")),
    (rf"\bcap {NUMBER}\b|{NUMBER}-token (?:cap|responses|replies)", ("rollout.max_response_tokens",)),
    (rf"ε = {NUMBER}/{NUMBER}", ("algo.eps_low", "algo.eps_high")),
    (rf"ε = {NUMBER}(?![\d./])", ("algo.eps_low", "algo.eps_high")),
    (rf"λ = {NUMBER} for actor and critic", ("algo.lambda_policy", "algo.lambda_critic")),
    (rf"λ_actor (?:= )?{NUMBER}", ("algo.lambda_policy",)),
    (rf"λ_critic (?:= )?{NUMBER}", ("algo.lambda_critic",)),
    (rf"α = {NUMBER}", ("algo.length_alpha",)),
    (rf"β = {NUMBER}", ("algo.kl_coef",)),
    (rf"μ = {NUMBER}", ("algo.nll_weight",)),
    (rf"value clip {NUMBER}", ("algo.value_clip",)),
    (rf"{NUMBER}× over-sampling", ("algo.oversample_factor",)),
    (rf"≤ {NUMBER} passes", ("algo.max_generation_passes",)),
    (rf"{NUMBER} (?:value-)?pretraining steps", ("algo.value_pretrain_steps",)),
    (rf"EV ≥ {NUMBER}", ("algo.value_pretrain_ev_target",)),
    (rf"window {NUMBER} tokens|{NUMBER}-token window", ("algo.window_tokens",)),
    (rf"{NUMBER}-slot pool", ("plan.sequences_per_rollout",)),
    (rf"{NUMBER}(?:-step warm-up| warm-up rollout steps)", ("train.warmup_rollout_steps",)),
    (rf"weight decay {NUMBER}", ("train.weight_decay",)),
    (r"(one|\d+) optimiser steps? per rollout", ("plan.optimizer_steps_per_rollout",)),
    (r"\blr (\d+(?:\.\d+)?e-\d+)", ("train.lr",)),
    (r"reward (±)1", ("reward.incorrect_score",)),
]
WORDS = {"one": 1.0, "±": -1.0}


def claims(cell: str) -> dict[str, float]:
    """The settings a table cell quotes; "(paper …)" asides quote the paper and are skipped."""
    text = re.sub(r"\(paper [^)]*\)", "", cell).replace("**", "")
    found: dict[str, float] = {}
    for pattern, keys in CLAIMS:
        for match in re.finditer(pattern, text):
            values = [WORDS[g] if g in WORDS else float(g) for g in match.groups() if g is not None]
            if len(values) == 1:  # one value quoted for several settings ("ε = 0.2": both clip ranges)
                values *= len(keys)
            found |= dict(zip(keys, values, strict=True))
    return found


def test_the_claim_parser_reads_the_table_phrases():
    assert claims("8 × 8 (paper 512 × 16), cap 64 (paper 20480), 1× over-sampling, reward ±1") == {
        "rollout.rollout_prompts": 8.0,
        "rollout.samples_per_prompt": 8.0,
        "rollout.max_response_tokens": 64.0,
        "algo.oversample_factor": 1.0,
        "reward.incorrect_score": -1.0,
    }
    assert claims("ε = 0.2, λ_critic 1, **α = 0.05**") == {
        "algo.eps_low": 0.2,
        "algo.eps_high": 0.2,
        "algo.lambda_critic": 1.0,
        "algo.length_alpha": 0.05,
    }


def preset_rows() -> dict[str, tuple[str, str]]:
    """preset -> (AlgoSpec cell, run-scaling cell) of the ## Presets table."""
    text = (ROOT / "docs" / "algorithms.md").read_text()
    table = text.split("## Presets", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        name, _, spec, run = (cell.strip() for cell in line.strip("|").split(" | "))
        rows[name.strip("`")] = (spec, run)
    return rows


def differences() -> dict[str, str]:
    """preset -> its "Differences from the papers" list."""
    text = (ROOT / "docs" / "algorithms.md").read_text().split("## Differences from the papers", 1)[1]
    text = text.split("\n## ", 1)[0]
    return {part.split("`", 1)[0]: part for part in text.split("\n### `")[1:]}


def resolved(name: str, capsys) -> dict[str, float]:
    """`reasonrl config show NAME`, config and derived plan, flattened to dotted keys."""
    assert main(["config", "show", name]) == 0
    config_text, plan_text = capsys.readouterr().out.split("# derived plan", 1)
    plan_text = plan_text.split("# memory plan", 1)[0]  # the memory plan after it is a table, not YAML
    plan = yaml.safe_load("\n".join(line.removeprefix("# ") for line in plan_text.splitlines()[1:]))
    flat = {f"plan.{key}": value for key, value in plan.items()}
    for group, values in yaml.safe_load(config_text).items():
        flat |= {f"{group}.{key}": value for key, value in values.items()}
    return flat


def test_the_table_lists_every_preset():
    assert sorted(preset_rows()) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_preset_table_quotes_what_config_show_resolves(name, capsys):
    rows = preset_rows()
    spec_cell, run_cell = rows[name]
    run_claims = claims(run_cell)
    inherited = re.match(r"as `(\w+)`", run_cell)  # "as `grpo`, ...": that row's scaling, then this one's
    if inherited:
        run_claims = claims(rows[inherited.group(1)][1]) | run_claims
    config = resolved(name, capsys)
    for key, value in run_claims.items():
        assert config[key] == value, (
            f"docs/algorithms.md, {name} run scaling: {key} = {value}, resolves to {config[key]}"
        )
    spec = PRESETS[name].spec
    for key, value in claims(spec_cell).items():
        assert key.startswith("algo."), f"the {name} AlgoSpec column quotes {key}, a run setting"
        assert getattr(spec, key.removeprefix("algo.")) == value, f"{name} AlgoSpec: {key} = {value} in the docs"
        if key not in run_claims:  # the run preset keeps the paper's value, or the run column must say otherwise
            assert config[key] == value, f"{name}: the docs quote {key} = {value}, the preset resolves {config[key]}"
    assert run_claims, f"the {name} row quotes no run settings"


def test_every_preset_has_a_numbered_differences_list():
    lists = differences()
    assert sorted(lists) == sorted(PRESETS)
    for name, text in lists.items():
        assert re.search(r"^1\. ", text, re.MULTILINE), f"the {name} differences are not a numbered list"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_differences_lists_quote_what_config_show_resolves(name, capsys):
    config = resolved(name, capsys)
    for key, value in claims(differences()[name]).items():
        assert config[key] == value, (
            f"docs/algorithms.md, {name} differences: {key} = {value}, resolves to {config[key]}"
        )


@pytest.mark.parametrize("path", sorted(PRESET_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_preset_files_comments_quote_what_config_show_resolves(path, capsys):
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    header = re.sub(r"\(paper[^)]*\)", "", header)
    config = resolved(path.stem, capsys)
    for prompts, samples in re.findall(r"(\d+) prompts x (\d+)", header):
        assert (config["rollout.rollout_prompts"], config["rollout.samples_per_prompt"]) == (int(prompts), int(samples))
    for cap in re.findall(r"(\d+)-token (?:cap|replies)|cap (\d+) tokens", header):
        assert config["rollout.max_response_tokens"] == int("".join(cap)), f"{path.name}: {cap}"


def test_nothing_cites_documents_a_users_clone_does_not_have():
    # cite a paper's equation or a section of docs/algorithms.md instead
    pattern = re.compile(r"\b(?:spec|DESIGN) §")
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"]
    for folder in ("reasonrl", "docs", "tests", "bench", "scripts"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md", ".yaml", ".toml", ".sh"}]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        if path.is_file()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
