"""Where a client connects: the endpoint URL as the user gives it, the gRPC channel options every client channel
uses, and the error a client reports to the user."""

from __future__ import annotations

# Same limits tritonclient.grpc uses.
_MAX_MESSAGE = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
]


class ClientError(RuntimeError):
    """A server or connection problem, with a message fit for the user."""


def parse_url(url: str) -> str:
    """'grpc://HOST:PORT', 'HOST:PORT' or 'HOST' -> 'HOST:PORT' (port 8001 by default)."""
    url = url.strip()
    if "://" in url:
        scheme, url = url.split("://", 1)
        if scheme not in ("grpc", "dns"):
            raise ValueError(f"unsupported URL scheme {scheme!r} in --url: use grpc://HOST:PORT or HOST:PORT")
    url = url.rstrip("/")
    if not url:
        raise ValueError("empty --url: use grpc://HOST:PORT or HOST:PORT")
    host, sep, port = url.rpartition(":")
    if not sep or "]" in port:  # no port (IPv6 literals end with ']')
        return f"{url}:8001"
    if not port.isdigit():
        raise ValueError(f"bad port {port!r} in --url {url!r}")
    return url
