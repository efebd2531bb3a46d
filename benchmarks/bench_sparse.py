"""Rows/s of sparse CSR batches against densifying the whole matrix first.

A matrix of 20,000 x 2,000 float32 at 2 % density (about 800,000 stored values, 160 MB dense),
stored the ways a user has it: a ``scipy.sparse`` CSR matrix in memory, an ``.h5ad`` written as
anndata writes it (resizable, so chunked, datasets), the same with contiguous datasets (memory
mapped), an AnnData Zarr v3 store, and ``arrayfeed convert``'s CSR copies of the ``.h5ad``
(HDF5 with the default, no compression, hence contiguous; Zarr with lzf; the conversion time is
printed). For each, ``arrayfeed.batches`` (no TensorFlow) with batch
256 and a full shuffle (and ``shuffle="block"``), yielding dense rows (the default) and
``sparse=True`` batches (``scipy.sparse.csr_array``); with ``--tf``, ``from_arrays`` too.

Baselines measured in the same run:

- ``densify first``: the whole matrix made dense once (``toarray()``, after reading the file for
  the stored cases), then the same stream from the dense array in RAM. Both the one-off cost and
  the stream's rows/s are shown, and ``1 epoch incl. densify``: rows of one epoch divided by the
  densify time plus one epoch's time (what a single pass costs).
- ``scipy m[idx].toarray()``: what a hand-written loop does per batch.

Each figure is rows consumed in a plain loop over whole epochs for ``--seconds``, the median of
``--reps`` interleaved repetitions. Data is page-cached (written, then read once) before timing.

    python benchmarks/bench_sparse.py                 # ~1-2 min on 2 cores
    python benchmarks/bench_sparse.py --quick --tf
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import arrayfeed as af
from tests._anndata import write_anndata_zarr, write_h5ad

BATCH = 256


def make_matrix(rows: int, cols: int, density: float, seed: int = 0) -> scipy.sparse.csr_matrix:
    rng = np.random.default_rng(seed)
    m = scipy.sparse.random(rows, cols, density=density, format="csr", random_state=rng)
    m.data = np.ceil(m.data * 20).astype(np.float32)
    return m.astype(np.float32)


def write_contiguous(path: Path, m: scipy.sparse.csr_matrix) -> Path:
    import h5py

    with h5py.File(path, "w") as f:
        g = f.create_group("X")
        g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
        g.attrs["shape"] = np.asarray(m.shape)
        g["data"], g["indices"], g["indptr"] = m.data, m.indices, m.indptr
    return path


def touch(x: Any) -> None:
    """Read one value per 4 KiB page of a dense batch (a lazily zeroed buffer pays its page faults
    here, not in the consumer), or every stored value of a sparse one."""
    if isinstance(x, np.ndarray):
        x.reshape(len(x), -1)[:, ::1024].sum()
    elif scipy.sparse.issparse(x):
        x.data.sum()


def rate(epochs: Callable[[], Iterator[Any]], seconds: float) -> float:
    """Rows/s over whole epochs for at least ``seconds``."""
    rows, start = 0, time.perf_counter()
    while True:
        for batch in epochs():
            x = batch[0] if isinstance(batch, tuple) else batch
            touch(x)
            rows += x.shape[0]
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return rows / elapsed


def scipy_loop(m: Any, seed: int) -> Callable[[], Iterator[Any]]:
    rng = np.random.default_rng(seed)

    def epoch() -> Iterator[Any]:
        order = rng.permutation(m.shape[0])
        for i in range(0, len(order) - BATCH + 1, BATCH):
            yield m[np.sort(order[i : i + BATCH])].toarray()

    return epoch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cols", type=int, default=2_000)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--seconds", type=float, default=2.0, help="per case and repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 s per case, 2 repetitions")
    parser.add_argument("--tf", action="store_true", help="also through from_arrays (TensorFlow)")
    parser.add_argument("--threads", type=int, default=None, help="reader threads (default: af's)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.reps = 1.0, 2
    m = make_matrix(args.rows, args.cols, args.density)
    tmp = Path(tempfile.mkdtemp(prefix="bench_sparse_"))
    h5ad = write_h5ad(tmp / "a.h5ad", m)
    converted: dict[str, float] = {}  # `arrayfeed convert` of the .h5ad, copied as CSR: seconds
    for out, compression in (("o.h5", None), ("o.zarr", "lzf")):
        began = time.perf_counter()
        af.convert({"X": f"{h5ad}:X"}, tmp / out, compression=compression, progress=False)
        converted[out] = time.perf_counter() - began
    zarr_paths = {"AnnData Zarr v3": tmp / "a.zarr", "convert output, Zarr lzf": tmp / "o.zarr"}
    stored: dict[str, Any] = {
        "scipy CSR in RAM": m,
        "h5ad (as anndata writes)": f"{h5ad}:X",
        "h5ad, contiguous": f"{write_contiguous(tmp / 'c.h5ad', m)}:X",
        "AnnData Zarr v3": af.open_array(write_anndata_zarr(tmp / "a.zarr", m), "X"),
        "convert output, HDF5 (contiguous)": f"{tmp / 'o.h5'}:X",
        "convert output, Zarr lzf": af.open_array(tmp / "o.zarr", "X"),
    }
    for value in stored.values():  # page-cache the files
        source = af.open_array(value) if isinstance(value, str) else af.open_array(m)
        source.read(np.arange(0, args.rows, 97, dtype=np.int64))
    threads = {"num_threads": args.threads} if args.threads else {}

    # -- densify first -------------------------------------------------------------------------
    densify: dict[str, list[float]] = {name: [] for name in stored}
    for name, value in [(n, v) for _ in range(args.reps) for n, v in stored.items()]:
        dense = None  # the previous copy goes first: the timing includes a fresh allocation
        began = time.perf_counter()
        if isinstance(value, str):
            path, key = value.rsplit(":", 1)
            import h5py

            with h5py.File(path, "r") as f:
                g = f[key]
                whole = scipy.sparse.csr_matrix(
                    (g["data"][...], g["indices"][...], g["indptr"][...]), shape=m.shape
                )
        elif not isinstance(value, scipy.sparse.spmatrix):
            import zarr

            g = zarr.open_group(str(zarr_paths[name]), mode="r")["X"]
            whole = scipy.sparse.csr_matrix(
                (g["data"][...], g["indices"][...], g["indptr"][...]), shape=m.shape
            )
        else:
            whole = value
        dense = whole.toarray()
        touch(dense)
        densify[name].append(time.perf_counter() - began)
    cases: dict[str, Callable[[], Iterator[Any]]] = {}
    cases["densify first: stream from dense ndarray"] = lambda: iter(
        af.batches(dense, batch_size=BATCH, seed=0, drop_remainder=True, **threads)
    )
    cases["scipy m[idx].toarray() loop"] = scipy_loop(m, 0)
    for name, value in stored.items():
        for shuffle in (True, "block"):
            for sparse in (False, True):
                label = f"{name}, {'full' if shuffle is True else 'block'}, " + (
                    "sparse=True" if sparse else "dense rows"
                )
                b = af.batches(
                    value,
                    batch_size=BATCH,
                    shuffle=shuffle,
                    seed=0,
                    drop_remainder=True,
                    sparse=sparse,
                    **threads,
                )
                cases[label] = lambda b=b: iter(b)
    if args.tf:
        import tensorflow as tf  # noqa: F401

        for name in ("scipy CSR in RAM", "h5ad (as anndata writes)"):
            for sparse in (False, True):
                ds = af.from_arrays(
                    stored[name],
                    batch_size=BATCH,
                    seed=0,
                    drop_remainder=True,
                    sparse=sparse,
                    **threads,
                )
                cases[f"tf.data: {name}, full, {'sparse=True' if sparse else 'dense rows'}"] = (
                    lambda ds=ds: iter(ds)
                )
        dense_ds = af.from_arrays(dense, batch_size=BATCH, seed=0, drop_remainder=True, **threads)
        cases["tf.data: densify first, dense ndarray"] = lambda: iter(dense_ds)

    results: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.reps):
        for name, epochs in cases.items():
            results[name].append(rate(epochs, args.seconds))
            print(f"[rep {rep + 1}] {name}: {results[name][-1]:,.0f} rows/s", file=sys.stderr)
    medians = {name: statistics.median(v) for name, v in results.items()}
    base = medians["densify first: stream from dense ndarray"]
    nnz = m.nnz
    print(
        f"\n{args.rows:,} x {args.cols:,} float32, density {nnz / (args.rows * args.cols):.2%} "
        f"({nnz:,} stored values; dense {args.rows * args.cols * 4 / 2**20:.0f} MiB), batch "
        f"{BATCH}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"median of {args.reps} x {args.seconds:.0f} s"
    )
    width = max(len(n) for n in medians)
    print(f"{'case':{width}}  {'rows/s':>11}  {'vs densified stream':>19}")
    for name, value in medians.items():
        print(f"{name:{width}}  {value:>11,.0f}  {value / base:>18.2f}x")
    print(
        "\narrayfeed convert of the .h5ad, copied as CSR (HDF5 uncompressed, Zarr lzf): "
        + ", ".join(f"{out} {seconds:.2f} s" for out, seconds in converted.items())
    )
    epoch_s = args.rows / base
    print("\ndensify the whole matrix first (read + toarray), then one epoch from RAM:")
    for name, times in densify.items():
        seconds = statistics.median(times)
        one = args.rows / (seconds + epoch_s)
        print(
            f"  {name:{width - 2}}  densify {seconds:6.2f} s   1 epoch incl. densify {one:>11,.0f} rows/s"
        )


if __name__ == "__main__":
    main()
