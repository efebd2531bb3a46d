"""Raw HDF5 chunks decoded outside h5py: every value bit for bit what h5py reads.

Each case writes a real file with h5py (and hdf5plugin for the plugin filters), reads it back
through :class:`~arrayfeed._storage.hdf5.source.H5Source` on the raw-chunk path, and compares the
bytes with h5py's own ``dset[...]``; then the same reads from other processes and threads.
"""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.structure import flatten
from arrayfeed._storage import as_source, workbuffers
from arrayfeed._storage.hdf5 import rawchunks
from arrayfeed._storage.hdf5.chunks import ChunkFile
from arrayfeed._storage.hdf5.codecs import Stage
from arrayfeed._storage.hdf5.source import H5Source, open_hdf5

from . import _h5files
from ._feeds import piece_runs
from ._h5files import (
    DTYPES,
    FILTERS,
    HAVE_IMAGECODECS,
    LAYOUTS,
    _assert_same,
    _check_reads,
    _reference,
    _reference_rows,
    _source,
    _values,
    _write,
)

# hdf5plugin's filters, registered for this module.
plugins = _h5files.plugins


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(FILTERS))
def test_values_equal_h5py_bit_for_bit(
    tmp_path: Path, plugins: Any, name: str, dtype: str, layout: str
) -> None:
    options, needs_imagecodecs = FILTERS[name]
    shape, chunks = LAYOUTS[layout]
    path = tmp_path / "a.h5"
    _write(path, _values(dtype, shape), chunks, options(plugins))
    ref = _reference(path)
    src = _source(path)
    direct = HAVE_IMAGECODECS or not needs_imagecodecs
    assert src.read_path == "chunks" if direct else src.read_path.startswith("h5py: decoding")
    _check_reads(src, ref, chunks[0])
    reader = src.chunk_reader()
    assert (reader is not None and reader.decoded > 0) == direct  # the decoders did the work


