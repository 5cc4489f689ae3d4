"""The port picker the tests and benches share hands each port out once per process, so components
started together before any of them binds never get the same port."""

from __future__ import annotations

from bench.chaos_stack import free_port, free_port_range


def test_ports_picked_before_any_is_bound_are_all_different() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_a_range_shares_no_port_with_one_handed_out_before() -> None:
    single = free_port()
    base = free_port_range(50)
    assert single not in range(base, base + 50)
    assert free_port() not in range(base, base + 50)
