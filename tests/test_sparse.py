"""Sparse CSR rows: ``scipy.sparse`` matrices and AnnData CSR groups (HDF5, Zarr), read through
``indptr`` into dense rows, or as sparse batches with ``sparse=True``.

Every stream is checked against the stream of a dense copy of the same matrix: the same seed,
shuffle mode, shard and resume position give the same batches, value for value.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import pytest
import scipy.sparse
import zarr

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._storage import GatherInto, Source, SparseRows, chunked_rows, open_for_copy
from arrayfeed._storage.sparse.csr import GATHER_CHUNK_BYTES
from arrayfeed._storage.sparse.rows import plan_spans, ragged_arange, repeats
from arrayfeed.testing import SourceTests, assert_same_rows
from tests._anndata import random_csr, write_anndata_zarr, write_h5ad


def _csr_parts(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(data, indices, indptr)`` of every entry whose bits are not all zero (so ``-0.0`` and
    NaN payloads are stored and must come back bit for bit)."""
    bits = dense.view(f"u{dense.dtype.itemsize}") if dense.dtype.kind != "b" else dense
    rows, cols = np.nonzero(bits)
    indptr = np.zeros(len(dense) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(dense)), out=indptr[1:])
    return dense[rows, cols], cols.astype(np.int32), indptr


def _sparse_data(dense: np.ndarray) -> np.ndarray:
    """``dense`` with three entries in four zeroed, and every seventh row empty."""
    out = dense.copy()
    rng = np.random.default_rng(11)
    out[rng.random(out.shape) < 0.75] = 0
    out[::7] = 0
    return out


# -- the conformance suite, over every way a CSR matrix is stored --------------------------------
class CSRTests(SourceTests):
    dtypes: ClassVar[tuple[str, ...]] = ("float32", ">f4", "float16", "int64", "uint8", "bool")
    row_shapes: ClassVar[tuple[tuple[int, ...], ...]] = ((9,), (1,), (40,))
    #: Whether the source should gather rows in any order (memory, memory maps).
    gathers: ClassVar[bool] = False

    def data(
        self, dtype: str | None = None, row_shape: tuple[int, ...] | None = None
    ) -> np.ndarray:
        return _sparse_data(super().data(dtype, row_shape))

    def write(self, parts: tuple[np.ndarray, ...], shape: tuple[int, int], tmp: Path) -> Source:
        raise NotImplementedError

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        source = self.write(_csr_parts(data), data.shape, tmp_path)
        assert isinstance(source, SparseRows)
        assert isinstance(source, GatherInto) == self.gathers
        return source

    def test_read_csr_is_canonical(self, open_source: Any) -> None:
        data = self.data()
        source = open_source(data)
        idx = np.arange(0, len(data), 3, dtype=np.int64)
        indptr, cols, values = source.read_csr(idx)
        got = scipy.sparse.csr_array((values, cols, indptr), shape=(len(idx), data.shape[1]))
        assert got.has_canonical_format
        # Placed by hand: scipy's toarray() adds, which quiets signalling NaNs.
        dense = np.zeros((len(idx), data.shape[1]), dtype=values.dtype)
        dense[np.repeat(np.arange(len(idx)), np.diff(indptr)), cols] = values
        assert_same_rows(dense, data[idx], "read_csr")


class TestScipyCSR(CSRTests):
    gathers = True

    def write(self, parts: tuple[np.ndarray, ...], shape: tuple[int, int], tmp: Path) -> Source:
        data, indices, indptr = parts
        matrix = scipy.sparse.csr_array((data, indices, indptr), shape=shape)
        return af.open_array(matrix)


class TestH5adCSR(CSRTests):
    """As anndata writes it: resizable (so chunked) datasets, read through h5py's chunks; small
    chunks, so batches are gathered."""

    gathers = True

    def write(self, parts: tuple[np.ndarray, ...], shape: tuple[int, int], tmp: Path) -> Source:
        with h5py.File(tmp / "data.h5ad", "w") as f:
            group = f.create_group("X")
            group.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
            group.attrs["shape"] = np.asarray(shape)
            for name, array in zip(("data", "indices", "indptr"), parts, strict=True):
                group.create_dataset(name, data=array, maxshape=(None,), chunks=(64,))
        return af.open_array(tmp / "data.h5ad", "X")


