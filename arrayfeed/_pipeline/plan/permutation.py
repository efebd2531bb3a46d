"""A stateless, seekable pseudo-random permutation of ``range(n)``.

Pure NumPy, no I/O. ``permute(positions, n, key)`` maps any positions to their images under a
permutation fixed by ``key``; ``invert`` maps images back. Any step of any epoch can be reached in
O(1), without replaying earlier ones.

Two constructions, chosen by ``n``:

- ``n <= EXACT_MAX`` (65,536): the permutation is materialised as the stable argsort of a 64-bit
  hash of every position (uniform over all permutations for a random hash; O(n) memory, so only
  for small ``n``; the last few are cached). A Feistel network over a tiny domain can reach only a
  small, biased subset of permutations, which is why small ``n`` does not use it.
- larger ``n``: an unbalanced Feistel network over the smallest power of two ``>= n`` (so fewer
  than two encryptions per position on average), six rounds keyed from ``key`` with the SplitMix64
  mixer as round function, plus cycle walking: images ``>= n`` are encrypted again until they fall
  inside ``range(n)``. Memory is O(len(positions)) for any ``n`` up to 2**62, plus, up to
  ``2**(2 * TABLE_BITS)``, a table of each round's function over its inputs (O(sqrt(n)): the
  same images, a lookup a round).

Both depend only on this module's arithmetic, not on NumPy's random generators, so a seed gives
the same permutation with any NumPy version.

Positions go through the network ``CHUNK`` at a time, in work buffers that calls reuse, and the
images can be written into a caller's array (``out=``): a reader thread permutes every block of
an epoch's positions (:mod:`.indexblocks`) without allocating. That matters beside TensorFlow:
building a ``from_generator`` iterator lowers glibc's mmap threshold for the whole process (and
freezes it there), so every large temporary is a fresh ``mmap`` that page-faults on first touch,
and a Feistel evaluation makes dozens of group-sized temporaries (docs/performance.md, "Fresh
temporaries beside TensorFlow").
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from ..._forks import renew_after_fork

__all__ = ["CHUNK", "EXACT_MAX", "derive_key", "invert", "permute", "splitmix64"]

EXACT_MAX = 1 << 16
#: Most positions permuted per pass through the work buffers. Every NumPy call of a pass (about
#: 200 with cycle walking) hands the GIL over and back, and beside a busy Python thread (a training
#: loop) each hand-off can wait the switch interval, so passes are long: readers compute an epoch's
#: indices in blocks of this many positions (:mod:`.indexblocks`; docs/performance.md,
#: "Permutation passes").
CHUNK = 1 << 18
_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_GOLDEN = 0x9E3779B97F4A7C15

Int64s = npt.NDArray[np.int64]
UInt64s = npt.NDArray[np.uint64]
Keys = tuple[UInt64s, ...]
Words = tuple[UInt64s, ...]
Tables = tuple[UInt64s, ...] | tuple[None, ...]


def _word(value: int) -> UInt64s:
    """``value`` as a 0-d uint64 array: the operand a ufunc takes fastest (a NumPy scalar
    costs a conversion per call, a third of a call on a batch's few hundred positions)."""
    return np.array(value, dtype=np.uint64)


_M1, _M2 = _word(0xBF58476D1CE4E5B9), _word(0x94D049BB133111EB)


def splitmix64(x: int) -> int:
    """The SplitMix64 finaliser on a Python int (a well-mixed 64-bit hash)."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from a sequence of integers (seed, epoch, shard …), order-sensitive."""
    key = 0
    for part in parts:
        key = splitmix64(key ^ (int(part) & _MASK64))
        key = splitmix64(key ^ ((int(part) >> 64) & _MASK64))
    return key


_S30, _S27, _S31 = _word(30), _word(27), _word(31)


def _mix_into(x: UInt64s, tmp: UInt64s) -> None:
    """The SplitMix64 finaliser of every element of ``x``, in place (``tmp``: same length)."""
    np.right_shift(x, _S30, out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, _M1, out=x)
    np.right_shift(x, _S27, out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, _M2, out=x)
    np.right_shift(x, _S31, out=tmp)
    np.bitwise_xor(x, tmp, out=x)


def _mix(x: UInt64s) -> UInt64s:
    out = x.copy()
    _mix_into(out, np.empty_like(out))
    return out


class _Scratch:
    """Work buffers for ``size`` positions: four words each for the network, a flag for cycle
    walking."""

    def __init__(self, size: int) -> None:
        self.words: Words = tuple(np.empty(size, dtype=np.uint64) for _ in range(4))
        self.flags = np.empty(size, dtype=bool)


#: Work buffers not in use, kept for the next call (reader threads end with every epoch, so
#: buffers kept per thread would be allocated and faulted in anew each epoch). At most
#: ``_MAX_SPARE`` sets of at most ``CHUNK`` positions (four words and a flag each) are kept.
_spare: list[_Scratch] = []
_spare_lock = threading.Lock()
renew_after_fork(sys.modules[__name__], "_spare_lock")
_MAX_SPARE = 4


@contextlib.contextmanager
def _scratch(size: int) -> Iterator[_Scratch]:
    """Work buffers for ``size`` positions, for this caller alone until it is done."""
    with _spare_lock:
        scratch = _spare.pop() if _spare else None
    if scratch is None or len(scratch.flags) < size:
        scratch = _Scratch(size)
    try:
        yield scratch
    finally:
        with _spare_lock:
            if len(_spare) < _MAX_SPARE:
                _spare.append(scratch)


@functools.lru_cache(maxsize=8)
def _round_keys(key: int) -> Keys:
    keys = []
    k = key & _MASK64
    for _ in range(_ROUNDS):
        k = splitmix64(k)
        keys.append(_word(k))
    return tuple(keys)


def _widths(n: int) -> tuple[int, int]:
    """Bit widths ``(a, b)`` of the two halves; ``2**(a+b)`` is the smallest power of two >= n."""
    total = max(2, (n - 1).bit_length())
    return total // 2, total - total // 2


@functools.lru_cache(maxsize=64)
def _masks(bits: int) -> tuple[UInt64s, UInt64s]:
    """``bits`` (a shift) and ``2**bits - 1`` (a mask) as operands."""
    return _word(bits), _word((1 << bits) - 1)


def _round_function(
    x: UInt64s, key: UInt64s, mask: UInt64s, words: Words, table: UInt64s | None
) -> UInt64s:
    """``_mix(x ^ key) & mask`` in ``words[2]`` (``words[3]``: scratch), looked up in
    ``table`` where there is one (see :func:`_tables`)."""
    f = words[2][: len(x)]
    if table is not None:
        np.take(table, x.view(np.int64), out=f, mode="wrap")  # (x < len(table))
        return f
    np.bitwise_xor(x, key, out=f)
    _mix_into(f, words[3][: len(x)])
    np.bitwise_and(f, mask, out=f)
    return f


#: Round functions of inputs of at most this many bits are tabulated (:func:`_tables`): up to
#: a permutation of 2**28 positions, whose tables (6 x 16,384 words, 768 KiB) take the mixer
#: over about 100,000 positions to build, a fortieth of what a worker's epoch permutes there.
TABLE_BITS = 14
_NO_TABLES: tuple[None, ...] = (None,) * _ROUNDS


@functools.lru_cache(maxsize=8)
def _tables(key: int, a: int, b: int) -> tuple[UInt64s, ...] | tuple[None, ...]:
    """Each round's function over every input it can take, for a network of halves of ``a``
    and ``b`` bits (round ``i`` maps ``b`` bits to ``a`` for even ``i``, ``a`` to ``b`` for
    odd): a round is then one lookup, not the mixer's ten NumPy calls (a pass over a chunk of
    positions three times faster, over a batch's few hundred five times). Built where the
    halves have at most :data:`TABLE_BITS` bits, else none."""
    if max(a, b) > TABLE_BITS:
        return _NO_TABLES
    tables = []
    for i, k in enumerate(_round_keys(key)):
        x = np.arange(1 << (b if i % 2 == 0 else a), dtype=np.uint64)
        np.bitwise_xor(x, k, out=x)
        _mix_into(x, np.empty_like(x))
        np.bitwise_and(x, _masks(a if i % 2 == 0 else b)[1], out=x)
        x.setflags(write=False)
        tables.append(x)
    return tuple(tables)


def _encrypt(
    x: UInt64s, out: UInt64s, a: int, b: int, keys: Keys, words: Words, tables: Tables
) -> None:
    # State (left: wl bits, right: wr bits); a round maps it to (right, left ^ F(right)), whose
    # widths are (wr, wl). Six rounds (even) bring the widths back to (a, b). `out` may be `x`.
    left, right = words[0][: len(x)], words[1][: len(x)]
    (_, mask_a), (shift_b, mask_b) = _masks(a), _masks(b)
    np.right_shift(x, shift_b, out=left)
    np.bitwise_and(x, mask_b, out=right)
    ml, mr = mask_a, mask_b
    for k, table in zip(keys, tables, strict=True):
        np.bitwise_xor(left, _round_function(right, k, ml, words, table), out=left)
        left, right = right, left
        ml, mr = mr, ml
    np.left_shift(left, shift_b, out=out)  # (an even number of rounds: widths (a, b) again)
    np.bitwise_or(out, right, out=out)


def _decrypt(
    x: UInt64s, out: UInt64s, a: int, b: int, keys: Keys, words: Words, tables: Tables
) -> None:
    left, right = words[0][: len(x)], words[1][: len(x)]
    (_, mask_a), (shift_b, mask_b) = _masks(a), _masks(b)
    np.right_shift(x, shift_b, out=left)
    np.bitwise_and(x, mask_b, out=right)
    ml, mr = mask_a, mask_b
    for k, table in zip(reversed(keys), reversed(tables), strict=True):
        # Undo (l, r) -> (r, l ^ F(r)): the previous state had widths (wr, wl).
        np.bitwise_xor(right, _round_function(left, k, mr, words, table), out=right)
        left, right = right, left
        ml, mr = mr, ml
    np.left_shift(left, shift_b, out=out)  # (an even number of rounds: widths (a, b) again)
    np.bitwise_or(out, right, out=out)


def _encrypt_int(x: int, a: int, b: int, keys: tuple[int, ...]) -> int:
    """:func:`_encrypt` of one value, on Python ints (``keys`` as ints)."""
    left, right, wl, wr = x >> b, x & ((1 << b) - 1), a, b
    for k in keys:
        # _mix_into's finaliser on one value, inlined (a few dozen calls per batch).
        f = right ^ k
        f = ((f ^ (f >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        f = ((f ^ (f >> 27)) * 0x94D049BB133111EB) & _MASK64
        left ^= (f ^ (f >> 31)) & ((1 << wl) - 1)
        left, right, wl, wr = right, left, wr, wl
    return (left << wr) | right


def _decrypt_int(x: int, a: int, b: int, keys: tuple[int, ...]) -> int:
    """:func:`_decrypt` of one value, on Python ints (``keys`` as ints)."""
    left, right, wl, wr = x >> b, x & ((1 << b) - 1), a, b
    for k in reversed(keys):
        f = left ^ k  # as in _encrypt_int
        f = ((f ^ (f >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        f = ((f ^ (f >> 27)) * 0x94D049BB133111EB) & _MASK64
        right ^= (f ^ (f >> 31)) & ((1 << wr) - 1)
        left, right, wl, wr = right, left, wr, wl
    return (left << wr) | right


Step = Callable[[UInt64s, UInt64s, int, int, Keys, Words, Tables], None]
StepInt = Callable[[int, int, int, tuple[int, ...]], int]
_ON_INTS: dict[Step, StepInt] = {_encrypt: _encrypt_int, _decrypt: _decrypt_int}
#: Images still outside ``range(n)`` that cycle walking finishes one by one on Python ints: a
#: pass over a few positions costs as many NumPy calls (about 60) as one over many, and the last
#: few of a batch's positions can need a dozen passes (a step leaves more than a third outside
#: when ``n`` is just above a power of two), where walking them alone takes microseconds each.
#: Both costs are the interpreter's, so where they balance does not move with the machine; a
#: batch's first call takes as long from 4 to 32 left (permutation of 1.25 M, 256 positions).
SCALAR_TAIL = 32
#: The same where the rounds are tabulated: the balance moves with the NumPy calls of a pass,
#: two a round (a lookup, an xor) against the mixer's eleven, and eight around them.
TABLE_TAIL = SCALAR_TAIL * (_ROUNDS * 2 + 8) // (_ROUNDS * 11 + 8)


def _walk(x: Int64s, out: Int64s, n: int, key: int, step: Step) -> None:
    """``out[i] = step(x[i])`` with cycle walking, ``CHUNK`` positions at a time (1-D arrays)."""
    a, b = _widths(n)
    keys = _round_keys(key & _MASK64)
    tables = _tables(key & _MASK64, a, b)
    limit = _word(n)
    one = _ON_INTS[step]
    tail = SCALAR_TAIL if tables[0] is None else TABLE_TAIL
    # Values lie in [0, n), n < 2**62, so the int64 arrays are read and written as uint64.
    src, dst = x.view(np.uint64), out.view(np.uint64)
    with _scratch(min(len(x), CHUNK)) as scratch:
        for i in range(0, len(src), CHUNK):
            images = dst[i : i + CHUNK]
            step(src[i : i + CHUNK], images, a, b, keys, scratch.words, tables)
            outside = scratch.flags[: len(images)]
            np.greater_equal(images, limit, out=outside)
            while (left := int(np.count_nonzero(outside))) > tail:
                again = images[outside]  # fewer than half of them, fewer each pass
                step(again, again, a, b, keys, scratch.words, tables)
                images[outside] = again
                np.greater_equal(images, limit, out=outside)
            if left:
                ints = tuple(map(int, keys))
                for j in np.flatnonzero(outside).tolist():
                    image = int(images[j])
                    while image >= n:
                        image = one(image, a, b, ints)
                    images[j] = image


@functools.lru_cache(maxsize=8)
def _exact(n: int, key: int) -> tuple[Int64s, Int64s]:
    """The permutation of ``range(n)`` and its inverse, materialised (small ``n`` only)."""
    hashes = _mix(np.arange(n, dtype=np.uint64) ^ np.uint64(key & _MASK64))
    forward = np.argsort(hashes, kind="stable").astype(np.int64)
    backward = np.empty(n, dtype=np.int64)
    backward[forward] = np.arange(n, dtype=np.int64)
    forward.setflags(write=False)
    backward.setflags(write=False)
    return forward, backward


def _check(values: npt.ArrayLike, n: int, what: str) -> Int64s:
    x = np.asarray(values, dtype=np.int64)
    if n < 0 or n >= 1 << 62:
        raise ValueError(f"`n` must be in [0, 2**62) (got {n}).")
    if x.size and (int(x.min()) < 0 or int(x.max()) >= n):
        raise ValueError(f"{what} must lie in [0, {n}) (got min {x.min()}, max {x.max()}).")
    return x


def _output(x: Int64s, out: Int64s | None) -> tuple[Int64s, Int64s, Int64s]:
    """``(src, dst, result)``: ``x`` and the output as 1-D arrays that ``dst`` may be written
    over ``src`` chunk by chunk, and the array to return (``out``, or a new one)."""
    if out is None:
        out = np.empty(x.shape, dtype=np.int64)
    elif out.dtype != np.int64 or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(
            f"`out` must be a C-contiguous int64 array of shape {x.shape} "
            f"(got {out.dtype} {out.shape})."
        )
    src = x.reshape(-1)
    dst = out.reshape(-1)
    # Writing a chunk over itself is safe; any other overlap would read overwritten positions.
    same = src.ctypes.data == dst.ctypes.data and src.strides == dst.strides
    if np.may_share_memory(src, dst) and not same:
        src = src.copy()
    return src, dst, out


def _images(
    values: npt.ArrayLike, n: int, key: int, out: Int64s | None, what: str, inverse: bool
) -> Int64s:
    x = _check(values, n, what)
    src, dst, result = _output(x, out)
    if n <= 1:
        np.copyto(dst, src)
    elif n <= EXACT_MAX:
        table = _exact(n, key & _MASK64)[1 if inverse else 0]
        with _scratch(min(len(src), CHUNK)) as scratch:
            copy = scratch.words[0].view(np.int64)
            for i in range(0, len(src), CHUNK):  # through a copy: `dst` may be `src`
                chunk = copy[: min(CHUNK, len(src) - i)]
                np.copyto(chunk, src[i : i + CHUNK])
                np.take(table, chunk, out=dst[i : i + CHUNK], mode="clip")  # checked: in range
    else:
        _walk(src, dst, n, key, _decrypt if inverse else _encrypt)
    return result


def permute(positions: npt.ArrayLike, n: int, key: int, out: Int64s | None = None) -> Int64s:
    """Images of ``positions`` (each in ``range(n)``) under the permutation chosen by ``key``.

    ``out``: a C-contiguous int64 array of the positions' shape to write the images into (it may
    be ``positions`` itself), returned; by default a new array.

    >>> import numpy as np
    >>> p = permute(np.arange(10), 10, key=42)
    >>> sorted(p.tolist()) == list(range(10))
    True
    >>> bool((permute(np.arange(3, 7), 10, key=42) == p[3:7]).all())
    True
    """
    return _images(positions, n, key, out, "positions", inverse=False)


def invert(images: npt.ArrayLike, n: int, key: int, out: Int64s | None = None) -> Int64s:
    """Positions whose images are ``images``: ``invert(permute(p, n, k), n, k) == p``
    (``out`` as for :func:`permute`).

    >>> import numpy as np
    >>> int(invert(permute(np.array([7]), 100_000, key=1), 100_000, key=1)[0])
    7
    """
    return _images(images, n, key, out, "images", inverse=True)
