"""One object read in fixed blocks through the cache: ``.npy`` and HDF5 files behind URLs.

A ``.npy`` or HDF5 file is one object, often far larger than a read needs. With a cache it is
fetched and kept in blocks of :data:`BLOCK_BYTES` (a ranged request each, many in flight), so
that the bound and the check on every hit concern objects of a known, moderate size, and a read
fetches only the blocks it touches. :class:`BlockFetcher` fetches them; :class:`BlockFile` is
the file object h5py reads through it. :func:`block_fetcher` makes one for a URL with a cache,
from the object's size and version as the store reports them when the file is opened.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from ..._errors import CorruptDataError
from .cache import version_at
from .cachespec import CacheSpec
from .errors import remote_error
from .fetcher import Fetcher
from .paths import RemotePath

__all__ = ["BLOCK_BYTES", "READ_AHEAD", "BlockFetcher", "BlockFile", "block_fetcher"]

#: Bytes of a block: a ranged request, and an object of the cache.
BLOCK_BYTES = 4 << 20
#: Blocks after those a read of a :class:`BlockFile` touches that are fetched with them.
READ_AHEAD = 1


class BlockFetcher(Fetcher):
    """The blocks of the object at ``path`` (``size`` bytes at ``version``), key ``"i"`` for
    bytes ``[i * block, (i + 1) * block)``."""

    def __init__(
        self,
        fs: Any,
        path: str,
        url: str,
        size: int,
        version: str | None,
        cache: CacheSpec | None,
        *,
        block: int | None = None,
    ) -> None:
        super().__init__(fs, path, url, cache=cache)
        self.size, self.version, self.block = size, version, block or BLOCK_BYTES

    def _bounds(self, key: str) -> tuple[int, int]:
        i = int(key)
        return i * self.block, min(self.size, (i + 1) * self.block)

    def _request(self, key: str) -> tuple[str, dict[str, Any]]:
        start, end = self._bounds(key)
        return self.root, {"start": start, "end": end}

    def _name(self, key: str) -> str:
        start, end = self._bounds(key)
        return f"{self.url}#bytes={start}-{end - 1}"

    @property
    def kept_locally(self) -> bool:
        return self.cache is not None and self.version is not None

    def _version(self, key: str) -> str | bool | None:
        return self.version if self.cache is not None else None

    def _keys(self, start: int, stop: int) -> list[str]:
        last = (max(stop, start + 1) - 1) // self.block
        return [str(i) for i in range(start // self.block, last + 1)]

    def fetch_ranges(self, starts: Sequence[int], stops: Sequence[int], ahead: int = 0) -> None:
        """Start fetching the blocks of bytes ``[starts[i], stops[i])`` (and ``ahead`` more
        after each range, within the object)."""
        last = (self.size - 1) // self.block
        keys = []
        for start, stop in zip(starts, stops, strict=True):
            first = start // self.block
            end = min(last, (max(stop, start + 1) - 1) // self.block + ahead)
            keys += [str(i) for i in range(first, end + 1)]
        self.fetch(keys)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object, from the blocks that hold them."""
        if stop <= start:
            return b""
        parts = []
        for key in self._keys(start, stop):
            lo, hi = self._bounds(key)
            data = self.get(key)
            if data is None or len(data) != hi - lo:
                raise CorruptDataError(
                    f"'{self.url}' is shorter than when it was opened ({self.size:,} bytes); "
                    "it was replaced or truncated: open it again."
                )
            parts.append(memoryview(data)[max(start, lo) - lo : min(stop, hi) - lo])
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)


class BlockFile(io.RawIOBase):
    """A read-only, seekable file object over a :class:`BlockFetcher` (what h5py reads)."""

    def __init__(self, blocks: BlockFetcher) -> None:
        super().__init__()
        self.blocks, self._position = blocks, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.blocks.size}
        self._position = max(0, base[whence] + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start = self._position
        stop = min(self.blocks.size, start + len(view))
        if stop <= start:
            return 0
        self.blocks.fetch_ranges([start], [stop], ahead=READ_AHEAD)
        view[: stop - start] = self.blocks.read(start, stop)
        self._position = stop
        return stop - start


def block_fetcher(location: RemotePath) -> BlockFetcher | None:
    """The blocks of the object at ``location`` through its cache (None: it has none)."""
    if location.cache is None:
        return None
    fs, path = location.filesystem()
    try:
        size, version = version_at(fs, path)
    except Exception as exc:
        raise remote_error(exc, location.url) from None
    return BlockFetcher(fs, path, location.url, size, version, location.cache)
