"""The dev stack's port plan: stacks whose base ports differ never share a port."""

from __future__ import annotations

import itertools

import pytest

from taskplane.dev.ports import MAX_REPLICAS, WIDTH, PortPlanError, plan


def test_any_two_different_bases_give_disjoint_port_sets() -> None:
    bases = range(1100, 30000, WIDTH)
    sets = {b: set(plan(b, MAX_REPLICAS).named().values()) for b in bases}
    for a, b in itertools.combinations(bases, 2):
        assert not sets[a] & sets[b], (a, b)
    # the pair the old plan broke: 1000 apart (replay port = KV-events port + 1000)
    assert not set(plan(18200, 3).named().values()) & set(plan(19200, 3).named().values())


def test_every_port_lies_in_the_stack_block_and_is_unique() -> None:
    for replicas in (1, 3, MAX_REPLICAS):
        p = plan(18200, replicas)
        ports = list(p.named().values())
        assert len(ports) == len(set(ports)) == 4 + 3 * replicas
        assert all(port in p.all_ports() for port in ports)


@pytest.mark.parametrize(("base", "replicas"), [(18250, 3), (18201, 3), (500, 3), (65500, 3), (18200, 0),
                                                (18200, MAX_REPLICAS + 1)])
def test_bases_off_the_grid_and_too_many_replicas_are_refused(base: int, replicas: int) -> None:
    with pytest.raises(PortPlanError):
        plan(base, replicas)
