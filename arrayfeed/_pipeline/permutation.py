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
  inside ``range(n)``. Memory is O(len(positions)) for any ``n`` up to 2**62.

Both depend only on this module's arithmetic, not on NumPy's random generators, so a seed gives
the same permutation with any NumPy version.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

__all__ = ["EXACT_MAX", "derive_key", "invert", "permute", "splitmix64"]

EXACT_MAX = 1 << 16
_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15

Int64s = npt.NDArray[np.int64]
UInt64s = npt.NDArray[np.uint64]


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


def _mix(x: UInt64s) -> UInt64s:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@functools.lru_cache(maxsize=8)
def _round_keys(key: int) -> tuple[np.uint64, ...]:
    keys = []
    k = key & _MASK64
    for _ in range(_ROUNDS):
        k = splitmix64(k)
        keys.append(np.uint64(k))
    return tuple(keys)


def _widths(n: int) -> tuple[int, int]:
    """Bit widths ``(a, b)`` of the two halves; ``2**(a+b)`` is the smallest power of two >= n."""
    total = max(2, (n - 1).bit_length())
    return total // 2, total - total // 2


def _encrypt(x: UInt64s, a: int, b: int, keys: tuple[np.uint64, ...]) -> UInt64s:
    # State (left: wl bits, right: wr bits); a round maps it to (right, left ^ F(right)), whose
    # widths are (wr, wl). Six rounds (even) bring the widths back to (a, b).
    left, right = x >> np.uint64(b), x & np.uint64((1 << b) - 1)
    wl, wr = a, b
    for k in keys:
        left, right = right, left ^ (_mix(right ^ k) & np.uint64((1 << wl) - 1))
        wl, wr = wr, wl
    return (left << np.uint64(wr)) | right


def _decrypt(x: UInt64s, a: int, b: int, keys: tuple[np.uint64, ...]) -> UInt64s:
    left, right = x >> np.uint64(b), x & np.uint64((1 << b) - 1)
    wl, wr = a, b
    for k in reversed(keys):
        # Undo (l, r) -> (r, l ^ F(r)): the previous state had widths (wr, wl).
        left, right = right ^ (_mix(left ^ k) & np.uint64((1 << wr) - 1)), left
        wl, wr = wr, wl
    return (left << np.uint64(wr)) | right


def _walk(x: Int64s, n: int, key: int, step: object) -> Int64s:
    a, b = _widths(n)
    keys = _round_keys(key & _MASK64)
    out = step(x.astype(np.uint64), a, b, keys)  # type: ignore[operator]
    limit = np.uint64(n)
    outside = np.flatnonzero(out >= limit)
    while outside.size:
        out[outside] = step(out[outside], a, b, keys)  # type: ignore[operator]
        outside = outside[out[outside] >= limit]
    return out.astype(np.int64)  # type: ignore[no-any-return]


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


def permute(positions: npt.ArrayLike, n: int, key: int) -> Int64s:
    """Images of ``positions`` (each in ``range(n)``) under the permutation chosen by ``key``.

    >>> import numpy as np
    >>> p = permute(np.arange(10), 10, key=42)
    >>> sorted(p.tolist()) == list(range(10))
    True
    >>> bool((permute(np.arange(3, 7), 10, key=42) == p[3:7]).all())
    True
    """
    pos = _check(positions, n, "positions")
    if n <= 1:
        return pos.copy()
    if n <= EXACT_MAX:
        return _exact(n, key & _MASK64)[0][pos]
    return _walk(pos, n, key, _encrypt)


def invert(images: npt.ArrayLike, n: int, key: int) -> Int64s:
    """Positions whose images are ``images``: ``invert(permute(p, n, k), n, k) == p``.

    >>> import numpy as np
    >>> int(invert(permute(np.array([7]), 100_000, key=1), 100_000, key=1)[0])
    7
    """
    img = _check(images, n, "images")
    if n <= 1:
        return img.copy()
    if n <= EXACT_MAX:
        return _exact(n, key & _MASK64)[1][img]
    return _walk(img, n, key, _decrypt)
