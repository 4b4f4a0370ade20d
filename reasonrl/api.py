"""``reasonrl.train(...)``: a run from a script or a notebook, the way TRL's trainers are driven.

A thin layer over ``reasonrl train``'s own path: the preset and the settings go through the same config
loader as the command line's ``key=value`` overrides (the same checks, the same errors), the run goes
through the same ``fit``, and every Python object given becomes settings a run directory records:

- ``model``: a name or path is ``model.name_or_path``; a transformers model object is saved (safetensors,
  with its tokenizer) to ``<run_dir>/initial_model``, which the run loads, as its reference model does and as
  a resumed run does again;
- ``dataset`` / ``eval_dataset``: a name or path is ``data.dataset`` / ``data.eval_dataset``; rows (a list of
  dicts, a ``datasets.Dataset``) are checked by the data layer and written to ``<run_dir>/dataset.jsonl`` /
  ``eval_dataset.jsonl``, which the run reads like any file;
- ``reward_funcs``: a function is ``reward.functions``' ``module:function`` (``__main__:function`` for one
  of the running script), which the scoring workers (other processes) import by name, as they do the
  command line's;
- ``environment``: a class (an ``Environment``, or a TRL ``environment_factory`` class) is
  ``rollout.environment``'s ``module:Class``, named as a reward function is; a name is kept; either way with
  ``rollout.multiturn=env``;
- ``callbacks``: each gets every record of ``metrics.jsonl`` as it is written.

A directory that holds a run continues it, as ``fit`` does: the inputs given again must be the ones it
recorded (the rows, the model's weights), else the call refuses, naming what differs.  A directory that is
not empty and holds no run is refused before anything is written there (``reasonrl.training.record.rundir``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config import Config, ConfigError, load_config
from reasonrl.data.loaders import DataError, Fields, examples_from_rows
from reasonrl.data.source import check_sources
from reasonrl.rollout.multiturn.environments import given_environment
from reasonrl.train_command import DEFAULT_PRESET, new_run_dir
from reasonrl.training.loop import fit
from reasonrl.training.record.rundir import SCRIPT_MODULE, RunDirError, has_progress, make_run_dir, override
from reasonrl.training.record.trackers import MAIN_STREAM
from reasonrl.training.run_inputs import data_spec

log = logging.getLogger(__name__)

DATASET_FILES = {"dataset": "dataset.jsonl", "eval_dataset": "eval_dataset.jsonl"}
INITIAL_MODEL = "initial_model"
MODEL_FINGERPRINT = "reasonrl-fingerprint.txt"
"""In ``initial_model/``: the SHA-256 of the saved weights, which a resumed run's model object must match."""

ARGUMENT_SETTINGS = {
    "model": "model.name_or_path",
    "dataset": "data.dataset",
    "eval_dataset": "data.eval_dataset",
    "reward_funcs": "reward.functions",
    "environment": "rollout.environment",
}
"""The setting each argument gives (one or the other, never both)."""

TRL_NAMES = {
    "environment_factory": "environment=",
    "train_dataset": "dataset=",
    "processing_class": "tokenizer=",
    "reward_weights": "settings={'reward.weights': [...]}",
    "args": "settings= (dotted keys, e.g. {'train.lr': 1e-6}) or **{'train.lr': 1e-6}",
}
"""GRPOTrainer's argument names a TRL user may pass, and what reasonrl.train takes instead."""

MetricsCallback = Callable[[dict[str, Any]], object]


@dataclass(frozen=True)
class TrainResult:
    """What a run returns."""

    summary: dict[str, Any]
    """``fit``'s summary (also in ``summary.json``): accuracy before and after, steps, wall time, the plot, ..."""
    run_dir: Path
    """The run directory: metrics, checkpoints, the final model (``final/``)."""


