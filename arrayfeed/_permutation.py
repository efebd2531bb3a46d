"""A stateless, seekable pseudo-random permutation of ``range(n)``.

Pure NumPy, no I/O. ``permute(positions, n, key)`` maps any positions to their images under a
permutation fixed by ``key``, without materialising the permutation: memory is O(len(positions))
for any ``n`` up to 2**62, so a batch of an epoch over 10**12 rows is planned as cheaply as one over
10**3 rows, and any step of any epoch can be reached in O(1).

The construction is a balanced Feistel network over the smallest power of four ``>= n`` (so the
two halves have equal widths), keyed per round from ``key`` with the SplitMix64 mixer, plus
cycle walking: images ``>= n`` are encrypted again until they fall inside ``range(n)``. Since the
domain is less than ``4 * n``, the expected number of walks per position is below four.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["derive_key", "permute", "splitmix64"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15


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


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _encrypt(
    x: npt.NDArray[np.uint64], half_bits: int, keys: list[np.uint64]
) -> npt.NDArray[np.uint64]:
    shift = np.uint64(half_bits)
    mask = np.uint64((1 << half_bits) - 1)
    left = x >> shift
    right = x & mask
    for k in keys:
        left, right = right, left ^ (_mix(right ^ k) & mask)
    return (left << shift) | right


def permute(positions: npt.ArrayLike, n: int, key: int) -> npt.NDArray[np.int64]:
    """Images of ``positions`` (each in ``range(n)``) under the permutation chosen by ``key``.

    >>> import numpy as np
    >>> p = permute(np.arange(10), 10, key=42)
    >>> sorted(p.tolist()) == list(range(10))
    True
    >>> bool((permute(np.arange(3, 7), 10, key=42) == p[3:7]).all())
    True
    """
    pos = np.asarray(positions, dtype=np.int64)
    if n < 0 or n >= 1 << 62:
        raise ValueError(f"`n` must be in [0, 2**62) (got {n}).")
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n}) (got min {pos.min()}, max {pos.max()}).")
    if n <= 1:
        return pos.copy()
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    keys = []
    k = key & _MASK64
    for _ in range(_ROUNDS):
        k = splitmix64(k)
        keys.append(np.uint64(k))
    out = _encrypt(pos.astype(np.uint64), half_bits, keys)
    limit = np.uint64(n)
    outside = np.flatnonzero(out >= limit)
    while outside.size:
        out[outside] = _encrypt(out[outside], half_bits, keys)
        outside = outside[out[outside] >= limit]
    return out.astype(np.int64)
