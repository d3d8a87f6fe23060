"""``--dp``: balanced steps beat the seed's order and keep every row once."""

from __future__ import annotations

import numpy as np

from packshard.format.topology import Topology, step_balance
from packshard.pack.plan.balance import balance_stats, balanced_order


def test_the_docstring_step_balances_exactly():
    topology = Topology(dp=2, micro_batch=1, grad_accum=2, cost="tokens")
    costs = np.array([9, 4, 7, 2], np.float64)  # the seed's order: ranks get 9+7 and 4+2
    order = balanced_order(costs, topology, seed=0)
    per_rank = costs[order].reshape(2, 2).sum(axis=0)  # row j·dp + r to rank r
    assert per_rank.tolist() == [11.0, 11.0]
    assert step_balance(costs, topology)["max_over_mean"] > 1.4


def test_balanced_order_is_a_permutation_and_beats_the_seeds_order():
    rng = np.random.default_rng(0)
    costs = rng.uniform(500, 4096, 10_003) + 1e-4 * rng.uniform(0, 4096, 10_003) ** 2
    for dp, k in ((8, 1), (8, 4), (64, 2)):
        topology = Topology(dp=dp, micro_batch=1, grad_accum=k)
        order = balanced_order(costs, topology, seed=1)
        assert sorted(order.tolist()) == list(range(len(costs)))
        stats = balance_stats(costs, order, topology)
        assert stats["max_over_mean"] <= 1.02
        assert stats["unbalanced_max_over_mean"] > stats["max_over_mean"]
        assert stats["partial_rows"] == len(costs) % (dp * k)


def test_the_seed_shuffles_steps_not_their_rows():
    costs = np.arange(64, dtype=np.float64)
    topology = Topology(dp=4, micro_batch=2, grad_accum=1, cost="tokens")
    a, b = balanced_order(costs, topology, 0), balanced_order(costs, topology, 1)
    assert a.tolist() != b.tolist()
    steps_a = {frozenset(s) for s in a.reshape(-1, 8).tolist()}
    steps_b = {frozenset(s) for s in b.reshape(-1, 8).tolist()}
    assert steps_a == steps_b
