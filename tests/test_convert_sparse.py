"""``convert`` copies sparse CSR matrices as CSR: AnnData's ``csr_matrix`` group, verified.

Every copy is checked three ways: its rows (read dense through arrayfeed) equal the input's rows
in the order the record gives; the group reads back as the same ``scipy.sparse`` matrix with
anndata's own reader; and ``arrayfeed verify`` passes, then fails once a byte is flipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anndata.io
import h5py
import numpy as np
import pytest
import scipy.sparse
import zarr

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._conversion.inputs import Parts
from arrayfeed._storage import SparseRows
from arrayfeed.testing import assert_same_rows
from tests._anndata import random_csr, write_anndata_zarr, write_h5ad

ROWS, COLS = 900, 70


@pytest.fixture(scope="module")
def matrix() -> scipy.sparse.csr_matrix:
    return random_csr(ROWS, COLS, 0.06, seed=4)


def _inputs(kind: str, matrix: Any, tmp: Path) -> Any:
    """The same matrix as each kind of input ``convert`` takes."""
    if kind == "scipy":
        return matrix
    if kind == "h5ad":  # small chunks, gzip: slow to gather at random, so a shuffle stages it
        return f"{write_h5ad(tmp / 'm.h5ad', matrix, compression='gzip')}:X"
    if kind == "zarr":
        return f"{write_anndata_zarr(tmp / 'm.zarr', matrix)}:X"
    half = ROWS // 3  # two parts, concatenated
    return [matrix[:half], f"{write_h5ad(tmp / 'rest.h5ad', matrix[half:])}:X"]


def _stored(path: Path, name: str) -> scipy.sparse.csr_matrix:
    """The group ``name`` read by anndata's own reader."""
    if path.suffix == ".zarr":
        return anndata.io.read_elem(zarr.open_group(str(path), mode="r")[name])
    with h5py.File(path, "r") as f:
        return anndata.io.read_elem(f[name])


def _order(path: Path) -> np.ndarray:
    return af.open_array(path, "ids").read(np.arange(ROWS, dtype=np.int64))


@pytest.mark.parametrize("kind", ["scipy", "h5ad", "zarr", "parts"])
@pytest.mark.parametrize(
    ("output", "compression", "shuffle"),
    [
        ("o.h5", None, False),
        ("o.h5", "lzf", True),
        ("o.zarr", "gzip", True),
        ("o.zarr", None, False),
    ],
)
def test_a_csr_matrix_is_copied_as_csr(
    tmp_path: Path, matrix: Any, kind: str, output: str, compression: str | None, shuffle: bool
) -> None:
    out = tmp_path / output
    record = af.convert(
        {"x": _inputs(kind, matrix, tmp_path), "ids": np.arange(ROWS)},
        out,
        compression=compression,
        shuffle=shuffle,
        seed=7 if shuffle else None,
        progress=False,
    )
    assert record.sparse == {"x": (COLS, matrix.nnz)}
    assert record.arrays == ("ids", "x")
    assert set(record.checksums) == {"ids", "x/data", "x/indices", "x/indptr"}
    order = _order(out)
    assert shuffle != bool(np.array_equal(order, np.arange(ROWS)))
    source = af.open_array(out, "x")
    assert isinstance(source, SparseRows) and source.shape == (ROWS, COLS)
    assert_same_rows(source.read(np.arange(ROWS, dtype=np.int64)), matrix.toarray()[order])
    copy = _stored(out, "x")
    assert isinstance(copy, scipy.sparse.csr_matrix) and copy.has_canonical_format
    assert (copy != matrix[order]).nnz == 0
    assert copy.indices.dtype == np.int32 and copy.data.dtype == matrix.dtype
    assert af.verify(out, progress=False).arrays == ("ids", "x")


def test_the_copy_streams_like_the_input(tmp_path: Path, matrix: Any) -> None:
    out = tmp_path / "o.zarr"
    af.convert({"x": matrix, "y": np.arange(ROWS)}, out, compression="lzf", progress=False)
    for shuffle in (True, "block"):
        seen = []
        for xb, yb in af.batches(f"{out}:x", f"{out}:y", batch_size=64, shuffle=shuffle, seed=3):
            assert_same_rows(xb, matrix[yb].toarray())
            seen.append(yb)
        assert sorted(np.concatenate(seen).tolist()) == list(range(ROWS))


def test_every_stored_entry_is_kept_with_columns_sorted(tmp_path: Path) -> None:
    """Unsorted columns are sorted within their row; repeated entries are kept as stored
    (summed when read, as scipy does), so the copy is the same matrix entry for entry."""
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], np.float32)
    indices = np.array([3, 0, 3, 2, 1, 1], np.int32)  # row 0: 3, 0, 3; row 2: 2, 1, 1
    indptr = np.array([0, 3, 3, 6])
    odd = scipy.sparse.csr_matrix((data, indices, indptr), shape=(3, 4))
    assert not odd.has_canonical_format
    out = tmp_path / "o.h5"
    af.convert({"x": odd}, out, progress=False)
    with h5py.File(out, "r") as f:
        assert f["x/indices"][:].tolist() == [0, 3, 3, 1, 1, 2]
        assert f["x/data"][:].tolist() == [2.0, 1.0, 3.0, 5.0, 6.0, 4.0]
        assert f["x/indptr"][:].tolist() == [0, 3, 3, 6]
    assert_same_rows(af.open_array(out, "x").read(np.arange(3)), odd.toarray())


