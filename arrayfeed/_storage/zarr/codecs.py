"""Zarr codecs decoded in the reader thread: ``numcodecs`` compressors and the CRC-32C.

What :class:`.chunks.ChunkReader` runs on a chunk's stored bytes, in decoding order: a
compressor's decoder (Blosc and Zstandard into a reused buffer when their frame declares exactly a
chunk's size), and Zarr v3's trailing CRC-32C, checked outside the GIL when the ``crc32c``
package (a dependency of arrayfeed) is there. Also the codec names ``inspect`` shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..frames import blosc_nbytes as _blosc_nbytes

__all__ = [
    "CodecDecoder",
    "Decoder",
    "codec_label",
    "check_crc32c",
    "crc32c_checksum",
    "crc32c_end",
    "decoder",
    "describe_codecs",
]

#: ``decode(data, out)``: the decoded bytes of ``data``; ``out`` is None or a free work buffer
#: of exactly one decoded chunk's size, which the decoder may fill and return.
Decoder = Callable[[Any, "np.ndarray | None"], Any]


def _crc32c_checksum() -> Callable[[np.ndarray], int]:
    """CRC-32C of a buffer: with the ``crc32c`` package (a dependency) computed
    outside the GIL, so reader threads check their chunks at once; else numcodecs' (through
    ``google_crc32c``), which holds the GIL while it runs, so reader threads check their chunks
    one at a time."""
    from numcodecs.checksum32 import CRC32C

    try:
        import crc32c

        # The check value of CRC-32C: an old crc32c (no `gil_release_mode`, before 2.5) or one
        # without a usable implementation (CRC32C_SW_MODE=none on a CPU without the
        # instruction) fails here, not on every chunk as if the store were corrupt.
        if crc32c.crc32c(b"123456789", gil_release_mode=1) != 0xE3069283:
            raise ValueError("crc32c computes a wrong check value")
    except Exception:
        return CRC32C.checksum  # type: ignore[no-any-return]

    def checksum(body: np.ndarray) -> int:
        return int(crc32c.crc32c(body.data, gil_release_mode=1))

    return checksum


#: How :func:`crc32c_end` computes a checksum (one choice per process).
crc32c_checksum = _crc32c_checksum()


def crc32c_end(data: Any, out: np.ndarray | None) -> np.ndarray:
    """The bytes of ``data`` before its trailing CRC-32C (Zarr v3's ``crc32c`` codec), checked,
    as a read-only view: ``numcodecs.CRC32C.decode`` would copy them."""
    view = np.frombuffer(data, dtype=np.uint8)
    if view.nbytes < 4:
        raise ValueError(f"{view.nbytes} bytes cannot hold a crc32c checksum")
    body = view[:-4]
    check_crc32c(body, view[-4:].tobytes())
    return body


def check_crc32c(body: np.ndarray, checksum: bytes) -> None:
    """Raise unless ``checksum`` (4 bytes, little-endian) is the CRC-32C of ``body`` (bytes,
    made read-only here: the checksum takes read-only buffers)."""
    body.flags.writeable = False
    stored, computed = int.from_bytes(checksum, "little"), crc32c_checksum(body)
    if stored != computed:
        raise RuntimeError(
            f"Stored and computed crc32c checksum do not match. Stored: {stored}. "
            f"Computed: {computed}."
        )


def _zstd_nbytes(data: Any) -> int:
    """The decoded size a Zstandard frame declares in its header (RFC 8878, 3.1.1.1), or -1 when
    it declares none. numcodecs has no call for it."""
    view = memoryview(data).cast("B")
    if view.nbytes < 6 or bytes(view[:4]) != b"\x28\xb5\x2f\xfd":
        return -1
    descriptor = view[4]
    fcs_flag, single, dict_flag = descriptor >> 6, descriptor >> 5 & 1, descriptor & 3
    size = (1 if single else 0) if fcs_flag == 0 else (2, 4, 8)[fcs_flag - 1]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    if size == 0 or view.nbytes < at + size:
        return -1
    value = int.from_bytes(view[at : at + size], "little")
    return value + 256 if size == 2 else value


#: Codecs that decode into a given buffer, and the decoded size each frame declares.
_DECLARED_SIZE: dict[str, Callable[[Any], int]] = {"blosc": _blosc_nbytes, "zstd": _zstd_nbytes}


class CodecDecoder:
    """The decoder of a ``numcodecs`` codec (picklable, as readers travel to worker processes).
    Blosc and Zstandard decode into ``out`` when the frame declares exactly its size, so a short
    frame cannot leave a previous chunk's bytes in it; anything else gets a new buffer."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        #: The decoded size a frame declares, for codecs that can decode into a buffer.
        self.declared = _DECLARED_SIZE.get(getattr(codec, "codec_id", None) or "")

    def __call__(self, data: Any, out: np.ndarray | None) -> Any:
        # Blosc trusts its own header for the stored size: a cut frame decodes to garbage, so
        # the header is checked against what is stored first (it raises if they differ).
        size = self.declared(data) if self.declared is not None else -1
        if out is not None and size == out.nbytes:
            return self.codec.decode(data, out=out)
        return self.codec.decode(data)


def codec_label(codec: Any) -> str:
    """A codec's name: ``"zstd"``, ``"blosc"``, ``"crc32c"`` … (Zarr v3 codecs or numcodecs)."""
    label = getattr(codec, "codec_id", None) or type(codec).__name__.removesuffix("Codec").lower()
    return str(label)


def describe_codecs(array: Any) -> str:
    """The compressors of a Zarr array, as ``inspect`` shows them (``"blosc(lz4,5)+crc32c"``)."""
    names = []
    for codec in array.compressors:
        detail = [
            str(getattr(codec, attr))
            for attr in ("cname", "clevel", "level")
            if hasattr(codec, attr)
        ]
        detail = [d.rsplit(".", 1)[-1] for d in detail]
        label = codec_label(codec)
        names.append(f"{label}({','.join(detail)})" if detail else label)
    return "+".join(names) or "none"


def decoder(spec: dict[str, Any]) -> Decoder | None:
    """A bytes-to-bytes decoder for a Zarr v3 codec, or None if this module cannot run it."""
    import numcodecs

    name = spec.get("name")
    if name == "zstd":
        return CodecDecoder(numcodecs.Zstd())
    if name == "blosc":
        return CodecDecoder(numcodecs.Blosc())
    if name == "gzip":
        return CodecDecoder(numcodecs.GZip())
    if name == "crc32c":
        return crc32c_end  # Zarr v3 puts the checksum after the data
    return None
