"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a directory ``checkpoints/step-NNNNNN`` holding the policy as a Hugging Face
directory (weights in safetensors, ``config.json``, the generation config and the tokenizer, so
``AutoModelForCausalLM.from_pretrained`` loads it), the critic (``critic/``, a ``ValueModel``
directory, when there is one), optimiser + scheduler + RNG states (``trainer.pt``: tensors, numbers,
strings, lists and dicts only, read back weights-only: a checkpoint from someone else runs no code when a
run resumes it) and ``state.json`` (step, data position, KL coefficient, ...).  With LoRA the policy and critic
directories hold the merged weights plus ``adapter/``, which is what a resumed run loads onto its
frozen base.  It is assembled in
``step-NNNNNN.tmp`` and renamed into place, then ``checkpoints/latest`` is replaced atomically: a
run killed mid-checkpoint leaves the previous checkpoint intact and a ``.tmp`` directory that the
next start removes (``remove_unfinished``, under the run's lock: reading a run, as ``latest_checkpoint``
and ``reasonrl push`` do, removes nothing); a write that fails (a full disk) removes its ``.tmp`` at once.
Nothing here follows a symbolic link: a ``checkpoints`` that is one is refused, and a checkpoint, ``latest``
or ``.tmp`` that is one is no checkpoint (a leftover link is removed, never what it points to).  With
SmolLM2-135M a checkpoint takes about 1.6 GB, ``trainer.pt`` 1.08 GB of it (AdamW's two fp32
moments per weight); each save logs its size.  A run's ``final/`` is its last checkpoint's policy, hard-linked
(``export_model``): the weights are stored once, and the optimiser state stays for a run continued longer.
Files are never rewritten in place (a save or an export builds a new directory), so the two stay apart;
write a changed model elsewhere, not into ``final/`` or a checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file

from reasonrl.config import ConfigError
from reasonrl.models.lora import has_lora, load_lora_adapter, save_lora_model
from reasonrl.models.untrusted import load_tensor_file, safe_dcp_load
from reasonrl.models.value import HEAD_FILE, ValueModel

STATE_FILE = "state.json"  # written last: its presence marks a complete checkpoint
STEP_NAME = re.compile(r"step-\d+")  # a checkpoint's directory name; its .tmp while it is written
CRITIC_DIR = "critic"
NEARLY_FULL_BYTES = 64 * 2**20  # a failed write with less free space than this is a full disk

log = logging.getLogger(__name__)


class LinkedCheckpointsError(ConfigError):
    """A run directory whose ``checkpoints/`` is a symbolic link: nothing is read, written or removed through it."""


def _checkpoint_dir(run_dir: Path) -> Path:
    """The run's ``checkpoints/``, refused when it is a link: a run reads, writes and removes only its own files."""
    root = run_dir / "checkpoints"
    if root.is_symlink():
        raise LinkedCheckpointsError(
            f"{root} is a symbolic link (to {os.readlink(root)}); a run keeps its checkpoints in a directory of its "
            "own and follows no link: move them there or remove the link"
        )
    return root


def _step_dirs(root: Path) -> list[Path]:
    """The checkpoint directories in ``root``, oldest first: ``step-NNNNNN`` directories, no ``.tmp`` nor link."""
    return sorted(p for p in root.iterdir() if STEP_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states, as plain data (numbers, tuples, dicts, tensors) that a weights-only
    load reads back."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured (or the tuple NumPy state of checkpoints written before 2026-11-26)."""
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        key = numpy_state["state"]["key"]
        numpy_state = {**numpy_state, "state": {**numpy_state["state"], "key": key.numpy().astype(np.uint32)}}
    np.random.set_state(numpy_state)
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
    try:
        tmp.mkdir(parents=True)
        if has_lora(model):  # the merged model, and the adapter a resumed run continues from
            save_lora_model(model, tmp)
        else:  # as save_pretrained writes them (a tied LM head once, under the embedding's name), as final/ holds them
            tied = _tied_names(model)
            weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items() if name not in tied}
            save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        save_pretrained_files(model, tokenizer, tmp)
        trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()}
        if critic is not None:
            critic[0].save(tmp / CRITIC_DIR)
            trainer["critic_optimizer"] = critic[1].state_dict()
        torch.save(trainer, tmp / "trainer.pt")
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2))
    except Exception as exc:  # a failed write leaves nothing behind; the previous checkpoint stays
        full = _disk_full(exc, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp)) from exc
        raise
    return _commit(tmp, target, keep)


def _commit(tmp: Path, target: Path, keep: int) -> Path:
    """Rename a complete ``.tmp`` checkpoint into place, point ``latest`` at it, drop the oldest."""
    root = target.parent
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(target.name)
    os.replace(latest_tmp, root / "latest")
    for old in _step_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("saved the checkpoint of step %d: %s (%s)", int(target.name.split("-")[1]), target, _describe_size(target))
    return target


