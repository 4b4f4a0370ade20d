"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` holding the policy as a Hugging Face
directory (weights in safetensors, ``config.json``, the generation config and the tokenizer, so
``AutoModelForCausalLM.from_pretrained`` loads it), the critic (``critic/``, a ``ValueModel``
directory, when there is one), optimiser + scheduler + RNG states (``trainer.pt``) and
``state.json`` (step, data position, KL coefficient, ...).  It is assembled in
``step-NNNNNN.tmp`` and renamed into place, then ``checkpoints/latest`` is replaced atomically: a
run killed mid-checkpoint leaves the previous checkpoint intact and a ``.tmp`` directory that the
next start removes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_model

from reasonrl.models.value import HEAD_FILE, ValueModel

STATE_FILE = "state.json"  # written last: its presence marks a complete checkpoint
CRITIC_DIR = "critic"


def _checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep: int,
    critic: tuple[ValueModel, torch.optim.Optimizer] | None = None,
    tokenizer: Any = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and keep only the ``keep`` most recent ones."""
    root = _checkpoint_dir(run_dir)
    target = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})  # what from_pretrained expects
    save_pretrained_files(model, tokenizer, tmp)
    trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()}
    if critic is not None:
        critic[0].save(tmp / CRITIC_DIR)
        trainer["critic_optimizer"] = critic[1].state_dict()
    torch.save(trainer, tmp / "trainer.pt")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(target.name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def save_pretrained_files(model: torch.nn.Module, tokenizer: Any, directory: Path) -> None:
    """Beside the weights, what makes a directory a Hugging Face model: its config, generation config
    and tokenizer (each when the model or tokenizer has one)."""
    for part in (getattr(model, "config", None), getattr(model, "generation_config", None), tokenizer):
        if part is not None and hasattr(part, "save_pretrained"):
            part.save_pretrained(directory)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (stale ``.tmp`` leftovers are removed), or None."""
    root = _checkpoint_dir(run_dir)
    if not root.is_dir():
        return None
    for stale in root.glob("*.tmp"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    pointer = root / "latest"
    if pointer.exists() and (root / pointer.read_text().strip() / STATE_FILE).exists():
        return root / pointer.read_text().strip()
    complete = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).exists())
    return complete[-1] if complete else None


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    critic: tuple[ValueModel, torch.optim.Optimizer] | None = None,
) -> dict[str, Any]:
    """Restore weights, optimiser, scheduler and RNG states; returns the saved ``state.json``."""
    load_model(model, str(path / "model.safetensors"))
    trainer = torch.load(path / "trainer.pt", weights_only=False)
    if critic is not None:
        load_value_weights(critic[0], path / CRITIC_DIR)
        critic[1].load_state_dict(trainer["critic_optimizer"])
    optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return json.loads((path / STATE_FILE).read_text())


def load_value_weights(value_model: ValueModel, directory: Path) -> None:
    """Load a saved ``ValueModel`` directory's weights into an existing critic (in place)."""
    value_model.backbone.load_state_dict(load_file(directory / "model.safetensors"))
    value_model.head.load_state_dict(load_file(directory / HEAD_FILE))
