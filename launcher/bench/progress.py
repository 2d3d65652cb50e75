"""A small progress bar on stderr (no tqdm needed).

It runs on its own thread and polls a `read()` function every `interval`
seconds, so nothing is added to the receive path. On a terminal it redraws one
line; otherwise (logs, CI) it prints a plain line at most every 10 s.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional


class Progress:
    def __init__(
        self,
        read: Callable[[], tuple],
        total: Optional[int],
        label: str = "",
        interval: float = 0.25,
        stream=None,
        enabled: bool = True,
    ):
        """read() -> (requests done, output tokens so far, failed requests)."""
        self.read = read
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval if self.tty else 10.0
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = 0.0
        self._last = (0.0, 0)  # (time, tokens) of the previous draw, for the token rate

    def line(self, now: float) -> str:
        done, tokens, failed = self.read()
        elapsed = now - self._t0
        t_prev, tok_prev = self._last
        rate = (tokens - tok_prev) / (now - t_prev) if now > t_prev else 0.0
        self._last = (now, tokens)
        if self.total:
            width = 24
            filled = min(width, int(width * done / self.total))
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
        else:
            bar = f"{done} done"
        fail = f"  {failed} failed" if failed else ""
        return f"{self.label}{bar}  {rate:,.0f} tok/s  {tokens:,} tok  {elapsed:6.1f}s{fail}"

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw(time.perf_counter())

    def _draw(self, now: float, final: bool = False) -> None:
        text = self.line(now)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def start(self) -> "Progress":
        if self.enabled:
            self._t0 = time.perf_counter()
            self._last = (self._t0, 0)
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            # final line: average rate over the whole run
            self._last = (self._t0, 0)
            self._draw(time.perf_counter(), final=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
