"""Ports on this host: a taken port is named with whoever holds it, read from /proc."""

import socket
import subprocess
import sys

import pytest

from launcher.errors import LaunchError
from launcher.ports import check_ports, free_port, pick_ports, port_holders


def test_a_taken_port_names_the_process_that_listens_on_it():
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            " print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(holder.stdout.readline())
        holders = port_holders(port)
        assert len(holders) == 1 and holders[0].startswith(f"pid {holder.pid} ({sys.executable} -c "), holders
        with pytest.raises(LaunchError) as e:
            check_ports("127.0.0.1", {"grpc_port": port})
        assert f"serve.grpc_port={port}" in str(e.value) and f"by pid {holder.pid} (" in str(e.value), str(e.value)
        assert pick_ports("127.0.0.1", {"grpc_port": port})["grpc_port"] != port  # a free one instead
    finally:
        holder.kill()
        holder.wait()


def test_a_port_nobody_listens_on_has_no_holder():
    with socket.socket() as s:  # bound but not listening: not a holder
        s.bind(("127.0.0.1", 0))
        assert port_holders(s.getsockname()[1]) == []
    assert port_holders(free_port()) == []


def test_a_free_port_is_picked_outside_the_kernels_ephemeral_range(monkeypatch):
    """An outgoing connection can take a port of the ephemeral range between the pick and the server's bind; a port
    outside it only another listener can take."""
    from launcher import ports

    low, high = ports.ephemeral_range()
    picked = {ports.free_port() for _ in range(50)}
    assert all(p >= ports.LISTEN_FLOOR and not low <= p <= high for p in picked), sorted(picked)
    assert len(picked) > 40  # spread over the range, not one port for every caller
    with socket.socket() as s:
        s.bind(("127.0.0.1", picked.pop()))  # free when returned

    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))  # no room outside: the kernel's pick
    p = ports.free_port()
    assert 1024 <= p <= 65535
