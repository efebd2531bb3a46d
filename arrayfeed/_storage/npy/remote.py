"""``.npy`` files behind URLs: one ranged request per run of rows, all in flight at once.

With a cache (``cache=``), the file is read in the cache's blocks instead, each fetched once and
kept there (:mod:`..remote.blocks`). A :class:`RemoteNpySource` pickles as its
:class:`~..remote.paths.RemotePath` (URL, storage options, cache), and reads the file again in
the process that unpickles it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import ConfigError, CorruptDataError
from ..base import REOPENS, Indices, Portability
from ..remote.blocks import block_fetcher
from ..remote.errors import remote_error
from ..remote.paths import RemotePath
from .files import read_npy_header

__all__ = ["RemoteNpySource"]


class RemoteNpySource:
    """A ``.npy`` file behind a URL: one ranged request per run of rows, all in flight."""

    def __init__(self, location: RemotePath) -> None:
        self.location = location
        self.name = location.url
        fs, path = location.filesystem()
        try:
            with fs.open(path, "rb", block_size=1 << 16) as f:
                self._shape, self._dtype, fortran = read_npy_header(f)
                self._offset = int(f.tell())
        except (ValueError, SyntaxError) as exc:
            raise CorruptDataError(f"'{location}' is not a readable .npy file ({exc}).") from None
        except Exception as exc:
            raise remote_error(exc, location.url) from None
        if fortran and len(self._shape) > 1:
            raise ConfigError(
                f"'{location}' is stored in Fortran order, so its rows are not contiguous; save "
                "it in C order (np.ascontiguousarray) or convert it."
            )
        self._row = int(np.prod(self._shape[1:], dtype=np.int64)) * self._dtype.itemsize
        self._blocks = block_fetcher(location)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def kept_locally(self) -> bool:
        """Whether the blocks read are kept in a local cache."""
        return self._blocks is not None and self._blocks.kept_locally

    def portability(self) -> Portability:
        return REOPENS  # the URL and storage options travel; the other process fetches

    def read(self, indices: Indices) -> np.ndarray:
        out = np.empty((len(indices), *self._shape[1:]), self._dtype)
        if not len(indices):
            return out
        cuts = np.flatnonzero(np.diff(indices) != 1) + 1
        firsts = np.concatenate(([0], cuts))
        lasts = np.concatenate((cuts, [len(indices)]))
        starts: npt.NDArray[np.int64] = self._offset + indices[firsts] * self._row
        ends = starts + (lasts - firsts) * self._row
        pieces: list[Any]
        if self._blocks is not None:
            self._blocks.fetch_ranges(starts.tolist(), ends.tolist())
            pieces = [
                self._blocks.read(a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
            ]
        else:
            fs, path = self.location.filesystem()
            try:
                pieces = fs.cat_ranges([path] * len(starts), starts.tolist(), ends.tolist())
            except Exception as exc:
                raise remote_error(exc, self.location.url) from exc
        flat = out.reshape(len(indices), -1).view(np.uint8)
        for a, b, piece in zip(firsts.tolist(), lasts.tolist(), pieces, strict=True):
            if isinstance(piece, Exception):
                raise remote_error(piece, self.location.url)
            if len(piece) != (b - a) * self._row:
                raise CorruptDataError(f"'{self.location}' is truncated; re-create it.")
            flat[a:b] = np.frombuffer(piece, np.uint8).reshape(b - a, -1)
        return out

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self.read(np.arange(start, stop, dtype=np.int64))

    def __repr__(self) -> str:
        return f"RemoteNpySource({self.name!r}, shape={self.shape}, dtype={self.dtype})"