def train(
    preset: str = DEFAULT_PRESET,
    *,
    model: Any = None,
    tokenizer: Any = None,
    dataset: Any = None,
    eval_dataset: Any = None,
    reward_funcs: Any = None,
    environment: Any = None,
    run_dir: str | os.PathLike | None = None,
    callbacks: MetricsCallback | Iterable[MetricsCallback] = (),
    settings: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    **dotted_settings: Any,
) -> TrainResult:
    """Train ``preset`` (a run preset's name or a YAML file) with these inputs and settings; see the module
    docstring and docs/python-api.md.

    ``settings`` and ``**dotted_settings`` are dotted keys (``{"train.rollout_steps": 2}``), checked as the
    command line's overrides.  ``tokenizer`` goes with a model object (default: the tokenizer of the model's
    ``name_or_path``).  ``run_dir`` defaults to ``run.output_dir/run.name`` as for ``reasonrl train``; a
    directory that holds a run continues it (``train.rollout_steps`` higher: it trains longer), one that holds
    other files is refused.  ``progress`` as ``fit``'s ``show_progress``.  A callback that raises is logged, with
    its traceback, the first time; the run goes on.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test of this
        raise RuntimeError(
            "reasonrl.train() was called in a worker process that re-ran your script: guard the script's entry "
            'point with `if __name__ == "__main__":`, as any multiprocessing code'
        )
    trl_named = [
        f"{name}= is TRL's name; reasonrl.train takes {ours}"
        for name, ours in TRL_NAMES.items()
        if name in dotted_settings
    ]
    if trl_named:
        raise ConfigError("; ".join(trl_named))
    chosen = {**(settings or {}), **dotted_settings}
    given = {
        "model": model,
        "dataset": dataset,
        "eval_dataset": eval_dataset,
        "reward_funcs": reward_funcs,
        "environment": environment,
    }
    cfg = _settings_alone(preset, chosen, given)
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(cfg, preset)
    named = {**_model_name(model, tokenizer), **_reward_names(reward_funcs), **_environment_name(environment)}
    fields = data_spec(cfg).fields
    if named.get("rollout.multiturn") == "env":  # an environment run's rows need no answer (data_spec's rule)
        fields = dataclasses.replace(fields, answer_optional=True)
    rows = {name: _jsonl(name, value, fields) for name, value in given.items() if name in DATASET_FILES}
    callbacks = [callbacks] if callable(callbacks) else list(callbacks)
    created = make_run_dir(run_dir)  # refuses a directory of other files before anything is written there
    try:
        inputs = {**named, **_written_inputs(run_dir, model, tokenizer, rows)}
        cfg = load_config(preset, {**chosen, **inputs})
        check_sources(data_spec(cfg))
        overrides = tuple(override(key, value) for key, value in {**chosen, **inputs}.items())
        observers = [MetricsCallbacks(callbacks)] if callbacks else []
        summary = fit(
            cfg, run_dir, preset=Path(preset).stem, overrides=overrides, show_progress=progress, trackers=observers
        )
    except Exception:
        if created and not has_progress(run_dir):  # as fit does with a directory it made: nothing is kept
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return TrainResult(summary, run_dir)


def _settings_alone(preset: str, chosen: Mapping[str, Any], given: Mapping[str, Any]) -> Config:
    """The config of the preset and the settings chosen, checked before anything is written: a bad setting
    fails here with the config loader's error, as does a setting that an argument also gives."""
    twice = [f"{arg}= and {key}" for arg, key in ARGUMENT_SETTINGS.items() if key in chosen and given[arg] is not None]
    if twice:
        raise ConfigError(f"{'; '.join(twice)} name the same thing; give each once")
    if given["environment"] is not None and "rollout.multiturn" in chosen:
        raise ConfigError("environment= sets rollout.multiturn=env; leave rollout.multiturn out")
    cfg = load_config(preset, chosen)
    if cfg.dist.backend == "ray":
        raise ConfigError(
            "reasonrl.train() trains in this process (or under torchrun); for dist.backend=ray run `reasonrl train` "
            "with the same settings"
        )
    return cfg


# --- the inputs as settings ----------------------------------------------------------------------
# Each Python object a run takes becomes settings here: named where another process can import it, written
# into the run directory where it must outlive this process.


