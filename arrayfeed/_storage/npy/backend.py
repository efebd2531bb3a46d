"""The NumPy family's backend: ``.npy``/``.npz`` files, in-memory arrays, and, asked last, any
object NumPy can make an array of."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._errors import SourceNotFoundError
from ..base import Source
from ..layout import ArrayLayout, StoreInfo
from ..registry import Backend, Location, OpenOptions
from ..remote.paths import RemotePath
from .files import NpySource, NpzMemberSource, describe_npy, describe_npz, open_npz
from .memory import ArraySource
from .remote import RemoteNpySource

__all__ = ["NpyBackend"]


class NpyBackend(Backend):
    """``.npy`` files memory-mapped (read with ranged requests from URLs), ``.npz`` members
    loaded whole (streamed when copied; not read from URLs), and arrays in memory."""

    name = "npy"
    label = "NumPy"
    order = 50  # last: it loads whatever no other backend recognised
    suffixes = frozenset({".npy", ".npz"})

    def recognises(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray) or hasattr(obj, "__array__")

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        return ArraySource(obj, name=name) if isinstance(obj, np.ndarray) else None

    def load(self, obj: Any, name: str) -> Source | None:
        return ArraySource(np.asarray(obj), name=name)

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        archive = location.suffix.lower() == ".npz"
        if isinstance(location, RemotePath):
            if archive:
                raise SourceNotFoundError(
                    f"'{location}' is a .npz archive, which arrayfeed does not read from URLs; "
                    "download it, or convert it to a Zarr store with `arrayfeed convert`."
                )
            _no_key(location, key)
            return RemoteNpySource(location)
        if not archive:
            _no_key(location, key)
            return NpySource(location)
        if options.for_copy and location.is_file():
            return NpzMemberSource(location, key)
        return open_npz(location, key)

    def describe(self, location: Location) -> StoreInfo:
        archive = location.suffix.lower() == ".npz"
        if not isinstance(location, RemotePath):
            return describe_npz(location) if archive else describe_npy(location)
        if archive:
            raise SourceNotFoundError(
                f"'{location}' is a .npz archive, which arrayfeed cannot inspect."
            )
        source = RemoteNpySource(location)
        layout = ArrayLayout(name="", shape=source.shape, dtype=source.dtype, chunks=None)
        return StoreInfo(format=".npy", arrays=(layout,), specs={"": location.url})


def _no_key(location: Location, key: str | None) -> None:
    if key is not None:
        raise SourceNotFoundError(
            f"'{location}' is a .npy file, which holds one array; drop `key` ({key!r})."
        )
