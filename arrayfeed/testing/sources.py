"""The conformance suite: :class:`SourceTests`, the contract of a source as tests (see the
package docstring)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from .._dtypes import native_dtype
from .._pipeline.plan.plan import Plan
from .._pipeline.plan.shard import Shard
from .._pipeline.read.blocks import WindowCache
from .._pipeline.read.rows import read_rows
from .._storage import (
    Chunked,
    Closeable,
    GatherInto,
    ReadRangeInto,
    RunReader,
    Source,
    Verifiable,
    chunked_rows,
    portability,
)
from .rows import assert_same_rows, garbage, indices, sample_data

__all__ = ["SourceTests"]

Indices = npt.NDArray[np.int64]

OpenSource = Callable[..., Source]


class _Sources:
    """Sources made by ``make_source``, one per array they hold, each in a new directory."""

    def __init__(self, new_directory: Callable[[], Path]) -> None:
        self._new_directory = new_directory
        self._sources: dict[tuple[str, tuple[int, ...], bytes], Source] = {}

    def get(self, data: np.ndarray, make: Callable[[np.ndarray, Path], Source]) -> Source:
        digest = hashlib.sha256(np.ascontiguousarray(data).data).digest()
        key = (data.dtype.str, data.shape, digest)
        if key not in self._sources:
            self._sources[key] = make(data, self._new_directory())
        return self._sources[key]

    def close(self) -> None:
        for source in self._sources.values():
            if isinstance(source, Closeable):
                source.close()
        self._sources.clear()


class SourceTests:
    """The contract of a :class:`~arrayfeed.storage.Source`, as tests a backend's test class inherits.

    Subclasses implement :meth:`make_source` and may narrow the data it is given. They may also
    add tests of their own: the ``open_source`` fixture makes sources (``open_source(data)``),
    :meth:`data` the arrays, and :meth:`selections` and :meth:`ranges` the reads every source
    must serve (a subclass may extend them).

    Attributes:
        dtypes: dtypes the tests store (tests not parametrized over dtypes use the first).
        row_shapes: Shapes of one row (tests not parametrized over row shapes use the first).
        n_rows: Rows of every stored array (at least 4).
        picklable: False for sources that cannot be pickled; say why in ``not_picklable_because``.
        share_sources: The tests of the class share one source per array (False: each test
            makes its own).
    """

    dtypes: ClassVar[tuple[str, ...]] = (
        "float64",
        ">f4",
        "float16",
        "complex64",
        "int64",
        ">i2",
        "uint8",
        "bool",
    )
    row_shapes: ClassVar[tuple[tuple[int, ...], ...]] = ((4, 3), (), (3,))
    n_rows: ClassVar[int] = 300
    picklable: ClassVar[bool] = True
    not_picklable_because: ClassVar[str] = ""
    share_sources: ClassVar[bool] = True

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        """A source holding exactly ``data`` (rows along axis 0), written under ``tmp_path`` (an
        empty directory of its own) the way the backend's users write it."""
        raise NotImplementedError(f"{type(self).__name__} must implement `make_source`.")

    # -- parametrization and fixtures ------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize ``dtype`` and ``row_shape`` over this class's ``dtypes`` and
        ``row_shapes`` (pytest calls this hook on test classes)."""
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", self.dtypes, ids=[str(d) for d in self.dtypes])
        if "row_shape" in metafunc.fixturenames:
            ids = ["x".join(map(str, s)) or "scalar" for s in self.row_shapes]
            metafunc.parametrize("row_shape", self.row_shapes, ids=ids)

    @pytest.fixture(scope="class")
    @classmethod
    def shared_sources(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Sources]:
        """The sources the tests of a class share, by the data they hold; closed at the end."""
        sources = _Sources(lambda: tmp_path_factory.mktemp("source"))
        yield sources
        sources.close()

    @pytest.fixture
    def open_source(
        self, shared_sources: _Sources, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[OpenSource]:
        """``open_source(data, fresh=False)``: a source holding ``data``, from :meth:`make_source`.

        Unless ``fresh`` (or ``share_sources`` is False), the tests of a class share one source
        per array, as one source serves a whole training run (and files are written once).
        """
        own = _Sources(lambda: tmp_path_factory.mktemp("source"))

        def open_(data: np.ndarray, fresh: bool = False) -> Source:
            sources = own if fresh or not self.share_sources else shared_sources
            return sources.get(data, self.make_source)

        yield open_
        own.close()

    def data(
        self, dtype: str | None = None, row_shape: tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The array a test stores (the class's first dtype and row shape unless given)."""
        return sample_data(
            self.dtypes[0] if dtype is None else dtype,
            self.row_shapes[0] if row_shape is None else row_shape,
            n_rows=self.n_rows,
        )

    def selections(self, source: Source) -> dict[str, Indices]:
        """Sorted unique index arrays every ``read`` must serve, by name."""
        n = len(source)
        rng = np.random.default_rng(n)
        chunk = source.chunk_rows if isinstance(source, Chunked) else None
        chosen: dict[str, Indices] = {
            "empty": indices([]),
            "first row": indices([0]),
            "last row": indices([n - 1]),
            "middle row": indices([n // 2]),
            "first and last rows": indices(sorted({0, n - 1})),
            "a run": np.arange(n // 3, min(n, n // 3 + 11), dtype=np.int64),
            "runs and gaps": indices(
                sorted({0, 1, 2, n // 2, n // 2 + 1, n - 2, n - 1} & set(range(n)))
            ),
            "a sparse subset": np.sort(rng.choice(n, size=max(1, n // 10), replace=False)),
            "a dense subset": np.sort(rng.choice(n, size=max(1, n - n // 10), replace=False)),
            "every other row": np.arange(0, n, 2, dtype=np.int64),
            "all rows": np.arange(n, dtype=np.int64),
        }
        if chunk:
            chosen["a run across a chunk boundary"] = np.arange(
                max(0, chunk - 2), min(n, chunk + 2), dtype=np.int64
            )
        return {name: idx.astype(np.int64) for name, idx in chosen.items()}

    def ranges(self, source: Source) -> list[tuple[int, int]]:
        """Non-empty row ranges ``[start, stop)`` for run reads, crossing chunk boundaries."""
        n = len(source)
        chunk = source.chunk_rows if isinstance(source, Chunked) else None
        chunk = chunk or max(1, n // 5)
        wanted = [
            (0, 1),
            (n - 1, n),
            (0, n),
            (n // 3, n // 3 + 7),
            (chunk - 1, chunk + 1),  # the last row of a chunk and the first of the next
            (0, chunk),  # exactly one chunk
            (chunk, 2 * chunk),
            (chunk // 2, 2 * chunk + chunk // 2 + 1),  # parts of two chunks and a whole one
            (n - chunk - 1, n),  # into the (possibly partial) last chunk
        ]
        ranges = [(max(0, a), min(n, b)) for a, b in wanted]
        return list(dict.fromkeys((a, b) for a, b in ranges if a < b))

    # -- the Source protocol ---------------------------------------------------------------------
    def test_satisfies_the_source_protocol(self, open_source: OpenSource, dtype: str) -> None:
        data = self.data(dtype)
        source = open_source(data)
        assert isinstance(source, Source), f"{type(source).__name__} is not a Source"
        assert tuple(source.shape) == data.shape, f"shape {source.shape}, expected {data.shape}"
        assert all(type(n) is int for n in source.shape), f"shape {source.shape!r} is not ints"
        assert isinstance(source.dtype, np.dtype), f"dtype {source.dtype!r} is not a np.dtype"
        assert native_dtype(source.dtype) == native_dtype(data.dtype), (
            f"dtype {source.dtype}, expected {data.dtype}"
        )
        assert len(source) == len(data), f"len() {len(source)}, expected {len(data)}"

    def test_read_returns_the_rows(self, open_source: OpenSource, dtype: str) -> None:
        data = self.data(dtype)
        source = open_source(data)
        self._check_reads(source, data)

    def test_read_rows_of_any_shape(
        self, open_source: OpenSource, row_shape: tuple[int, ...]
    ) -> None:
        data = self.data(row_shape=row_shape)
        source = open_source(data)
        self._check_reads(source, data)

    def _check_reads(self, source: Source, data: np.ndarray) -> None:
        for name, idx in self.selections(source).items():
            got = source.read(idx.copy())
            assert isinstance(got, np.ndarray), f"read({name}) returned {type(got).__name__}"
            assert_same_rows(got, data[idx], f"read({name})")

    def test_read_returns_a_new_array(self, open_source: OpenSource) -> None:
        data = self.data()
        expected = data.copy()
        source = open_source(data, fresh=True)  # made from this very `data`
        for name, idx in self.selections(source).items():
            got = source.read(idx)
            assert got.flags.writeable, f"read({name}) returned a read-only array"
            got[...] = garbage(got.shape, got.dtype)  # the caller owns the result
            assert_same_rows(source.read(idx), expected[idx], f"read({name}) after writing")
        assert_same_rows(data, expected, "the array the source was made from")

    def test_read_leaves_the_indices_alone(self, open_source: OpenSource) -> None:
        source = open_source(self.data())
        idx = np.arange(1, len(source), 3, dtype=np.int64)
        before = idx.copy()
        source.read(idx)
        assert np.array_equal(idx, before), "read() changed the indices it was given"

    # -- optional capabilities -------------------------------------------------------------------
    def test_gather_into_takes_any_order(self, open_source: OpenSource, dtype: str) -> None:
        data = self.data(dtype)
        source = open_source(data)
        if not isinstance(source, GatherInto):
            pytest.skip(f"{type(source).__name__} does not implement GatherInto")
        n = len(source)
        rng = np.random.default_rng(1)
        requests = {
            "empty": indices([]),
            "one row": indices([n // 2]),
            "reversed": np.arange(n - 1, -1, -1, dtype=np.int64),
            "shuffled": rng.permutation(n).astype(np.int64),
            "duplicates": indices([5 % n, 0, 5 % n, n - 1, 0, n - 1, n // 2]),
            "with replacement": rng.integers(0, n, size=2 * n).astype(np.int64),
            "sorted run": np.arange(n // 4, n // 2, dtype=np.int64),
        }
        for name, idx in requests.items():
            idx.setflags(write=False)  # read-only, as the feed's
            buffer = garbage((len(idx) + 4, *data.shape[1:]), data.dtype)
            out = buffer[2 : 2 + len(idx)]  # inside a larger buffer, as a caller's batch may be
            source.gather_into(idx, out)
            assert_same_rows(out, data[idx], f"gather_into({name})")
            untouched = np.concatenate([buffer[:2], buffer[2 + len(idx) :]])
            assert_same_rows(untouched, garbage(untouched.shape, data.dtype), "around `out`")

    def test_read_range_into(self, open_source: OpenSource, dtype: str) -> None:
        data = self.data(dtype)
        source = open_source(data)
        if not isinstance(source, ReadRangeInto):
            pytest.skip(f"{type(source).__name__} does not implement ReadRangeInto")
        for start, stop in self.ranges(source):
            buffer = garbage((stop - start + 4, *data.shape[1:]), data.dtype)
            out = buffer[2 : 2 + stop - start]
            source.read_range_into(start, stop, out)
            assert_same_rows(out, data[start:stop], f"read_range_into({start}, {stop})")
            untouched = np.concatenate([buffer[:2], buffer[2 + stop - start :]])
            assert_same_rows(untouched, garbage(untouched.shape, data.dtype), "around `out`")

    def test_read_run(self, open_source: OpenSource) -> None:
        data = self.data()
        source = open_source(data)
        if not isinstance(source, RunReader):
            pytest.skip(f"{type(source).__name__} does not implement RunReader")
        # Runs in increasing order, then decreasing (cheapest in increasing order, but correct).
        for start, stop in [*self.ranges(source), *reversed(self.ranges(source))]:
            got = source.read_run(start, stop)
            assert_same_rows(got, data[start:stop], f"read_run({start}, {stop})")

    def test_chunk_rows(self, open_source: OpenSource) -> None:
        source = open_source(self.data())
        if isinstance(source, Chunked):
            rows = source.chunk_rows
            assert rows is None or (type(rows) is int and 1 <= rows <= len(source)), (
                f"chunk_rows must be None or an int in [1, {len(source)}] (got {rows!r})"
            )
        # Whole-chunk reads only matter to sources that cannot gather rows cheaply.
        expected = (
            source.chunk_rows or None
            if isinstance(source, Chunked) and not isinstance(source, GatherInto)
            else None
        )
        assert chunked_rows(source) == expected, f"chunked_rows() {chunked_rows(source)!r}"

    def test_verify_passes_while_unchanged(self, open_source: OpenSource) -> None:
        data = self.data()
        source = open_source(data)
        if not isinstance(source, Verifiable):
            pytest.skip(f"{type(source).__name__} does not implement Verifiable")
        source.verify()
        source.read(np.arange(len(source), dtype=np.int64))
        source.verify()

    def test_pickle_round_trip(self, open_source: OpenSource) -> None:
        if not self.picklable:
            pytest.skip(self.not_picklable_because or "the source is not picklable")
        data = self.data()
        source = open_source(data)
        idx = self.selections(source)["a dense subset"]
        source.read(idx)  # files and handles are open now: pickling must leave them out
        clone = pickle.loads(pickle.dumps(source))
        try:
            assert tuple(clone.shape) == data.shape, f"unpickled shape {clone.shape}"
            assert native_dtype(clone.dtype) == native_dtype(data.dtype), (
                f"unpickled dtype {clone.dtype}"
            )
            assert len(clone) == len(data), f"unpickled len() {len(clone)}"
            assert_same_rows(clone.read(idx), data[idx], "read() of the unpickled source")
            assert_same_rows(source.read(idx), data[idx], "read() of the source after pickling")
        finally:
            if isinstance(clone, Closeable):
                clone.close()

    def test_portability_says_what_travels(self, open_source: OpenSource) -> None:
        """What a source says of reaching another process (a loader) holds: one that opens its
        file again pickles without its rows, one that is copied names the bytes it carries, and
        one that cannot be pickled stays."""
        data = self.data()
        source = open_source(data)
        move = portability(source)
        assert move.how in ("reopen", "copy", "stays"), f"portability() said {move.how!r}"
        if not self.picklable or move.how == "stays":
            assert move.how == "stays" and move.why, "a source that cannot travel must say why"
            return
        if move.how == "copy":  # what it holds: a sparse matrix holds less than its dense rows
            assert 0 < move.nbytes <= len(pickle.dumps(source)), f"'copy' of {move.nbytes} bytes"
            return
        stored = np.ascontiguousarray(data).tobytes()
        carried = pickle.dumps(source)
        pieces = [stored[i : i + 24] for i in range(0, len(stored) - 24, max(24, len(stored) // 8))]
        assert not any(piece in carried for piece in pieces), "'reopen', yet its pickle holds rows"

    # -- through the reading engine ---------------------------------------------------------------
    def test_read_rows_in_any_order(self, open_source: OpenSource, dtype: str) -> None:
        data = self.data(dtype)
        source = open_source(data)
        n = len(source)
        rng = np.random.default_rng(2)
        idx = np.concatenate([rng.integers(0, n, size=n // 2), [n - 1, 0, n - 1]]).astype(np.int64)
        (got,) = read_rows([source], idx)
        assert got.dtype == native_dtype(data.dtype), f"read_rows() dtype {got.dtype}"
        assert_same_rows(got, data[idx], "read_rows")

    def test_a_shuffled_epoch_reads_every_row_once(self, open_source: OpenSource) -> None:
        data = self.data()
        source = open_source(data)
        plan = Plan(n_rows=len(source), batch_size=32, shuffle="full", seed=7)
        seen = []
        for step in range(plan.steps):
            idx = plan.indices(1, step)
            (batch,) = read_rows([source], idx)
            assert_same_rows(batch, data[idx], f"batch {step}")
            seen.append(idx)
        rows = np.sort(np.concatenate(seen))
        assert np.array_equal(rows, np.arange(len(data))), "the epoch missed or repeated rows"

    @pytest.mark.parametrize(
        "shard", [Shard(1, 0), Shard(4, 1)], ids=["one worker", "worker 1 of 4"]
    )
    def test_a_block_shuffled_epoch_through_the_window_cache(
        self, open_source: OpenSource, shard: Shard
    ) -> None:
        """As shuffle="block" reads a source: whole chunk-aligned blocks, a window of them at a
        time, then batches gathered from the window."""
        data = self.data()
        source = open_source(data)
        block_rows = chunked_rows(source) or 16
        plan = Plan(
            n_rows=len(source),
            batch_size=13,
            shard=shard,
            shuffle="block",
            seed=3,
            block_rows=block_rows,
            window_blocks=3,
        )
        order = plan.block_order(1)
        cache = WindowCache(source, order, capacity=2, pool=None)
        seen = []
        for step in range(plan.steps):
            idx = plan.indices(1, step)
            out = garbage((len(idx), *data.shape[1:]), data.dtype)
            cache.gather_into(idx, out)
            assert_same_rows(out, data[idx], f"batch {step}")
            seen.append(idx)
        rows = np.concatenate(seen)
        start, stop = plan.bounds
        assert len(np.unique(rows)) == len(rows) == plan.rows_per_epoch, "rows missed or repeated"
        assert start <= int(rows.min()) and int(rows.max()) < stop, "rows outside the shard"
        blocks = sum(len(order.window_blocks(w)[0]) for w in range(order.windows))
        assert cache.loads == blocks, f"{blocks} blocks read {cache.loads} times"
