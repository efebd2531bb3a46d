"""``arrayfeed.inspect``: layouts, verdicts and the fix command."""

from __future__ import annotations

import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed.storage import written_by_arrayfeed


def test_converted_stores_are_suited(tmp_path: Path) -> None:
    x, y = np.zeros((5000, 32, 32, 3), np.uint8), np.arange(5000)
    for name, kwargs in [
        ("plain.h5", {}),
        ("fast.h5", {"compression": "lzf"}),
        ("s.zarr", {"shuffle": True, "seed": 3}),
    ]:
        af.convert({"images": x, "labels": y}, tmp_path / name, progress=False, **kwargs)
        report = af.inspect(tmp_path / name)
        assert report.suited and report.problems == () and report.fixes == ()
        assert report.record == written_by_arrayfeed(tmp_path / name)
        assert [a.name for a in report.arrays] == ["images", "labels"]
        text = str(report)
        assert "Layout: suited to shuffled batch reads." in text
        assert "written by arrayfeed" in text and "Fix" not in text
    text = str(af.inspect(tmp_path / "s.zarr"))
    assert "chunks of 256 rows, no compression, shuffled with seed 3" in text
    assert "(256, 32, 32, 3)" in text
    plain = af.inspect(tmp_path / "plain.h5")
    assert plain.format == "HDF5" and plain.arrays[0].chunks is None
    assert "contiguous" in str(plain)


def test_bad_hdf5_layout_and_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "raw data.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "train/images",
            data=np.zeros((2000, 16, 16), np.uint8),
            chunks=(1, 16, 16),
            compression="gzip",
        )
        f.create_dataset("train/labels", data=np.arange(2000), chunks=(2000,))
        f.create_dataset("classes", data=np.arange(10))
        f.create_dataset("scalar", data=3.0)
    report = af.inspect(path)
    assert not report.suited
    layouts = {a.name: a for a in report.arrays}
    assert list(layouts) == ["classes", "scalar", "train/images", "train/labels"]
    assert layouts["train/images"].compression == "gzip(4)"
    assert layouts["train/images"].chunks == (1, 16, 16)
    text = str(report)
    assert "Layout: NOT suited to shuffled batch reads:" in text
    assert any("different row blocks" in p for p in report.problems)
    assert any("`train/images`: chunks of 1 rows hold 256 B" in p for p in report.problems)
    assert any("0-d" in n for n in report.notes)
    assert any("gzip decodes" in n for n in report.notes)
    # one command per length; the main group first, with a fast compression since it was compressed
    assert len(report.fixes) == 2
    words = shlex.split(report.fixes[0])
    assert words[:2] == ["arrayfeed", "convert"]
    assert words[2:4] == [f"train/images={path}:train/images", f"train/labels={path}:train/labels"]
    assert words[4:] == ["-o", str(tmp_path / "raw data.arrayfeed.h5"), "--compression", "lzf"]
    assert shlex.split(report.fixes[1])[2:] == [
        f"classes={path}:classes",
        "-o",
        str(tmp_path / "raw data.arrayfeed-2.h5"),
    ]
    assert "Fix: convert it with\n  arrayfeed convert" in text


