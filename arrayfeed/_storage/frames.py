"""What a compressed frame's header says, checked the same way by HDF5's and Zarr's chunk readers.

numcodecs has no public call for these header fields, and Blosc trusts the size its header
records: a cut frame would decode to garbage, so both readers check it here before decoding.
"""

from __future__ import annotations

from typing import Any

__all__ = ["blosc_nbytes"]


def blosc_nbytes(data: Any) -> int:
    """The decoded size a Blosc frame declares (bytes 4-7 of its 16-byte Blosc 1 header), or -1
    when ``data`` is too short to be a frame; ``ValueError`` when the stored size the header
    records (bytes 12-15) is not the frame's length (a cut or padded frame)."""
    view = memoryview(data).cast("B")
    if view.nbytes < 16:
        return -1
    stored = int.from_bytes(view[12:16], "little")
    if stored != view.nbytes:
        raise ValueError(
            f"the Blosc frame says it holds {stored} bytes, but {view.nbytes} are stored"
        )
    return int.from_bytes(view[4:8], "little")
