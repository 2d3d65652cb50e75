"""Which replica a request goes to (`serve.routing`): a registry of policies, one class each.

- `least_outstanding`: the up replica with the fewest requests in flight (in every worker process); ties in turn.
- `prefix`: the replica most likely to hold the request's prompt prefix in its KV cache, within a load bound.  The
  prompt's text is cut into blocks of BLOCK_BYTES and chained (each block's key hashes the key before it, as the
  engines' prefix caches key their token blocks), and an index remembers, for each key, which replicas were sent a
  prompt containing that block (bounded, least recently used first out).  A request goes to the replica that holds
  the longest run of its blocks, among the replicas whose load is within LOAD_BOUND of the mean (consistent hashing
  with bounded loads): a hot prefix stays on one replica until that replica carries more than its share, then the
  next request of it goes to the least loaded one, which then holds it too.  A prefix no replica holds goes where
  its first block's rendezvous hash ranks highest among the least loaded, so every worker process of the front end
  (each with its own index) sends a new prefix to the same replica.  A request that names its session (the
  `session_id` parameter; the OpenAI API's `X-Session-ID` header) goes where the session's last request went, while
  that replica is within the bound; a session new to this process goes where its prefix is, else where the session
  id's rendezvous hash ranks highest, so the API's processes, each reaching its own front-end process, agree.

- `kv`: as `prefix`, with the index kept from what the engines hold (their KV-cache events, launcher/kv_events.py:
  vLLM and the hf engine publish them) and the prompt cut into the engines' token blocks with the model's tokenizer.

Why `prefix` keys text blocks and not token blocks: the front end forwards the request bytes as they came and needs
no tokenizer then; hashing text is cheap (benchmark/routing.py: a pick takes 30 us for 8 KiB of prompt, 310 us for 64 KiB), and a
shared prefix of text is a shared prefix of tokens up to the last token it cuts.  The index is what the front end
sent, not what the engines still hold: an engine that evicted a prefix is still credited with it until the index
ages it out.  `kv` knows, at the price of tokenizing every prompt in the front end.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Type

from launcher.contract import SESSION_PARAMETER
from launcher.domains import ROUTINGS
from launcher.frontend.text_blocks import BLOCK_BYTES, block_keys

INDEX_BLOCKS = 1 << 18  # keys the index remembers, least recently used out first (~30 MiB at most)
LOAD_BOUND = 1.25  # a replica takes a request while its load <= LOAD_BOUND x (mean load + 1)
SESSIONS = 1 << 16  # session ids remembered, least recently used out first


class Routing:
    """A policy: `pick(replicas, exclude, prompt, session)` -> the replica for a request, or None where none is up."""

    name = ""
    needs_prompt = False  # whether pick() reads prompt and session (the front end reads them out of the request then)

    def __init__(self) -> None:
        self._turn = 0

    @classmethod
    def from_options(cls, kv_events: Sequence[str] = (), tokenizer: str = "") -> "Routing":
        """The policy for the front end's options (those a policy does not read are ignored)."""
        return cls()

    def start(self) -> None:
        """Called as the front end starts."""

    def close(self) -> None:
        """Called as the front end stops."""

    def forget(self, index: int) -> None:
        """Replica `index` left (a members file's slot, which may go to another server next): what the policy
        remembers of it goes."""

    def pick(self, replicas: Sequence, exclude: Sequence = (), prompt: bytes = b"", session: str = ""):
        raise NotImplementedError

    def _least_loaded(self, candidates: List) -> Optional[object]:
        """The candidate with the fewest requests in flight; ties in turn."""
        n = len(candidates)
        if not n:
            return None
        start = self._turn = (self._turn + 1) % n
        best, best_load = None, 0
        for k in range(n):
            r = candidates[(start + k) % n]
            load = r.load()
            if best is None or load < best_load:
                best, best_load = r, load
        return best


class LeastOutstanding(Routing):
    name = "least_outstanding"

    def pick(self, replicas, exclude=(), prompt=b"", session=""):
        return self._least_loaded([r for r in replicas if r.up and r not in exclude])


