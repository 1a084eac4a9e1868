"""The claim's batch shared among tenants on a distributed store (``batch_shares``): by
weight, in rotation order, at least one each while the batch lasts, summing to the batch."""

from __future__ import annotations

import pytest

from toolkit.store.distributed_leases import batch_shares


@pytest.mark.parametrize(
    ("limit", "weights", "shares"),
    [
        (16, [1, 1, 1, 1], [4, 4, 4, 4]),
        (4, [1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]),  # more tenants than tasks: lowest vtime first
        (10, [3, 1], [8, 2]),  # by weight, the remainder to the first
        (5, [1, 1, 1], [2, 2, 1]),
        (3, [10, 1, 1], [2, 1, 0]),  # by weight, each at least one while the batch lasts
        (0, [1, 2], [0, 0]),
        (5, [], []),
    ],
)
def test_the_batch_is_shared_by_weight(limit: int, weights: list[float], shares: list[int]) -> None:
    assert batch_shares(limit, weights) == shares


def test_the_shares_sum_to_the_batch() -> None:
    for limit in range(1, 40):
        for count in range(1, 12):
            weights = [1 + (i * 7) % 5 for i in range(count)]
            shares = batch_shares(limit, weights)
            assert sum(shares) == limit and min(shares) >= 0, (limit, weights, shares)