@pytest.mark.parametrize("output", ["o.h5", "o.zarr"])
def test_matrices_without_entries(tmp_path: Path, output: str) -> None:
    empty = scipy.sparse.csr_matrix((50, 8), dtype=np.float32)
    out = tmp_path / output
    af.convert({"x": empty, "y": np.arange(50)}, out, compression="lzf", progress=False)
    assert af.open_array(out, "x").read(np.arange(50)).tolist() == np.zeros((50, 8)).tolist()
    assert _stored(out, "x").nnz == 0
    af.verify(out, progress=False)


def test_the_layout_lines_up_with_the_dense_arrays(tmp_path: Path) -> None:
    """Chunks of ``data``/``indices`` hold about as many rows as the dense arrays' chunks."""
    big = random_csr(20_000, 200, 0.05, seed=2)
    out = tmp_path / "o.zarr"
    record = af.convert({"x": big, "y": np.arange(20_000)}, out, progress=False)
    group = zarr.open_group(str(out), mode="r")
    per_row = -(-big.nnz // 20_000)
    assert record.chunk_rows is not None
    assert group["x/data"].chunks == (record.chunk_rows * per_row,)
    assert group["y"].chunks == (record.chunk_rows,)
    source = af.open_array(out, "x")
    assert source.chunk_rows is not None
    assert abs(source.chunk_rows - record.chunk_rows) <= record.chunk_rows // 8
    assert json.loads(json.dumps(dict(group["x"].attrs))) == {
        "encoding-type": "csr_matrix",
        "encoding-version": "0.1.0",
        "shape": [20_000, 200],
    }


def test_densify_still_writes_dense(tmp_path: Path, matrix: Any) -> None:
    out = tmp_path / "o.h5"
    record = af.convert({"x": matrix}, out, densify=True, progress=False)
    assert record.sparse == {} and record.arrays == ("x",)
    with h5py.File(out, "r") as f:
        assert isinstance(f["x"], h5py.Dataset) and f["x"].shape == (ROWS, COLS)


def test_mixing_sparse_and_dense_parts_is_refused(tmp_path: Path, matrix: Any) -> None:
    with pytest.raises(af.StructureError, match="concatenates sparse matrices and dense arrays"):
        af.convert({"x": [matrix, matrix.toarray()]}, tmp_path / "o.h5", progress=False)
    assert not (tmp_path / "o.h5").exists()


def test_a_matrix_that_changes_while_copied_is_refused(
    tmp_path: Path, matrix: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries read for each slab must match the ``indptr`` planned at the start."""
    real = Parts.row_lengths

    def stale(self: Parts) -> np.ndarray:
        lengths = real(self).copy()
        lengths[[10, 11]] += [1, -1]  # same total: only the per-row check can see it
        return lengths

    monkeypatch.setattr(Parts, "row_lengths", stale)
    with pytest.raises(af.CorruptDataError, match=r"`x` \(a sparse matrix\) changed while"):
        af.convert({"x": matrix}, tmp_path / "o.zarr", progress=False)
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("part", ["data", "indices", "indptr"])
def test_verify_finds_a_flipped_byte_in_each_array(tmp_path: Path, matrix: Any, part: str) -> None:
    out = tmp_path / "o.h5"  # contiguous: only the record's CRC-32 protects it
    af.convert({"x": matrix}, out, progress=False)
    with h5py.File(out, "r+") as f:
        values = f[f"x/{part}"][:]
        values[len(values) // 2] += 1
        f[f"x/{part}"][:] = values
    with pytest.raises(af.CorruptDataError, match=rf"`x/{part}`.*CRC-32"):
        af.verify(out, progress=False)


def test_verify_finds_a_group_that_no_longer_reads_as_the_matrix(
    tmp_path: Path, matrix: Any
) -> None:
    out = tmp_path / "o.zarr"
    af.convert({"x": matrix}, out, progress=False)
    group = zarr.open_group(str(out), mode="r+")
    group["x"].attrs["shape"] = [ROWS, COLS + 1]
    with pytest.raises(af.CorruptDataError, match=r"`x`.*does not read as the sparse matrix"):
        af.verify(out, progress=False)


def test_cli_copies_as_csr_and_densifies_on_request(
    tmp_path: Path, matrix: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_h5ad(tmp_path / "m.h5ad", matrix)
    assert main(["convert", f"x={path}:X", "-o", str(tmp_path / "o.zarr")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (_stored(tmp_path / "o.zarr", "x") != matrix).nnz == 0
    assert main(["convert", f"x={path}:X", "-o", str(tmp_path / "d.h5"), "-q", "--densify"]) == 0
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert_same_rows(f["x"][:], matrix.toarray())
    assert main(["verify", str(tmp_path / "o.zarr")]) == 0
    assert f"OK, 1 array of {ROWS:,} rows" in capsys.readouterr().out  # a matrix, not 3 arrays


# anndata writes consolidated metadata into Zarr v3 stores, which zarr warns about, and warns
# of its own coming defaults.
@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
@pytest.mark.filterwarnings("ignore:zarr v3 autosharding:UserWarning")
@pytest.mark.parametrize("written", ["real.h5ad", "real.zarr"])
def test_a_real_anndata_file_converts_and_trains(tmp_path: Path, matrix: Any, written: str) -> None:
    """A file written by anndata itself, with a categorical label, read in place, copied as CSR
    and fed to Keras."""
    import pandas as pd

    labels = pd.Categorical(np.where(np.arange(ROWS) % 3 == 0, "B", "T"))
    obs = pd.DataFrame({"cell_type": labels}, index=[f"c{i}" for i in range(ROWS)])
    adata = anndata.AnnData(X=matrix, obs=obs)
    real = tmp_path / written
    if written.endswith(".h5ad"):
        adata.write_h5ad(real)
    else:
        with anndata.settings.override(zarr_write_format=3):
            adata.write_zarr(real)
    in_place = af.open_array(real, "X")
    assert_same_rows(in_place.read(np.arange(ROWS, dtype=np.int64)), matrix.toarray())
    assert af.open_array(real, "obs/cell_type").categories == ("B", "T")  # type: ignore[attr-defined]
    out = tmp_path / "train.zarr"
    af.convert(
        {"x": f"{real}:X", "y": f"{real}:obs/cell_type"},
        out,
        shuffle=True,
        seed=2,
        progress=False,
    )
    back = anndata.io.read_elem(zarr.open_group(str(out), mode="r")["x"])
    codes = af.open_array(out, "y").read(np.arange(ROWS))
    assert back.shape == matrix.shape and back.nnz == matrix.nnz
    assert set(np.unique(codes)) == {0, 1}
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((COLS,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(
        af.from_arrays(x=f"{out}:x", y=f"{out}:y", batch_size=64, shuffle="block", seed=0),
        epochs=2,
        verbose=0,
    )
    assert np.isfinite(history.history["loss"]).all()


def test_inspect_proposes_copying_the_matrix_as_csr(tmp_path: Path, matrix: Any) -> None:
    """The fix ``inspect`` prints names the matrix (never its arrays), and running it copies
    the matrix as CSR beside the other arrays of its rows."""
    import shlex

    path = write_h5ad(tmp_path / "m.h5ad", matrix)
    with h5py.File(path, "r+") as f:  # tiny chunks: a layout problem, so a fix is proposed
        f.create_dataset("obsm/X_umap", data=np.ones((ROWS, 2), np.float32), chunks=(8, 2))
    report = af.inspect(path)
    assert not report.suited and len(report.fixes) == 1
    words = shlex.split(report.fixes[0])
    assert f"X={path}:X" in words and not any("X/" in w for w in words)
    assert main([*words[1:], "-q"]) == 0
    out = Path(words[words.index("-o") + 1])
    assert (_stored(out, "X") != matrix).nnz == 0
    assert af.inspect(out).suited


def test_an_opened_array_of_a_matrix_is_refused_as_rows(tmp_path: Path, matrix: Any) -> None:
    pca = np.ones((ROWS, 3), np.float32)
    h5ad = write_h5ad(tmp_path / "m.h5ad", matrix, obsm={"X_pca": pca})
    store = write_anndata_zarr(tmp_path / "m.zarr", matrix)
    with h5py.File(h5ad, "r") as f:
        for part in ("data", "indices", "indptr"):
            with pytest.raises(af.StructureError, match=rf"`{part}` array of the sparse matrix"):
                af.convert({"x": f[f"X/{part}"]}, tmp_path / "o.h5", progress=False)
        af.convert({"pca": f["obsm/X_pca"]}, tmp_path / "ok.h5", progress=False)  # a plain array
    assert af.open_array(tmp_path / "ok.h5", "pca").shape == pca.shape
    group = zarr.open_group(str(store), mode="r")
    with pytest.raises(af.StructureError, match=r"`indices` array of the sparse matrix 'X'"):
        af.convert({"x": group["X/indices"]}, tmp_path / "o.h5", progress=False)
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("output", ["o.h5", "o.zarr"])
def test_a_store_without_a_key_names_matrices_whole(tmp_path: Path, output: str) -> None:
    """Without a key: a store's only matrix opens; otherwise the error names it, not its
    arrays."""
    m = random_csr(50, 9, 0.2, seed=5)
    alone, both = tmp_path / f"alone-{output}", tmp_path / output
    af.convert({"x": m}, alone, progress=False)
    af.convert({"x": m, "y": np.arange(50)}, both, progress=False)
    source = af.open_array(alone)
    assert isinstance(source, SparseRows) and source.shape == (50, 9)
    with pytest.raises(af.SourceNotFoundError, match=r"\['x', 'y'\]"):
        af.open_array(both)