@pytest.mark.parametrize("chunks", [(8, 3, 2), (8, 2, 5)])  # the second splits axis 1 alone
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name", ["none", "shuffle+gzip+fletcher32", "lzf", "zstd", "bitshuffle-lz4"]
)
def test_chunks_never_written_read_as_the_fill_value(
    tmp_path: Path, plugins: Any, name: str, dtype: str, chunks: tuple[int, ...]
) -> None:
    options, _ = FILTERS[name]
    shape = (40, 6, 5)
    values = _values(dtype, shape)
    fill = {"b": True, "c": 1.5 - 2j, "f": -2.5}.get(np.dtype(dtype).kind, 7)
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=shape, dtype=dtype, chunks=chunks, fillvalue=fill, **options(plugins)
        )
        d[:9] = values[:9]
        d[25:30, 2:4] = values[25:30, 2:4]
        stored = d.id.get_num_chunks()
    assert stored < np.prod([-(-s // c) for s, c in zip(shape, chunks, strict=True)])
    ref = _reference(path)
    src = _source(path)
    _check_reads(src, ref, chunks[0])
    assert np.array_equal(
        src.read(np.array([39], dtype=np.int64))[0, 0, 0], np.asarray(fill, dtype)
    )


def test_a_dataset_never_written_reads_as_its_fill_value(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(30, 4), dtype="f4", chunks=(7, 4), fillvalue=3.25)
    src = _source(path)
    _assert_same(src.read_run(0, 30), np.full((30, 4), 3.25, dtype="f4"))
    reader = src.chunk_reader()
    assert reader is not None and reader.decoded == 0


@pytest.mark.parametrize("chunks", [(8, 32), (8, 4)])  # whole rows; columns
def test_filter_mask_chunks_stored_uncompressed_are_read_as_they_are(
    tmp_path: Path, chunks: tuple[int, int]
) -> None:
    # lzf gives up on noise and HDF5 stores the chunk raw, marking the filter skipped.
    shape = (64, 32)
    values = _values("float64", shape)
    path = tmp_path / "a.h5"
    _write(path, values, chunks, {"compression": "lzf", "fletcher32": True})
    src = _source(path)
    reader = src.chunk_reader()
    if reader is None:
        pytest.skip(src.read_path)
    assert (reader.masks & 1).any() and not (reader.masks & 1).all()
    _check_reads(src, _reference(path), chunks[0])


def test_each_chunk_a_read_touches_is_decoded_once(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("int16", (40, 6, 5)), (10, 3, 2), {"compression": "gzip"})
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    # Rows from row chunks 0 and 2; each row chunk has 2 x 3 chunks along the other axes.
    src.read(np.array([1, 2, 5, 9, 20, 27, 29], dtype=np.int64))
    assert reader.decoded == 2 * 6


def test_file_with_a_user_block(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    values = _values("float32", (30, 5))
    with h5py.File(path, "w", userblock_size=4096) as f:
        f.create_dataset("x", data=values, chunks=(4, 5), compression="gzip", fletcher32=True)
    src = _source(path)
    assert src.read_path == "chunks"
    _check_reads(src, _reference(path), 4)


# -- processes and threads ----------------------------------------------------------------------
def test_pickled_source_carries_no_reader_and_opens_its_own(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 5)), (8, 5), {"compression": "gzip"})
    src = _source(path)
    first = src.chunk_reader()
    assert first is not None
    state = src.__getstate__()
    assert state["_chunk_reader"] is None and "_reader_lock" not in state
    assert not any(isinstance(v, ChunkFile) for v in state.values())
    clone = pickle.loads(pickle.dumps(src))
    second = clone.chunk_reader()
    assert second is not None and second is not first and second.fd != first.fd
    _assert_same(clone.read_run(0, 40), _reference(path))
    src.close()
    _assert_same(src.read_run(0, 40), _reference(path))  # reopens after close


def test_reads_run_while_another_thread_holds_h5pys_lock(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float64", (40, 6)), (8, 3), {"compression": "gzip", "shuffle": True})
    src = _source(path)
    assert src.chunk_reader() is not None  # the index comes from h5py, once, beforehand
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with h5py._objects.phil:  # the lock every h5py call takes
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    result: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: result.append(src.read_run(0, 40)))
    reader.start()
    reader.join(30)  # a deadlock guard, not a timing check
    finished = not reader.is_alive()
    release.set()
    holder.join()
    reader.join()
    assert finished, "the read waited for h5py's lock"
    _assert_same(result[0], _reference(path))


def test_two_threads_decode_at_the_same_time(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 6)), (10, 6), {"compression": "gzip"})
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    both_inside = threading.Barrier(2, timeout=30)

    def meet(stage: Stage) -> Stage:
        def decode(data: Any, size: int | None) -> Any:
            both_inside.wait()  # breaks (and the read fails) unless the other thread is decoding
            return stage.decode(data, size)

        return Stage(stage.code, stage.name, decode, stage.grows)

    reader.stages = tuple(meet(s) for s in reader.stages)
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def read(start: int) -> None:
        try:
            results[start] = src.read_run(start, start + 10)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(s,)) for s in (0, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ref = _reference(path)
    _assert_same(results[0], ref[0:10])
    _assert_same(results[20], ref[20:30])


@pytest.mark.parametrize("threads", [1, 2])
def test_block_shuffled_feed_reads_every_row_once(tmp_path: Path, threads: int) -> None:
    path = tmp_path / "a.h5"
    n = 300
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x", data=_values("uint8", (n, 4, 4, 3)), chunks=(16, 2, 4, 1), compression="lzf"
        )
        f.create_dataset("y", data=np.arange(n, dtype=np.int32), chunks=(32,), compression="gzip")
    sources = [open_hdf5(path, "x"), open_hdf5(path, "y")]
    _, treedef = flatten((0, 0), lambda v: isinstance(v, int))
    plan = Plan(n_rows=n, batch_size=16, shuffle="block", block_rows=32, window_blocks=3, seed=3)
    feed = Feed(sources, treedef, plan, num_threads=threads)
    xs, ys = [], []
    for x, y in feed.epoch(0):
        xs.append(x.reshape(-1, 4, 4, 3))
        ys.append(y.reshape(-1))
    order = np.concatenate(ys)
    assert sorted(order.tolist()) == list(range(n))
    _assert_same(np.concatenate(xs), _reference_rows(path, 0, n)[order])
    for s in sources:
        assert isinstance(s, H5Source)
        reader = s.chunk_reader()
        assert (reader is not None and reader.decoded > 0) or not HAVE_IMAGECODECS


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
@pytest.mark.parametrize("chunks", [(7, 5, 3), (4, 2, 2), (16, 5, 1), (6, 2, 3)])
def test_a_range_read_piece_by_piece_equals_h5py(
    tmp_path: Path, compression: str | None, chunks: tuple[int, ...]
) -> None:
    """Pieces are the chunks a range touches; read one by one or in runs, in any order (as
    window-cache threads do), they fill exactly the range, bit for bit as h5py reads it."""
    data = np.random.default_rng(4).standard_normal((50, 5, 3)).astype(np.float32)
    with h5py.File(tmp_path / "p.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=chunks, compression=compression, fletcher32=True)
    source = af.open_array(tmp_path / "p.h5", "x")
    assert source.read_path == "chunks"  # type: ignore[attr-defined]
    grid = -(-5 // chunks[1]) * -(-3 // chunks[2])
    for start, stop in [(0, 50), (3, 11), (5, 6), (49, 50), (13, 42)]:
        pieces = source.range_pieces(start, stop)  # type: ignore[attr-defined]
        assert pieces == ((stop - 1) // chunks[0] - start // chunks[0] + 1) * grid
        for runs in piece_runs(pieces, np.random.default_rng(start)):
            out = np.full((stop - start, 5, 3), np.nan, dtype=np.float32)
            for first, last in runs:
                source.read_pieces_into(start, stop, first, last, out)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(out.view(np.uint32), data[start:stop].view(np.uint32))


@pytest.mark.parametrize("name", ["none", "lzf+fletcher32", "shuffle+gzip", "shuffle+lzf"])
def test_large_chunks_reuse_their_work_buffers(
    tmp_path: Path, plugins: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 128 KiB and more are read and decoded into lent buffers, not fresh ones (a fresh
    one page-faults every byte once TensorFlow has lowered glibc's mmap threshold)."""
    options, needs_imagecodecs = FILTERS[name]
    if needs_imagecodecs and not HAVE_IMAGECODECS:
        pytest.skip("lzf is decoded here only with imagecodecs")
    fresh = []

    class Counting(workbuffers.WorkBuffers):
        def take(self, nbytes: int) -> np.ndarray:
            with self._lock:
                kept = {id(b) for b in self._free}
            buffer = super().take(nbytes)
            fresh.append(id(buffer) not in kept)
            return buffer

    monkeypatch.setattr(workbuffers, "work", Counting())
    shape, chunks = LAYOUTS["large-chunks"]
    path = tmp_path / "a.h5"
    _write(path, _values("float32", shape), chunks, options(plugins))
    ref, src = _reference(path), _source(path)
    passes = []
    for _ in range(3):
        out = np.empty_like(ref)
        src.read_range_into(0, len(ref), out)
        _assert_same(out, ref)
        passes.append(sum(fresh))
    assert passes[0] > 0 and passes == [passes[0]] * 3  # later passes: kept buffers only
    assert len(fresh) >= 3 * 3  # buffers are taken every pass: one or more per row of chunks


def test_a_cut_blosc_chunk_is_named_as_corrupt(tmp_path: Path, plugins: Any) -> None:
    """Blosc trusts the stored size in its own header: a chunk cut short (written that way here)
    would decode to garbage, so the header is checked against the chunk's stored size."""
    if plugins is None:  # pragma: no cover - the test extra installs hdf5plugin
        pytest.skip("writing blosc needs hdf5plugin")
    options, _ = FILTERS["blosc-lz4"]
    path = tmp_path / "a.h5"
    values = _values("int32", (40, 5000))
    _write(path, values, (10, 5000), options(plugins))
    with h5py.File(path, "r+") as f:
        mask, raw = f["x"].id.read_direct_chunk((10, 0))
        f["x"].id.write_direct_chunk((10, 0), raw[:-500], filter_mask=mask)
    src = _source(path)
    assert src.read_path == "chunks"
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\).*Blosc frame says"):
        src.read(np.arange(10, 20, dtype=np.int64))
    _assert_same(src.read_run(20, 40), values[20:40])  # the other chunks still read


def test_reading_a_chunk_through_hdf5_holds_h5pys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read_direct_chunk` (the once-per-process check of chunk offsets) runs under h5py's own
    lock: h5py before its pull request 2764 did not take it, and another thread in HDF5 at the
    same time made it fail or crash."""
    assert rawchunks._H5PY_LOCK is h5py._objects.phil
    held = []

    class Recording:
        def __enter__(self) -> None:
            held.append(h5py._objects.phil.acquire())

        def __exit__(self, *exc: object) -> None:
            h5py._objects.phil.release()

    monkeypatch.setattr(rawchunks, "_H5PY_LOCK", Recording())
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(1000), chunks=(100,), compression="gzip")
    with h5py.File(tmp_path / "a.h5", "r") as f:
        source = as_source(f["x"], "x")
        assert source.chunk_reader() is not None
        np.testing.assert_array_equal(source.read(np.arange(5, 500, 7)), np.arange(5, 500, 7))
    assert held == [True]
