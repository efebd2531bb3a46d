"""HDF5's compression filters decoded outside HDF5: deflate, zstd, blosc, lzf, lz4, bitshuffle.

Each ``_stage``-style factory returns a decoder (``decode(data, size)``) or the reason there is
none here; :mod:`.codecs` puts them in pipelines with the shuffle and fletcher32 filters and
says which library decodes what, and why.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

from ..frames import blosc_nbytes

__all__ = [
    "IMAGECODECS_MIN",
    "Buffer",
    "Decode",
    "Undecodable",
    "bitshuffle",
    "blosc",
    "deflate",
    "imagecodecs_module",
    "lz4",
    "lzf",
    "zstd",
]

Buffer = bytes | bytearray | memoryview
#: ``decode(data, size)``: the bytes this stage was given when the chunk was written, which
#: were ``size`` bytes long (None: unknown, when an earlier stage compressed them).
Decode = Callable[[Buffer, int | None], Buffer]


class Undecodable(Exception):
    """A chunk in a form this module does not decode (not corruption): read it through HDF5."""


#: imagecodecs releases before this one mis-decode some LZ4H5 chunks (its issues #126, #127).
IMAGECODECS_MIN = (2025, 8, 2)


def imagecodecs_module() -> Any:
    """The ``imagecodecs`` module, if a release this module trusts is installed."""
    try:
        import imagecodecs
    except ImportError:
        return None
    try:
        version = tuple(int(p) for p in imagecodecs.__version__.split(".")[:3])
    except ValueError:
        return None
    return imagecodecs if version >= IMAGECODECS_MIN else None


def _inflate(data: Buffer, size: int | None) -> Buffer:
    # HDF5 inflates a zlib stream to its end and ignores bytes after it, as zlib.decompress does.
    return zlib.decompress(data, bufsize=max(size or len(data), 1))


def deflate() -> Decode:
    """The deflate filter's decoder: libdeflate (``imagecodecs``) where the size the stream
    decodes to is known, else ``zlib``."""
    codecs = imagecodecs_module()
    if codecs is None or not codecs.DEFLATE.available:
        return _inflate
    libdeflate = codecs.deflate_decode

    def decode(data: Buffer, size: int | None) -> Buffer:
        if size is None:  # libdeflate needs room for all of it; the stream does not say how much
            return _inflate(data, size)
        # Stops at the stream's end as zlib does (bytes after it ignored, a short stream
        # yields fewer bytes); a longer one raises.
        return libdeflate(data, out=size)  # type: ignore[no-any-return]

    return decode


def zstd() -> Decode:
    import numcodecs.zstd

    def decode(data: Buffer, size: int | None) -> Buffer:
        view = memoryview(data)
        if len(view) > 4 and bytes(view[:4]) == b"\x28\xb5\x2f\xfd":
            descriptor = view[4]  # frame content size present: size flag or single segment
            if not descriptor >> 6 and not descriptor & 0x20:
                raise Undecodable("a zstd frame that does not record its decoded size")
        return numcodecs.zstd.decompress(data)  # type: ignore[no-any-return]

    return decode


#: Blosc 1 compressor formats (bits 5-7 of the header flags) that numcodecs' Blosc decodes.
_BLOSC_FORMATS = {"blosclz": 0, "lz4": 1, "lz4hc": 1, "snappy": 2, "zlib": 3, "zstd": 4}


def blosc(values: Sequence[int]) -> Decode | str:
    import numcodecs.blosc

    known = {_BLOSC_FORMATS[name] for name in numcodecs.blosc.list_compressors()}
    if len(values) > 6 and values[6] not in (0, 1, 2, 3, 4, 5):  # BLOSC_BLOSCLZ .. BLOSC_ZSTD
        return f"its blosc filter uses compressor {values[6]}, unknown here"
    if len(values) > 6 and values[6] == 3 and 2 not in known:
        return "its blosc filter uses snappy, which numcodecs' Blosc cannot decode"

    def decode(data: Buffer, size: int | None) -> Buffer:
        view = memoryview(data)
        if len(view) >= 16 and view[0] == 2 and (view[2] >> 5) not in known:
            raise Undecodable(f"blosc compressor format {view[2] >> 5}")
        if len(view) >= 16 and view[0] > 2:
            raise Undecodable(f"blosc format version {view[0]}")
        blosc_nbytes(view)  # a cut frame raises
        return numcodecs.blosc.decompress(data)  # type: ignore[no-any-return]

    return decode


def lzf() -> Decode | str:
    codecs = imagecodecs_module()
    if codecs is None or not codecs.LZF.available:
        return "decoding lzf needs `imagecodecs` >= 2025.8.2 (python -m pip install 'imagecodecs>=2025.8.2')"

    def decode(data: Buffer, size: int | None) -> Buffer:
        if size is None:  # LZF does not record the size it decodes to
            raise Undecodable("lzf after another compressor")
        return codecs.lzf_decode(data, out=size)  # type: ignore[no-any-return]

    return decode


def lz4() -> Decode | str:
    codecs = imagecodecs_module()
    if codecs is None or not getattr(codecs, "LZ4H5", None) or not codecs.LZ4H5.available:
        return "decoding lz4 needs `imagecodecs` >= 2025.8.2 (python -m pip install 'imagecodecs>=2025.8.2')"

    def decode(data: Buffer, size: int | None) -> Buffer:
        return codecs.lz4h5_decode(data, out=size)  # type: ignore[no-any-return]

    return decode


def bitshuffle(values: Sequence[int], itemsize: int) -> Decode | str:
    """The bitshuffle filter: bit-transposed blocks of ``block`` elements, each LZ4- or
    zstd-compressed after a 4-byte big-endian length when compression is on (then behind a
    12-byte header: total bytes, block bytes); the last ``count % 8`` elements stored as is."""
    codecs = imagecodecs_module()
    if codecs is None or not codecs.BITSHUFFLE.available:
        return "decoding bitshuffle needs `imagecodecs` >= 2025.8.2 (python -m pip install 'imagecodecs>=2025.8.2')"
    if len(values) < 3 or values[2] != itemsize:
        return "its bitshuffle filter has an element size other than the dataset's"
    mode = int(values[4]) if len(values) > 4 else 0
    if mode not in (0, 2, 3):
        return f"its bitshuffle filter uses compression {mode}, unknown here"
    if (mode == 2 and not codecs.LZ4.available) or (mode == 3 and not codecs.ZSTD.available):
        return f"its bitshuffle filter uses compression {mode}, which this imagecodecs lacks"
    elem = int(values[2])
    user_block = int(values[3]) if len(values) > 3 else 0
    if user_block % 8:
        return f"its bitshuffle filter has block size {user_block}, not a multiple of 8"
    inflate = codecs.lz4_decode if mode == 2 else codecs.zstd_decode

    def unbit(data: Buffer, block: int) -> Buffer:
        return codecs.bitshuffle_decode(data, itemsize=elem, blocksize=block)  # type: ignore[no-any-return]

    def decode(data: Buffer, size: int | None) -> Buffer:
        if mode == 0:
            if len(data) % elem:
                raise ValueError(f"{len(data)} bytes, not whole {elem}-byte elements")
            return unbit(data, user_block)
        view = memoryview(data)
        if len(view) < 12:
            raise ValueError(f"{len(view)} bytes, shorter than the bitshuffle header")
        total = int.from_bytes(view[:8], "big")
        block = int.from_bytes(view[8:12], "big") // elem
        if (size is not None and total != size) or total % elem or block <= 0 or block % 8:
            raise ValueError(f"bitshuffle header says {total} bytes in blocks of {block} elements")
        size = total
        out = bytearray(size)
        count, at, pos = size // elem, 0, 12
        sizes = [block] * (count // block)
        if (last := count % block - count % block % 8) > 0:
            sizes.append(last)
        for n in sizes:
            length = int.from_bytes(view[pos : pos + 4], "big")
            packed = view[pos + 4 : pos + 4 + length]
            if length < 0 or len(packed) != length:
                raise ValueError("a bitshuffle block runs past the end of the chunk")
            plain = inflate(packed, out=n * elem)
            if len(plain) != n * elem:
                raise ValueError(
                    f"a bitshuffle block decoded to {len(plain)} bytes, not {n * elem}"
                )
            out[at : at + n * elem] = unbit(plain, n)
            at, pos = at + n * elem, pos + 4 + length
        rest = size - at  # the last count % 8 elements, stored as they are
        if len(view) - pos != rest:
            raise ValueError(f"{len(view) - pos} bytes after the blocks, expected {rest}")
        out[at:] = view[pos:]
        return out

    return decode
