"""Files from others load without running their code.

A run directory, a checkpoint or a model may come from someone else (a shared file system, a download),
and Python's pickle runs whatever a file tells it to.  So every file reasonrl reads back is read in a form
that cannot run code:
  - ``.pt`` files (a checkpoint's ``trainer.pt``, the offline reference cache) through torch's weights-only
    unpickler: tensors, numbers, strings, lists, tuples, dicts.  A file that needs more is refused with
    ``UnsafeFileError`` naming it.  The one thing older reasonrl checkpoints held beyond that, NumPy's RNG
    state array, is admitted by its three constructors (no code runs to build an array);
  - a data-parallel checkpoint's ``torch.distributed.checkpoint`` files: DCP unpickles its ``.metadata``
    with plain pickle and the non-tensor items with ``weights_only=False``; ``safe_dcp_load`` reads the
    metadata through an allowlist of DCP's own record classes and the items weights-only;
  - model weights from safetensors only: a directory or hub id with only pickled weights
    (``pytorch_model.bin``) is refused unless the user names it in ``$REASONRL_TRUST_PICKLE``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

from reasonrl.models.model_error import ModelError

TRUST_PICKLE_ENV = "REASONRL_TRUST_PICKLE"
"""Model specs (``os.pathsep``-separated) whose pickled weights the user accepts by name."""


class UnsafeFileError(ModelError):
    """A file that loads only by running code it carries (pickled objects), refused, with why and what to do."""


def _legacy_numpy_globals() -> list[Any]:
    """What NumPy's RNG state array (in checkpoints written before 2026-11-26) pickles as: array constructors."""
    import numpy as np

    return [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_tensor_file(path: Path) -> Any:
    """A ``.pt`` file's tensors, numbers, strings and containers, read weights-only onto the CPU; a file
    that holds anything else (code, arbitrary objects) raises UnsafeFileError naming it."""
    import torch

    try:
        with torch.serialization.safe_globals(_legacy_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"WeightsUnpickler error:\s*(Unsupported global: GLOBAL \S+|[^\n]+)", str(exc))
        reason = found.group(1).strip().rstrip(".") if found else "it holds pickled objects"
        raise UnsafeFileError(
            f"refusing to load {path}: it holds objects that only a full unpickler rebuilds, and unpickling runs "
            f"code the file chooses ({reason[:160]}); reasonrl writes only tensors, numbers, strings, lists and "
            "dicts, so this file was not written by this version of reasonrl: remove it or start a new run"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:  # a truncated or foreign file
        detail = " ".join(str(exc).split())[:160]
        raise ModelError(f"{path} is damaged or not a torch file ({type(exc).__name__}: {detail})") from None


# --- torch.distributed.checkpoint ------------------------------------------------------------------------
_DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
}
"""What a DCP ``.metadata`` file is made of: DCP's record dataclasses, sizes, layouts, dtypes, paths."""


class _DCPMetadataUnpickler(pickle.Unpickler):
    """Plain pickle restricted to DCP's metadata records (and torch dtypes): anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def _safe_dcp_classes():
    """A DCP storage reader and load planner that read nothing as code (built lazily: torch.distributed)."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            metadata = read_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                with torch.serialization.safe_globals(_legacy_numpy_globals()):
                    loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError:
                raise UnsafeFileError(
                    f"refusing to load the checkpoint item {read_item.dest_index.fqn}: it holds pickled objects"
                ) from None
            super().load_bytes(read_item, _saved(loaded))

    return SafeReader, SafePlanner


def read_dcp_metadata(path: Path) -> Any:
    """A DCP ``.metadata`` file read through the allowlist of its record classes; UnsafeFileError otherwise."""
    try:
        with open(path, "rb") as handle:
            metadata = _DCPMetadataUnpickler(handle).load()
        shards = [info.relative_path for info in (metadata.storage_data or {}).values()]
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
        raise UnsafeFileError(
            f"refusing to load {path}: not a torch.distributed.checkpoint metadata file ({exc})"
        ) from None
    if any(not isinstance(name, str) or Path(name).name != name for name in shards):
        raise UnsafeFileError(f"refusing to load {path}: it names shard files outside its directory")
    return metadata


def _saved(value: Any) -> io.BytesIO:
    """``value`` serialised again, for the parent planner's own read (it only holds plain data now)."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def safe_dcp_load(state: dict[str, Any], directory: Path) -> None:
    """``torch.distributed.checkpoint.load(state, checkpoint_id=directory)`` without unpickling code."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_dcp_metadata(directory / ".metadata")  # a refusal as itself, not inside DCP's CheckpointException
    reader, planner = _safe_dcp_classes()
    try:
        dcp.load(state, storage_reader=reader(directory), planner=planner())
    except CheckpointException as exc:  # every rank's failure, wrapped: a refusal among them is the error
        refused = [e for e, _ in exc.failures.values() if isinstance(e, UnsafeFileError)]
        if refused:
            raise refused[0] from None
        raise


# --- model weights ---------------------------------------------------------------------------------------
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def trusted_pickle(spec: str) -> bool:
    """Whether the user named ``spec`` in ``$REASONRL_TRUST_PICKLE`` (paths compared resolved)."""
    named = [s for s in os.environ.get(TRUST_PICKLE_ENV, "").split(os.pathsep) if s]

    def same(a: str, b: str) -> bool:
        return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())

    return any(same(spec, s) for s in named)


def check_safetensors(location: str, spec: str) -> dict[str, bool]:
    """``from_pretrained`` options that load only safetensors weights, unless the user trusts ``spec``'s pickled
    weights by name.  A local directory that holds only pickled weights is refused here, with the fix."""
    if trusted_pickle(spec) or trusted_pickle(location):
        return {}
    path = Path(location)
    if path.is_dir() and not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in path.glob(pattern))
        if pickled:
            raise UnsafeFileError(
                f"refusing to load {path}: its weights are pickled ({', '.join(pickled[:3])}), and loading a pickle "
                "runs code the file chooses; convert them to safetensors, or if you trust this model set "
                f"{TRUST_PICKLE_ENV}={spec}"
            )
    return {"use_safetensors": True}
