"""URLs matching a glob pattern (``s3://bkt/parts/*.npy``): inputs given as many objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import remote_error
from .paths import protocol_of, url_to_fs

__all__ = ["expand_url"]


def expand_url(pattern: str, storage_options: Mapping[str, Any]) -> list[str]:
    """Every URL matching a glob ``pattern`` (``s3://bkt/parts/*.npy``), sorted."""
    fs, path = url_to_fs(pattern, storage_options, writing=False)
    protocol = protocol_of(pattern)
    try:
        found = sorted(fs.glob(path))
    except Exception as exc:
        raise remote_error(exc, pattern) from None
    return [f"{protocol}://{p}" for p in found]
