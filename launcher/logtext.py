"""Reading a log's end: its last lines, and the error lines that say why a server or rank failed (tritonserver's
glog errors, Python exceptions), for failure records and launch messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional


def read_end(path: Path, size: int) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _last_lines(text: Optional[str], lines: int) -> str:
    return "(no log)" if text is None else "\n".join(text.splitlines()[-lines:])


def log_tail(path: Path, lines: int = 30) -> str:
    return _last_lines(read_end(path, 16384), lines)


_GLOG_ERROR = re.compile(r"^E\d{4} [\d:.]+ +\d+ [^\]]+\] ?(.*)$")
# errors every CPU-only tritonserver logs at start (no CUDA driver): not why anything failed
_BENIGN = ("CudaDriverHelper has not been initialized",)
_EXCEPTION = re.compile(r"\b\w+(?:Error|Exception): .*$")


def log_errors(path: Path, limit: int = 3, width: int = 700) -> list:
    """The last `limit` distinct error lines tritonserver logged (glog's E lines, in the log's last MiB: the ones
    nearest the failure, for a server that served a while), each cut at `width` characters, the python stub's escaped
    traceback lines unfolded.  A model that fails to load logs its reason there, and then tritonserver prints its
    model and settings tables and shuts down: the last lines alone do not say why (a stub's ModuleNotFoundError, an
    engine that refused its parameters)."""
    return _errors_in(read_end(path, 1 << 20), limit, width)


def _errors_in(text: Optional[str], limit: int = 3, width: int = 700) -> list:
    found: dict = {}  # a message's exception (else its first line) -> the message: Triton logs one failure as the
    # instance's and again as the model's, with different prefixes; the first wording is kept, the latest place
    for line in (text or "").splitlines():
        m = _GLOG_ERROR.match(line)
        if not m:
            continue
        msg = m.group(1).strip().strip('"').replace('\\"', '"')
        if msg.startswith(_BENIGN):
            continue
        first = msg.split("\\n")[0]
        exc = _EXCEPTION.search(first)
        key = exc.group(0) if exc else first
        found[key] = found.pop(key, msg)
    out = []
    for msg in list(found.values())[-limit:]:
        msg = msg if len(msg) <= width else msg[:width] + " ..."
        out.append("\n    ".join(part for part in msg.split("\\n") if part.strip()))
    return out


def log_excerpt(path: Path, lines: int = 30) -> str:
    """What to show of a server log when the server failed: its error lines (log_errors), then its last lines."""
    text = read_end(path, 1 << 20)  # read once for both
    errors = _errors_in(text)
    head = "errors:\n" + "\n".join(f"  {e}" for e in errors) + "\nlast lines:\n" if errors else ""
    return head + _last_lines(text, lines)