class TestH5adCSRContiguous(CSRTests):
    """Contiguous components are memory-mapped: rows gather in any order."""

    gathers = True

    def write(self, parts: tuple[np.ndarray, ...], shape: tuple[int, int], tmp: Path) -> Source:
        with h5py.File(tmp / "data.h5", "w") as f:
            group = f.create_group("m")
            group.attrs.update({"h5sparse_format": "csr", "h5sparse_shape": np.asarray(shape)})
            for name, array in zip(("data", "indices", "indptr"), parts, strict=True):
                group.create_dataset(name, data=array)
        return af.open_array(f"{tmp / 'data.h5'}:m")


class TestZarrCSR(CSRTests):
    """Small chunks that are not compressed (a CRC-32C alone): batches are gathered."""

    gathers = True
    compressors: ClassVar[Any] = [zarr.codecs.Crc32cCodec()]

    def write(self, parts: tuple[np.ndarray, ...], shape: tuple[int, int], tmp: Path) -> Source:
        root = zarr.open_group(str(tmp / "data.zarr"), mode="w", zarr_format=3)
        group = root.create_group("layers/counts")
        group.attrs.update(
            {"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": list(shape)}
        )
        for name, array in zip(("data", "indices", "indptr"), parts, strict=True):
            group.create_array(name, data=array, chunks=(50,), compressors=self.compressors)
        return af.open_array(tmp / "data.zarr", "layers/counts")


class TestZarrCSRReadByChunks(TestZarrCSR):
    """Compressed chunks (zarr's default, zstd), however small: reads cost whole chunks, and
    ``shuffle="block"`` reads chunk-aligned windows (the class :func:`csr_source` also picks for
    large chunks)."""

    gathers = False
    compressors = "auto"

    def test_block_mode_reads_windows(self, open_source: Any) -> None:
        source = open_source(self.data())
        assert chunked_rows(source) == round(50 / (source.nnz / len(source)))


def test_large_or_compressed_chunks_are_read_whole(tmp_path: Path) -> None:
    matrix = random_csr(2000, 400, 0.1)
    assert matrix.nnz * 4 > GATHER_CHUNK_BYTES
    for chunks, compression, gathers in (
        ((4096,), None, True),
        ((matrix.nnz,), None, False),
        ((4096,), "gzip", False),
        ((4096,), "lzf", False),
    ):
        name = f"{chunks[0]}-{compression}.h5"
        path = _h5_csr(
            tmp_path / name, *_parts(matrix), matrix.shape, chunks=chunks, compression=compression
        )
        source = af.open_array(path, "X")
        assert isinstance(source, GatherInto) == gathers
        assert (chunked_rows(source) is None) == gathers
        assert_same_rows(source.read(np.arange(0, 2000, 3)), matrix.toarray()[::3])


# -- the pure parts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("starts", "stops", "gap", "spans"),
    [
        ([], [], 0, []),
        ([3], [3], 0, []),  # an empty range needs no read
        ([0, 4], [4, 8], 0, [(0, 8)]),  # touching
        ([0, 5], [4, 8], 0, [(0, 4), (5, 8)]),
        ([0, 5], [4, 8], 1, [(0, 8)]),
        ([0, 4, 4, 9], [2, 4, 6, 12], 2, [(0, 6), (9, 12)]),
        ([10, 100, 1000], [20, 110, 1010], 50, [(10, 20), (100, 110), (1000, 1010)]),
    ],
)
def test_plan_spans(starts: list[int], stops: list[int], gap: int, spans: list[Any]) -> None:
    a, b = plan_spans(np.array(starts, np.int64), np.array(stops, np.int64), gap)
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == spans


def test_spans_cover_every_range() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(0, 5, size=30)
        starts = np.cumsum(rng.integers(0, 9, size=30)) + np.concatenate(
            ([0], np.cumsum(lengths)[:-1])
        )
        stops = starts + lengths
        a, b = plan_spans(starts, stops, int(rng.integers(0, 10)))
        inside = ragged_arange(a, b - a)
        assert set(ragged_arange(starts, lengths).tolist()) <= set(inside.tolist())
        assert np.all(a[1:] > b[:-1]) and np.all(b > a)


