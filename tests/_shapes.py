"""Chunk shapes shared by the HDF5 and Zarr conformance tests."""

from __future__ import annotations

__all__ = ["_halves"]


def _halves(row_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A chunk shape for one row that splits every axis in two (the last chunk partial when odd)."""
    return tuple(max(1, -(-n // 2)) for n in row_shape)