def _model_name(model: Any, tokenizer: Any) -> dict[str, str]:
    """``model.name_or_path`` of a model given by name or path ({} for an object, which is written)."""
    if model is not None and _is_model_object(model):
        return {}
    if tokenizer is not None:
        raise ConfigError("tokenizer= goes with a model object; a model name or path brings its own tokenizer")
    return {} if model is None else {"model.name_or_path": os.fspath(model)}


def _is_model_object(model: Any) -> bool:
    if isinstance(model, str | os.PathLike):
        return False
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(
            f"model= takes a model name or path, or a transformers model object, not a {type(model).__name__}"
        )
    return True


def _reward_names(reward_funcs: Any) -> dict[str, list[str]]:
    """``reward.functions`` of the functions given (one, or a list): names kept, functions named."""
    if reward_funcs is None:
        return {}
    functions = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
    return {"reward.functions": [f if isinstance(f, str) else importable_name(f, "reward function") for f in functions]}


def _environment_name(environment: Any) -> dict[str, str]:
    """``rollout.environment`` of the environment given, with ``rollout.multiturn=env``: a name kept; a class or a
    function named as another process imports it; any other zero-argument callable (TRL's ``environment_factory``
    may be a ``functools.partial``) held by this process (``given_environment``).  It is loaded and checked when
    the run starts, before any model, as the command line's."""
    if environment is None:
        return {}
    if not isinstance(environment, str) and not callable(environment):
        raise ConfigError(
            "environment= takes an environment class (an Environment subclass or a TRL environment_factory class), "
            "a function or functools.partial that makes one, or its name ('countdown', 'module:Class', "
            f"'file.py:Class'), not a {type(environment).__name__}"
        )
    if isinstance(environment, str):
        name = environment
    else:
        try:
            name = importable_name(environment, "environment")
        except ConfigError:  # a partial, a callable object: this process holds it
            name = given_environment(environment)
    return {"rollout.environment": name, "rollout.multiturn": "env"}


def importable_name(obj: Any, kind: str) -> str:
    """``module:qualname`` of a function or class that another process can import (``__main__:name`` for one
    of the running script, which a spawned process runs again as its ``__main__``); ConfigError says why an
    object cannot be named that way and what to do (``kind``: "reward function", ...)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    shown = getattr(obj, "__name__", None) or repr(obj)
    if not module or not qualname:
        raise ConfigError(
            f"{kind} {shown} is not a function or a class; give one defined at the top level of a module or "
            "script, or its 'module:function' name"
        )
    if "<" in qualname:  # <lambda>, <locals>
        raise ConfigError(
            f"{kind} {qualname} is a lambda or is defined inside a function; its workers are other processes, which "
            "find it by its module and name: define it at the top level of a module or script"
        )
    if module == SCRIPT_MODULE and not getattr(sys.modules[SCRIPT_MODULE], "__file__", None):
        raise ConfigError(
            f"{kind} {qualname} is defined in a notebook or an interactive session, where its workers (other "
            f"processes) cannot find it: write it to a .py file (in a notebook: %%writefile rewards.py) and import "
            f"it from there, or give its name, 'rewards.py:{qualname}'"
        )
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise ConfigError(
            f"{kind} {shown} is not what {module}:{qualname} names (a method, or an object made by a decorator "
            "or functools.partial); give a function defined at the top level of a module or script"
        )
    return f"{module}:{qualname}"


def _jsonl(name: str, dataset: Any, fields: Fields) -> str | None:
    """The rows of a dataset given as data (a list of dicts, a ``datasets.Dataset``) as JSON lines, checked by
    the data layer as a file's rows are; None for one given by name or path (a setting)."""
    if dataset is None or isinstance(dataset, str | os.PathLike):
        return None
    datasets = sys.modules.get("datasets")  # only a caller who has it can pass its tables
    if datasets is not None and isinstance(dataset, datasets.DatasetDict):
        raise DataError(f"{name} is a DatasetDict of splits ({', '.join(dataset)}); give one, e.g. {name}['train']")
    if datasets is not None and isinstance(dataset, datasets.Dataset):
        rows = dataset.to_list()
    elif isinstance(dataset, Sequence):
        rows = list(dataset)
    else:
        raise DataError(
            f"{name}= takes a list of dicts, a datasets.Dataset, or a dataset name or path, not a "
            f"{type(dataset).__name__}"
        )
    examples_from_rows(name, rows, fields)
    lines = []
    for index, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        except (TypeError, ValueError) as exc:
            raise DataError(f"{name}[{index}]: {exc}; a row holds strings, numbers, lists and dicts") from None
    return "".join(lines)


