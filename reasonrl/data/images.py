"""A data row's images: the ``images`` column of a prompt file or a `datasets` table, decoded once at load.

Each entry may be a path (absolute, or relative to the data file's folder), a ``data:image/...;base64,``
URI or bare base64, a ``{"bytes": ...}`` / ``{"path": ...}`` record (how Parquet and `datasets` store an
image), or a PIL image.  One string is one image.  An image that is missing, corrupt or of another kind is
an error naming the row (file and line) and the image's position in it.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

IMAGES_FIELD = "images"
MAX_IMAGE_PIXELS = 4096 * 4096  # larger images (or decompression bombs) are refused, not decoded
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # never a format that runs an external program (EPS)


class ImageError(ValueError):
    """An image of a data row that cannot be read."""


def row_images(value: Any, location: str, base_dir: Path | None) -> tuple[Any, ...]:
    """The PIL images (RGB) of one row's ``images`` value."""
    entries = value if isinstance(value, list | tuple) else [value]
    count = len(entries)
    return tuple(_image(entry, f"{location}: image {i + 1} of {count}", base_dir) for i, entry in enumerate(entries))


def _image(entry: Any, where: str, base_dir: Path | None):
    from PIL import Image, UnidentifiedImageError

    if isinstance(entry, Image.Image):
        return entry.convert("RGB")
    if isinstance(entry, dict) and (entry.get("bytes") or entry.get("path")):
        entry = entry["bytes"] if entry.get("bytes") else entry["path"]
    if isinstance(entry, bytes):
        data, what = entry, "bytes"
    elif isinstance(entry, str):
        data, what = _string_data(entry, where, base_dir)
    else:
        raise ImageError(f"{where} is a {type(entry).__name__}; give a path, a base64 string or image bytes")
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                size = f"{width} x {height} pixels, over the {MAX_IMAGE_PIXELS:,} allowed"
                raise ImageError(f"{where} ({what}) is {size}")
            return image.convert("RGB")
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{where} ({what}) is not a readable image: {exc}") from None


def _string_data(entry: str, where: str, base_dir: Path | None) -> tuple[bytes, str]:
    """(the bytes of a path, data URI or bare base64 string; how it was given)."""
    if not entry.strip():
        raise ImageError(f"{where} is an empty string; give a path or base64 image data")
    if entry.startswith("data:"):
        _, _, payload = entry.partition(",")
        return _decoded(payload, where), "a data URI"
    try:  # a name too long for the file system, or "~user" of no user, is not a file
        path = Path(entry).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if path.is_file():
            return path.read_bytes(), str(path)
    except (OSError, RuntimeError, ValueError):
        path = Path(entry[:60] + "...")
    try:
        return base64.b64decode(entry, validate=True), f"base64, as there is no file {path}"
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: no image file {path}") from None


def _decoded(payload: str, where: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the base64 data does not decode") from None
