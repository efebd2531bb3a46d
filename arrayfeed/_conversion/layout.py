"""Storage layout for shuffled batch reads: ``convert``'s chunk policy and ``inspect``'s verdict.

Pure Python and NumPy, no I/O.

**Chunk policy.** Every chunked array of a converted store is chunked along the batch axis only,
in blocks of the *same* number of rows ``R`` for all arrays: a chunk never splits a row, and rows
``[k*R, (k+1)*R)`` are one chunk in every array, so a run of rows decodes one chunk per array.
Without an explicit ``chunk_rows``, ``R`` is the largest power of two whose chunks, summed over
the arrays, hold at most :data:`CHUNK_TARGET_BYTES` of the format: 256 KiB for HDF5, 1 MiB for
Zarr (so a chunk of rows holds between half the target and the target); at least one row, at
most all rows. Powers of two keep chunks aligned with the usual batch sizes.

Why these targets: smaller chunks pay a per-chunk cost on every read, larger ones make a batch
decode far more than it uses, and a converted layout serves reads of runs of rows (random rows
stay slow from any chunked store). Uncompressed HDF5 without an explicit ``chunk_rows`` is
written contiguous instead: HDF5 needs chunks only to compress, and h5py gathers random rows of a
contiguous dataset much faster than of a chunked one (docs/performance.md, 'Chunk sizes of
converted stores').

**Verdict.** Contiguous arrays (``.npy``, contiguous HDF5) suit shuffled reads. Chunked arrays
suit them when chunks hold whole rows, when a chunk of rows (summed over the arrays of the same
length) holds at least :data:`TINY_CHUNK_BYTES`, when no chunk exceeds :data:`HUGE_CHUNK_BYTES`, and
when the arrays of one length share the same chunk rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from .._errors import ConfigError
from .._storage import ArrayLayout

__all__ = [
    "SLAB_BYTES",
    "CHUNK_TARGET_BYTES",
    "COMPRESSIONS",
    "HUGE_CHUNK_BYTES",
    "TINY_CHUNK_BYTES",
    "assess",
    "choose_chunk_rows",
    "element_runs",
    "format_bytes",
    "normalize_compression",
    "slab_rows",
]

#: Default most bytes in one chunk of rows, summed over the arrays of a store, per format.
CHUNK_TARGET_BYTES: Mapping[str, int] = MappingProxyType({"hdf5": 256 << 10, "zarr": 1 << 20})
#: Bytes of rows (summed over arrays) that ``convert`` reads and writes at a time, a *slab*: whole
#: chunks, at least one chunk. This bounds the memory a conversion holds.
SLAB_BYTES = 64 << 20
#: Below this, per-chunk overhead dominates a batch read.
TINY_CHUNK_BYTES = 64 << 10
#: Above this, a batch read decodes far more than it uses (see the module docstring).
HUGE_CHUNK_BYTES = 8 << 20
#: Compressions ``convert`` writes (see ``arrayfeed.convert`` for the Zarr codecs they map to).
COMPRESSIONS = ("none", "lzf", "gzip")


def choose_chunk_rows(row_bytes: int, n_rows: int, *, target_bytes: int) -> int:
    """Rows per chunk: the largest power of two with ``rows * row_bytes <= target_bytes``.

    At least 1 (a chunk never splits a row) and at most ``n_rows`` (one chunk holds everything).

    >>> choose_chunk_rows(3 * 1024, 100_000, target_bytes=256 << 10)  # 64 rows = 192 KiB
    64
    >>> choose_chunk_rows(8, 1000, target_bytes=256 << 10)  # tiny arrays are one chunk
    1000
    >>> choose_chunk_rows(1 << 20, 10, target_bytes=256 << 10)  # a chunk never splits a row
    1
    """
    if row_bytes < 1 or n_rows < 1:
        raise ValueError(f"`row_bytes` and `n_rows` must be positive (got {row_bytes}, {n_rows}).")
    rows = max(1, target_bytes // row_bytes)
    return min(1 << (rows.bit_length() - 1), n_rows)


def slab_rows(
    chunk_rows: int, row_bytes: int, n_rows: int, *, target_bytes: int = SLAB_BYTES
) -> int:
    """Rows a conversion moves at a time (a slab): a whole number of chunks within
    ``target_bytes`` (at least one chunk).

    >>> slab_rows(256, 3 * 1024, 10**6)
    21760
    """
    chunks = max(1, target_bytes // max(1, chunk_rows * row_bytes))
    return max(1, min(chunks * chunk_rows, n_rows))


def element_runs(length: int, itemsize: int) -> list[tuple[int, int]]:
    """``(start, stop)`` runs of about :data:`SLAB_BYTES` covering a 1-D array of ``length``
    elements (the arrays of a sparse matrix, which have no rows to slab by).

    >>> element_runs(10, SLAB_BYTES // 4)
    [(0, 4), (4, 8), (8, 10)]
    """
    step = max(1, SLAB_BYTES // itemsize)
    return [(a, min(a + step, length)) for a in range(0, length, step)]


def normalize_compression(value: str | None) -> str:
    """``"none"``, ``"lzf"`` or ``"gzip"`` from what a caller passed (None means ``"none"``)."""
    if value is None:
        return "none"
    if isinstance(value, str) and value.lower() in COMPRESSIONS:
        return value.lower()
    raise ConfigError(
        f"`compression` must be one of {', '.join(COMPRESSIONS)} or None (got {value!r}); "
        "pick lzf for fast reads or gzip for small files."
    )


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``'1.5 MiB'``.

    >>> format_bytes(1536 * 1024)
    '1.5 MiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _label(layout: ArrayLayout) -> str:
    return f"`{layout.name or '(array)'}`"


def assess(arrays: Sequence[ArrayLayout]) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` about reading ``arrays`` in shuffled batches.

    ``problems`` are what makes the layout unsuited (each says why); ``notes`` are worth knowing
    but harmless. An empty ``problems`` means the layout suits shuffled batch reads.

    >>> ok = ArrayLayout(name="x", shape=(10_000, 256), dtype="float32", chunks=(1024, 256))
    >>> assess([ok])
    ([], [])
    >>> split = ArrayLayout(name="x", shape=(10_000, 256), dtype="float32", chunks=(10_000, 16))
    >>> print(assess([split])[0][0])
    `x`: chunks (10000, 16) split each row into 16 pieces; a batch read decodes 16 chunks per row.
    """
    problems: list[str] = []
    notes: list[str] = []
    dense: list[ArrayLayout] = []  # arrays of rows: neither 0-d, unreadable nor sparse
    matrices: dict[int, list[ArrayLayout]] = {}  # CSR matrices, by rows
    for a in arrays:
        if not a.shape:
            notes.append(
                f"{_label(a)} is 0-d (a scalar); it has no rows to read and is left aside."
            )
        elif a.unreadable is not None:
            problems.append(f"{_label(a)} cannot be read here: {a.unreadable}")
        elif a.encoding in ("csr_matrix", "csc_matrix"):
            _assess_sparse(a, problems, notes)  # its chunks hold nonzeros, not rows
            if a.encoding == "csr_matrix":
                matrices.setdefault(a.shape[0], []).append(a)
        else:
            dense.append(a)
            _assess_chunks(a, problems, notes)
    by_length: dict[int, list[ArrayLayout]] = {}
    for a in dense:
        by_length.setdefault(a.shape[0], []).append(a)
    for n_rows, group in sorted(by_length.items()):
        problems.extend(_row_block_problems(n_rows, group, matrices.get(n_rows, [])))
    whole = [a for a in dense if a.loads_whole]
    if whole:
        problems.append(
            f"{_labels(whole)}: .npz members cannot be memory-mapped, so every process reads them "
            f"whole into memory ({format_bytes(sum(a.nbytes for a in whole))})."
        )
    notes.extend(_encoding_notes(dense))
    return problems, notes


def _assess_chunks(a: ArrayLayout, problems: list[str], notes: list[str]) -> None:
    """What the chunks of one array of rows mean for batch reads (nothing when contiguous)."""
    if a.chunks is None:
        return
    if a.chunk_rows is None:
        pieces = math.prod(
            -(-s // c) for c, s in zip(a.chunks[1:], a.shape[1:], strict=True) if c > 0
        )
        problems.append(
            f"{_label(a)}: chunks {a.chunks} split each row into {pieces} pieces; a batch "
            f"read decodes {pieces} chunks per row."
        )
    chunk_bytes = a.chunk_bytes or 0
    if chunk_bytes > HUGE_CHUNK_BYTES:
        problems.append(
            f"{_label(a)}: chunks of {format_bytes(chunk_bytes)} are huge; a batch read "
            f"decodes whole chunks and uses a sliver of each (aim for about "
            "256 KiB to 1 MiB)."
        )
    if a.missing_chunks and a.strict:
        problems.append(
            f"{_label(a)}: {a.missing_chunks} chunks are missing from a store arrayfeed "
            "wrote complete; the store is corrupt, convert it again from the original data."
        )
    elif a.missing_chunks:
        notes.append(
            f"{_label(a)}: {a.missing_chunks} chunks are not stored and read as the fill value."
        )


def _row_block_problems(
    n_rows: int, group: Sequence[ArrayLayout], matrices: Sequence[ArrayLayout]
) -> list[str]:
    """What the chunks of the arrays of ``n_rows`` rows (``group``, and the CSR ``matrices`` of
    as many rows, read beside them) mean together: a batch read decodes a chunk of each."""
    problems = []
    chunked = [a for a in group if a.chunk_rows is not None]
    rows = sorted({a.chunk_rows for a in chunked if a.chunk_rows is not None})
    if len(rows) > 1:
        listing = ", ".join(f"{_label(a)}: {a.chunk_rows}" for a in chunked)
        problems.append(
            f"the arrays of {n_rows} rows are chunked in different row blocks ({listing}), so "
            "a batch read decodes a whole chunk of each, mostly unused in the larger ones."
        )
    for r in rows:
        same = [a for a in chunked if a.chunk_rows == r]
        total = sum(a.chunk_bytes or 0 for a in same) + sum(_csr_bytes(m, r) for m in matrices)
        if total < TINY_CHUNK_BYTES and r < n_rows:
            together = " (all arrays together)" if len(same) + len(matrices) > 1 else ""
            problems.append(
                f"{_labels(same)}: chunks of {r} rows hold {format_bytes(total)}{together}, "
                f"below {format_bytes(TINY_CHUNK_BYTES)}; per-chunk overhead dominates batch "
                "reads."
            )
    return problems


def _encoding_notes(dense: Sequence[ArrayLayout]) -> list[str]:
    """Harmless remarks on how arrays of rows are encoded: categoricals, tables, gzip."""
    notes = []
    categoricals = [a for a in dense if a.encoding == "categorical"]
    if categoricals:
        notes.append(
            f"{_labels(categoricals)}: categorical (integer codes of labels); arrayfeed reads "
            "the codes (-1: missing), with the labels as `open_array(...).categories`. "
            "`convert` copies the codes only."
        )
    for a in dense:
        if a.dtype.fields is not None:
            fields = ", ".join(a.dtype.names or ())
            notes.append(
                f"{_label(a)} is a table (compound dtype; fields {fields}); each field is read "
                f"as its own array: 'FILE:{a.name}#FIELD' as a path, or `open_array(FILE, "
                f"{a.name!r}, field=FIELD)`."
            )
    gzipped = [a for a in dense if a.chunks is not None and "gzip" in a.compression]
    if gzipped:
        notes.append(
            f"{_labels(gzipped)}: gzip decodes several times slower than lzf, LZ4 or Zstd; fine "
            "when reads are bound by the disk rather than the CPU."
        )
    return notes


def _csr_bytes(a: ArrayLayout, rows: int) -> int:
    """Bytes that ``rows`` rows of the CSR matrix ``a`` store on average (values and column
    indices, taken as 32-bit: the usual width)."""
    n_rows = a.shape[0] if a.shape else 0
    return (a.nnz or 0) * rows // max(1, n_rows) * (a.dtype.itemsize + 4)


def _assess_sparse(a: ArrayLayout, problems: list[str], notes: list[str]) -> None:
    """What a sparse matrix (an AnnData ``csr_matrix`` / ``csc_matrix`` group) means for reads."""
    rows, cols = (*a.shape, 0, 0)[:2]
    nnz = a.nnz or 0
    if a.encoding == "csc_matrix":
        problems.append(
            f"{_label(a)}: a sparse matrix stored by column (CSC, {rows:,} x {cols:,}), whose rows "
            "are spread over the whole matrix; arrayfeed reads CSR. Convert it: "
            "`adata.X = adata.X.tocsr()` (or the layer's `.tocsr()`) and write the file again."
        )
        return
    density = nnz / (rows * cols) if rows * cols else 0.0
    notes.append(
        f"{_label(a)}: a sparse CSR matrix ({rows:,} x {cols:,}, {nnz:,} stored values, "
        f"{density:.2%} dense); arrayfeed reads its rows through `indptr`, dense "
        f"({format_bytes(a.nbytes)} in all) or as sparse tensors with `sparse=True`. "
        "`convert` copies it as CSR (dense with `densify=True`, --densify)."
    )
    chunk_bytes = a.chunk_bytes or 0
    if chunk_bytes > HUGE_CHUNK_BYTES:
        problems.append(
            f"{_label(a)}: its values are stored in chunks of {format_bytes(chunk_bytes)}; a "
            "shuffled batch decodes whole chunks and uses a sliver of each. Write the matrix "
            "again with smaller chunks (anndata: `dataset_kwargs={'chunks': (65536,)}`)."
        )


def _labels(layouts: Sequence[ArrayLayout]) -> str:
    return ", ".join(_label(a) for a in layouts)