def test_fix_command_gives_a_suited_layout(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    g = zarr.open_group(str(path), mode="w")
    g.create_array("x", data=np.ones((3000, 64), np.float32), chunks=(3000, 8))
    g.create_array("y", data=np.arange(3000), chunks=(100,))
    report = af.inspect(path)
    assert not report.suited and report.format == "Zarr v3"
    assert any("split each row into 8 pieces" in p for p in report.problems)
    words = shlex.split(report.fixes[0])
    inputs = dict(w.split("=", 1) for w in words[2:4])
    af.convert(inputs, words[5], compression=words[7], progress=False)
    assert af.inspect(words[5]).suited


def test_npy_npz_and_lone_zarr_arrays(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((10, 3)))
    np.savez_compressed(tmp_path / "d.npz", a=np.zeros((10, 3)), b=np.zeros(10))
    zarr.create_array(str(tmp_path / "lone.zarr"), data=np.zeros((1000, 10)), chunks=(1, 10))
    npy = af.inspect(tmp_path / "x.npy")
    assert npy.suited and npy.format == ".npy" and npy.arrays[0].name == ""
    npz = af.inspect(tmp_path / "d.npz")
    assert not npz.suited and "cannot be memory-mapped" in npz.problems[0]
    assert npz.arrays[0].compression == "deflate" and npz.arrays[0].loads_whole
    assert shlex.split(npz.fixes[0])[2:] == [
        f"a={tmp_path}/d.npz:a",
        f"b={tmp_path}/d.npz:b",
        "-o",
        f"{tmp_path}/d.arrayfeed.h5",
        "--compression",
        "lzf",
    ]
    lone = af.inspect(tmp_path / "lone.zarr")
    assert not lone.suited
    assert shlex.split(lone.fixes[0])[2] == f"lone={tmp_path}/lone.zarr"


def test_missing_chunks(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.zarr"
    g = zarr.open_group(str(foreign), mode="w")
    a = g.create_array("x", shape=(1000,), dtype="int64", chunks=(250,))
    a[:500] = 1  # the other chunks hold only the fill value: not stored
    report = af.inspect(foreign)
    assert report.arrays[0].missing_chunks == 2 and not report.arrays[0].strict
    assert any("fill value" in n for n in report.notes)

    ours = tmp_path / "ours.zarr"
    af.convert({"x": np.zeros((1000, 128))}, ours, chunk_rows=250, progress=False)
    assert af.inspect(ours).suited
    (ours / "x" / "c" / "3" / "0").unlink()  # lose one chunk
    report = af.inspect(ours)
    assert (
        not report.suited and "missing from a store arrayfeed wrote complete" in report.problems[0]
    )


def test_not_inspectable(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "file").write_text("hello")
    with pytest.raises(af.SourceNotFoundError, match="nothing at"):
        af.inspect(tmp_path / "missing.h5")
    with pytest.raises(af.SourceNotFoundError, match="is not an HDF5 file, Zarr store"):
        af.inspect(tmp_path / "notes.txt")
    with pytest.raises(af.SourceNotFoundError, match="not a Zarr store"):
        af.inspect(tmp_path / "dir")


def test_doctests() -> None:
    import doctest

    from arrayfeed._conversion import inspect as _inspect

    assert doctest.testmod(_inspect, optionflags=doctest.ELLIPSIS).failed == 0


def _odd_file(path: Path) -> None:
    """Datasets other tools write and this machine cannot read, next to a good one."""
    with h5py.File(path, "w") as f:
        f.create_dataset("good", data=np.zeros((1000, 64), np.float32), chunks=(256, 64))
        space = h5py.h5s.create_simple((10,))
        h5py.h5d.create(f.id, b"time", h5py.h5t.UNIX_D32LE, space)  # no NumPy equivalent
        quad = h5py.h5t.IEEE_F64LE.copy()  # a 128-bit float: "Insufficient precision"
        quad.set_size(16)
        quad.set_precision(128)
        quad.set_fields(127, 112, 15, 0, 112)
        quad.set_ebias(16383)
        h5py.h5d.create(f.id, b"quad", quad, space)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((5,))
        dcpl.set_filter(32099, h5py.h5z.FLAG_OPTIONAL, (1,))  # a filter with no plugin here
        table = np.dtype([("a", "f4"), ("b", "i2")])
        h5py.h5d.create(f.id, b"table", h5py.h5t.py_create(table), space, dcpl=dcpl)


def test_unreadable_datasets_are_listed_with_their_reason(tmp_path: Path) -> None:
    path = tmp_path / "odd.h5"
    _odd_file(path)
    report = af.inspect(path)  # does not abort on the first unreadable dataset
    by_name = {a.name: a for a in report.arrays}
    assert set(by_name) == {"good", "time", "quad", "table"}
    assert by_name["good"].unreadable is None
    assert "TypeTimeID" in (by_name["time"].unreadable or "")
    assert "precision" in (by_name["quad"].unreadable or "")
    assert "filter 32099" in (by_name["table"].unreadable or "")  # a table is not "suited" now
    assert not report.suited
    text = str(report)
    assert "unreadable" in text and "cannot be read here" in text
    for fix in report.fixes:  # never proposes converting what cannot be read
        assert "time" not in fix and "quad" not in fix and "table" not in fix


def test_tables_are_described_with_their_fields(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=np.zeros(100, [("a", "f4"), ("b", "i2")]), chunks=(50,))
    report = af.inspect(path)
    assert any("is a table" in n and "fields a, b" in n and "t#FIELD" in n for n in report.notes)
    assert all(":t " not in fix for fix in report.fixes)


def test_netcdf_dimension_placeholders_are_not_arrays(tmp_path: Path) -> None:
    path = tmp_path / "vars.nc"
    with h5py.File(path, "w") as f:
        for dim, size in (("time", 100), ("lat", 4)):
            scale = f.create_dataset(dim, shape=(size,), dtype="f4")
            scale.make_scale(f"This is a netCDF dimension but not a netCDF variable.{size:10d}")
        var = f.create_dataset("t2m", data=np.zeros((100, 4), np.int16), chunks=(10, 4))
        var.dims[0].attach_scale(f["time"])
        var.dims[1].attach_scale(f["lat"])
    report = af.inspect(path)
    assert [a.name for a in report.arrays] == ["t2m"]
    assert all("time=" not in fix and "lat=" not in fix for fix in report.fixes)
    assert af.open_array(path).shape == (100, 4)  # the one variable, without naming it


def test_one_array_is_judged_alone(tmp_path: Path) -> None:
    """``path:key`` reports that array, its problems as read alone, and the fix for it alone."""
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=np.zeros((4000, 64), np.float32), chunks=(8, 64))
        f.create_dataset("train/y", data=np.arange(4000), chunks=(4000,))
    whole = af.inspect(path)
    x = af.inspect(f"{path}:train/x")
    assert (x.path, x.key, [a.name for a in x.arrays]) == (path, "train/x", ["train/x"])
    assert x.arrays[0] == next(a for a in whole.arrays if a.name == "train/x")
    assert not x.suited and all("train/y" not in p for p in x.problems)
    assert shlex.split(x.fixes[0])[2:4] == [f"train/x={path}:train/x", "-o"]
    assert str(x).startswith(f"{path}:train/x: HDF5, 1 array, 1000.0 KiB stored\n")
    y = af.inspect(f"{path}:/train/y")  # with HDF5's leading '/'
    assert y.key == "train/y" and y.suited and y.fixes == ()
    with pytest.raises(af.SourceNotFoundError, match=r"its arrays are \['train/x', 'train/y'\]"):
        af.inspect(f"{path}:train")


def test_one_array_of_a_converted_store_keeps_its_record(tmp_path: Path) -> None:
    out = tmp_path / "c.zarr"
    af.convert({"x": np.zeros((100, 4)), "y": np.arange(100)}, out, progress=False)
    report = af.inspect(f"{out}:y")
    assert report.record == written_by_arrayfeed(out) and report.suited
    assert "(written by arrayfeed" in str(report).splitlines()[0]
    np.save(tmp_path / "lone.npy", np.zeros(3))
    with pytest.raises(af.SourceNotFoundError, match=r"holds one array, .* drop ':x'"):
        af.inspect(f"{tmp_path}/lone.npy:x")
