"""The hf engine's KV cache as a pool of fixed-size blocks, and the prefix cache over them: plain Python, engine
thread only.

The runner holds the pool's memory (per layer, keys and values `[num_blocks, block_size, kv_heads, head_dim]`);
this module decides which block holds which tokens.  A sequence owns a block table, one block id per
`block_size` tokens, taken as it grows and given back when it ends, so memory goes to the tokens that exist
instead of `max_num_seqs x max_model_len` reserved up front, and a long context and many short ones share it.

Prefix caching, as vLLM's block manager does it: a block that is full is keyed by a hash of its tokens and of every
token before it (a chain: the hash of block i covers block i-1's), so two requests that share a prefix (a system
prompt, the history of a conversation, the shots of a few-shot prompt) find the same blocks.  A new request takes the
cached blocks of its longest cached prefix (their reference count goes up) and prefills only the rest.  A block
nobody references any more keeps its tokens and its key, findable, until the pool needs it: the free blocks are
taken first, then the cached ones least recently freed first (LRU).  Only full blocks are shared, so a sequence
only ever writes into blocks it owns alone.

With `events` (a list), the pool records what becomes findable and what is evicted, as KV-cache events
(launcher.kv_events: BlockStored, BlockRemoved) the engine publishes for the front end's `kv` routing.

Block 0 is the null block: never handed out, it is where padded rows of a CUDA graph write and what an unused
block-table entry points at.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Iterable, Sequence

from launcher.kv_events import chain_keys, removed, stored

NULL_BLOCK = 0


def block_hashes(tokens: Sequence[int], block_size: int, start: int = 0, parent: int | None = None) -> list[int]:
    """The chained keys of the full blocks of `tokens` from block `start` on (`parent`: the key of block start-1):
    launcher.kv_events.chain_keys, the keys the front end's `kv` routing gives the blocks of the engine's events."""
    return chain_keys(tokens, block_size, parent, start)


class BlockPool:
    """Blocks 1..num_blocks-1 for sequences, with reference counts and, with `prefix_caching`, the cache of full
    blocks by key."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True, events: list | None = None):
        if num_blocks < 2:
            raise ValueError(f"a KV-cache pool needs at least 2 blocks (got {num_blocks})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(1, num_blocks))  # referenced by nobody, holding nothing worth keeping
        self._evictable: OrderedDict[int, None] = OrderedDict()  # referenced by nobody, still cached: LRU first
        self._refs = [0] * num_blocks
        self._key_of: dict[int, int] = {}  # block -> its key, for cached blocks
        self._block_of: dict[int, int] = {}  # key -> block
        self.events = events  # where KV-cache events go (None: not recorded); the engine takes them after each step

    # ------------------------------------------------------------------------------------------ capacity
    @property
    def capacity(self) -> int:
        """Blocks a sequence may ever hold: all but the null block."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free, or cached and referenced by nobody)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def usage(self) -> float:
        """The share of the pool held by running sequences."""
        return 1.0 - self.num_free / self.capacity

    # ------------------------------------------------------------------------------------------ taking and giving
    def allocate(self, n: int) -> list[int] | None:
        """`n` blocks for one sequence (reference count 1 each), or None, taking nothing, where the pool has fewer."""
        if n > self.num_free:
            return None
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:  # the least recently freed cached block: its tokens are forgotten
                b, _ = self._evictable.popitem(last=False)
                key = self._key_of.pop(b)
                del self._block_of[key]
                if self.events is not None:
                    self.events.append(removed([key]))
            self._refs[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Iterable[int]) -> None:
        """A sequence lets go of its blocks (in order: its last blocks are evicted first among those it frees)."""
        for b in reversed(list(blocks)):
            self._refs[b] -= 1
            if self._refs[b] > 0:
                continue
            if b in self._key_of:
                self._evictable[b] = None
            else:
                self._free.append(b)

    # ------------------------------------------------------------------------------------------ the prefix cache
    def match(self, tokens: Sequence[int], limit: int) -> tuple[list[int], list[int]]:
        """(the cached blocks of the longest cached prefix of `tokens`, at most `limit` blocks, each now referenced
        once more (`free` them to give them back); their keys)."""
        if not self.prefix_caching:
            return [], []
        blocks, keys = [], []
        for key in block_hashes(tokens[: limit * self.block_size], self.block_size):
            b = self._block_of.get(key)
            if b is None:
                break
            blocks.append(b)
            keys.append(key)
        for b in blocks:
            if self._refs[b] == 0:
                del self._evictable[b]
            self._refs[b] += 1
        return blocks, keys

    def take(self, keys: Sequence[int]) -> list[int | None]:
        """Per key, the cached block holding it, referenced once more (`free` it to give it back), or None where no
        block holds it; unlike `match`, a key missing here does not end the lookup (a prefix moved to this pool can
        find part of itself already cached)."""
        out: list[int | None] = []
        for key in keys:
            b = self._block_of.get(key) if self.prefix_caching else None
            if b is not None:
                if self._refs[b] == 0:
                    del self._evictable[b]
                self._refs[b] += 1
            out.append(b)
        return out

    def publish(
        self, blocks: Sequence[int], keys: Sequence[int], tokens: Sequence[int] = (), parent: int | None = None
    ) -> None:
        """Full blocks of a sequence (its blocks `blocks`, keyed `keys`, in order; `tokens`, theirs; `parent`, the
        key of the block before them) become findable.  A key another block already holds (two requests computed the
        same prefix at once) stays with that block."""
        if not self.prefix_caching:
            return
        run = None  # the first of the blocks in a row that became findable here
        for i, (b, key) in enumerate(zip(blocks, keys)):
            if key in self._block_of or b in self._key_of:
                run = self._stored(run, i, keys, tokens, parent)
                continue
            self._block_of[key] = b
            self._key_of[b] = key
            run = i if run is None else run
        self._stored(run, len(keys), keys, tokens, parent)

    def _stored(self, run: int | None, end: int, keys: Sequence[int], tokens: Sequence[int], parent) -> None:
        """Blocks run..end-1 of a publish became findable: one BlockStored event for them (a key another block already
        holds was said when that block stored it, and goes once when it is evicted)."""
        if self.events is not None and run is not None and end > run:
            bs = self.block_size
            self.events.append(stored(keys[run:end], keys[run - 1] if run else parent, tokens[run * bs : end * bs], bs))


# How long a prefill's blocks stay held for its decode to fetch them (vLLM's NIXL connector holds a remote decode's
# blocks 30 s by default, kv_lease_duration): past it they are cached like any others, evictable.
PIN_S = 30.0


class ExportPins:
    """The blocks of prompts that prefills computed for another engine (kv_export), held in the pool (referenced once
    more: never evicted) until a decode engine fetches them (`drop`, after read_prefix), `pin_s` passes (`expire`),
    or a request of this engine cannot run without them (`give_up_oldest`: the engine's own requests come first; the
    decode then computes what it cannot fetch).  Engine thread only."""

    def __init__(self, pool, pin_s: float = PIN_S):
        self.pool = pool
        self.pin_s = pin_s
        self._held: dict[int, list[tuple[list[int], float]]] = {}  # the last block's key -> [(blocks, until)]

    def __len__(self) -> int:
        return sum(len(v) for v in self._held.values())

    def __bool__(self) -> bool:  # checked every step: no count needed
        return bool(self._held)

    def hold(self, prompt: list[int]) -> int:
        """Hold the cached blocks of `prompt` an export would read (its first (len - 1) // block_size, as far as they
        are cached); the blocks held."""
        blocks, keys = self.pool.match(prompt, (len(prompt) - 1) // self.pool.block_size)
        if blocks:
            self._held.setdefault(keys[-1], []).append((blocks, time.monotonic() + self.pin_s))
        return len(blocks)

    def drop(self, last_key: int) -> None:
        """A decode fetched the prefix ending in the block keyed `last_key`: the oldest hold of it goes."""
        held = self._held.get(last_key)
        if held:
            blocks, _ = held.pop(0)
            if not held:
                del self._held[last_key]
            self.pool.free(blocks)

    def give_up_oldest(self) -> bool:
        """Let go of the hold that ends first (evictable from now on); False where none is held."""
        if not self._held:
            return False
        key = min(self._held, key=lambda k: self._held[k][0][1])
        blocks, _ = self._held[key].pop(0)
        if not self._held[key]:
            del self._held[key]
        self.pool.free(blocks)
        return True

    def expire(self, now: float) -> int:
        """Let go of the holds past their time (no decode came for them); how many."""
        gone = 0
        for key in list(self._held):
            kept = []
            for blocks, until in self._held[key]:
                if until <= now:
                    self.pool.free(blocks)
                    gone += 1
                else:
                    kept.append((blocks, until))
            if kept:
                self._held[key] = kept
            else:
                del self._held[key]
        return gone
