"""Zarr arrays for the tests of chunk reads: the codecs stores are written with, and requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import (
    BloscCodec,
    Crc32cCodec,
    GzipCodec,
    ZstdCodec,
)

__all__ = ["COMPRESSORS", "_array", "_requests"]

COMPRESSORS: dict[str, Any] = {
    "none": None,
    "zstd": [ZstdCodec()],
    "blosc": [BloscCodec()],
    "gzip": [GzipCodec()],
    "zstd+crc32c": [ZstdCodec(), Crc32cCodec()],
    "crc32c": [Crc32cCodec()],  # what `convert` writes without compression
    "blosc+crc32c": [BloscCodec(cname="lz4"), Crc32cCodec()],  # `convert --compression lzf`
}


def _array(path: Path, data: np.ndarray, chunks: tuple[int, ...], **kwargs: Any) -> Any:
    z = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=chunks, **kwargs)
    z[...] = data
    return zarr.open_array(path, mode="r")


def _requests(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [
        np.arange(n, dtype=np.int64),  # every row: runs across chunks
        np.arange(3, min(n, 11), dtype=np.int64),  # a run inside and across chunks
        np.sort(rng.choice(n, size=max(1, n // 3), replace=False)).astype(np.int64),
        np.array([n - 1], dtype=np.int64),  # the edge chunk
        np.array([], dtype=np.int64),
    ]
