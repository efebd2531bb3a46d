"""HDF5 filter pipelines decoded outside HDF5, for chunks read raw (see :mod:`.rawchunks`).

h5py runs every HDF5 call under one global lock, decompression included, so reader threads
never decode two chunks at once through it. The decoders here run in the calling thread and
release the GIL while they work, so chunks decode on as many cores as there are reader threads.
They reproduce HDF5's filters exactly or not at all: :func:`pipeline` returns a reason string
for any filter, option or codec library it does not cover, and the caller reads through h5py.

Libraries, chosen by measuring two threads decoding against one, and a Python thread spinning
beside a decoding thread (docs/performance.md, "HDF5 decoders"): each below scales with threads and
leaves the spinner at full speed, as it releases the GIL.

- deflate: ``libdeflate`` through ``imagecodecs`` when the extra below is installed, into a given
  buffer (faster than ``zlib`` per chunk), else the standard library's ``zlib``. Both ignore
  bytes after the zlib stream, as HDF5 does, and yield what the stream holds, so a short one is
  caught;
- zstd, blosc: ``numcodecs``, already a dependency;
- lzf, lz4 (HDF5's framing), bitshuffle: ``imagecodecs``, a dependency of arrayfeed; should it
  be missing, those filters are read through h5py, correctly but on one core. ``python-lzf`` was rejected: it holds the GIL while it
  decodes, so a second thread gains nothing and slows the spinner;
- shuffle and fletcher32: NumPy here (whole-array operations, which release the GIL).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import compressors
from .compressors import Buffer, Decode, Undecodable

__all__ = [
    "FILTER_NAMES",
    "DEFLATE",
    "FLETCHER32",
    "SHUFFLE",
    "ChecksumError",
    "ChunkDecoder",
    "Stage",
    "StageError",
    "Undecodable",
    "fletcher32",
    "pipeline",
    "unshuffle",
]

#: Registered HDF5 filter ids (https://github.com/HDFGroup/hdf5_plugins) -> usual names.
FILTER_NAMES = {
    1: "gzip",
    2: "shuffle",
    3: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    305: "lzo",
    307: "bzip2",
    32000: "lzf",
    32001: "blosc",
    32004: "lz4",
    32008: "bitshuffle",
    32013: "zfp",
    32014: "fpzip",
    32015: "zstd",
    32017: "sz",
    32018: "fcidecomp",
    32024: "sz3",
    32026: "blosc2",
}

DEFLATE, SHUFFLE, FLETCHER32 = 1, 2, 3
LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD = 32000, 32001, 32004, 32008, 32015

#: ``into(data, out)``: decode ``data`` into ``out``, a buffer of exactly the decoded size, and
#: return the decoded bytes (a view of ``out``, shorter if ``data`` decodes to fewer bytes).
DecodeInto = Callable[[Buffer, np.ndarray], Buffer]


class ChecksumError(ValueError):
    """A chunk's stored fletcher32 checksum does not match its bytes."""


@dataclass(frozen=True)
class Stage:
    """One filter of a pipeline: its id, a name for messages, its decoder, and how it changed
    the size of a chunk when writing: ``grows`` bytes more, or None when it compressed it."""

    code: int
    name: str
    decode: Decode
    grows: int | None = None
    #: Decodes into a given buffer instead of a new one (see :class:`ChunkDecoder`'s ``out``).
    into: DecodeInto | None = None


# -- fletcher32 --------------------------------------------------------------------------------
_WEIGHTS = np.arange(65535, dtype=np.uint64)


def fletcher32(data: Buffer) -> int:
    """HDF5's Fletcher-32 checksum of ``data`` (``H5_checksum_fletcher32``), bit for bit.

    Computed by ``imagecodecs.h5checksum_fletcher32`` (HDF5's own C code, without the GIL) when
    ``imagecodecs`` is installed: the NumPy passes below are a few times slower, enough
    to slow an epoch of lzf-stored large rows (docs/performance.md, "HDF5 decoders").

    HDF5 sums big-endian 16-bit words (an odd last byte is the high byte of a last word) with
    end-around-carry folding, which keeps each sum congruent modulo 65535 and positive once any
    word is: so ``sum1`` is the word sum and ``sum2`` the sum of ``(N - k) * word[k]``, each
    reduced to ``1 .. 65535`` (0 only for all-zero data). Computed in whole-array NumPy passes.

    >>> hex(fletcher32(b"abcde"))
    '0x4ff029c7'
    """
    codecs = _fast_checksums()
    if codecs is not None:
        return int(codecs.h5checksum_fletcher32(data))
    return fletcher32_numpy(data)


