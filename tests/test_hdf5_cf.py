"""netCDF4 / CF: packed and masked variables come out as xarray decodes them.

The files are written the way netCDF tools write them: by xarray through h5netcdf, and by h5py
with netCDF-C's conventions (scalar attributes as 1-element arrays, dimensions as HDF5 dimension
scales). xarray reading the same file is the reference, value for value and dtype for dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

N = 40


def _stored(dtype: str, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    rng = np.random.default_rng(seed)
    if info is None:
        return rng.normal(size=(N, 3)).astype(dtype)
    return rng.integers(info.min, info.max, size=(N, 3), endpoint=True).astype(dtype)


# name: (stored dtype, CF attributes, the stored value used as fill, if any)
CASES: dict[str, tuple[str, dict[str, Any], Any]] = {
    "i2_f4_packed_fill": (
        "int16",
        {"scale_factor": np.float32(0.01), "add_offset": np.float32(273.15)},
        -32767,
    ),
    "i2_f8_packed": ("int16", {"scale_factor": 0.5, "add_offset": -3.0}, None),
    "i4_f4_packed": (
        "int32",
        {"scale_factor": np.float32(1e-3), "add_offset": np.float32(2.0)},
        None,
    ),
    "u1_scale_only": ("uint8", {"scale_factor": np.float32(0.25)}, None),
    "i2_offset_only": ("int16", {"add_offset": np.float32(100.0)}, None),
    "f4_fill": ("float32", {}, np.float32(-9999.0)),
    "i4_missing": ("int32", {"missing_value": np.int32(-999)}, None),
    "i1_unsigned_fill": ("int8", {"_Unsigned": "true"}, -1),
    "i2_plain": ("int16", {}, None),
}


def _write_h5py(path: Path, netcdf_c_style: bool) -> None:
    """A netCDF4 file as netCDF-C lays it out, written with h5py."""
    with h5py.File(path, "w") as f:
        f.attrs["_NCProperties"] = b"version=2,netcdf=4.9.2,hdf5=1.14.3"
        for dim, size in (("row", N), ("col", 3)):
            scale = f.create_dataset(dim, shape=(size,), dtype="f4")
            scale.make_scale(f"This is a netCDF dimension but not a netCDF variable.{size:10d}")
        for name, (dtype, attrs, fill) in CASES.items():
            data = _stored(dtype)
            if fill is not None:
                data[::7, 1] = fill
                attrs = {**attrs, "_FillValue": np.array(fill, dtype)}
            var = f.create_dataset(name, data=data, chunks=(8, 3))
            for key, value in attrs.items():
                if isinstance(value, str):
                    var.attrs[key] = value
                else:
                    value = np.asarray(value)
                    var.attrs[key] = value.reshape(1) if netcdf_c_style else value
            var.dims[0].attach_scale(f["row"])
            var.dims[1].attach_scale(f["col"])


def _write_xarray(path: Path) -> None:
    """The same variables, encoded and written by xarray itself."""
    variables = {}
    for name, (dtype, attrs, fill) in CASES.items():
        data = _stored(dtype)
        if fill is not None:
            data[::7, 1] = fill
        encoding: dict[str, Any] = {"dtype": dtype, "_FillValue": fill}
        var = xr.Variable(("row", "col"), data, attrs={**attrs})
        variables[name] = (var, encoding)
    ds = xr.Dataset({name: var for name, (var, _) in variables.items()})
    # Raw stored values with their attributes: xarray must not encode them again.
    ds.to_netcdf(
        path,
        engine="h5netcdf",
        encoding={n: {"_FillValue": e["_FillValue"]} for n, (_, e) in variables.items()},
    )


@pytest.fixture(params=["h5py-netcdf-c", "h5py-scalar-attrs", "xarray"])
def netcdf(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "vars.nc"
    if request.param == "xarray":
        _write_xarray(path)
    else:
        _write_h5py(path, netcdf_c_style=request.param == "h5py-netcdf-c")
    return path


def _assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    np.testing.assert_array_equal(got, expected)  # NaN where NaN, bit-equal otherwise


@pytest.mark.parametrize("name", list(CASES))
def test_variables_decode_as_xarray_decodes_them(netcdf: Path, name: str) -> None:
    with xr.open_dataset(netcdf, engine="h5netcdf") as ds:
        expected = ds[name].values
    source = af.open_array(netcdf, name)
    assert source.dtype == expected.dtype
    _assert_same(source.read(np.arange(N, dtype=np.int64)), expected)
    rows = np.array([0, 7, 8, 30], dtype=np.int64)
    _assert_same(source.read(rows), expected[rows])


@pytest.mark.parametrize("name", list(CASES))
def test_decode_cf_false_gives_the_stored_values(netcdf: Path, name: str) -> None:
    with xr.open_dataset(netcdf, engine="h5netcdf", decode_cf=False, mask_and_scale=False) as ds:
        expected = ds[name].values
    source = af.open_array(netcdf, name, decode_cf=False)
    _assert_same(source.read(np.arange(N, dtype=np.int64)), expected)


def test_masked_values_are_nan_and_packing_is_undone(tmp_path: Path) -> None:
    """A packed, masked variable by hand: stored [-2 30 14 24], fill -2, scale 0.5, offset 1."""
    path = tmp_path / "small.nc"
    with h5py.File(path, "w") as f:
        var = f.create_dataset("t", data=np.array([-2, 30, 14, 24], np.int16))
        var.attrs["_FillValue"] = np.array([-2], np.int16)
        var.attrs["scale_factor"] = np.array([0.5], np.float32)
        var.attrs["add_offset"] = np.array([1.0], np.float32)
    got = af.open_array(path, "t").read(np.arange(4, dtype=np.int64))
    np.testing.assert_array_equal(got, np.array([np.nan, 16, 8, 13], np.float32))
    assert got.dtype == np.float32


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_from_arrays_streams_decoded_values(netcdf: Path, shuffle: bool | str) -> None:
    with xr.open_dataset(netcdf, engine="h5netcdf") as ds:
        expected = ds["i2_f4_packed_fill"].values
    ids = netcdf.with_name("ids.h5")  # row ids, chunked like the variable: the same blocks
    with h5py.File(ids, "w") as f:
        f.create_dataset("id", data=np.arange(N), chunks=(8,))
    stream = af.batches(
        (f"{netcdf}:i2_f4_packed_fill", f"{ids}:id"), batch_size=16, shuffle=shuffle, seed=2
    )
    seen = []
    for values, rows in stream:
        _assert_same(values, expected[rows])
        seen += rows.tolist()
    assert sorted(seen) == list(range(N))


def test_a_netcdf3_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "classic.nc"
    xr.Dataset({"v": (("t",), np.arange(5.0))}).to_netcdf(path, engine="scipy")  # netCDF3
    with pytest.raises(af.SourceUnavailableError, match=r"netCDF3.*to_netcdf"):
        af.open_array(path, "v")


def test_string_fill_value_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "odd.nc"
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=np.arange(4, dtype=np.int16)).attrs["_FillValue"] = "none"
    with pytest.raises(af.SourceUnavailableError, match="decode_cf=False"):
        af.open_array(path, "v")
    assert af.open_array(path, "v", decode_cf=False).dtype == np.int16