def test_repeated_entries_are_found() -> None:
    assert not repeats(np.array([0, 0, 1]), np.array([1, 2, 0]), 3)
    assert not repeats(np.array([0, 0]), np.array([2, 1]), 3)  # unsorted, no repeat
    assert repeats(np.array([0, 1, 1]), np.array([1, 0, 0]), 3)


# -- scipy.sparse in memory ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["csr_matrix", "csr_array"])
def test_scipy_csr_streams_like_its_dense_copy(kind: str) -> None:
    matrix = getattr(scipy.sparse, kind)(random_csr(300, 25, 0.1))
    dense, ids = matrix.toarray(), np.arange(300)
    for shuffle in (True, "block", False):
        got = list(af.batches(matrix, ids, batch_size=32, shuffle=shuffle, seed=4))
        want = list(af.batches(dense, ids, batch_size=32, shuffle=shuffle, seed=4))
        assert len(got) == len(want) == 10
        for (x, i), (xd, idd) in zip(got, want, strict=True):
            assert np.array_equal(i, idd)
            assert_same_rows(x, xd)


def test_unsorted_and_repeated_entries_read_as_scipy_sums_them() -> None:
    data, indices = np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([2, 0, 2, 1])
    matrix = scipy.sparse.csr_matrix((data, indices, np.array([0, 3, 3, 4])), shape=(3, 3))
    assert not matrix.has_canonical_format
    source = af.open_array(matrix)
    assert_same_rows(source.read(np.arange(3)), matrix.toarray())
    (batch,) = af.batches(matrix, batch_size=3, shuffle=False, sparse=True)
    assert batch.has_canonical_format
    assert_same_rows(batch.toarray(), matrix.toarray())


def test_other_scipy_formats_are_refused_with_the_fix() -> None:
    dense = np.eye(4, dtype=np.float32)
    for make in (scipy.sparse.csc_matrix, scipy.sparse.coo_array, scipy.sparse.lil_matrix):
        with pytest.raises(af.StructureError, match=r"tocsr\(\)"):
            af.batches(make(dense), batch_size=2)
    with pytest.raises(TypeError, match=r"stored by column|CSC"):
        af.open_array(scipy.sparse.csc_array(dense))


# -- every shuffle mode, sharding and resume, dense and sparse ------------------------------------------
@pytest.fixture(scope="module")
def matrix() -> scipy.sparse.csr_matrix:
    return random_csr(700, 60, 0.05, seed=1)


