"""The stateless permutation: a bijection, seekable, invertible, deterministic, well mixed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrayfeed._pipeline.plan import permutation
from arrayfeed._pipeline.plan.permutation import (
    CHUNK,
    EXACT_MAX,
    SCALAR_TAIL,
    derive_key,
    invert,
    permute,
)

# Sizes on both sides of the switch from the exact construction to the Feistel network.
SIZES = [0, 1, 2, 3, 10, 1000, EXACT_MAX - 1, EXACT_MAX, EXACT_MAX + 1, 3 * EXACT_MAX + 17, 1 << 18]


@pytest.mark.parametrize("n", SIZES)
def test_is_a_bijection_with_an_inverse(n: int) -> None:
    for key in (0, 12345, 2**64 - 1):
        image = permute(np.arange(n), n, key)
        assert image.dtype == np.int64
        assert np.array_equal(np.sort(image), np.arange(n))
        assert np.array_equal(invert(image, n, key), np.arange(n))


@given(n=st.integers(0, 3000), key=st.integers(0, 2**64 - 1))
@settings(max_examples=100, deadline=None)
def test_small_n_is_a_bijection(n: int, key: int) -> None:
    assert np.array_equal(np.sort(permute(np.arange(n), n, key)), np.arange(n))


@given(n=st.integers(1, 2**40), key=st.integers(0, 2**64 - 1), data=st.data())
@settings(max_examples=150, deadline=None)
def test_seekable_invertible_and_deterministic(n: int, key: int, data: st.DataObject) -> None:
    positions = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40)))
    image = permute(positions, n, key)
    assert ((image >= 0) & (image < n)).all()
    assert np.array_equal(invert(image, n, key), positions)
    assert np.array_equal(image, permute(positions, n, key))
    # Distinct positions have distinct images.
    assert len(np.unique(image)) == len(np.unique(positions))
    # Any subset agrees with the whole: permuting one position alone gives the same image.
    assert all(
        int(permute(np.array([p]), n, key)[0]) == int(i)
        for p, i in zip(positions[:5], image[:5], strict=False)
    )


def test_keys_give_different_orders() -> None:
    for n in (1000, 5 * EXACT_MAX):
        orders = {tuple(permute(np.arange(50), n, derive_key(0, epoch))) for epoch in range(10)}
        assert len(orders) == 10


def test_huge_n_plans_in_batch_memory() -> None:
    n = 2**40 + 12345
    positions = np.arange(n - 256, n, dtype=np.int64)
    image = permute(positions, n, key=7)
    assert image.min() >= 0 and image.max() < n
    assert len(np.unique(image)) == 256


@pytest.mark.parametrize("n", [6, 10])
def test_small_n_pairs_are_uniform(n: int) -> None:
    # Over many keys, the images of positions 0 and 1 should be uniform over ordered pairs.
    # (A Feistel network over such a tiny domain fails this badly: chi2 in the hundreds.)
    trials = 20000
    pairs = np.array([permute(np.array([0, 1]), n, derive_key(7, k)) for k in range(trials)])
    counts = np.bincount(pairs[:, 0] * n + pairs[:, 1], minlength=n * n)
    cells = counts[[i * n + j for i in range(n) for j in range(n) if i != j]]
    expected = trials / (n * (n - 1))
    chi2 = float(((cells - expected) ** 2 / expected).sum())
    dof = n * (n - 1) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof), chi2


@pytest.mark.parametrize("n", [EXACT_MAX + 1, 1_000_003])
def test_large_n_pairs_are_uniform_at_coarse_scale(n: int) -> None:
    trials, bins = 10000, 8
    pairs = np.array([permute(np.array([0, 1]), n, derive_key(3, k)) for k in range(trials)])
    cells = np.bincount(
        (pairs[:, 0] * bins // n) * bins + pairs[:, 1] * bins // n, minlength=bins * bins
    )
    expected = trials / bins**2
    chi2 = float(((cells - expected) ** 2 / expected).sum())
    assert chi2 < 63 + 6 * np.sqrt(2 * 63), chi2


@pytest.mark.parametrize("n", [10_000, 1_000_003])
def test_adjacent_positions_decorrelated(n: int) -> None:
    image = permute(np.arange(n), n, key=3).astype(np.float64)
    assert abs(np.corrcoef(image[:-1], image[1:])[0, 1]) < 0.03


def test_derive_key_is_order_sensitive() -> None:
    assert derive_key(1, 2) != derive_key(2, 1)
    assert derive_key(0, 1) == derive_key(0, 1)
    assert derive_key(2**100) != derive_key(2**100 + 1)


def test_rejects_out_of_range_values() -> None:
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 5\)"):
        permute(np.array([5]), 5, key=0)
    with pytest.raises(ValueError, match=r"images must lie in \[0, 5\)"):
        invert(np.array([-1]), 5, key=0)


def test_the_stream_is_pinned() -> None:
    # Pinned values: a seed must keep giving the same epochs (resuming a run on a newer
    # arrayfeed), on both constructions.
    assert permute(np.arange(6), 1_000_000, derive_key(0, 1)).tolist() == [
        928488, 532402, 436988, 635623, 662069, 128424,
    ]  # fmt: skip
    assert permute(np.arange(6), 1000, derive_key(0, 1)).tolist() == [306, 163, 928, 288, 416, 881]
    assert invert(np.arange(3), 2**40 + 3, 7).tolist() == [
        556844564515, 718827057540, 1011962142454,
    ]  # fmt: skip


@pytest.mark.parametrize("n", [(1 << 20) + 1, 3 * (1 << 19), 10**12 + 7])
@pytest.mark.parametrize("fn", [permute, invert])
def test_walking_the_last_few_one_by_one_gives_the_same_images(n: int, fn: Any) -> None:
    # A large call walks nearly every position through NumPy; one position at a time walks on
    # Python ints after the first step: both must land on the same images (n just above a
    # power of two needs the most walking).
    positions = np.random.default_rng(n).integers(0, n, size=4 * SCALAR_TAIL + 1000)
    together = fn(positions, n, 3)
    one_by_one = [int(fn(positions[i : i + 1], n, 3)[0]) for i in range(0, len(positions), 7)]
    assert one_by_one == together[::7].tolist()
    other = invert if fn is permute else permute
    assert np.array_equal(other(together[:SCALAR_TAIL], n, 3), positions[:SCALAR_TAIL])


@pytest.mark.parametrize("n", [1, EXACT_MAX - 1, (1 << 20) + 1, 10**12])
@pytest.mark.parametrize("fn", [permute, invert])
def test_out_in_place_and_in_several_chunks(n: int, fn: Any) -> None:
    count = 2 * CHUNK + 5  # several passes through the work buffers, the last one short
    positions = np.random.default_rng(n).integers(0, n, size=count)
    expected = fn(positions, n, 99)
    work = positions.copy()
    assert fn(work, n, 99, out=work) is work
    assert np.array_equal(work, expected)
    # An `out` overlapping the positions at an offset reads them first.
    shifted = np.concatenate([positions, [0]])
    assert np.array_equal(fn(shifted[:-1], n, 99, out=shifted[1:]), expected)
    with pytest.raises(ValueError, match="out"):
        fn(positions, n, 99, out=np.empty(count, dtype=np.int32))


def test_concurrent_calls_never_share_work_buffers() -> None:
    n, key = 10**9, 5
    chunks = [np.arange(i * CHUNK, (i + 1) * CHUNK) for i in range(8)]
    expected = [permute(c, n, key) for c in chunks]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: permute(c, n, key), chunks * 3))
    assert all(np.array_equal(r, e) for r, e in zip(results, expected * 3, strict=True))


@pytest.mark.parametrize("n", [65_537, (1 << 20) + 1, 3 * (1 << 19), (1 << 28) - 3, (1 << 28) + 1])
@pytest.mark.parametrize("fn", [permute, invert])
def test_tabulated_rounds_give_the_images_of_the_mixer(
    n: int, fn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Up to 2**28 (halves of 14 bits) each round is a lookup in a table of its function; the
    # images must be the mixer's, both ways, cycle walking included.
    positions = np.random.default_rng(n).integers(0, n, size=5000)
    key = derive_key(11, n)
    tabulated = fn(positions, n, key)
    assert (permutation._tables(key, *permutation._widths(n))[0] is None) == (n > 1 << 28)
    monkeypatch.setattr(permutation, "TABLE_BITS", 0)
    permutation._tables.cache_clear()
    np.testing.assert_array_equal(tabulated, fn(positions, n, key))
    permutation._tables.cache_clear()
