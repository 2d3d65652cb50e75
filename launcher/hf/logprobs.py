"""Log probabilities of a step of the `hf` engine: of the sampled tokens (rows that asked, SamplingRows.logprobs) and
of prompt tokens (chunks that asked, PrefillChunk.logprobs), from the model's own logits: before temperature,
penalties, top-k/top-p and banned tokens, as vLLM returns them by default and as evaluation harnesses expect.

`StepLogProbs.start` takes the step's logits before the sampler touches them (it masks in place), `finish` adds the
sampled tokens; both only queue device work.  `read` runs after the step's wait: one copy to the host per part.
"""

from __future__ import annotations

from launcher.python_backend.logprob_io import LogProbRows


class StepLogProbs:
    """One step's log probabilities, on the device until `read`."""

    def __init__(self, step, n_sampled: int):
        self.step = step
        self.n_sampled = n_sampled
        self.ks = step.sampling.logprobs  # per sampled row: -1 or its top-k
        self.rows = [i for i, k in enumerate(self.ks) if k >= 0]
        self.sampled = None  # (ids [r, 1 + k], log probs [r, 1 + k]) after finish
        self.prompt = None  # (ids, log probs) of every prompt row, chunks in order
        self._lp = None  # log_softmax of the sampled rows that asked, until finish

    @staticmethod
    def _top(lp, own_ids, k: int):
        import torch

        own = lp.gather(1, own_ids[:, None])
        if k <= 0:
            return own_ids[:, None].to(torch.int32), own
        vals, ids = lp.topk(k, dim=-1)
        return torch.cat([own_ids[:, None], ids], 1).to(torch.int32), torch.cat([own, vals], 1)

    def start(self, logits, valid_vocab: int, device) -> None:
        """logits: the step's rows, sampled rows first, then its prompt_logit_rows (launcher.hf.step)."""
        import torch

        if self.rows:
            idx = torch.tensor(self.rows, dtype=torch.long).to(device, non_blocking=True)
            self._lp = logits[idx, :valid_vocab].float().log_softmax(-1)
        chunks = [c for c in self.step.prefill if c.logprobs >= 0]
        if not chunks:
            return
        targets, offset = [], 0
        for c in self.step.prefill:
            if c.logprobs >= 0:
                tokens = self.step.prefill_tokens[offset : offset + c.length]
                targets.extend(tokens[1:] + ([] if c.sample else [c.next_token]))
            offset += c.length
        lp = logits[self.n_sampled :, :valid_vocab].float().log_softmax(-1)
        own = torch.tensor(targets, dtype=torch.long).to(device, non_blocking=True)
        self.prompt = self._top(lp, own, max(c.logprobs for c in chunks))

    def finish(self, tokens) -> None:
        """tokens: the sampled token per row (device)."""
        if self._lp is not None:
            idx = tokens.new_tensor(self.rows)
            self.sampled = self._top(self._lp, tokens[idx].long(), max(self.ks[i] for i in self.rows))
            self._lp = None

    def read(self) -> tuple[list, list]:
        """(per sampled row: LogProbRows of its token or None, per prompt chunk: LogProbRows of its rows or None)."""
        per_row: list = [None] * self.n_sampled
        if self.sampled is not None:
            ids, lps = (t.tolist() for t in self.sampled)
            for j, i in enumerate(self.rows):
                k = 1 + self.ks[i]
                per_row[i] = LogProbRows([ids[j][:k]], [lps[j][:k]])
        per_chunk: list = [None] * len(self.step.prefill)
        if self.prompt is not None:
            ids, lps = (t.tolist() for t in self.prompt)
            at = 0
            for n, c in enumerate(self.step.prefill):
                if c.logprobs >= 0:
                    k, m = 1 + c.logprobs, c.length - c.sample
                    per_chunk[n] = LogProbRows([r[:k] for r in ids[at : at + m]], [r[:k] for r in lps[at : at + m]])
                    at += m
        return per_row, per_chunk
