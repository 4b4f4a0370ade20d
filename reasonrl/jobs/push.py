"""``reasonrl push``: a run's trained model to the Hugging Face Hub, with a generated model card.

What goes up, in one commit: the model directory (``final/`` by default, or a checkpoint: its
weights, config and tokenizer, never the optimiser state or the critic), ``README.md`` (the model
card: base model, data, preset and paper, results, the whole config, how to load it), and the run's
record under ``reasonrl/`` (``config.yaml``, ``run.json``, ``summary.json``, ``metrics.jsonl``,
``training_curves.png``, whichever exist).  No local absolute path goes up: in every text file (the card,
the record, the model's JSON files: a LoRA adapter's config names its base model's path) a path inside
the run directory becomes relative to it and any other keeps only its file name.  Only the run's own files go
up: a symbolic link in the model directory, or on the way to what is uploaded (``final/`` or a checkpoint as a
link), refuses the push, naming it; no link is followed.  Authentication is huggingface_hub's own (``HF_TOKEN``
or ``huggingface-cli login``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from reasonrl.errors import ReasonRLError
from reasonrl.training.record.checkpoint import STATE_FILE, LinkedCheckpointsError, find_checkpoint, latest_checkpoint

FINAL_DIR = "final"
RUN_RECORD = ("config.yaml", "run.json", "summary.json", "metrics.jsonl", "training_curves.png")
NOT_UPLOADED = {"trainer.pt", STATE_FILE}  # optimiser and data-stream state: for resuming, not for sharing
HUB_NAMES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # built-in model specs on the Hub


class PushError(ReasonRLError, ValueError):
    """A run or checkpoint that cannot be pushed, or a push that failed, with what to do about it."""


def model_directory(run_dir: Path, checkpoint: str | None = None) -> Path:
    """The model to push: ``final/``, or with ``checkpoint`` (``latest``, ``step-000010`` or ``10``)
    that checkpoint of the run."""
    if not (run_dir / "config.yaml").is_file():
        raise PushError(f"{run_dir} is not a reasonrl run directory (no config.yaml)")
    if checkpoint is None:
        final = run_dir / FINAL_DIR
        if not (final / "config.json").is_file():
            raise PushError(
                f"{run_dir} has no trained model in {FINAL_DIR}/ yet; push a checkpoint with --checkpoint latest"
            )
        return final
    name = f"step-{int(checkpoint):06d}" if checkpoint.isdigit() else checkpoint
    try:
        found = latest_checkpoint(run_dir) if name == "latest" else find_checkpoint(run_dir, name)
    except LinkedCheckpointsError as exc:
        raise PushError(str(exc)) from None
    if found is None:
        raise PushError(f"{run_dir} has no complete checkpoint {checkpoint!r} (see {run_dir / 'checkpoints'})")
    if not (found / "config.json").is_file():
        raise PushError(f"{found} holds no config.json: it was written before checkpoints were Hugging Face models")
    return found


def upload_files(run_dir: Path, model_dir: Path) -> dict[str, Path]:
    """``path in the repository -> local file`` of everything a push uploads (the card aside): regular files of
    the run directory only, reached through no symbolic link (PushError names a link)."""
    skipped = {*NOT_UPLOADED, "README.md"}
    from reasonrl.models.lora import ADAPTER_DIR  # a LoRA run's adapter, beside the merged model

    files = {p.name: p for p in _own_files(run_dir, model_dir) if p.name not in skipped}
    adapter = model_dir / ADAPTER_DIR
    if adapter.is_dir():
        files.update({f"{ADAPTER_DIR}/{p.name}": p for p in _own_files(run_dir, adapter)})
    files.update({f"reasonrl/{name}": _refuse_link(run_dir, run_dir / name) for name in RUN_RECORD})
    return {name: path for name, path in files.items() if path.is_file()}


def _own_files(run_dir: Path, folder: Path) -> list[Path]:
    """The entries of ``folder`` (in ``run_dir``), refusing a link among them or on the way to ``folder``."""
    _refuse_link(run_dir, folder)
    return [_refuse_link(run_dir, path) for path in sorted(folder.iterdir())]


def _refuse_link(run_dir: Path, path: Path) -> Path:
    """``path`` (in ``run_dir``) unless it, or a directory between ``run_dir`` and it, is a symbolic link: then a
    PushError naming the link (a push publishes the run's own files, not what a link points to)."""
    inside = path.relative_to(run_dir)
    for part in (*reversed(inside.parents[:-1]), inside):
        link = run_dir / part
        if link.is_symlink():
            raise PushError(
                f"{link} is a symbolic link (to {os.readlink(link)}); a push publishes only the run's own files and "
                "follows no link: replace it with the file itself, or remove it"
            )
    return path


def refuse_non_finite_weights(files: dict[str, Path]) -> None:
    """A PushError naming the first weight that is NaN or infinite in the safetensors files of ``files``: a model
    with such weights computes nothing and is never published (a run stops before it saves one)."""
    import torch
    from safetensors import safe_open

    for name, path in files.items():
        if not name.endswith(".safetensors"):
            continue
        with safe_open(str(path), framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open has no iterator)
                tensor = weights.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise PushError(f"{path}: the weight {key} holds NaN or infinity; such a model is not published")


LOCAL_PATH = re.compile(r"(?<![\w.:/~-])~?/[^\s'\",;:()\[\]{}<>|*`]+")
"""An absolute (or home-relative) local path inside text: a path component after a separator, not a URL's
``//host``, a metric key (``reward/mean``) or a fraction."""
TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".jinja")


