"""Batched sampling for the `hf` engine: one set of tensor ops per step for all rows, whatever their settings.

Greedy rows take the argmax.  Sampled rows draw by inverse CDF with a uniform
number that the scheduler takes from the request's own `random.Random(seed)`,
so a seeded request gives the same tokens whatever else is in the batch (up to
floating-point differences between batch shapes), and no per-row torch
generator or kernel launch is needed.  Work that no row asks for is skipped:
a batch of greedy rows costs one `argmax`.
"""

from __future__ import annotations


class Sampler:
    def __init__(self, max_num_seqs: int, vocab_size: int, device):
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.valid_vocab = vocab_size  # ids >= this are never sampled (padded embeddings beyond the tokenizer)
        self.device = device
        # Per-slot penalty state, allocated on first use: output token counts and a prompt-token mask.
        self._counts = None
        self._prompt_seen = None

    def _penalty_state(self):
        import torch

        if self._counts is None:
            self._counts = torch.zeros(self.max_num_seqs, self.vocab_size, dtype=torch.int32, device=self.device)
            self._prompt_seen = torch.zeros(self.max_num_seqs, self.vocab_size, dtype=torch.bool, device=self.device)
        return self._counts, self._prompt_seen

    def sample(self, logits, rows, penalty_resets=()):
        """logits [n, V] (any float dtype) -> token ids [n] (long, on device)."""
        import torch

        dev = logits.device
        if penalty_resets:
            counts, seen = self._penalty_state()
            for slot, prompt, generated in penalty_resets:
                counts[slot].zero_()
                seen[slot].zero_()
                if prompt:
                    seen[slot, torch.tensor(prompt, dtype=torch.long, device=dev)] = True
                if generated:  # a request computed again after preemption keeps the counts of what it generated
                    counts[slot].index_add_(
                        0,
                        torch.tensor(generated, dtype=torch.long, device=dev),
                        torch.ones(len(generated), dtype=counts.dtype, device=dev),
                    )
        logits = logits.float()
        n, vocab = logits.shape
        if vocab > self.valid_vocab:  # padded embeddings: never sample ids the tokenizer does not know
            logits[:, self.valid_vocab :] = float("-inf")
        if rows.any_penalty:
            logits = self._apply_penalties(logits, rows)
        if rows.guided:
            from launcher.hf.guided import apply_masks

            apply_masks(logits, rows.guided, rows.guide_masks)
        if rows.banned:
            r, t = zip(*rows.banned)
            logits[torch.tensor(r, device=dev), torch.tensor(t, device=dev)] = float("-inf")
        greedy = logits.argmax(dim=-1)
        if rows.any_sampling:
            tokens = torch.where(
                torch.tensor([t > 0 for t in rows.temperature], device=dev), self._draw(logits, rows), greedy
            )
        else:
            tokens = greedy
        if rows.any_penalty:
            counts, _ = self._penalty_state()
            slots = torch.tensor(rows.slots, dtype=torch.long, device=dev)
            counts.index_put_((slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        return tokens

    def _apply_penalties(self, logits, rows):
        import torch

        dev = logits.device
        counts, seen = self._penalty_state()
        slots = torch.tensor(rows.slots, dtype=torch.long, device=dev)
        c = counts[slots]
        out_seen = c > 0
        rep = torch.tensor(rows.repetition_penalty, device=dev)[:, None]
        # repetition penalty (HF/vLLM): over prompt and output tokens, divide positive logits, multiply negative ones
        any_seen = out_seen | seen[slots]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(any_seen, penalised, logits)
        # presence / frequency penalties (OpenAI): over output tokens
        freq = torch.tensor(rows.frequency_penalty, device=dev)[:, None]
        pres = torch.tensor(rows.presence_penalty, device=dev)[:, None]
        return logits - freq * c.float() - pres * out_seen.float()

    def _draw(self, logits, rows):
        import torch

        dev = logits.device
        temp = torch.tensor([t if t > 0 else 1.0 for t in rows.temperature], device=dev)[:, None]
        u = torch.tensor(rows.uniform, device=dev)[:, None]
        scaled = logits / temp
        if rows.any_top:
            vocab = scaled.shape[-1]
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            top_k = torch.tensor([k if 0 < k < vocab else vocab for k in rows.top_k], device=dev)[:, None]
            sorted_logits = sorted_logits.masked_fill(torch.arange(vocab, device=dev)[None, :] >= top_k, float("-inf"))
            probs = sorted_logits.softmax(dim=-1)
            top_p = torch.tensor(rows.top_p, device=dev)[:, None]
            cum = probs.cumsum(dim=-1)
            probs = probs.masked_fill((cum - probs) > top_p, 0.0)  # keeps at least the most likely token
            cdf = probs.cumsum(dim=-1)
            pick = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=vocab - 1)
            return order.gather(1, pick).squeeze(1)
        probs = scaled.softmax(dim=-1)
        cdf = probs.cumsum(dim=-1)
        pick = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=cdf.shape[-1] - 1)
        return pick.squeeze(1)
