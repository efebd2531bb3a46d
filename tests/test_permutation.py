"""The stateless permutation: a bijection, seekable, deterministic, keyed, and O(batch) memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrayfeed._permutation import derive_key, permute


@given(n=st.integers(0, 3000), key=st.integers(0, 2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_is_a_bijection(n: int, key: int) -> None:
    image = permute(np.arange(n), n, key)
    assert image.dtype == np.int64
    assert np.array_equal(np.sort(image), np.arange(n))


@given(n=st.integers(1, 10**6), key=st.integers(0, 2**64 - 1), data=st.data())
@settings(max_examples=100, deadline=None)
def test_seekable_any_subset_agrees_with_the_whole(n: int, key: int, data: st.DataObject) -> None:
    positions = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50)))
    whole_prefix = permute(np.arange(min(n, 2000)), n, key)
    sub = permute(positions, n, key)
    inside = positions < len(whole_prefix)
    assert np.array_equal(sub[inside], whole_prefix[positions[inside]])
    assert np.array_equal(sub, permute(positions, n, key))  # deterministic


def test_keys_give_different_orders() -> None:
    n = 1000
    orders = {tuple(permute(np.arange(n), n, derive_key(0, epoch))) for epoch in range(10)}
    assert len(orders) == 10
    assert not np.array_equal(permute(np.arange(n), n, 1), np.arange(n))


def test_huge_n_plans_in_batch_memory() -> None:
    n = 2**40 + 12345
    positions = np.arange(n - 256, n, dtype=np.int64)
    image = permute(positions, n, key=7)
    assert image.min() >= 0 and image.max() < n
    assert len(np.unique(image)) == 256


def test_mixing_looks_uniform() -> None:
    # Where position 0 lands over many keys should be close to uniform over range(n).
    n, trials = 10, 20000
    landing = np.array([permute(np.array([0]), n, derive_key(k))[0] for k in range(trials)])
    counts = np.bincount(landing, minlength=n)
    chi2 = float(((counts - trials / n) ** 2 / (trials / n)).sum())
    assert chi2 < 40, counts  # 9 degrees of freedom: p < 1e-5 above ~37


def test_adjacent_positions_decorrelated() -> None:
    n = 100_000
    image = permute(np.arange(n), n, key=3).astype(np.float64)
    corr = np.corrcoef(image[:-1], image[1:])[0, 1]
    assert abs(corr) < 0.02


def test_derive_key_is_order_sensitive() -> None:
    assert derive_key(1, 2) != derive_key(2, 1)
    assert derive_key(0, 1) == derive_key(0, 1)
    assert derive_key(2**100) != derive_key(2**100 + 1)


def test_rejects_out_of_range_positions() -> None:
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 5\)"):
        permute(np.array([5]), 5, key=0)
