"""Small chunked leaves (labels beside large features) are read whole once and gathered from
memory; the features keep the chunked path, and every guarantee of the storage still holds."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.plan.shard import Shard
from arrayfeed._pipeline.read import resident
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.resident import Resident
from arrayfeed._storage import as_source

from ._feeds import h5_feed

N, ROWS = 1200, 16
EVERY = Shard(1, 0)  # one worker: every row


def _write(path: Path, *, fletcher32: bool = False) -> Path:
    """x: N rows of float32[8, 8] holding their index; y: the index times 3; both in chunks of
    ROWS rows, lzf (as `arrayfeed convert` writes labels beside features)."""
    with h5py.File(path, "w") as f:
        x = np.repeat(np.arange(N, dtype=np.float32), 64).reshape(N, 8, 8)
        f.create_dataset("x", data=x, chunks=(ROWS, 8, 8), compression="gzip")
        f.create_dataset(
            "y",
            data=np.arange(N, dtype=np.int32) * 3,
            chunks=(ROWS,),
            compression="gzip",
            fletcher32=fletcher32,
        )
    return path


def _feed(
    path: Path, shuffle: Any = "block", threads: int = 2, shard: Shard = EVERY
) -> tuple[Feed, Any]:
    f = h5py.File(path, "r")
    options = {"batch_size": 50, "shuffle": shuffle, "seed": 7, "threads": threads, "shard": shard}
    return h5_feed((f["x"], f["y"]), **options), f


def _epoch(feed: Feed) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for x, y in feed():
        xs.append(x.reshape(-1, 8, 8))
        ys.append(y.reshape(-1))
    return np.concatenate(xs), np.concatenate(ys)


def _decoded(source: Any) -> int:
    reader = source.chunk_reader()
    assert reader is not None, source.read_path  # the chunked path, outside h5py's lock
    return int(reader.decoded)


@pytest.mark.parametrize("shuffle", ["block", True, False])
@pytest.mark.parametrize("threads", [1, 4])
def test_a_small_label_leaf_is_read_once_and_every_row_matches(
    tmp_path: Path, shuffle: Any, threads: int
) -> None:
    feed, f = _feed(_write(tmp_path / "d.h5"), shuffle, threads)
    with f:
        x_source, y_source = feed.sources
        assert isinstance(feed.readable[1], Resident) and feed.readable[1].source is y_source
        assert feed.readable[0] is x_source  # the largest leaf keeps the chunked path
        assert not feed.readable[1].loaded  # nothing is read before an epoch asks
        epochs = [_epoch(feed) for _ in range(3)]
        assert _decoded(y_source) == N // ROWS  # every label chunk once, in three epochs
        assert _decoded(x_source) >= 3 * (N // ROWS)  # the features: chunk by chunk, each epoch
        for x, y in epochs:
            np.testing.assert_array_equal(y, x[:, 0, 0].astype(np.int32) * 3)  # rows stay paired
            assert sorted(y.tolist()) == list(range(0, 3 * N, 3))  # each row once
        if shuffle:
            assert not np.array_equal(epochs[0][1], epochs[1][1])  # reshuffled every epoch


def test_leaves_that_are_not_small_beside_another_keep_their_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "d.h5")
    with h5py.File(path, "r") as f:
        x, y = as_source(f["x"], "x"), as_source(f["y"], "y")
        every = (0, N)
        assert resident.resident_sources([y], every) == [y]  # the only leaf
        memory = as_source(np.zeros((N, 8, 8), np.float32), "m")
        held = resident.resident_sources([memory, y], every)
        assert held[0] is memory and isinstance(held[1], Resident)
        monkeypatch.setattr(resident, "RESIDENT_BYTES", N * 4 - 1)  # y is one byte too large
        assert resident.resident_sources([x, y], every) == [x, y]
        monkeypatch.setattr(resident, "RESIDENT_BYTES", N * 4)
        monkeypatch.setattr(resident, "RESIDENT_SHARE", 64 + 1)  # y is 1/64 of x
        assert resident.resident_sources([x, y], every) == [x, y]


def test_a_leaf_given_twice_is_held_once_and_the_total_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "d.h5")
    with h5py.File(path, "r") as f:
        f2 = h5py.File(path, "r")
        x, y, w = as_source(f["x"], "x"), as_source(f["y"], "y"), as_source(f2["y"], "w")
        held = resident.resident_sources([x, y, y], (0, N))  # y as labels and as weights
        assert isinstance(held[1], Resident) and held[1] is held[2]
        monkeypatch.setattr(resident, "RESIDENT_TOTAL", N * 4)  # room for one of y and w
        held = resident.resident_sources([x, w, y], (0, N))
        assert [isinstance(s, Resident) for s in held] == [False, True, False]
        # Only the shard's rows count (and are read).
        held = resident.resident_sources([x, w, y], (0, N // 2))
        assert [isinstance(s, Resident) for s in held] == [False, True, True]
        f2.close()


def test_a_worker_reads_and_checks_only_its_own_labels(tmp_path: Path) -> None:
    """A sharded worker holds its shard's labels only: a corrupt label chunk in another
    worker's rows is that worker's error, not this one's."""
    path = _write(tmp_path / "d.h5", fletcher32=True)
    with h5py.File(path, "r") as f:
        info = f["y"].id.get_chunk_info_by_coord((ROWS * 60,))  # rows 960.., shard 1 of 2
    with open(path, "r+b") as raw:
        raw.seek(info.byte_offset + 2)
        byte = raw.read(1)
        raw.seek(info.byte_offset + 2)
        raw.write(bytes([byte[0] ^ 0xFF]))
    for shuffle in ("block", True):
        feed, f = _feed(path, shuffle, shard=Shard(2, 0))
        with f:
            x, y = _epoch(feed)
            np.testing.assert_array_equal(y, x[:, 0, 0].astype(np.int32) * 3)
            assert sorted(y.tolist()) == list(range(0, 3 * (N // 2), 3))
            assert _decoded(feed.sources[1]) == -(-(N // 2) // ROWS)  # its own chunks only
        other, f = _feed(path, shuffle, shard=Shard(2, 1))
        with f, pytest.raises(af.CorruptDataError, match=r"chunk \(60,\)"):
            _epoch(other)


def test_a_corrupt_label_chunk_is_named_when_first_read_and_on_every_try(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.h5", fletcher32=True)
    with h5py.File(path, "r") as f:
        info = f["y"].id.get_chunk_info_by_coord((ROWS * 5,))
    with open(path, "r+b") as raw:  # flip one byte of label chunk 5
        raw.seek(info.byte_offset + 2)
        byte = raw.read(1)
        raw.seek(info.byte_offset + 2)
        raw.write(bytes([byte[0] ^ 0xFF]))
    feed, f = _feed(path)
    with f:
        for _ in range(2):  # a failed whole read is not kept: the next epoch tries again
            with pytest.raises(af.CorruptDataError, match=r"chunk \(5,\).*fletcher32"):
                _epoch(feed)
        assert not feed.readable[1].loaded


def test_a_file_changed_after_the_labels_were_read_fails_the_next_epoch(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.h5")
    feed, f = _feed(path)
    with f:
        _epoch(feed)
        assert feed.readable[1].loaded
        stat = os.stat(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        with pytest.raises(af.CorruptDataError, match="changed"):
            _epoch(feed)


def test_threads_that_need_the_labels_at_once_read_them_once(tmp_path: Path) -> None:
    feed, f = _feed(_write(tmp_path / "d.h5"))
    with f:
        labels = feed.readable[1]
        assert isinstance(labels, Resident)
        outs = [np.empty(N, np.int32) for _ in range(8)]
        start = threading.Barrier(len(outs))

        def gather(out: np.ndarray) -> None:
            start.wait()
            labels.gather_into(np.arange(N)[::-1].copy(), out)

        threads = [threading.Thread(target=gather, args=(out,)) for out in outs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert _decoded(feed.sources[1]) == N // ROWS
        for out in outs:
            np.testing.assert_array_equal(out, np.arange(N, dtype=np.int32)[::-1] * 3)
        with pytest.raises(IndexError, match="this worker's rows"):
            labels.gather_into(np.array([N]), np.empty(1, np.int32))
        half = Resident(feed.sources[1], 100, 300)
        np.testing.assert_array_equal(half.read(np.array([100, 299])), [300, 897])
        with pytest.raises(IndexError, match=r"rows 100\.\.299"):
            half.read(np.array([99]))


def test_a_copy_in_another_process_reads_its_own(tmp_path: Path) -> None:
    feed, f = _feed(_write(tmp_path / "d.h5"))
    with f:
        first = _epoch(feed)
        copy = pickle.loads(pickle.dumps(feed))
        assert isinstance(copy.readable[1], Resident) and not copy.readable[1].loaded
        assert copy.readable[1].source is copy.sources[1]  # one source, not two
        copy.seek(0)
        again = _epoch(copy)
        np.testing.assert_array_equal(first[1], again[1])


def test_from_arrays_holds_the_labels_of_an_arrayfeed_convert_store(tmp_path: Path) -> None:
    """End to end, as users read what `arrayfeed convert` wrote: the same batches as from the
    arrays in memory."""
    x = np.random.default_rng(0).integers(0, 255, (N, 8, 8, 3), dtype=np.uint8)
    y = np.arange(N, dtype=np.int64)
    af.convert({"x": x, "y": y}, tmp_path / "c.h5", compression="lzf")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f["y"].chunks is not None  # labels chunked beside the features
        stored = af.batches(
            f["x"],
            f["y"],
            batch_size=64,
            shuffle="block",
            seed=3,
            shard=None,
            drop_remainder=True,
            processes=0,  # the labels are held in this process, where the test looks
        )
        got = [(bx.copy(), by.copy()) for bx, by in stored]
        assert isinstance(stored._feed.readable[1], Resident) and stored._feed.readable[1].loaded
    for bx, by in got:
        np.testing.assert_array_equal(bx, x[by])
    seen = np.concatenate([by for _, by in got])
    assert len(np.unique(seen)) == len(seen) == N - N % 64 and seen.max() < N  # each row once


def test_a_zarr_label_leaf_is_read_once_through_its_checksums(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zarr as Zarr writes it (zstd features, CRC-32C-checked labels in the same rows): each
    label chunk file is read once in two epochs, and a flipped byte in one is named."""
    import zarr
    from zarr.codecs import Crc32cCodec

    from arrayfeed._storage.zarr.chunks import ChunkReader

    root = zarr.open_group(tmp_path / "d.zarr", mode="w")
    x = np.repeat(np.arange(N, dtype=np.float32), 64).reshape(N, 8, 8)
    root.create_array("x", data=x, chunks=(ROWS, 8, 8))
    root.create_array(
        "y", data=np.arange(N, dtype=np.int32) * 3, chunks=(ROWS,), compressors=[Crc32cCodec()]
    )
    reads: list[str] = []
    read_file = ChunkReader._read_file

    def counted(path: str) -> Any:
        reads.append(os.path.relpath(path, tmp_path / "d.zarr").split(os.sep)[0])
        return read_file(path)

    def stream_of_store() -> af.Batches:
        store = tmp_path / "d.zarr"
        return af.batches(
            af.open_array(store, "x"),
            af.open_array(store, "y"),
            batch_size=50,
            shuffle="block",
            seed=5,
            shard=None,
            num_threads=2,
            processes=0,  # the chunk reads counted are this process's
        )

    monkeypatch.setattr(ChunkReader, "_read_file", staticmethod(counted))
    # Chunks counted per epoch: no epoch's first windows read ahead while the one before ends.
    monkeypatch.setattr("arrayfeed._pipeline.read.readers.FOLLOW_SECONDS", 0.0)
    stream = stream_of_store()
    reads.clear()  # the first batches, timed when the dataset was built
    labels = stream._feed.readable[1]
    assert isinstance(labels, Resident) and labels.source is stream._feed.sources[1]
    for _ in range(2):
        ys = []
        for bx, by in stream:
            np.testing.assert_array_equal(by, bx[:, 0, 0].astype(np.int32) * 3)
            ys.append(by.copy())
        assert sorted(np.concatenate(ys).tolist()) == list(range(0, 3 * N, 3))
    assert reads.count("y") == N // ROWS  # every label chunk once, in two epochs
    assert reads.count("x") == 2 * (N // ROWS)

    chunk = tmp_path / "d.zarr" / "y" / "c" / "5"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0x10
    chunk.write_bytes(bytes(data))
    fresh = stream_of_store()
    assert isinstance(fresh._feed.readable[1], Resident)
    with pytest.raises(af.CorruptDataError, match=r"chunk \(5,\).*d\.zarr:y.*crc32c"):
        list(fresh)


def _double_labels(batch: Any) -> Any:
    x, y = batch
    return x, y * 2


def test_loaders_map_beside_held_labels(tmp_path: Path) -> None:
    """Groups read into shared memory for worker processes gather the held labels too."""
    with h5py.File(_write(tmp_path / "d.h5"), "r") as f:
        stream = af.batches(
            f["x"],
            f["y"],
            batch_size=50,
            shuffle="block",
            seed=2,
            shard=None,
            map_batch=_double_labels,
            processes=1,
        )
        for _ in range(2):
            got = [(bx.copy(), by.copy()) for bx, by in stream]
            for bx, by in got:
                np.testing.assert_array_equal(by, bx[:, 0, 0].astype(np.int32) * 6)
            seen = np.concatenate([by for _, by in got])
            assert sorted(seen.tolist()) == list(range(0, 6 * N, 6))
        held = stream._feed.readable[1]
        assert isinstance(held, Resident) and not held.loaded  # held by the loader, not here
        del stream


@pytest.mark.parametrize("shuffle", ["block", True])
@pytest.mark.parametrize("sparse", [True, False])
def test_sparse_rows_beside_held_labels(tmp_path: Path, shuffle: Any, sparse: bool) -> None:
    """An AnnData-style CSR matrix (never held: its rows are read through ``indptr``) beside
    chunked labels in the same file, which are."""
    import scipy.sparse

    cols = 64
    dense = np.zeros((N, cols), np.float32)
    dense[np.arange(N), np.arange(N) % cols] = np.arange(N) + 1
    dense[np.arange(N), (np.arange(N) * 7 + 3) % cols] += 0.5
    csr = scipy.sparse.csr_matrix(dense)
    path = tmp_path / "d.h5ad"
    with h5py.File(path, "w") as f:
        group = f.create_group("X")
        group.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
        group.attrs["shape"] = np.asarray(dense.shape)
        for name in ("data", "indices", "indptr"):
            group.create_dataset(name, data=getattr(csr, name), chunks=(256,), compression="gzip")
        f.create_dataset(
            "y", data=np.arange(N, dtype=np.int32) * 3, chunks=(ROWS,), compression="gzip"
        )
    stream = af.batches(
        af.open_array(path, "X"),
        af.open_array(path, "y"),
        batch_size=50,
        shuffle=shuffle,
        seed=4,
        shard=None,
        sparse=sparse,
        processes=0,  # the labels are held in this process, where the test looks
    )
    held = stream._feed.readable
    assert not isinstance(held[0], Resident) and isinstance(held[1], Resident)
    seen = []
    for bx, by in stream:
        rows = bx.toarray() if sparse else bx
        np.testing.assert_array_equal(rows, dense[by // 3])
        seen.append(by.copy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(0, 3 * N, 3))
    assert held[1].loaded
