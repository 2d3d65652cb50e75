"""The hf engine's scheduler: admission, batching and prompt-chunking decisions, in plain lists.

`Scheduler` holds the requests the engine thread owns (waiting, prefilling, decoding) and makes each step's
`StepInputs`: every decoding sequence decodes one token, waiting requests take a free slot and the KV-cache blocks
their prompt needs (launcher.hf.blocks: after the blocks of their longest cached prefix, which they prefill no
more), prompt chunks fill the step up to `max_prefill_tokens`, and where the runner has CUDA graphs for them, prompts go beside the decode
rows (mixed), in waves, or alone (see `Scheduler.schedule`).  It only reads the runner's graph limits; the loop
(launcher.hf.engine) launches the steps and output processing (launcher.hf.outputs) consumes their tokens.

A sequence takes a block as it grows; when the pool has none left for a decoding sequence, the request admitted
last is preempted: its blocks go back (its full ones stay in the prefix cache), and it waits first in line to be
computed again, its generated tokens part of the prompt it prefills then (recompute, as vLLM does).
"""

from __future__ import annotations

import heapq
import time
from bisect import insort
from collections import deque
from typing import Callable

from launcher.engines.hf.config import DEFAULTS
from launcher.hf.blocks import BlockPool, ExportPins, block_hashes
from launcher.hf.guided import masks
from launcher.hf.runner import PrefillChunk, SamplingRows, StepInputs
from launcher.hf.sequence import Seq


