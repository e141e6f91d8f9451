"""Free local ports for the gloo stores and daemons the project starts itself."""

from __future__ import annotations

import socket

import pytest

from malleparsl.ports import EPHEMERAL_LO, free_port, free_port_block


def test_a_free_port_is_bindable_and_below_the_ephemeral_range():
    """A random 20000-60000 port was taken by an outgoing connection's source port between the
    draw and a gloo store's bind (CI, 2026-11-26): ports now come from below that range."""
    for _ in range(20):
        port = free_port()
        assert 20000 <= port < EPHEMERAL_LO
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_block_skips_ports_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        base = free_port_block(3, lo=taken - 1, hi=taken + 8)
        assert not base <= taken < base + 3


def test_a_block_that_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="count"):
        free_port_block(10, lo=20000, hi=20005)
