"""Verifying a converted copy before it is published: read it back, compare with what was read.

The written store is opened again through the storage layer, and every array is checked for its
shape and dtype, (Zarr) for every chunk being stored, and for the CRC-32 of its rows against the
checksum taken from the inputs while writing. The stored record must equal the one written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .._errors import CorruptDataError
from .._storage import ConversionRecord, open_written
from .atomic import Interrupts
from .copy import Checksums, Copy
from .progress import Progress

__all__ = ["verify_copy"]


def verify_copy(
    copy: Copy, target: Path, record: ConversionRecord, output: Path, interrupts: Interrupts
) -> None:
    """Raise :class:`CorruptDataError` (naming ``output``) unless the store at ``target`` holds
    exactly what ``copy`` read from its inputs and ``record`` describes."""

    def fail(what: str) -> NoReturn:
        raise CorruptDataError(
            f"verifying the converted copy failed: {what}; nothing was written to "
            f"'{output}'. Check the disk and convert again."
        )

    with (
        Progress(copy.total_bytes, label="verifying", enabled=copy.progress) as bar,
        open_written(copy.fmt, target, list(copy.parts)) as stored,
    ):
        for name, missing in stored.missing_chunks.items():
            if missing:
                total = stored.total_chunks[name]
                fail(f"`{name}` has {total - missing} of {total} chunks")
        for name, p in copy.parts.items():
            array = stored.arrays[name]
            if tuple(array.shape) != p.shape or np.dtype(array.dtype) != p.dtype:
                fail(
                    f"`{name}` reads back as {tuple(array.shape)} {np.dtype(array.dtype)}, "
                    f"not {p.shape} {p.dtype}"
                )
        checksums = _checksums(copy, stored.arrays, bar, interrupts)
        for name, crc in checksums.items():
            if crc != record.checksums[name]:
                fail(f"`{name}` reads back with CRC-32 {crc:08x}, not {record.checksums[name]:08x}")
        if stored.record != record:
            fail("the stored record differs from what was written")


def _checksums(
    copy: Copy, arrays: Mapping[str, Any], bar: Progress, interrupts: Interrupts
) -> dict[str, int]:
    running = Checksums(list(copy.parts))
    try:
        for a, b in copy.slabs():
            for name in copy.parts:
                running.add(name, np.asarray(arrays[name][a:b]))
            bar.update((b - a) * copy.row_bytes)
            interrupts.checkpoint()
        return running.result()
    finally:
        running.close()
