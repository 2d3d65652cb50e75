"""Ports on this host: is one free, pick free ones (keeping a configured one where it is free), refuse a launch whose
fixed ports are taken."""

from __future__ import annotations

import socket
from typing import Dict

from launcher.errors import LaunchError


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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
                    f"port {p} on {host} is already in use",
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