@pytest.fixture(scope="module", params=["scipy", "h5ad", "zarr"])
def stored(
    request: pytest.FixtureRequest, matrix: Any, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """The same matrix, in memory or written as AnnData writes it."""
    tmp = tmp_path_factory.mktemp("stored")
    if request.param == "scipy":
        return matrix
    if request.param == "h5ad":
        return f"{write_h5ad(tmp / 'm.h5ad', matrix)}:X"
    return af.open_array(write_anndata_zarr(tmp / "m.zarr", matrix), "X")


@pytest.mark.parametrize("shuffle", [True, "block", False])
@pytest.mark.parametrize("shard", [None, af.Shard(3, 1)], ids=["one worker", "worker 1 of 3"])
def test_csr_stream_equals_the_dense_stream(
    stored: Any, matrix: Any, shuffle: Any, shard: Any
) -> None:
    dense, ids = matrix.toarray(), np.arange(matrix.shape[0])
    options = {"batch_size": 48, "shuffle": shuffle, "seed": 9, "shard": shard}
    for epoch in range(2):
        got = list(af.batches(stored, ids, start_epoch=epoch, **options))
        sparse = list(af.batches(stored, ids, start_epoch=epoch, sparse=True, **options))
        want = list(af.batches(dense, ids, start_epoch=epoch, **options))
        assert len(got) == len(sparse) == len(want)
        seen = []
        for (x, i), (s, si), (xd, idd) in zip(got, sparse, want, strict=True):
            assert isinstance(s, scipy.sparse.csr_array) and s.shape == (len(i), dense.shape[1])
            assert np.array_equal(i, si)
            assert_same_rows(x, dense[i], "dense rows")  # the rows of the ids it came with
            assert_same_rows(s.toarray(), dense[i], "sparse rows")
            if not (shuffle == "block" and not isinstance(stored, scipy.sparse.csr_matrix)):
                # The very same batches as the dense array (block mode plans blocks from the
                # storage's chunks, which a chunked file has and an array in memory has not).
                assert np.array_equal(i, idd)
                assert_same_rows(x, xd)
            seen.append(i)
        rows = np.concatenate(seen)
        assert len(np.unique(rows)) == len(rows)  # each row once per epoch


def test_resume_continues_the_same_stream(stored: Any, matrix: Any) -> None:
    ids = np.arange(matrix.shape[0])
    for sparse in (False, True):
        whole = list(af.batches(stored, ids, batch_size=64, seed=2, start_epoch=1, sparse=sparse))
        tail = list(
            af.batches(
                stored, ids, batch_size=64, seed=2, start_epoch=1, start_step=4, sparse=sparse
            )
        )
        assert len(tail) == len(whole) - 4
        for (x, i), (xt, it) in zip(whole[4:], tail, strict=True):
            assert np.array_equal(i, it)
            a, b = (x.toarray(), xt.toarray()) if sparse else (x, xt)
            assert_same_rows(a, b)


def test_from_arrays_dense_and_sparse_tensors(stored: Any, matrix: Any) -> None:
    import tensorflow as tf

    dense, ids = matrix.toarray(), np.arange(matrix.shape[0])
    for shuffle in (True, "block"):
        options = {"batch_size": 100, "shuffle": shuffle, "seed": 5}
        want = [i for _, i in af.batches(dense, ids, **options)]
        ds = af.from_arrays(stored, ids, **options)
        assert ds.element_spec[0].shape.as_list() == [None, 60]
        for (x, i), idd in zip(ds, want, strict=True):
            assert_same_rows(x.numpy(), dense[i.numpy()])
            if shuffle is True:
                assert np.array_equal(i.numpy(), idd)
        sds = af.from_arrays(stored, ids, sparse=True, drop_remainder=True, **options)
        spec = sds.element_spec[0]
        assert isinstance(spec, tf.SparseTensorSpec) and spec.shape.as_list() == [100, 60]
        assert len(sds) == 7
        for x, i in sds:
            assert isinstance(x, tf.SparseTensor)
            assert x.dense_shape.numpy().tolist() == [100, 60]
            assert_same_rows(tf.sparse.to_dense(x).numpy(), dense[i.numpy()])
    # A resumed first pass (the shorter epoch's placeholder must be sparse too).
    sds = af.from_arrays(stored, ids, batch_size=100, seed=5, sparse=True, start_step=5)
    assert len(sds) == 7 and len(list(sds)) == 2


def test_sparse_needs_a_sparse_leaf_and_no_map_batch(matrix: Any) -> None:
    with pytest.raises(af.ConfigError, match=r"no leaf is sparse.*drop `sparse`"):
        af.batches(np.zeros((10, 2)), batch_size=2, sparse=True)
    with pytest.raises(af.ConfigError, match=r"`sparse=True` and `map_batch`"):
        af.batches(matrix, batch_size=2, sparse=True, map_batch=lambda b: b)
    with pytest.raises(af.ConfigError, match=r"`sparse` must be"):
        af.batches(matrix, batch_size=2, sparse="yes")


def test_a_dict_with_sparse_and_dense_leaves(matrix: Any) -> None:
    y = np.arange(matrix.shape[0]) % 3
    x = {"counts": matrix, "size": np.asarray(matrix.sum(axis=1)).reshape(-1, 1)}
    for batch_x, batch_y in af.batches(x, y, batch_size=128, seed=0, sparse=True):
        assert isinstance(batch_x["counts"], scipy.sparse.csr_array)
        sums = np.asarray(batch_x["counts"].sum(axis=1)).reshape(-1, 1)
        assert np.allclose(sums, batch_x["size"])
        assert batch_y.dtype == y.dtype


# -- damaged matrices ----------------------------------------------------------------------------
def _parts(matrix: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return matrix.data, matrix.indices, matrix.indptr


def _h5_csr(
    path: Path,
    data: Any,
    indices: Any,
    indptr: Any,
    shape: tuple[int, int],
    chunks: tuple[int, ...] | None = None,
    compression: str | None = None,
) -> Path:
    with h5py.File(path, "w") as f:
        group = f.create_group("X")
        group.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
        group.attrs["shape"] = np.asarray(shape)
        for name, array in zip(("data", "indices", "indptr"), (data, indices, indptr), strict=True):
            group.create_dataset(
                name,
                data=array,
                chunks=chunks and min(chunks, array.shape),
                compression=compression,
                fletcher32=chunks is not None,  # a checksum alone does not make chunks encoded
            )
    return path


def test_inconsistent_matrices_are_named(tmp_path: Path) -> None:
    ok = (np.ones(4, np.float32), np.array([0, 1, 2, 0]), np.array([0, 2, 3, 4]))
    path = _h5_csr(tmp_path / "a.h5", *ok, shape=(3, 3))
    assert_same_rows(
        af.open_array(path, "X").read(np.arange(3)),
        np.array([[1, 1, 0], [0, 0, 1], [1, 0, 0]], np.float32),
    )
    with pytest.raises(af.CorruptDataError, match=r"`indptr` has 4 entries.*5"):
        af.open_array(_h5_csr(tmp_path / "b.h5", *ok, shape=(4, 3)), "X")
    with pytest.raises(af.CorruptDataError, match=r"outside `data`"):
        af.open_array(_h5_csr(tmp_path / "c.h5", *ok[:2], np.array([0, 2, 3, 9]), (3, 3)), "X")
    source = af.open_array(_h5_csr(tmp_path / "d.h5", *ok[:2], np.array([0, 3, 1, 4]), (3, 3)), "X")
    with pytest.raises(af.CorruptDataError, match=r"indptr` decreases"):
        source.read(np.arange(3))
    source = af.open_array(
        _h5_csr(tmp_path / "e.h5", ok[0], np.array([0, 1, 7, 0]), ok[2], (3, 3)), "X"
    )
    with pytest.raises(af.CorruptDataError, match=r"column index lies outside \[0, 3\)"):
        source.read(np.arange(3))


# -- convert -----------------------------------------------------------------------------------
def test_convert_densifies_on_request(tmp_path: Path, matrix: Any) -> None:
    """``densify=True`` writes dense rows (copying as CSR: ``test_convert_sparse.py``)."""
    path = write_h5ad(tmp_path / "m.h5ad", matrix)
    ids = np.arange(matrix.shape[0])
    for output, shuffle in (("out.h5", False), ("out.zarr", True)):
        af.convert(
            {"x": f"{path}:X", "ids": ids, "mem": matrix},
            tmp_path / output,
            densify=True,
            shuffle=shuffle,
            seed=1 if shuffle else None,
            progress=False,
        )
        got_ids = af.open_array(tmp_path / output, "ids").read(ids)
        for name in ("x", "mem"):
            got = af.open_array(tmp_path / output, name)
            assert not isinstance(got, SparseRows)
            assert_same_rows(got.read(ids), matrix.toarray()[got_ids])
        assert af.verify(tmp_path / output, progress=False).rows == 700


def test_convert_refuses_the_arrays_of_a_matrix_as_rows(tmp_path: Path, matrix: Any) -> None:
    path = write_h5ad(tmp_path / "m.h5ad", matrix)
    store = write_anndata_zarr(tmp_path / "m.zarr", matrix)
    for where in (path, store):
        for part in ("data", "indices", "indptr"):
            with pytest.raises(
                af.StructureError, match=rf"`{part}` array of the sparse matrix 'X'"
            ):
                af.convert(
                    {"x": f"{where}:X/{part}"}, tmp_path / "o.h5", shuffle=True, progress=False
                )
            with pytest.raises(af.StructureError, match="scrambles"):
                open_for_copy(Path(where), f"X/{part}")
    assert not (tmp_path / "o.h5").exists()


def test_cli_densify(tmp_path: Path, matrix: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_h5ad(tmp_path / "m.h5ad", matrix)
    out = tmp_path / "o.h5"
    assert main(["convert", f"x={path}:X/indices", "-o", str(out), "-q", "--shuffle"]) != 0
    assert "scrambles the matrix" in capsys.readouterr().err and not out.exists()
    assert main(["convert", f"x={path}:X", "-o", str(out), "-q", "--densify"]) == 0
    assert_same_rows(af.open_array(out, "x").read(np.arange(700)), matrix.toarray())


def test_sparse_batches_pickle(stored: Any, matrix: Any) -> None:
    b = af.batches(stored, batch_size=64, seed=1, sparse=True)
    clone = pickle.loads(pickle.dumps(b))
    for x, y in zip(b, clone, strict=True):
        assert_same_rows(x.toarray(), y.toarray())