def without_local_paths(text: str, run_dir: Path) -> str:
    """``text`` with no local absolute path: a path inside the run directory becomes relative to it, any
    other keeps only its file name (a dataset, a model, a reward-function file: the name says which)."""
    root = run_dir.resolve()

    def relative(match: re.Match) -> str:
        found = Path(match.group(0)).expanduser()
        try:
            return str(found.resolve().relative_to(root))
        except ValueError:
            return found.name or "."

    return LOCAL_PATH.sub(relative, text)


def upload_content(local: Path, run_dir: Path) -> bytes | str:
    """What is uploaded for a local file: a text file's bytes without local paths, any other file as it is."""
    if local.suffix in TEXT_SUFFIXES:
        return without_local_paths(local.read_text(encoding="utf-8", errors="replace"), run_dir).encode()
    return str(local)


def _hub_id(spec: str | None) -> str | None:
    """A model or dataset spec as a Hub id, when it is one (``owner/name``, not a local path)."""
    if not spec:
        return None
    spec = HUB_NAMES.get(spec, spec).partition(":")[0]
    looks_like_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    return spec if looks_like_id and not Path(spec).exists() else None


def _results(run_dir: Path, model_dir: Path) -> dict[str, Any]:
    """The run's summary, or for a checkpoint of an unfinished run, what its state and metrics say."""
    summary_path = run_dir / "summary.json"
    if model_dir.name == FINAL_DIR and summary_path.is_file():
        return json.loads(summary_path.read_text())
    state = json.loads((model_dir / STATE_FILE).read_text()) if (model_dir / STATE_FILE).is_file() else {}
    from reasonrl.training.record.metrics import read_metrics

    step = state.get("step")
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r and r["step"] <= (step or 0)]
    after = evals[-1]["eval/accuracy"] if evals and evals[-1]["step"] > 0 else None
    return {"steps": step, "accuracy_before": state.get("accuracy_before"), "accuracy_after": after}


def _reward_line(reward: dict[str, Any]) -> str:
    functions = reward.get("functions") or []
    if not functions:
        return "the built-in verifiers (math answers; code tests in a sandbox), routed per task"
    weights = reward.get("weights") or [1.0] * len(functions)
    return "the weighted sum of " + ", ".join(f"`{f}` × {w:g}" for f, w in zip(functions, weights, strict=False))


def _percent(value: Any) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, int | float) else "n/a"