ShardedParts = dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]
"""The FSDP2-sharded modules of a data-parallel run with their optimisers, by name (policy, critic)."""
SHARDS_DIR = "shards"
RESUME_ONLY = {"trainer.pt", STATE_FILE, CRITIC_DIR, SHARDS_DIR}
"""What a checkpoint holds beside its policy's Hugging Face directory: what a resume reads, no model loader."""


def _sharded_state(parts: ShardedParts) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state: dict[str, Any] = {}
    for name, (module, optimizer) in parts.items():
        state[name], state[f"{name}_optimizer"] = get_state_dict(module, optimizer)
    return state


def save_gathered_model(
    module: torch.nn.Module, directory: Path, parallel: Any, tokenizer: Any = None, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """A module sharded by FSDP2 as a Hugging Face directory (``from_pretrained`` loads it): its whole
    weights gathered into rank 0's CPU memory (every rank takes part) and written by rank 0 as
    ``model.safetensors`` (tied weights once), with the config, generation config and tokenizer.
    ``prefix``: the keys to keep, without it (``backbone.`` for a critic's language model).  Returns the
    gathered weights (rank 0; {} on the others)."""
    from reasonrl.training.placement.parallel import full_state_dict

    weights = full_state_dict(module, rank0_only=True)
    if parallel.is_main:
        tied = _tied_names(module)
        kept = {k.removeprefix(prefix): v.contiguous() for k, v in weights.items() if k.startswith(prefix)}
        directory.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v for k, v in kept.items() if prefix + k not in tied},
            str(directory / "model.safetensors"),
            {"format": "pt"},
        )
        save_pretrained_files(module.get_submodule(prefix.rstrip(".")) if prefix else module, tokenizer, directory)
    return weights


def save_gathered_value_model(value_model: ValueModel, directory: Path, parallel: Any) -> None:
    """A critic sharded by FSDP2 in ``ValueModel.save``'s layout (``critic.path`` loads it), written by rank 0."""
    weights = save_gathered_model(value_model, directory, parallel, prefix="backbone.")
    if parallel.is_main:
        head = {k.removeprefix("head."): v.contiguous() for k, v in weights.items() if k.startswith("head.")}
        save_file(head, str(directory / HEAD_FILE))


def _tied_names(module: torch.nn.Module) -> set[str]:
    """The names of parameters that repeat another's (an LM head tied to the embedding)."""
    seen: set[int] = set()
    repeats = set()
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            repeats.add(name)
        seen.add(id(tensor))
    return repeats


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    parts: ShardedParts,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep: int,
    parallel: Any,
    tokenizer: Any = None,
) -> None:
    """A data-parallel checkpoint, every rank taking part: each writes its shards of the weights and
    optimiser states with ``torch.distributed.checkpoint`` into ``shards/`` (what a resume loads); rank 0
    writes the gathered policy as a Hugging Face directory beside them (as a single-process checkpoint
    holds it), ``trainer.pt`` (scheduler, RNG) and ``state.json``, then renames the ``.tmp`` directory
    into place once every rank has finished (atomic, as for one process)."""
    import torch.distributed.checkpoint as dcp

    root = _checkpoint_dir(run_dir)
    target, tmp = root / f"step-{step:06d}", root / f"step-{step:06d}.tmp"
    if parallel.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    parallel.barrier()
    try:
        dcp.save(_sharded_state(parts), checkpoint_id=tmp / SHARDS_DIR)
        save_gathered_model(parts["policy"][0], tmp, parallel, tokenizer, prefix="model.")  # as one process's
        if parallel.is_main:
            torch.save({"scheduler": scheduler.state_dict(), "rng": rng_state()}, tmp / "trainer.pt")
            (tmp / STATE_FILE).write_text(json.dumps({"step": step, "world_size": parallel.world_size, **state}))
    except BaseException as exc:  # nothing half-written stays; a full disk says so
        full = parallel.is_main and _disk_full(exc if isinstance(exc, Exception) else Exception(), root)
        if parallel.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp)) from exc
        raise
    parallel.barrier()
    if parallel.is_main:
        _commit(tmp, target, keep)
    parallel.barrier()


