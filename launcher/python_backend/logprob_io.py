"""Log probabilities on the contract's wire (launcher/contract.py: log_prob_ids / log_probs and their prompt_ pair).

Every engine hands them over in one shape, `LogProbRows`: a row per token, the token's own id and log probability
first, then its top-k ids and log probabilities, most likely first.  These build the response tensors from it
(`arrays` pure and testable without Triton, `tensors` in the python stub) and merge the rows of responses that are
sent as one (`extend`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LogProbRows:
    """Per token: [its id, top ids...] and [its log prob, top log probs...]; rows of one request share a width."""

    ids: list[list[int]] = field(default_factory=list)
    lps: list[list[float]] = field(default_factory=list)

    def extend(self, other: "LogProbRows | None") -> "LogProbRows":
        if other is not None:
            self.ids.extend(other.ids)
            self.lps.extend(other.lps)
        return self

    def __len__(self) -> int:
        return len(self.ids)


def merged(a: "LogProbRows | None", b: "LogProbRows | None") -> "LogProbRows | None":
    """The rows of two responses sent as one (a and b may be None: nothing asked, or nothing yet)."""
    if a is None:
        return b
    if b is None:
        return a
    return LogProbRows(a.ids + b.ids, a.lps + b.lps)


def arrays(rows: LogProbRows | None, prompt: bool = False, batched: bool = True) -> dict:
    """{ids name: int32 [.., n, 1 + k], log-probs name: float32 [.., n, 1 + k]}; {} for None.  A row shorter than the
    widest (a token with fewer candidates than k in a tiny vocabulary) is padded with id -1 and -inf."""
    import numpy as np

    if rows is None:
        return {}
    width = max((len(r) for r in rows.ids), default=1)
    ids = np.full((len(rows), width), -1, dtype=np.int32)
    lps = np.full((len(rows), width), -np.inf, dtype=np.float32)
    for i, (ri, rl) in enumerate(zip(rows.ids, rows.lps)):
        ids[i, : len(ri)] = ri
        lps[i, : len(rl)] = rl
    if batched:
        ids, lps = ids[None], lps[None]
    pre = "prompt_" if prompt else ""
    return {f"{pre}log_prob_ids": ids, f"{pre}log_probs": lps}


def tensors(rows: LogProbRows | None, prompt_rows: LogProbRows | None = None, batched: bool = True) -> list:
    """The pb_utils tensors of a response's log probabilities (python stub only); [] when neither was asked."""
    if rows is None and prompt_rows is None:
        return []
    import triton_python_backend_utils as pb_utils

    out = {**arrays(rows, batched=batched), **arrays(prompt_rows, prompt=True, batched=batched)}
    return [pb_utils.Tensor(k, v) for k, v in out.items()]


def read(outputs: dict, prompt: bool = False) -> LogProbRows | None:
    """Client side: LogProbRows from a response's arrays by output name (None: not sent)."""
    pre = "prompt_" if prompt else ""
    ids, lps = outputs.get(f"{pre}log_prob_ids"), outputs.get(f"{pre}log_probs")
    if ids is None or lps is None:
        return None
    ids = ids.reshape(-1, ids.shape[-1]) if ids.size else ids.reshape(0, 1)
    lps = lps.reshape(-1, lps.shape[-1]) if lps.size else lps.reshape(0, 1)
    keep = [[j for j in range(len(r)) if r[j] >= 0] for r in ids]
    return LogProbRows(
        [[int(r[j]) for j in k] for r, k in zip(ids, keep)], [[float(r[j]) for j in k] for r, k in zip(lps, keep)]
    )
