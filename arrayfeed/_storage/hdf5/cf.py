"""netCDF / CF conventions: packed and masked variables decoded as xarray and netCDF4 do.

A netCDF4 file is an HDF5 file whose variables may carry CF attributes: ``scale_factor`` and
``add_offset`` (packing: ``value = stored * scale_factor + add_offset``), ``_FillValue`` and
``missing_value`` (stored values that mean "no data"), and ``_Unsigned`` (signed integers that
hold unsigned ones). Reading the stored values as data gives silently different numbers from what
xarray and netCDF4 give, so a source over such a variable decodes by default
(``open_array(..., decode_cf=False)`` keeps the stored values). The rules follow xarray's
``CFMaskCoder`` and ``CFScaleOffsetCoder`` (xarray 2025), checked against xarray in the tests:

- masked values become NaN, so the output is floating point: a float dtype stays as it is,
  integers of at most 2 bytes become ``float32``, wider ones ``float64``;
- packed values are decoded to the type of ``scale_factor`` / ``add_offset`` when both are given
  with the same float type (``float64`` for 4-byte integers), to ``float64`` when only
  ``add_offset`` is, to the type of ``scale_factor`` when only it is;
- the mask is applied before unpacking, so a fill value is compared with stored values.

Time units (``"days since …"``) are not decoded: such variables come as their stored numbers.
netCDF3 (classic) files are not HDF5; :func:`netcdf3_error` names them and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._errors import SourceUnavailableError
from ..base import Indices, Portability, Source, chunked_rows, portability

__all__ = ["CFDecoding", "CFSource", "cf_decoding", "is_dimension_placeholder", "netcdf3_error"]

#: The attributes that change what a stored value means.
CF_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")


@dataclass(frozen=True)
class CFDecoding:
    """How stored values of one variable become data values."""

    stored: np.dtype[Any]  # as read from storage
    unsigned: np.dtype[Any] | None  # view stored signed integers as this unsigned type first
    fills: tuple[Any, ...]  # masked values (in the viewed type), compared before unpacking
    scale: Any  # None or a NumPy scalar
    offset: Any
    dtype: np.dtype[Any]  # of the decoded values

    def apply(self, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Decode ``raw`` (stored values) into ``out`` (or a new array) and return it."""
        if self.unsigned is not None:
            raw = raw.view(self.unsigned)
        if out is None:
            out = np.empty(raw.shape, self.dtype)
        out[...] = raw
        if self.fills:
            mask = np.zeros(out.shape, bool)
            for fill in self.fills:
                mask |= out == fill
            out[mask] = np.nan
        if self.scale is not None:
            out *= self.scale
        if self.offset is not None:
            out += self.offset
        return out


def _scalar(value: Any) -> Any:
    """An attribute as a NumPy scalar (netCDF-C writes scalars as 1-element arrays)."""
    array = np.asarray(value)
    if array.dtype.kind in "SUO":
        return value.decode() if isinstance(value, bytes) else value
    return array.reshape(-1)[0] if array.size == 1 else array.reshape(-1)


