"""Local ports for the servers tests start: Ray clusters' GCS and agents, gloo groups, MLflow,
moto, the fake Kubernetes API.

A port the kernel hands out for `bind(("127.0.0.1", 0))` is free on loopback only, comes from
its ephemeral range, which every outgoing connection draws from too, and the other pytest-xdist
process probes the same range at the same time: between the probe and the server's own bind on
0.0.0.0 (Ray's GcsServer and raylet: src/ray/rpc/grpc_server.cc, GrpcServer::Run), the port can
be taken, and a Ray node that cannot bind its port exits. So each test process takes ports in
turn from a block of its own below the ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 by default) and above Ray's worker ports (--min/max-worker-port, 10002-19999), and
probes each on every address."""

from __future__ import annotations

import errno
import itertools
import os
import socket

FIRST, BLOCK = 20000, 1500  # blocks for 8 xdist processes: 20000-31999
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 8
_block = range(FIRST + _worker * BLOCK, FIRST + (_worker + 1) * BLOCK)
_start = os.getpid() % 100 * 10  # processes sharing a block (a subprocess's own) start apart
_ports = itertools.cycle([*_block[_start:], *_block[:_start]])


def free_port() -> int:
    """The next port of this process's block that nothing is bound to on any address."""
    for port in itertools.islice(_ports, BLOCK):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                continue
            return port
    raise RuntimeError(f"no free port in {_block.start}-{_block.stop - 1}")
