"""The OpenAI API's Prometheus counters, kept in one flat array of integers so that several worker processes
(launcher/openai_api/process.py) can each write their own slot and any of them can answer /metrics with the sums.
One process keeps them in a list; several share a multiprocessing RawArray."""

from __future__ import annotations

from typing import MutableSequence, Optional

ROUTES = ("completions", "chat")
STATUSES = (200, 400, 404, 429, 500, 503)  # every status translate.py and app.py answer with
_RUNNING, _PROMPT, _COMPLETION, _STARTED = range(4)
_FIXED = 4
WIDTH = _FIXED + len(ROUTES) * len(STATUSES)  # integers per worker slot


def shared_size(workers: int) -> int:
    return WIDTH * workers


class Counters:
    """Worker `slot`'s counters in `store` (WIDTH integers per slot, `workers` slots); sums over all slots."""

    def __init__(self, store: Optional[MutableSequence[int]] = None, slot: int = 0, workers: int = 1):
        self.store = store if store is not None else [0] * shared_size(workers)
        self.workers = workers
        self.base = slot * WIDTH

    def _add(self, index: int, n: int) -> None:
        self.store[self.base + index] += n

    def _sum(self, index: int) -> int:
        return sum(self.store[w * WIDTH + index] for w in range(self.workers))

    # --- this worker
    def started(self) -> None:
        """This worker serves: /health answers ok only once every worker has said so."""
        self.store[self.base + _STARTED] = 1

    def answered(self, route: str, status: int) -> None:
        s = status if status in STATUSES else 500
        self._add(_FIXED + ROUTES.index(route) * len(STATUSES) + STATUSES.index(s), 1)

    def begin(self) -> None:
        self._add(_RUNNING, 1)

    def end(self) -> None:
        self._add(_RUNNING, -1)

    def tokens(self, prompt: int, completion: int) -> None:
        self._add(_PROMPT, prompt)
        self._add(_COMPLETION, completion)

    # --- every worker
    @property
    def all_started(self) -> bool:
        return self._sum(_STARTED) == self.workers

    @property
    def running(self) -> int:
        return self._sum(_RUNNING)

    @property
    def prompt_tokens(self) -> int:
        return self._sum(_PROMPT)

    @property
    def completion_tokens(self) -> int:
        return self._sum(_COMPLETION)

    def requests(self) -> dict:
        """(route, status) -> requests answered, the nonzero ones."""
        out = {}
        for r, route in enumerate(ROUTES):
            for s, status in enumerate(STATUSES):
                n = self._sum(_FIXED + r * len(STATUSES) + s)
                if n:
                    out[(route, status)] = n
        return out

    def text(self) -> str:
        lines = [
            "# HELP llmlaunch_openai_requests_total OpenAI API requests answered, by route and HTTP status",
            "# TYPE llmlaunch_openai_requests_total counter",
        ]
        for (route, status), n in sorted(self.requests().items()):
            lines.append(f'llmlaunch_openai_requests_total{{route="{route}",status="{status}"}} {n}')
        for name, kind, help_, value in (
            ("llmlaunch_openai_requests_running", "gauge", "requests being generated", self.running),
            (
                "llmlaunch_openai_prompt_tokens_total",
                "counter",
                "prompt tokens of finished requests",
                self.prompt_tokens,
            ),
            (
                "llmlaunch_openai_completion_tokens_total",
                "counter",
                "tokens generated for finished requests",
                self.completion_tokens,
            ),
            ("llmlaunch_openai_processes", "gauge", "API worker processes sharing the port", self.workers),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