def cf_decoding(attrs: Mapping[str, Any], stored: np.dtype[Any], name: str) -> CFDecoding | None:
    """The decoding of a variable with ``attrs`` stored as ``stored``; None when it needs none
    (no CF attribute, or a dtype CF does not pack: bool, complex, compound)."""
    present = {key: _scalar(attrs[key]) for key in CF_ATTRS if key in attrs}
    if not present or stored.kind not in "iuf":
        return None
    unsigned = None
    if str(present.get("_Unsigned", "")).lower() == "true" and stored.kind == "i":
        unsigned = np.dtype(f"u{stored.itemsize}")
    viewed = unsigned or stored
    fills: list[Any] = []
    for key in ("_FillValue", "missing_value"):
        for value in np.atleast_1d(present.get(key, [])):
            if isinstance(value, str):
                raise SourceUnavailableError(
                    f"{name}: the CF attribute {key} is a string ({value!r}), not a number; "
                    "open it with `decode_cf=False` to read the stored values."
                )
            fill = np.asarray(value).astype(viewed)[()] if unsigned is not None else value
            if not (np.asarray(fill).dtype.kind == "f" and np.isnan(fill)) and fill not in fills:
                fills.append(fill)  # a NaN fill needs no mask: it already reads as NaN
    scale, offset = present.get("scale_factor"), present.get("add_offset")
    if scale is None and offset is None and not fills:
        if unsigned is None:
            return None
        dtype = unsigned  # only _Unsigned: the values, reinterpreted
    elif scale is not None or offset is not None:
        dtype = _packed_dtype(viewed, scale, offset)
    else:
        dtype = _masked_dtype(viewed)
    return CFDecoding(stored, unsigned, tuple(fills), scale, offset, dtype)


def _packed_dtype(stored: np.dtype[Any], scale: Any, offset: Any) -> np.dtype[Any]:
    """xarray's ``_choose_float_dtype`` when ``scale_factor`` or ``add_offset`` is given."""
    scale_type = None if scale is None else np.asarray(scale).dtype
    offset_type = None if offset is None else np.asarray(offset).dtype
    if scale_type is not None and scale_type == offset_type and scale_type.kind == "f":
        if stored.itemsize == 4 and stored.kind in "iu":
            return np.dtype(np.float64)
        return scale_type
    if offset_type is not None or scale_type is None or scale_type.kind != "f":
        return np.dtype(np.float64)
    return scale_type


def _masked_dtype(stored: np.dtype[Any]) -> np.dtype[Any]:
    """xarray's ``maybe_promote``: the smallest float type holding the values and NaN."""
    if stored.kind == "f":
        return stored.newbyteorder("=")
    return np.dtype(np.float32 if stored.itemsize <= 2 else np.float64)


class CFSource:
    """A source whose rows are the CF-decoded rows of ``inner``."""

    def __init__(self, inner: Source, decoding: CFDecoding) -> None:
        self.inner = inner
        self.decoding = decoding

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.inner.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.decoding.dtype

    def __len__(self) -> int:
        return len(self.inner)

    def portability(self) -> Portability:
        return portability(self.inner)

    def read(self, indices: Indices) -> np.ndarray:
        return self.decoding.apply(self.inner.read(indices))

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        self.decoding.apply(self.inner.read(np.arange(start, stop, dtype=np.int64)), out)

    @property
    def chunk_rows(self) -> int | None:
        return chunked_rows(self.inner)

    def verify(self) -> None:
        verify = getattr(self.inner, "verify", None)
        if verify is not None:
            verify()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"CFSource({self.inner!r}, decoded to {self.dtype})"


def is_dimension_placeholder(attrs: Mapping[str, Any]) -> bool:
    """A netCDF4 dimension without a coordinate variable: an HDF5 dimension scale that only
    gives the dimension its length (netCDF-C writes no data into it). False when the attribute
    cannot be read (files by other tools): not netCDF's."""
    try:
        name = attrs.get("NAME", b"")
    except (OSError, TypeError, ValueError):
        return False
    text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return text.startswith("This is a netCDF dimension but not a netCDF variable")


def netcdf3_error(path: Path) -> SourceUnavailableError | None:
    """The error for a netCDF3 (classic, 64-bit offset or CDF-5) file, else None."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return None
    if magic[:3] != b"CDF" or magic[3:] not in (b"\x01", b"\x02", b"\x05"):
        return None
    return SourceUnavailableError(
        f"'{path}' is a netCDF3 (classic) file, which is not HDF5 and cannot be read in batches "
        "here; rewrite it as netCDF4 or Zarr with xarray, e.g. "
        f"`xarray.open_dataset('{path}').to_netcdf('out.nc', engine='h5netcdf')`, or convert "
        "its variables to .npy."
    )
