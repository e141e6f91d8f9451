"""Free TCP ports on 127.0.0.1 for the local stores and daemons the project starts itself.

Drawn below Linux's ephemeral range (32768-60999 by default), where the kernel picks the source
port of every outgoing connection: a port drawn at random from 20000-60000 was taken by one
between the draw and a gloo store's bind (``EADDRINUSE`` in CI, 2026-11-26). Below that range
only another listener can take it, and the bind here checks for one.
"""

from __future__ import annotations

import os
import socket

EPHEMERAL_LO = 32768
"""Linux's default first ephemeral port: ports drawn here stay below it."""


def free_port_block(count: int = 1, *, lo: int = 20000, hi: int = EPHEMERAL_LO) -> int:
    """First port of ``count`` consecutive TCP ports on 127.0.0.1 that nothing is bound to now
    (a random start in ``[lo, hi - count)``)."""
    if count < 1 or hi - lo <= count:
        raise ValueError(f"need 1 <= count < hi - lo, got count={count}, lo={lo}, hi={hi}")
    rng = int.from_bytes(os.urandom(2), "little")
    for attempt in range(200):
        base = lo + (rng + attempt * 97) % (hi - lo - count)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {count} free ports found in {lo}..{hi}")


def free_port() -> int:
    """One free TCP port on 127.0.0.1, below the ephemeral range (a gloo store's)."""
    return free_port_block(1)