class PrefixRouting(Routing):
    name = "prefix"
    needs_prompt = True

    def __init__(self, index_blocks: int = INDEX_BLOCKS, load_bound: float = LOAD_BOUND, sessions: int = SESSIONS):
        super().__init__()
        self.index: "OrderedDict[int, int]" = OrderedDict()  # block key -> bit mask of the replicas sent it
        self.index_blocks = index_blocks
        self.sessions: "OrderedDict[str, int]" = OrderedDict()  # session id -> the replica its last request went to
        self.max_sessions = sessions
        self.load_bound = load_bound

    def matched(self, keys: List[int], candidates: List, index=None) -> Dict[int, int]:
        """Replica index -> how many of keys' leading blocks `index` (key -> bit mask of replicas; this policy's own
        by default) credits it with (only those with one or more)."""
        alive = 0
        for r in candidates:
            alive |= 1 << r.index
        found: Dict[int, int] = {}
        index = self.index if index is None else index
        for depth, key in enumerate(keys):
            has = index.get(key, 0) & alive
            dropped = alive & ~has
            if dropped and depth:
                for r in candidates:
                    if dropped >> r.index & 1:
                        found[r.index] = depth
            alive = has
            if not alive:
                break
        else:
            for r in candidates:
                if alive >> r.index & 1:
                    found[r.index] = len(keys)
        return found

    def pick(self, replicas, exclude=(), prompt=b"", session=""):
        up = [r for r in replicas if r.up and r not in exclude]
        if not up:
            return None
        keys = block_keys(prompt)
        loads = {r.index: r.load() for r in up}
        bound = self.load_bound * (sum(loads.values()) / len(up) + 1)
        within = [r for r in up if loads[r.index] <= bound] or up
        found, blocks, credited = self.credit(prompt, keys, within)
        last = self.sessions.get(session, -1) if session else -1
        if last >= 0 and any(r.index == last for r in within):  # the session's replica, while within its bound
            rep = next(r for r in within if r.index == last)
        elif not found and not keys and not session:  # shorter than a block, and held by no engine: nothing to share
            rep = self._least_loaded(within)
        elif found:
            # the longest cached run; of equals, the least loaded
            rep = max(within, key=lambda r: (found.get(r.index, 0), -loads[r.index]))
        else:
            # rendezvous hash of the session id, else of the first block's text: the same in every front-end
            # process (blake2b, not hash()), so each sends a new session or prefix to the same replica
            least = min(loads[r.index] for r in within)
            first = session.encode() if session else prompt[:BLOCK_BYTES]
            rep = max(
                (r for r in within if loads[r.index] == least),
                key=lambda r: hashlib.blake2b(first + r.index.to_bytes(4, "little"), digest_size=8).digest(),
            )
        rep.prompt_blocks += blocks
        rep.predicted_blocks += credited.get(rep.index, 0)
        self._remember(keys, rep.index)
        if session:
            self.sessions.pop(session, None)
            self.sessions[session] = rep.index
            if len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return rep

    def credit(self, prompt: bytes, keys: List[int], within: List):
        """(replica index -> the prompt's leading blocks to route by, the prompt's blocks, replica index -> the
        blocks counted as predicted hits on /metrics): here both are where the prompt's text blocks were sent."""
        found = self.matched(keys, within) if keys else {}
        return found, len(keys), found

    def forget(self, index: int) -> None:
        """Replica `index` left: its bit goes from every key of the index, its sessions are forgotten (a pass over
        both: a replica leaves rarely)."""
        bit, table = 1 << index, self.index
        for key in [k for k, mask in table.items() if mask & bit]:
            left = table[key] & ~bit
            if left:
                table[key] = left  # (assigning a key in place keeps its place in the LRU order)
            else:
                del table[key]
        for session in [s for s, i in self.sessions.items() if i == index]:
            del self.sessions[session]

    def _remember(self, keys: List[int], index: int) -> None:
        bit, table = 1 << index, self.index
        for key in keys:
            table[key] = table.pop(key, 0) | bit  # re-inserted: most recently used
        while len(table) > self.index_blocks:
            table.popitem(last=False)


class KvRouting(PrefixRouting):
    """`kv`: as `prefix`, but a replica is credited with the prompt's token blocks its engine holds now, as the
    engines' KV-cache events say (launcher/frontend/kv_index.py), not with the text it was sent: an evicted prefix
    stops drawing its requests, and a prefix one replica computed for a request routed by load draws the next ones.
    A prompt no engine holds yet (its first requests are still prefilling) goes where its text was sent, as `prefix`
    sends it, so a burst of a new prefix still meets on one replica."""

    name = "kv"

    def __init__(self, kv_events: Sequence[str] = (), tokenizer: str = "", **kw):
        from launcher.frontend.kv_index import KvIndex, Subscriber
        from launcher.frontend.prompt_tokens import PromptTokens

        super().__init__(**kw)
        if not tokenizer:
            raise ValueError("routing kv: the front end needs the model's tokenizer folder (--tokenizer)")
        self.kv = KvIndex(len(kv_events))
        self.blocks = PromptTokens(tokenizer)
        self.subscriber = Subscriber(self.kv, kv_events)

    def credit(self, prompt, keys, within):
        tokens = self.blocks.keys(prompt, self.kv.block_size)
        held = self.matched(tokens, within, self.kv.holders) if tokens else {}
        if held:
            return held, len(tokens), held
        return (self.matched(keys, within) if keys else {}), len(tokens), held

    @classmethod
    def from_options(cls, kv_events=(), tokenizer=""):
        return cls(kv_events, tokenizer)

    def start(self) -> None:
        self.subscriber.start()

    def close(self) -> None:
        self.subscriber.stop()


REGISTRY: Dict[str, Type[Routing]] = {cls.name: cls for cls in (LeastOutstanding, PrefixRouting, KvRouting)}
assert tuple(sorted(REGISTRY)) == tuple(sorted(ROUTINGS)), "launcher.domains.ROUTINGS names every policy here"


def make_routing(name: str, kv_events: Sequence[str] = (), tokenizer: str = "") -> Routing:
    """The policy `name`; `kv` reads the engines' KV-cache events at `kv_events` (one endpoint per replica) and
    tokenizes prompts with the tokenizer folder `tokenizer`."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ValueError(f"routing {name!r}: not a policy; use one of {', '.join(REGISTRY)}") from None
    return cls.from_options(kv_events, tokenizer)


def routing_keys(request) -> tuple:
    """(prompt text, session id) of a ModelInferRequest, what prefix routing reads."""
    session = request.parameters.get(SESSION_PARAMETER)
    return prompt_of(request), session.string_param if session is not None else ""


def prompt_of(request) -> bytes:
    """The text of a ModelInferRequest's `text_input` (a BYTES tensor: a 4-byte length, then the bytes), b"" where
    it has none (a model without it, or inputs sent as typed contents)."""
    for i, inp in enumerate(request.inputs):
        if inp.name == "text_input":
            if i < len(request.raw_input_contents):
                raw = request.raw_input_contents[i]
                return raw[4 : 4 + int.from_bytes(raw[:4], "little")]
            if inp.contents.bytes_contents:
                return inp.contents.bytes_contents[0]
            return b""
    return b""
