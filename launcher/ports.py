"""Ports on this host: is one free, pick free ones (keeping a configured one where it is free), refuse a launch whose
fixed ports are taken."""

from __future__ import annotations

import os
import random
import socket
from typing import Dict, List

from launcher.errors import LaunchError


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int) -> set:
    """The socket inodes that listen on TCP `port` in this network namespace (any user's)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    return inodes


def listening_pids(port: int, inodes=None) -> Dict[int, str]:
    """The processes that listen on TCP `port` in this network namespace, with their command lines (from /proc: no
    `ss` or `lsof` needed on a compute node; only this user's processes can be seen)."""
    inodes = _listening_inodes(port) if inodes is None else inodes
    found: Dict[int, str] = {}
    if not inodes:
        return found
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmd = "?"
                found[int(pid)] = cmd.strip()
                break
    return found


def port_holders(port: int) -> List[str]:
    """Who listens on TCP `port` here, as "pid N (command line)"; a listener this user cannot see shows as "a process
    of another user"."""
    inodes = _listening_inodes(port)
    listeners = listening_pids(port, inodes)
    if listeners:
        return [f"pid {pid} ({cmd[:160]})" for pid, cmd in listeners.items()]
    return ["a process of another user"] if inodes else []


def in_use_text(host: str, port: int) -> str:
    """ "port P on H is already in use", naming who holds it where this user can see."""
    who = port_holders(port)
    return f"port {port} on {host} is already in use" + (f" by {'; '.join(who)}" if who else "")


LISTEN_FLOOR = 10000  # below it lie the ports services and llmlaunch's own defaults (8000-8003) are configured on


def ephemeral_range() -> tuple:
    """(low, high) of the ports this network namespace's kernel gives outgoing connections (Linux's default where
    /proc does not say)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port free on `host` now, for a server to bind later.  Taken outside the ephemeral range where there is room:
    a port the kernel may give any outgoing connection (gloo's and NCCL's pairs, gRPC and ZMQ clients) can be taken
    by one between this pick and the server's bind, which only another listener can do to a port outside it."""
    low, high = ephemeral_range()
    spans = [(a, b) for a, b in ((LISTEN_FLOOR, low - 1), (high + 1, 65535)) if a <= b]
    width = sum(b - a + 1 for a, b in spans)
    pick = random.Random()
    for _ in range(tries if width else 0):
        k = pick.randrange(width)
        for a, b in spans:
            if k <= b - a:
                port = a + k
                break
            k -= b - a + 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room outside it, or all tried are taken
        s.bind((host, 0))
        return s.getsockname()[1]


def check_ports(host: str, ports: Dict[str, int]) -> None:
    """Local runs fail clearly on a taken port: which port, which setting changes it."""
    problems = []
    for key, p in ports.items():
        if not port_free(host, p):
            problems.append(
                (
                    f"serve.{key}={p}",
                    in_use_text(host, p),
                    f"stop what uses it, or pick another port: serve.{key}={free_port(host)}",
                )
            )
    if problems:
        raise LaunchError(problems)


def pick_ports(host: str, wanted: Dict[str, int], avoid=()) -> Dict[str, int]:
    """Ranks on shared nodes: keep the configured port when free, else take a free one (never crash-loop); never
    one of `avoid` (ports this rank keeps for something else: rank 0's front end) nor one port for two keys."""
    chosen: Dict[str, int] = {}
    avoid = set(avoid)
    bind = "0.0.0.0" if host in ("", "0.0.0.0") else host
    for key, p in wanted.items():
        while p <= 0 or p in avoid or p in chosen.values() or not port_free(host, p):
            p = free_port(bind)  # the configured port (if any) is taken: any free one outside `avoid`
        chosen[key] = p
    return chosen


def metrics_url(host: str, port) -> str:
    """tritonserver's Prometheus URL on `host`:`port` (an IPv6 address in brackets); "" without a port."""
    if not port:
        return ""
    return f"http://{f'[{host}]' if ':' in host else host}:{int(port)}/metrics"


# gRPC channel options for a client that waits for a server to come up (or back): a connection refused puts a
# channel into gRPC's reconnect backoff, which grows from 1 s by 1.6x (to 2 minutes), so a readiness poll would see a
# server that came up only at the next attempt, seconds later; this retries every 200 ms, at most every 2 s.
RECONNECT_SOON = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