class Scheduler:
    """The engine thread's requests and the choice of what each step runs (engine thread only)."""

    def __init__(
        self,
        runner,
        max_prefill_tokens: int,
        prompts_alone: int,
        stats,
        inbox_empty: Callable[[], bool],
        prefix_caching: bool = DEFAULTS.prefix_caching,
    ):
        """runner: the HFModelRunner whose graph limits shape the steps and whose pool (num_blocks, block_size) the
        blocks are of; stats: the engine's EngineStats (admitted, queued_s, preempted); inbox_empty: whether no
        request or abort waits for the loop (a step is only queued ahead while none does)."""
        self.runner = runner
        self.max_prefill_tokens = max_prefill_tokens
        self.stats = stats
        self._inbox_empty = inbox_empty
        self.waiting: deque[Seq] = deque()
        self.prefilling: list[Seq] = []
        self.decoding: list[tuple[int, Seq]] = []  # (slot, seq), sorted by slot
        self.by_id: dict[str, Seq] = {}
        self._prompts_alone = prompts_alone  # checked by the Engine before the model loaded
        self._waved = False  # the last step was a wave of prompts that decode rows waited for (_prompt_wave)
        self.free = list(range(runner.max_num_seqs))
        heapq.heapify(self.free)
        self.pool = BlockPool(runner.num_blocks, runner.block_size, prefix_caching)
        self.pins = ExportPins(self.pool)  # kv_export prompts' blocks, held for the decode engine that fetches them
        self.block_size = runner.block_size
        self._admissions = 0
        self._updates: list[tuple[int, int, list[int]]] = []  # block-table changes the next step carries

    @property
    def idle(self) -> bool:
        """Nothing waiting, prefilling or decoding."""
        return not (self.waiting or self.prefilling or self.decoding)

    def add(self, seq: Seq) -> None:
        """A new request: it waits for a slot."""
        self.by_id[seq.request_id] = seq
        self.waiting.append(seq)

    def started_decoding(self, seq: Seq) -> None:
        """seq's prefill sampled its token: it moves from prefill to decode."""
        self.prefilling.remove(seq)
        seq.decoding = True
        insort(self.decoding, (seq.slot, seq), key=lambda x: x[0])

    def release(self, seq: Seq, keep: bool = False) -> bool:
        """seq ends: forget it and free its slot; False where it had ended already.  keep: its prompt's blocks stay
        held for another engine to fetch (a kv_export prefill that finished)."""
        if self.by_id.pop(seq.request_id, None) is None:
            return False
        if seq.slot >= 0:
            if keep:
                self.pins.hold(seq.prompt_ids)
            self._vacate(seq)
        return True

    def _vacate(self, seq: Seq) -> None:
        """seq leaves the running set: its slot and its blocks go back (its full blocks stay findable)."""
        if seq.decoding:
            self.decoding.remove((seq.slot, seq))
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        heapq.heappush(self.free, seq.slot)
        self.pool.free(seq.blocks)
        seq.slot, seq.blocks, seq.keys, seq.decoding = -1, [], [], False

    def preempt(self, seq: Seq) -> None:
        """The pool ran out: seq gives its slot and blocks back and waits first in line; it will prefill its prompt and
        what it generated (its full blocks are likely still cached) and go on from there."""
        self._vacate(seq)
        if seq.prompt_lp is not None:  # preempted before its first token: its prompt's log probabilities start over
            seq.prompt_lp = seq.fresh_prompt_lp()
        seq.prefill_ids = seq.prompt_ids + seq.out_ids
        seq.num_computed = 0
        seq.prefill_started = False
        self.waiting.appendleft(seq)
        self.stats.preempted += 1

    def schedule(self, ahead_of: list[Seq] | None = None):
        """The next step: (step, output rows, sequences with a prompt chunk that does not end their prompt,
        prev_rows).  Every decoding sequence decodes one token, waiting requests take free slots, and prompt
        chunks fill the step up to max_prefill_tokens.  Blocks held for a fetch that did not come in time go back first.

        ahead_of: the output rows of a step still running (overlap).  This step is made and launched before that
        one's tokens are known, so that the host work of that step (detokenize, stop checks, send) runs while
        the GPU runs this one.  It decodes those rows again, their tokens passed from the step before on the
        device (`prev_rows`: each decode row's output row there).  Left out: a row that ends by length in the
        running step.  A row that ends by EOS or a stop string there decodes one token too many, which is dropped
        (OutputProcessor.on_token skips finished sequences) and whose cache entry the slot's next user overwrites.
        Rows that sat the running step out (it was a step of prompts only) decode here too, with their last tokens
        from the host (prev_rows -1).
        Where prompts wait, the runner has mixed graphs and all of them fit one, they go beside the decode rows in one
        step through it (_prompts_mixed), queued ahead too: their tokens come from the host, the decode rows' from the
        device; prompts part-way through go so too, with decode rows or without, where the mixed graphs attend
        through the paged prefill kernel (HFModelRunner.mixed_any_start).  Otherwise, where prompts wait and the
        runner replays prompt graphs, two or more of them go in steps
        of their own through wave graphs, taking turns with the decode rows (_prompt_wave), and one, or a few where
        there are no wave graphs (PROMPTS_ALONE_MAX), one per step alone, while the decode rows wait that step
        (_prompt_alone).  Such a step needs nothing of the running step's, so it is launched ahead too (prev_rows
        None): the GPU goes from the running step to the prompts, and from them to the decode rows' turn, without
        waiting for the host in between (on an H100 at 128 streams about one step in six carried or followed
        prompts and each waited ~1.5 ms for the host).
        Requests waiting for a slot (every slot taken) hold nothing back: the decode rows go ahead, and a request
        takes the slot of a row that ended in the step scheduled after the host has that row's last token.
        None (wait for the running step) where a row's sampling needs its last token on the host (bad words),
        a request is in the inbox, a prompt is part-way through prefill (its prefix cached, a chunk of it run) and
        the mixed graphs take no prompt that starts part-way, or waiting prompts would go in one step beside the
        decode rows (no prompt graphs).  A step with prompt tokens beside decode rows cannot replay a CUDA graph
        unless a mixed one holds it, and launched ahead one prompt at a time, as requests arrive, nearly every step under load
        became such a step (measured on an H100 at 128 streams: 6.1 ms a step instead of 3.2); prompts that
        arrive during a run of decode steps are taken together, in one step, once it ends.
        """
        if self.pins:
            self.pins.expire(time.monotonic())
        if ahead_of is None:
            decoding, prompts = self._choose()
            prev_rows = None
        else:
            chosen = self._choose_ahead(ahead_of)
            if chosen is None:
                return None
            decoding, prompts, prev_rows = chosen
        rows = list(decoding)
        decode_slots = [s.slot for s in decoding]
        # ahead: the tokens of the running step's rows follow on the device; rows that sat it out have theirs here
        decode_tokens = (
            [s.out_ids[-1] for s in decoding]
            if ahead_of is None
            else [0 if r >= 0 else s.out_ids[-1] for s, r in zip(decoding, prev_rows or [])]
        )
        decode_positions = [s.num_computed for s in decoding]
        for s in decoding:
            s.num_computed += 1  # the fed token is cached by this step
        # queued ahead, a step carries prompts only through a prompt, wave or mixed graph (see above)
        chunks, prefill_tokens, penalty_resets, chunk_seqs = self._prompt_chunks(prompts, rows)
        if not rows and not chunks:
            return None
        for seq in decoding:
            self._publish(seq)
        for seq in rows[len(decoding) :] + chunk_seqs:
            self._publish(seq)
        updates, self._updates = self._updates, []
        self.stats.kv_blocks_used = self.pool.capacity - self.pool.num_free
        running = sum(r >= 0 for r in prev_rows) if prev_rows is not None else 0  # the running step's rows: first
        step = StepInputs(
            decode_slots,
            decode_tokens,
            decode_positions,
            chunks,
            prefill_tokens,
            self._sampling_rows(rows, pending_rows=running),
            penalty_resets,
            updates,
        )
        return step, rows, chunk_seqs, prev_rows

    def _choose(self) -> tuple:
        """What a step that waits for the running one runs (schedule without ahead_of): (its decode rows, the
        sequences whose prompt or its next chunk it may take).  Decode rows that need a block and find none preempt
        the request admitted last; waiting requests are admitted."""
        self._grow_or_preempt()
        decoding = [s for _, s in self.decoding]
        self.admit()
        prompts = self.prefilling
        mixed = self._prompts_mixed(decoding)
        if mixed:  # the prompts beside the decode rows, through a mixed graph
            prompts = mixed
        else:
            only = self._prompts_only(decoding)
            if only:  # the prompts through their graph; the decode rows wait this step
                decoding, prompts = [], only
            elif only is not None:  # the decode rows' turn between two waves
                prompts = []
        return decoding, prompts

    def _choose_ahead(self, ahead_of: list[Seq]) -> tuple | None:
        """What a step queued behind the running one (its output rows `ahead_of`) runs: (its decode rows, the
        sequences whose prompt it may take, prev_rows), or None where it has to wait for the running step (see
        schedule)."""
        prev_rows = [
            i for i, s in enumerate(ahead_of) if s.slot >= 0 and len(s.out_ids) + 1 < s.max_tokens
        ]  # not finished, not ending now
        decoding = [ahead_of[i] for i in prev_rows]
        if any(s.needs_last_token for s in decoding) or not self._inbox_empty():
            return None
        ids = {id(s) for s in ahead_of}
        # a prompt part-way through (its prefix cached, or a chunk of it run): only a mixed graph that takes prompts
        # starting anywhere holds it
        if not self.runner.mixed_any_start and any(id(s) not in ids and s.num_computed for s in self.prefilling):
            return None
        # rows that sat the running step out (a step of prompts): their last tokens are on the host
        waited = [s for _, s in self.decoding if id(s) not in ids]
        prompts_waiting = bool(self.waiting) or any(id(s) not in ids for s in self.prefilling)
        prev_rows += [-1] * len(waited)
        decoding += waited
        if not self._grow(decoding):  # the pool is out of blocks: the step waits, and may preempt then
            return None
        prompts = []
        if prompts_waiting:
            self.admit()
            pending = [s for s in self.prefilling if id(s) not in ids]  # not those the running step prefills
            # Every slot taken: the waiting requests wait for one whatever this step is, so the decode rows go
            # ahead.  (Waiting for the running step instead lost the overlap exactly when the engine is full:
            # on an H100 with Poisson arrivals past its capacity, 42-61% of steps queued ahead instead of 99%,
            # each waiting for the host, and the queue grew faster.)
            # A slot frees when the host has a row's last token, so a waiting request is admitted in the step
            # scheduled after that.
            mixed = self._prompts_mixed(decoding, pending)
            if mixed:  # beside the decode rows (their tokens follow on the device), through a mixed graph
                only, prompts = [], mixed
            elif pending:
                only = self._prompts_only(decoding, pending)
            else:
                only, self._waved = [], False  # the decode rows' turn
            if only:  # prompts only, through their graph: nothing of the running step's
                decoding, prompts, prev_rows = [], only, None
            elif mixed and not decoding:  # prompts only, part-way ones among them, through a mixed graph
                prev_rows = None
            elif only is None:  # the prompts go beside the decode rows, in one step once the running one ends
                return None
            # else (only == []): the decode rows' turn, the prompts wait for the next step
        elif waited:
            self._waved = False  # the rows that waited for a wave step have their turn
        return decoding, prompts, prev_rows

    def _prompt_chunks(self, prompts: list[Seq], rows: list[Seq]) -> tuple:
        """The prompt chunks of a step: `prompts` in order, each its next chunk, until max_prefill_tokens are taken.
        (chunks, their tokens, penalty resets of the sequences that start their prefill, the sequences whose chunk
        does not end their prompt); those whose chunk does join `rows`."""
        chunks: list[PrefillChunk] = []
        prefill_tokens: list[int] = []
        penalty_resets = []
        chunk_seqs = []  # sequences whose chunk here does not end their prompt
        budget = self.max_prefill_tokens
        for seq in prompts:
            if budget <= 0:
                break
            start = seq.num_computed
            length = min(len(seq.prefill_ids) - start, budget)
            budget -= length
            last = start + length == len(seq.prefill_ids)
            chunk = PrefillChunk(seq.slot, start, length, last)
            if seq.prompt_lp is not None:  # its prompt's log probabilities, not sent yet: from these logits
                chunk.logprobs = seq.params.prompt_logprobs
                chunk.next_token = -1 if last else seq.prefill_ids[start + length]
            chunks.append(chunk)
            prefill_tokens.extend(seq.prefill_ids[start : start + length])
            seq.num_computed = start + length
            if not seq.prefill_started:
                seq.prefill_started = True
                if seq.penalties:
                    penalty_resets.append((seq.slot, seq.prompt_ids, list(seq.out_ids)))
            if last:
                rows.append(seq)
            else:
                chunk_seqs.append(seq)
        return chunks, prefill_tokens, penalty_resets, chunk_seqs

    def admit(self) -> None:
        """Waiting requests, first come first served, into free slots (lowest slot first keeps the decode batch rows
        compact), each with the blocks of its longest cached prefix and new ones for the rest of its prompt.  A
        request waits while the pool, less a reserve for the decoding sequences' next blocks, cannot hold it (blocks
        held for a decode engine's fetch are given up first, oldest first)."""
        now = time.monotonic()
        bs, pool = self.block_size, self.pool
        reserve = max(1, pool.capacity // 100)  # decoding sequences grow into it before anyone is preempted
        while self.waiting and self.free:
            seq = self.waiting[0]
            tokens = seq.prefill_ids
            # at least one token is prefilled: its logits give the first token; a request that asks for its prompt's
            # log probabilities computes the whole prompt (the cache keeps keys and values, not logits)
            wants_prompt = seq.prompt_lp is not None
            cached, keys = pool.match(tokens, 0 if wants_prompt else (len(tokens) - 1) // bs)
            need = -(-len(tokens) // bs) - len(cached)
            new = pool.allocate(need) if need <= pool.num_free - (reserve if self.decoding else 0) else None
            if new is None:
                pool.free(cached)
                if self.pins.give_up_oldest():  # a held prefill's blocks yield to a request that cannot run without
                    continue
                return
            self.waiting.popleft()
            seq.slot = heapq.heappop(self.free)
            seq.blocks, seq.keys = cached + new, keys
            seq.num_computed = seq.cached_tokens = len(cached) * bs
            self._admissions += 1
            seq.admitted = self._admissions
            self._updates.append((seq.slot, 0, list(seq.blocks)))
            self.prefilling.append(seq)
            self.stats.admitted += 1
            self.stats.queued_s += now - seq.added
            self.stats.prompt_tokens += len(tokens)
            self.stats.cached_prompt_tokens += seq.cached_tokens

    def resend_block_table(self) -> None:
        """The next step carries every running sequence's whole block-table row: after a step that failed to run,
        whose changes (and those of the step behind it) never reached the device."""
        running = [s for _, s in self.decoding] + self.prefilling
        self._updates = [(s.slot, 0, list(s.blocks)) for s in running if s.slot >= 0]

    def _grow(self, seqs: list[Seq]) -> bool:
        """Each of `seqs` feeds the token at its position num_computed this step: a new block where that position
        starts one.  False where the pool has none left (the blocks taken so far stay with their sequences)."""
        bs = self.block_size
        for seq in seqs:
            if seq.num_computed // bs < len(seq.blocks):
                continue
            new = self.pool.allocate(1)
            if new is None:
                return False
            self._updates.append((seq.slot, len(seq.blocks), new))
            seq.blocks += new
        return True

    def _grow_or_preempt(self) -> None:
        """Every decoding sequence gets the block its next token needs; where the pool has none, the request
        admitted last (decoding or prefilling) is preempted, until the others fit."""
        for _, seq in list(self.decoding):
            while seq.slot >= 0 and not self._grow([seq]):
                if self.pins.give_up_oldest():  # held prefills yield before a running request is preempted
                    continue
                running = [s for _, s in self.decoding] + self.prefilling
                self.preempt(max(running, key=lambda s: s.admitted))

    def _publish(self, seq: Seq) -> None:
        """seq's blocks that are full of tokens the host knows become findable in the prefix cache."""
        bs = self.block_size
        full = min(seq.num_computed, len(seq.prompt_ids) + len(seq.out_ids)) // bs
        done = len(seq.keys)
        if full <= done:
            return
        tokens = [seq.token_at(p) for p in range(done * bs, full * bs)]
        parent = seq.keys[-1] if seq.keys else None
        keys = block_hashes(tokens, bs, 0, parent)
        self.pool.publish(seq.blocks[done:full], keys, tokens, parent)
        seq.keys += keys

    # At most this many prompts waiting to be prefilled are taken one at a time, each alone in a step that replays
    # its prompt graph, instead of together in one eager step beside the decode rows.  Why: an eager step with
    # prompt tokens is kernel launches from Python, ~10-11 ms on an H100 host for a 1 B model whatever it holds,
    # while a prompt graph of up to 512 tokens replays in 2.2-3.8 ms and the decode rows' graph in ~1.7 ms.
    # So k prompts alone cost ~2.5 k ms (+ one decode step for the rows
    # that waited) against ~11 ms together: better for the prompts up to 4, and not worse for the decode rows.
    # A wave (more prompts than that) still goes in together, where the eager step's cost is shared.  Where the
    # runner has wave graphs, two or more prompts go through one of those instead (_prompt_wave).
    PROMPTS_ALONE_MAX = DEFAULTS.prompts_alone

    def _prompts_mixed(self, decoding: list[Seq], pending: list[Seq] | None = None) -> list[Seq] | None:
        """The waiting prompts, where they all go beside the decode rows in one step through a mixed graph
        (HFModelRunner.MIXED_PROMPTS): the rest of each prompt, no more of them and no more tokens than one holds.
        Prompts part-way through (a prefix from the prefix cache, a chunk already run) only where the mixed graphs
        take prompts that start anywhere (HFModelRunner.mixed_any_start), and then without decode rows too (whole
        prompts alone go through prompt and wave graphs), and, where not all fit, the first of them that do: no
        wave graph takes such prompts, so more than fit go through mixed graphs a step at a time, the decode rows
        beside them in each, not in one eager step.  None otherwise: more whole prompts than fit go in waves (one
        step takes them all while the decode rows wait it, where mixed steps would take several), and a prompt
        part-way through goes as before.  pending: as in _prompt_alone."""
        pending = self.prefilling if pending is None else pending
        if not pending:
            return None
        part_way = any(s.num_computed for s in pending)
        if (part_way and not self.runner.mixed_any_start) or not (decoding or part_way):
            return None
        lengths = [len(s.prefill_ids) - s.num_computed for s in pending]
        take = len(pending)
        while take and (
            sum(lengths[:take]) > self.max_prefill_tokens or not self.runner.mixed_prompts_fit(lengths[:take])
        ):
            if not part_way:
                return None
            take -= 1
        if not take or not (decoding or any(s.num_computed for s in pending[:take])):
            return None  # (whole prompts alone: the prompt and wave graphs' steps)
        self._waved = False
        return list(pending[:take])

    def _prompts_only(self, decoding: list[Seq], pending: list[Seq] | None = None) -> list[Seq] | None:
        """The prompts of a step of prompts only, through a graph (a wave, `_prompt_wave`, or one alone,
        `_prompt_alone`); [] for the decode rows' turn between two waves; None: no such step (the prompts, if any,
        go beside the decode rows).  pending: as in _prompt_alone."""
        wave = self._prompt_wave(decoding, pending)
        if wave is not None:
            return wave
        alone = self._prompt_alone(decoding, pending)
        return None if alone is None else [alone]

    def _prompt_alone(self, decoding: list[Seq], pending: list[Seq] | None = None) -> Seq | None:
        """The prompt to prefill alone in this step (its prompt graph), or None (one step for everything).
        pending: the prompts to choose from (default: all admitted and not prefilled yet)."""
        pending = self.prefilling if pending is None else pending
        if not pending or len(pending) > self._prompts_alone or (len(pending) == 1 and not decoding):
            return None  # nothing to prefill, a wave, or a prompt alone anyway
        first = pending[0]  # graphed prompts fit the prefill chunk (capture_prefill_graphs caps them at it)
        if first.num_computed or not self.runner.prompt_graphed(len(first.prefill_ids)):
            return None
        return first

    def _prompt_wave(self, decoding: list[Seq], pending: list[Seq] | None = None) -> list[Seq] | None:
        """Two or more prompts waiting, where the runner has wave graphs (HFModelRunner.WAVE_ROWS): the first of them
        (as many as the largest wave graph that fits holds) for a step of their own through a wave graph; [] for a
        decode-only step, so that decode rows sit out at most every other step while a long wave goes in; None: no
        wave (one prompt goes alone, `_prompt_alone`, or everything in one eager step).

        Why waves before prompts alone: k prompts alone take k steps, each with the decode rows waiting, and a wave
        of them one.  pending: as in _prompt_alone."""
        pending = self.prefilling if pending is None else pending
        if not pending or not self.runner.wave_rows:
            self._waved = False
            return None
        if decoding and self._waved:  # the decode rows waited for the last wave step: theirs now
            self._waved = False
            return []
        take = []
        for seq in pending[: max(self.runner.wave_rows)]:
            if seq.num_computed:  # a prompt part-way through its chunks: not a whole prompt
                break
            take.append(seq)
        while len(take) >= 2 and (
            sum(len(s.prefill_ids) for s in take) > self.max_prefill_tokens
            or self.runner.wave_graph_key([len(s.prefill_ids) for s in take]) is None
        ):
            take.pop()  # the longest prompts may not fit a wave of that many: fewer, in a smaller one
        if len(take) < 2:
            self._waved = False
            return None
        self._waved = bool(decoding)
        return take

    def _sampling_rows(self, rows: list[Seq], pending_rows: int = 0) -> SamplingRows:
        """pending_rows: the first rows each have a token sampled by a step still running (not yet in out_ids)."""
        sr = SamplingRows()
        sampled = [s for s in rows if s.params.temperature > 0]
        penal = any(s.penalties for s in rows)
        if sampled or penal:
            sr.slots = [s.slot for s in rows]
            sr.temperature = [s.params.temperature for s in rows]
        if sampled:
            sr.any_sampling = True
            sr.any_top = any(s.params.top_k > 0 or s.params.top_p < 1.0 for s in sampled)
            sr.top_k = [s.params.top_k for s in rows]
            sr.top_p = [s.params.top_p for s in rows]
            sr.uniform = [1.0 - s.rng.random() if s.params.temperature > 0 else 1.0 for s in rows]
        if penal:
            sr.any_penalty = True
            sr.repetition_penalty = [s.params.repetition_penalty for s in rows]
            sr.presence_penalty = [s.params.presence_penalty for s in rows]
            sr.frequency_penalty = [s.params.frequency_penalty for s in rows]
        if any(s.params.logprobs is not None for s in rows):
            sr.logprobs = [-1 if s.params.logprobs is None else s.params.logprobs for s in rows]
        guided = [i for i, s in enumerate(rows) if s.matcher is not None]
        if guided:  # their masks now: their last tokens are on the host (Seq.needs_last_token)
            sr.guided = guided
            sr.guide_masks = masks([rows[i].matcher for i in guided], self.runner.vocab_size)
        for i, s in enumerate(rows):
            n = len(s.out_ids) + (i < pending_rows)
            if n < s.min_tokens and s.eos and s.matcher is None:  # a guide says itself when its output may end
                sr.banned.extend((i, t) for t in s.eos)
            if s.bad:
                for word in s.bad:
                    if len(word) == 1 or s.out_ids[-(len(word) - 1) :] == word[:-1]:
                        sr.banned.append((i, word[-1]))
        return sr