def load_sharded_checkpoint(
    path: Path, parts: ShardedParts, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> dict[str, Any]:
    """Restore what ``save_sharded_checkpoint`` wrote into freshly sharded modules and their optimisers
    (every rank; the same world size, or any other: DCP reshards on load); returns ``state.json``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if not (path / SHARDS_DIR).is_dir():
        raise RuntimeError(f"{path} was written by a single-process run; resume it without torchrun")
    state = _sharded_state(parts)
    safe_dcp_load(state, path / SHARDS_DIR)
    for name, (module, optimizer) in parts.items():
        set_state_dict(module, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optimizer"])
    trainer = load_tensor_file(path / "trainer.pt")
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return json.loads((path / STATE_FILE).read_text())


def _disk_full(exc: Exception, root: Path) -> bool:
    """Whether a failed write ran out of disk: torch and safetensors report it as RuntimeError / their own
    error, not OSError(ENOSPC), so an almost empty file system counts too."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    with contextlib.suppress(OSError):
        return shutil.disk_usage(root).free < NEARLY_FULL_BYTES
    return False


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _bytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


def _describe_size(checkpoint: Path) -> str:
    """e.g. '1.62 GB: trainer.pt 1.08 GB, model.safetensors 540.0 MB' (the two largest parts)."""
    parts = sorted(((_size(p), p.name) for p in checkpoint.iterdir()), reverse=True)
    total = sum(size for size, _ in parts)
    return f"{_bytes(total)}: " + ", ".join(f"{name} {_bytes(size)}" for size, name in parts[:2])


def export_model(checkpoint: Path, directory: Path) -> Path:
    """``directory`` as the policy of ``checkpoint``: its Hugging Face directory (weights, config, tokenizer,
    a LoRA adapter) without what only a resume reads (``RESUME_ONLY``), each file hard-linked (copied where the
    file system has no links), so the weights are stored once; a symbolic link stays a link, never the file it
    points to.  Assembled beside ``directory`` and renamed into place: no file is ever rewritten, so the
    checkpoint keeps its own as they are."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)

    def resume_only(folder: str, names: list[str]) -> set[str]:
        return RESUME_ONLY & set(names) if Path(folder) == checkpoint else set()

    shutil.copytree(checkpoint, tmp, symlinks=True, ignore=resume_only, copy_function=_link_or_copy)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    return directory


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


def save_pretrained_files(model: torch.nn.Module, tokenizer: Any, directory: Path) -> None:
    """Beside the weights, what makes a directory a Hugging Face model: its config, generation config
    and tokenizer (each when the model or tokenizer has one)."""
    for part in (getattr(model, "config", None), getattr(model, "generation_config", None), tokenizer):
        if part is not None and hasattr(part, "save_pretrained"):
            part.save_pretrained(directory)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None: the one ``latest`` names when it names one, else the
    newest.  It only reads (a live run's checkpoint being written stays as it is)."""
    root = _checkpoint_dir(run_dir)
    if not root.is_dir():
        return None
    complete = [p for p in _step_dirs(root) if (p / STATE_FILE).is_file()]
    pointer = root / "latest"
    named = pointer.read_text().strip() if pointer.is_file() and not pointer.is_symlink() else None
    return next((p for p in complete if p.name == named), complete[-1] if complete else None)


def find_checkpoint(run_dir: Path, name: str) -> Path | None:
    """The complete checkpoint ``name`` (``step-NNNNNN``) of a run, or None (no such name, or not complete)."""
    path = _checkpoint_dir(run_dir) / name
    complete = STEP_NAME.fullmatch(name) and path.is_dir() and not path.is_symlink() and (path / STATE_FILE).is_file()
    return path if complete else None


def remove_unfinished(run_dir: Path) -> None:
    """Remove what a run killed mid-checkpoint left in ``checkpoints/`` (``*.tmp``); a link is removed itself,
    never what it points to.  Only a run holding the directory's lock calls it."""
    root = _checkpoint_dir(run_dir)
    if not root.is_dir():
        return
    for stale in root.glob("*.tmp"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)  # which removes links inside, never their targets
        else:
            stale.unlink(missing_ok=True)


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    critic: tuple[ValueModel, torch.optim.Optimizer] | None = None,
) -> dict[str, Any]:
    """Restore weights, optimiser, scheduler and RNG states; returns the saved ``state.json``."""
    if (path / SHARDS_DIR).is_dir():
        raise RuntimeError(f"{path} was written by a data-parallel run; resume it under torchrun")
    if has_lora(model):  # the frozen base is the one the run loaded; only the adapter trained
        load_lora_adapter(model, path)
    else:
        load_model(model, str(path / "model.safetensors"))
    trainer = load_tensor_file(path / "trainer.pt")
    if critic is not None:
        load_value_weights(critic[0], path / CRITIC_DIR)
        critic[1].load_state_dict(trainer["critic_optimizer"])
    optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return json.loads((path / STATE_FILE).read_text())


def load_value_weights(value_model: ValueModel, directory: Path) -> None:
    """Load a saved ``ValueModel`` directory's weights into an existing critic (in place)."""
    if has_lora(value_model.backbone):
        load_lora_adapter(value_model.backbone, directory)
    else:
        value_model.backbone.load_state_dict(load_file(directory / "model.safetensors"))
    value_model.head.load_state_dict(load_file(directory / HEAD_FILE))