def _results_table(results: dict[str, Any], held_out: Any, configured: Any) -> list[str]:
    """The card's greedy accuracy before and after training, over the held-out prompts the run evaluated (a
    checkpoint of an unfinished run: the ``configured`` data.eval_prompts), and what it counts; a line saying so
    where it evaluated none."""
    prompts = results.get("eval_prompts", configured)
    if prompts == 0:
        return ["The run evaluated no held-out prompt: no accuracy was measured."]
    meaning = f" (accuracy = {results['accuracy_means']})" if results.get("accuracy_means") else ""
    return [
        f"Greedy accuracy on {prompts or 'the'} held-out prompts of `{held_out}`{meaning}:",
        "",
        "| before training | after training |",
        "|---|---|",
        f"| {_percent(results.get('accuracy_before'))} | {_percent(results.get('accuracy_after'))} |",
    ]


def model_card(run_dir: Path, model_dir: Path, repo_id: str) -> str:
    """The README.md of a pushed model: metadata, what it was trained from and on, results, the config."""
    from reasonrl.config import list_presets

    config_text = (run_dir / "config.yaml").read_text()
    config = yaml.safe_load(config_text) or {}
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
    preset = run.get("preset", "custom")
    papers = {p.name: p.paper for p in list_presets()}
    model_spec = config.get("model", {}).get("name_or_path")
    data = config.get("data", {})
    base, dataset = _hub_id(model_spec), _hub_id(data.get("dataset"))
    results = _results(run_dir, model_dir)
    metadata: dict[str, Any] = {"library_name": "transformers", "pipeline_tag": "text-generation"}
    if base:
        metadata["base_model"] = base
    if dataset:
        metadata["datasets"] = [dataset]
    metadata["tags"] = ["reasonrl", "reinforcement-learning", preset]
    which = "the final policy" if model_dir.name == FINAL_DIR else f"the checkpoint `{model_dir.name}`"
    held_out = data.get("eval_dataset") or data.get("dataset")
    lines = [
        "---",
        yaml.safe_dump(metadata, sort_keys=False).strip(),
        "---",
        "",
        f"# {repo_id.rsplit('/', 1)[-1]}",
        "",
        f"`{model_spec}` trained by reinforcement learning with reasonrl, preset `{preset}`"
        + (f" ({papers[preset]})" if preset in papers else "")
        + f"; this is {which}.",
        "",
        "## Training",
        "",
        f"- base model: `{model_spec}`" + (f" ([{base}](https://huggingface.co/{base}))" if base else ""),
        f"- data: `{data.get('dataset')}`" + (f", held out: `{held_out}`" if data.get("eval_dataset") else ""),
        f"- preset: `{preset}`" + (f", overrides: `{' '.join(run['overrides'])}`" if run.get("overrides") else ""),
        f"- reward: {_reward_line(config.get('reward', {}))}",
        f"- rollout steps: {results.get('steps', 'n/a')}",
        "",
        "## Results",
        "",
        *_results_table(results, held_out, data.get("eval_prompts")),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
        "```",
        "",
        "## Configuration",
        "",
        "The run's full configuration (`reasonrl/config.yaml`; metrics in `reasonrl/metrics.jsonl`):",
        "",
        "```yaml",
        config_text.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def push_run(
    run_dir: Path, repo_id: str, *, checkpoint: str | None = None, private: bool = False, dry_run: bool = False
) -> dict[str, Any]:
    """Create ``repo_id`` if needed and upload the run's model, card and record in one commit.

    Returns what was (or, with ``dry_run``, would be) uploaded; nothing touches the network on a dry run.
    """
    model_dir = model_directory(run_dir, checkpoint)
    files = upload_files(run_dir, model_dir)
    refuse_non_finite_weights(files)
    card = without_local_paths(model_card(run_dir, model_dir, repo_id), run_dir)
    report: dict[str, Any] = {"repo": repo_id, "model": str(model_dir), "files": ["README.md", *files]}
    if dry_run:
        return {**report, "model_card": card}
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi()
    operations = [CommitOperationAdd("README.md", card.encode())]
    operations += [CommitOperationAdd(path, upload_content(local, run_dir)) for path, local in files.items()]
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.create_commit(
            repo_id, operations, commit_message=f"reasonrl: {model_dir.name} of run {run_dir.name}", repo_type="model"
        )
    except Exception as exc:  # the hub raises many types: no token, no network, no permission
        raise PushError(f"could not push to {repo_id}: {type(exc).__name__}: {exc}") from exc
    return {**report, "url": str(url)}
