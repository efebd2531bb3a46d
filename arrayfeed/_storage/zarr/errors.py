"""What goes wrong reading a Zarr store, as named errors: the store, the chunk, the fix.

A missing chunk of a store marked complete (:func:`missing_chunk_error`), a chunk that cannot be
decoded (:func:`corrupt_chunk_error`, and :func:`zarr_read_error`, which finds it after a failed
read), a store whose conversion has not finished (:func:`unfinished_error`), and a path or URL
that is no store (:func:`open_failed`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr

from ..._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError
from ..remote.errors import remote_error
from ..remote.paths import RemotePath

__all__ = [
    "corrupt_chunk_error",
    "missing_chunk_error",
    "open_failed",
    "unfinished_error",
    "zarr_read_error",
]


def _chunk_coords(key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", key))


def missing_chunk_error(name: str, key: str) -> CorruptDataError:
    """The error for chunk ``key`` missing from Zarr array ``name`` of a strict store."""
    return CorruptDataError(
        f"chunk {_chunk_coords(key)} (key '{key}') of Zarr array '{name}' is missing. The store "
        "is marked complete by arrayfeed (or was opened with strict=True), so a missing chunk is "
        "lost data, not fill values; restore the store from a backup or re-create it (e.g. with "
        "`arrayfeed convert`)."
    )


def corrupt_chunk_error(
    name: str, coords: tuple[int, ...], key: str, error: Exception
) -> CorruptDataError:
    """The error for chunk ``coords`` (``key``) of Zarr array ``name`` that cannot be read."""
    return CorruptDataError(
        f"chunk {coords} (key '{key}') of Zarr array '{name}' cannot be read "
        f"({type(error).__name__}: {error}); the store is corrupted. Restore it from a "
        "backup or re-create it (e.g. with `arrayfeed convert`)."
    )


def unfinished_error(name: str) -> CorruptDataError:
    """The error for reading a store whose conversion has not finished."""
    return CorruptDataError(
        f"Zarr array '{name}' is in a store that `arrayfeed convert` has not finished writing "
        "(its record says complete: false): the conversion is still running, or it failed or "
        "was interrupted, so chunks may be missing. Run the conversion again (it replaces the "
        "unfinished store), or wait for the running one."
    )


def open_failed(path: Path | RemotePath, exc: Exception) -> Exception:
    """The error for ``path`` that Zarr could not open (``exc``): no store there, or, for a URL,
    what object storage answered."""
    if not isinstance(path, RemotePath):
        return SourceNotFoundError(f"'{path}' is not a Zarr store ({exc}).")
    if isinstance(exc, ArrayfeedError) or not isinstance(exc, FileNotFoundError):
        return remote_error(exc, path.url)
    if path.bucket_exists() is False:
        return remote_error(FileNotFoundError("The specified bucket does not exist"), path.url)
    return SourceNotFoundError(f"there is no Zarr store at '{path}' ({exc}); check the URL.")


def zarr_read_error(
    array: zarr.Array[Any], name: str, indices: npt.NDArray[np.int64], error: Exception
) -> CorruptDataError:
    """A :class:`CorruptDataError` naming the chunk behind a failed read of rows ``indices``.

    Re-reads the chunks those rows touch one at a time (the slow path, taken only after a failure)
    and names the first that fails.
    """
    shape = tuple(int(n) for n in array.shape)
    grid: Sequence[int] = array.shards or array.chunks
    blocks = [range(-(-n // c)) for n, c in zip(shape[1:], grid[1:], strict=True)]
    for row_block in np.unique(np.asarray(indices) // grid[0]):
        for rest in itertools.product(*blocks):
            coords = (int(row_block), *rest)
            selection = tuple(
                slice(i * c, min((i + 1) * c, n))
                for i, c, n in zip(coords, grid, shape, strict=True)
            )
            try:
                array[selection]
            except ArrayfeedError as exc:
                return exc if isinstance(exc, CorruptDataError) else CorruptDataError(str(exc))
            except Exception as exc:
                return corrupt_chunk_error(
                    name, coords, array.metadata.encode_chunk_key(coords), exc
                )
    return CorruptDataError(
        f"reading rows of Zarr array '{name}' failed ({type(error).__name__}: {error}), although "
        "each chunk they touch reads on its own; check the store and its storage."
    )