@functools.cache
def _fast_checksums() -> Any:
    codecs = compressors.imagecodecs_module()
    return codecs if codecs is not None and hasattr(codecs, "h5checksum_fletcher32") else None


def fletcher32_numpy(data: Buffer) -> int:
    """:func:`fletcher32` in whole-array NumPy passes (no imagecodecs needed).

    >>> hex(fletcher32_numpy(b"abcde"))
    '0x4ff029c7'
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) % 2:
        raw = np.concatenate((raw, np.zeros(1, dtype=np.uint8)))
    words = raw.view(">u2")
    n = len(words)
    rows = n // 65535
    # Weight k mod 65535 of word k: fold full rows of 65535 words onto one row first.
    cols = words[: rows * 65535].reshape(rows, 65535).sum(axis=0, dtype=np.uint64)
    tail = words[rows * 65535 :].astype(np.uint64)
    total = int(cols.sum()) + int(tail.sum())
    if total == 0:
        return 0
    weighted = int(np.dot(cols, _WEIGHTS)) + int(np.dot(tail, _WEIGHTS[: len(tail)]))
    sum1 = (total - 1) % 65535 + 1
    sum2 = (n * total - weighted - 1) % 65535 + 1
    return (sum2 << 16) | sum1


def _swap_halves(value: int) -> int:
    """The checksum HDF5 before 1.6.3 stored: the bytes of each 16-bit half swapped."""
    return ((value & 0x00FF00FF) << 8) | ((value >> 8) & 0x00FF00FF)


def _check_fletcher32(data: Buffer, size: int | None) -> Buffer:
    if len(data) < 4 or (size is not None and len(data) != size + 4):
        raise ValueError(f"{len(data)} bytes, expected {size} and a 4-byte checksum")
    view = memoryview(data)
    size = len(view) - 4
    stored = int.from_bytes(view[size:], "little")
    computed = fletcher32(view[:size])
    # HDF5 accepts the checksum as written by HDF5 >= 1.6.3 and as written before it.
    if stored not in (computed, _swap_halves(computed)):
        raise ChecksumError(f"stored checksum {stored:#010x}, computed {computed:#010x}")
    return view[:size]


# -- byte shuffle ------------------------------------------------------------------------------
def unshuffle(data: Buffer, itemsize: int, out: np.ndarray | None = None) -> Buffer:
    """Undo HDF5's shuffle filter: byte ``j`` of every element was stored together; bytes past
    the last whole element were stored as they are.

    >>> bytes(unshuffle(b"acebdf!", 2))
    b'abcdef!'
    """
    count = len(data) // itemsize
    if itemsize <= 1 or count <= 1:
        return data
    src = np.frombuffer(data, dtype=np.uint8)
    if out is None or out.nbytes != len(src):
        out = np.empty(len(src), dtype=np.uint8)
    whole = count * itemsize
    out[:whole].reshape(count, itemsize)[...] = src[:whole].reshape(itemsize, count).T
    out[whole:] = src[whole:]
    return out.data


def _unshuffle(values: Sequence[int]) -> Decode | str:
    if len(values) < 1 or values[0] < 1:
        return "its shuffle filter has no element size"
    itemsize = int(values[0])

    def decode(data: Buffer, size: int | None) -> Buffer:
        return unshuffle(data, itemsize)

    return decode


# -- pipelines ---------------------------------------------------------------------------------
def _stage(code: int, values: Sequence[int], itemsize: int, name: str) -> Decode | str:
    """The decoder of filter ``code`` with parameters ``values``, or why there is none."""
    if code == DEFLATE:
        return compressors.deflate()
    if code == SHUFFLE:
        return _unshuffle(values)
    if code == FLETCHER32:
        return _check_fletcher32
    if code == LZF:
        return compressors.lzf()
    if code == ZSTD:
        return compressors.zstd()
    if code == BLOSC:
        return compressors.blosc(values)
    if code == LZ4:
        return compressors.lz4()
    if code == BITSHUFFLE:
        return compressors.bitshuffle(values, itemsize)
    return f"its {name} filter (id {code}) is decoded by HDF5 only"


def pipeline(
    filters: Sequence[tuple[int, Sequence[int], str]], itemsize: int
) -> tuple[Stage, ...] | str:
    """Decoders for HDF5 ``filters`` (``(id, parameters, name)`` in the order they were applied
    when writing), or the reason one cannot be decoded here."""
    stages = []
    for code, values, name in filters:
        decode = _stage(code, values, itemsize, name)
        if isinstance(decode, str):
            return decode
        # Shuffles keep a chunk's size, fletcher32 appends 4 bytes, the rest compress.
        keeps = code == SHUFFLE or (code == BITSHUFFLE and (len(values) < 5 or values[4] == 0))
        grows = 4 if code == FLETCHER32 else 0 if keeps else None
        stages.append(Stage(code, name, decode, grows, _into(code, values)))
    return tuple(stages)


def _into(code: int, values: Sequence[int]) -> DecodeInto | None:
    """The decoder of filter ``code`` that writes into a given buffer, where there is one."""
    # Looked up once, here: a lookup per chunk is GIL time on the hot path.
    codecs = compressors.imagecodecs_module()
    if code == DEFLATE and codecs is not None and codecs.DEFLATE.available:
        return functools.partial(_decode_into, codecs.deflate_decode)
    if code == LZF and codecs is not None:
        return functools.partial(_decode_into, codecs.lzf_decode)
    if code == LZ4 and codecs is not None:
        return functools.partial(_decode_into, codecs.lz4h5_decode)
    if code == SHUFFLE and values and values[0] >= 1:
        itemsize = int(values[0])
        return lambda data, out: unshuffle(data, itemsize, out)
    return None


def _decode_into(decode: Any, data: Buffer, out: np.ndarray) -> Buffer:
    return decode(data, out=out)  # type: ignore[no-any-return]


class StageError(Exception):
    """A stage of a pipeline failed on a chunk (``stage`` None: no stage ran, and the stored
    chunk has the wrong size)."""

    def __init__(self, stage: Stage | None, error: Exception) -> None:
        super().__init__(str(error))
        self.stage, self.error = stage, error


class ChunkDecoder:
    """Undoes ``stages`` on stored chunks that hold ``nbytes`` bytes of data each, last applied
    first; bit ``i`` of ``mask`` set means stage ``i`` was skipped when a chunk was written. The
    steps are worked out once per mask (a reader keeps one per mask: the work per chunk holds
    the GIL).

    Every stage's output must have the size its input had when the chunk was written, where
    that is known (up to the first compressor, in writing order).
    """

    def __init__(self, stages: Sequence[Stage], mask: int, nbytes: int) -> None:
        # The size each stage was given when writing, while no compressor ran before it.
        sizes: list[int | None] = []
        size: int | None = nbytes
        for i, stage in enumerate(stages):
            sizes.append(size)
            if not mask >> i & 1 and size is not None:
                size = None if stage.grows is None else size + stage.grows
        applied = [i for i in range(len(stages)) if not mask >> i & 1]
        #: (stage, size it was given when writing, whether it decodes into ``out``), in the
        #: order they are undone.
        self.steps = tuple(
            (
                stages[i],
                sizes[i],
                i == applied[0] and stages[i].into is not None and sizes[i] == nbytes,
            )
            for i in reversed(applied)
        )
        self.nbytes = nbytes
        #: Whether the decoded chunk is written into ``out`` when one is given.
        self.writes_into = any(into for *_, into in self.steps)

    def __call__(self, data: Buffer, out: np.ndarray | None = None) -> Buffer:
        """The chunk stored as ``data``, decoded. ``out``, a buffer of ``nbytes`` that ``data``
        does not share, may receive it (from the last stage undone, if it can write into a
        buffer: :attr:`writes_into`).

        Raises:
            StageError: A stage failed, or a chunk no stage applies to has the wrong size.
            Undecodable: A stage met a form of its codec that this module does not decode.
        """
        for stage, size, into in self.steps:
            try:
                if into and out is not None:
                    data = stage.into(data, out)  # type: ignore[misc]  # `into` says it has one
                else:
                    data = stage.decode(data, size)
            except Undecodable:
                raise
            except Exception as exc:
                raise StageError(stage, exc) from exc
            if size is not None and len(data) != size:
                error = ValueError(f"decoded to {len(data)} bytes, expected {size}")
                raise StageError(stage, error)
        if len(data) != self.nbytes:
            raise StageError(None, ValueError(f"{len(data)} bytes stored, expected {self.nbytes}"))
        return data


#: Byte order HDF5 writes native data in on this machine (for :mod:`.rawchunks`).
NATIVE = "<" if sys.byteorder == "little" else ">"
