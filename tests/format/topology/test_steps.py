"""Rank-balanced steps: a row's cost, the balance of an order, whole-step permutations."""

from __future__ import annotations

import numpy as np
import pytest

from packshard.errors import UsageError
from packshard.format.topology import Topology, row_costs, step_balance, step_permutation


def test_row_costs_by_tokens_and_by_attention():
    lengths = np.array([3, 4, 10, 2], np.int32)
    offsets = np.array([0, 2, 2, 4])  # row 1 is empty
    assert row_costs(lengths, offsets, "tokens").tolist() == [7.0, 0.0, 12.0]
    assert row_costs(lengths, offsets, "attention", c=0.5).tolist() == [19.5, 0.0, 64.0]


def test_step_balance_is_the_sum_of_step_maxima_over_the_sum_of_means():
    topology = Topology(dp=2, micro_batch=1, grad_accum=2, cost="tokens")
    # step 0: rank 0 rows 0, 2 → 9 + 4; rank 1 rows 1, 3 → 7 + 2 (13 vs 9); step 1: 5 5 5 5
    costs = np.array([9, 7, 4, 2, 5, 5, 5, 5, 1], np.float64)
    got = step_balance(costs, topology)
    assert got["steps"] == 2
    assert got["partial_rows"] == 1
    assert got["max_over_mean"] == pytest.approx((13 + 10) / (11 + 10), abs=1e-6)
    assert got["worst_step"] == pytest.approx(13 / 11, abs=1e-6)


def test_step_permutation_moves_whole_steps_only():
    perm = step_permutation(11, 4, np.random.default_rng(3))
    assert sorted(perm.tolist()) == list(range(11))
    steps = perm[:8].reshape(2, 4)
    assert all(s.tolist() == list(range(s[0], s[0] + 4)) for s in steps)
    assert perm[8:].tolist() == [8, 9, 10]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp": 0}, "--dp must be"),
        ({"dp": 2, "micro_batch": 0}, "--micro-batch must be"),
        ({"dp": 2, "cost": "flops"}, "--balance-cost must be one of"),
        ({"dp": 2, "c": -1.0}, "--attention-c must be"),
    ],
)
def test_impossible_topologies_are_refused(kwargs, message):
    with pytest.raises(UsageError, match=message):
        Topology(**kwargs)


def test_the_recorded_topology_reads_back():
    topology = Topology(8, 2, 4, "attention", 1e-4)
    assert Topology.from_config({"topology": topology.recorded()}) == topology
    assert Topology.from_config({}) is None