def _written_inputs(run_dir: Path, model: Any, tokenizer: Any, rows: Mapping[str, str | None]) -> dict[str, str]:
    """The settings of the inputs kept in ``run_dir``: the rows and a model object, written there (or, in a
    directory that holds them already, checked to be the same)."""
    written = {}
    for name, text in rows.items():
        if text is not None:
            _keep(run_dir, DATASET_FILES[name], text.encode(), f"the {name} given")
            written[ARGUMENT_SETTINGS[name]] = str((run_dir / DATASET_FILES[name]).resolve())
    if model is not None and _is_model_object(model):
        _save_model(model, tokenizer, run_dir)
        written["model.name_or_path"] = str((run_dir / INITIAL_MODEL).resolve())
    return written


def _keep(run_dir: Path, name: str, content: bytes, what: str) -> None:
    """Write ``content`` to ``run_dir/name`` (atomically), or check that the run's copy there is the same."""
    path = run_dir / name
    if path.exists():
        if path.read_bytes() != content:
            raise RunDirError(
                f"{run_dir} holds a run of other inputs: its {name.split('/')[0]} is not {what}. A run directory "
                f"keeps its inputs; to train on these, start a new run (another run_dir) or remove {run_dir}"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def _save_model(model: Any, tokenizer: Any, run_dir: Path) -> None:
    """Save a model object and its tokenizer to ``run_dir/initial_model`` with its weights' fingerprint (once:
    a resumed run's model object must have the same weights)."""
    fingerprint = weights_fingerprint(model)
    directory = run_dir / INITIAL_MODEL
    if directory.exists():
        _keep(run_dir, f"{INITIAL_MODEL}/{MODEL_FINGERPRINT}", fingerprint.encode(), "the model given (other weights)")
        return
    if tokenizer is None:
        from reasonrl.models.load import load_tokenizer

        if not getattr(model, "name_or_path", ""):
            raise ConfigError("the model object has no name_or_path to load its tokenizer from; give tokenizer=")
        tokenizer = load_tokenizer(model.name_or_path)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / MODEL_FINGERPRINT).write_text(fingerprint)
    tmp.rename(directory)


def weights_fingerprint(model: Any) -> str:
    """SHA-256 of a model's weights: every tensor's name, dtype, shape and bytes."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


# --- callbacks -----------------------------------------------------------------------------------


class MetricsCallbacks:
    """The caller's callbacks as a tracker (``reasonrl.training.record.trackers``): each gets every record of the RL
    steps (``{"step": n, **metrics}``, step 0 the evaluation before training; non-finite values left out),
    as it is written to ``metrics.jsonl``, on rank 0.

    A callback watches a run, it does not decide it: one that raises is logged with its traceback the first
    time (later failures at debug level) and the run goes on, so a bug in a plot costs neither the training
    nor a checkpoint (the step's checkpoint is saved after its metrics are written)."""

    def __init__(self, callbacks: Iterable[MetricsCallback]) -> None:
        self.callbacks = list(callbacks)
        self._failed: set[int] = set()

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """Callbacks get the metrics only (the samples are in the run directory's samples.jsonl)."""

    def log(self, stream: str, step: int, metrics: Mapping[str, float]) -> None:
        if stream != MAIN_STREAM:
            return
        for index, callback in enumerate(self.callbacks):
            try:
                callback({"step": step, **metrics})
            except Exception:
                name = getattr(callback, "__qualname__", repr(callback))
                if index in self._failed:
                    log.debug("metrics callback %s raised at step %d", name, step, exc_info=True)
                else:
                    self._failed.add(index)
                    log.warning(
                        "metrics callback %s raised at step %d; the run goes on (its later failures are not logged)",
                        name, step, exc_info=True,
                    )  # fmt: skip

    def close(self) -> None:
        """Nothing to flush."""
