"""Input specs, globs, streamed .npz members and concatenated parts."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

from arrayfeed._conversion.inputs import Parts, open_input
from arrayfeed._errors import ConfigError, DtypeError, ShapeError, SourceNotFoundError
from arrayfeed._storage import split_spec
from arrayfeed._storage.npy.files import NpzMemberSource
from arrayfeed._storage.npy.memory import ArraySource


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("x.npy", ("x.npy", None)),
        ("d/train.npz:images", ("d/train.npz", "images")),
        ("train.H5:group/x", ("train.H5", "group/x")),
        ("a.hdf5:x", ("a.hdf5", "x")),
        ("s.zarr", ("s.zarr", None)),
        ("s.zarr:", ("s.zarr", None)),
        ("shards/*.zarr:x", ("shards/*.zarr", "x")),
        ("dir.h5.d/f.h5:x", ("dir.h5.d/f.h5", "x")),
        ("data.nc:temperature", ("data.nc", "temperature")),  # any HDF5 file
        ("plain", ("plain", None)),
    ],
)
def test_split_spec(spec: str, expected: tuple[str, str | None]) -> None:
    assert split_spec(spec) == expected


def test_glob_is_sorted_lexicographically(tmp_path: Path) -> None:
    for i in (10, 2, 1):
        np.save(tmp_path / f"part-{i}.npy", np.full((i, 2), i, np.int32))
    parts = open_input("x", str(tmp_path / "part-*.npy"))
    assert [len(s) for s in parts.sources] == [1, 10, 2]  # part-1, part-10, part-2
    assert parts.read_run(0, 13)[:, 0].tolist() == [1] + [10] * 10 + [2] * 2


def test_glob_with_a_key(tmp_path: Path) -> None:
    for i in range(2):
        with h5py.File(tmp_path / f"s{i}.h5", "w") as f:
            f["x"] = np.full((3,), i)
            f["other"] = np.zeros(5)
    parts = open_input("x", f"{tmp_path}/s*.h5:x")
    assert parts.read_run(0, 6).tolist() == [0, 0, 0, 1, 1, 1]
    parts.close()


def test_glob_without_matches(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"`inputs\['x'\]`: no file matches the pattern"):
        open_input("x", str(tmp_path / "nothing-*.npy"))


def test_literal_names_win_over_spec_syntax(tmp_path: Path) -> None:
    odd = tmp_path / "a:b*.npy"
    np.save(odd, np.arange(3))
    assert open_input("x", str(odd)).read_run(0, 3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npz_members_stream(tmp_path: Path, compressed: bool, order: str) -> None:
    x = (
        np.asfortranarray(np.arange(60.0).reshape(20, 3))
        if order == "F"
        else np.arange(60.0).reshape(20, 3)
    )
    path = tmp_path / "d.npz"
    (np.savez_compressed if compressed else np.savez)(path, x=x, y=np.arange(20))
    src = NpzMemberSource(path, "x")
    assert src.shape == (20, 3) and src.dtype == np.float64 and len(src) == 20
    assert np.array_equal(src.read_run(5, 9), x[5:9])
    assert np.array_equal(src.read_run(0, 2), x[0:2])  # backwards seek
    assert np.array_equal(src.read(np.array([1, 4, 7])), x[[1, 4, 7]])
    src.close()


def test_npz_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, a=np.zeros(3), b=np.zeros(3))
    with pytest.raises(SourceNotFoundError, match=r"has no array 'c'; it holds \['a', 'b'\]"):
        NpzMemberSource(path, "c")
    with pytest.raises(SourceNotFoundError, match="has no array None"):
        NpzMemberSource(path, None)  # ambiguous
    np.savez(tmp_path / "one.npz", only=np.arange(4))
    assert NpzMemberSource(tmp_path / "one.npz", None).key == "only"


def test_parts_concatenate_and_gather() -> None:
    a, b = np.arange(10).reshape(5, 2), np.arange(10, 16).reshape(3, 2)
    parts = Parts("x", [ArraySource(a), ArraySource(np.zeros((0, 2), int)), ArraySource(b)])
    full = np.concatenate([a, b])
    assert parts.shape == (8, 2) and parts.n_rows == 8
    for start, stop in [(0, 8), (3, 7), (5, 6), (6, 8)]:
        assert np.array_equal(parts.read_run(start, stop), full[start:stop])
    idx = np.array([7, 0, 5, 4, 2], dtype=np.int64)
    assert np.array_equal(parts.gather(idx), full[idx])


def test_parts_from_slow_sources_gather_too(tmp_path: Path) -> None:
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("x", data=np.arange(20), chunks=(4,))
    parts = open_input("x", [f"{tmp_path}/s.zarr:x", np.arange(20, 25)])
    assert not parts.gatherable
    idx = np.array([24, 3, 19, 0, 7], dtype=np.int64)
    assert parts.gather(idx).tolist() == idx.tolist()


def test_parts_convert_byte_order() -> None:
    parts = Parts(
        "x", [ArraySource(np.arange(4, dtype=">i4")), ArraySource(np.arange(2, dtype="<i4"))]
    )
    rows = parts.read_run(0, 6)
    assert rows.dtype == np.dtype("=i4") and rows.tolist() == [0, 1, 2, 3, 0, 1]


def test_parts_refuse_mismatches() -> None:
    with pytest.raises(
        ShapeError, match=r"`x\[1\]` has rows of shape \(3,\) but `x\[0\]` has \(2,\)"
    ):
        Parts("x", [ArraySource(np.zeros((2, 2))), ArraySource(np.zeros((2, 3)))])
    with pytest.raises(
        DtypeError, match=r"has dtype float32 but `x\[0\]` has float64; cast the parts"
    ):
        Parts("x", [ArraySource(np.zeros((2, 2))), ArraySource(np.zeros((2, 2), np.float32))])
    with pytest.raises(ShapeError, match="is 0-d"):
        Parts("x", [ArraySource(np.float64(1.0).reshape(()))])
    with pytest.raises(ShapeError, match="hold no data"):
        Parts("x", [ArraySource(np.zeros((4, 0)))])
    with pytest.raises(DtypeError, match="dtype object"):
        Parts("x", [ArraySource(np.array([None, 1], dtype=object))])


def test_open_input_names_the_input(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"^`inputs\['x'\]`: nothing at '.*missing.npy'"):
        open_input("x", str(tmp_path / "missing.npy"))
    with pytest.raises(ConfigError, match=r"`inputs\['x'\]` is an empty list"):
        open_input("x", [])
    with pytest.raises(
        ConfigError, match=r"holds a value of type dict, which is not an array-like"
    ):
        open_input("x", {"a": 1})
    with pytest.raises(ConfigError, match=r"type int.*wrap a list of numbers in np.asarray"):
        open_input("y", [0, 1, 2])
    with pytest.raises(ShapeError, match=r"`inputs\['y'\]\[1\]` .*is 0-d"):
        open_input("y", [np.arange(3), np.int64(5)])


def test_doctests() -> None:
    import doctest

    from arrayfeed._conversion import inputs as _inputs

    assert doctest.testmod(_inputs, optionflags=doctest.ELLIPSIS).failed == 0
