"""The shared knapsack programme (``hold``'s dense table and ``milp``'s sparse rows): exact, the
same choice in either form and in any block size, ties to a job's first option."""

import itertools

import numpy as np
import pytest

import malleparsl.allocator.knapsack as knapsack
from malleparsl.allocator.knapsack import programme


def _brute(options, cap):
    best = -np.inf
    for ks in itertools.product(*[range(len(v)) for _, v in options]):
        if sum(int(w[k]) for (w, _), k in zip(options, ks)) <= cap:
            best = max(best, sum(v[k] for (_, v), k in zip(options, ks)))
    return best


@pytest.mark.parametrize("chunk", [knapsack.CHUNK_CELLS, 7])
def test_dense_and_sparse_forms_choose_alike_and_exactly(monkeypatch, chunk):
    monkeypatch.setattr(knapsack, "CHUNK_CELLS", chunk)  # 7: one or two options per block
    rng = np.random.default_rng(5)
    for _ in range(150):
        nj, s, cap = int(rng.integers(1, 5)), int(rng.integers(0, 5)), int(rng.integers(0, 9))
        table = rng.integers(-3, 4, size=(nj, s + 1)).astype(float)  # many ties
        table[rng.random(table.shape) < 0.2] = -np.inf  # sizes a job may not take
        table[:, 0] = 0.0
        dense, v_dense = programme([(None, row) for row in table], cap, from_cap=False)
        sparse, v_sparse = programme(
            [(np.arange(s + 1), row) for row in table], cap, from_cap=False
        )
        assert dense == sparse and v_dense == v_sparse
        opts = [(np.arange(s + 1), row) for row in table]
        assert v_dense == _brute(opts, cap)
        assert sum(dense) <= cap and sum(table[i, k] for i, k in enumerate(dense)) == v_dense


def test_sparse_rows_in_any_order_tie_to_the_first_option():
    # two options of equal value and weight order 3, 1: the first row wins, as milp's rows did
    w, v = np.array([0, 3, 1]), np.array([0.0, 5.0, 5.0])
    assert programme([(w, v)], 3)[0] == [1]
    assert programme([(w[[0, 2, 1]], v)], 3)[0] == [1]
    assert programme([(w, v)], 2) == ([2], 5.0)
    assert programme([(np.array([2]), np.array([1.0]))], 1)[1] == -np.inf  # nothing fits


def test_repeated_weights_make_more_options_than_sizes():
    """Options are (weight, value) pairs: two at the same weight are allowed (the buffer was
    sized by the largest weight and broke on such lists)."""
    opts = [(np.array([0, 0, 1]), np.array([1.0, 2.0, 3.0])), (np.array([1, 1]), np.array([4.0, 5.0]))]
    chosen, value = programme(opts, 5)
    assert value == _brute(opts, 5) == 8.0 and chosen == [2, 1]
