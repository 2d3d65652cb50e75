"""What `serve.routing=kv` knows: which replica's engine holds which token block of its prefix cache, kept from the
engines' KV-cache events (launcher/kv_events.py: vLLM's and the hf engine's); launcher/frontend/prompt_tokens.py
cuts a prompt into the token blocks looked up in it.

The index keys a block by the chain of its tokens (launcher.kv_events.chain_keys: the key of block i hashes the key
of block i-1 and block i's tokens), so the front end's keys of a prompt meet the blocks an engine stored whatever hash
the engine uses itself: a BlockStored event carries its blocks' tokens and the engine's hash of the block before them,
which the replica's map (engine hash -> key) turns into the chain's key.  A block stored after a block the index never
saw (the front end subscribed after it was stored) cannot be chained and is left out; so is a block whose engine hash
mixed in more than tokens (a LoRA adapter, a cache salt, images), which a prompt's tokens alone never find.  A gap in a
replica's sequence numbers (its publisher dropped batches) forgets what that replica holds: removals may have been
lost, and crediting a replica with blocks it evicted is the one mistake the index exists to avoid.

One thread per front-end process reads every replica's events (a ZMQ SUB socket each) and updates the index; the
event loop only reads it (dict lookups, atomic under the GIL).
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

from launcher.frontend.wire import log
from launcher.kv_events import TOPIC, chain_keys

FULL = (None, "full_attention", "mla_attention")  # KV-cache kinds whose blocks a prompt's prefix finds whole


class KvIndex:
    """Token block key -> bit mask of the replicas whose engines hold it, from their events.  Only the engine's GPU
    blocks of its first KV-cache group count, and only where that group keeps whole blocks of attention (a
    sliding-window group drops blocks out of its window, and its events leave out their hashes)."""

    def __init__(self, replicas: int):
        self.holders: Dict[int, int] = {}  # chain key -> bit mask of replicas
        # per replica: the engine's block hash -> [chain key, copies] (vLLM may cache two blocks under one hash, when
        # two requests computed them at once, and removes each copy by itself)
        self.keys: List[dict] = [{} for _ in range(replicas)]
        self.block_size = 0  # the engines' block size, from their first BlockStored (0: none seen yet)
        self.seq = [-1] * replicas  # the last batch's sequence number per replica
        self.gaps = [0] * replicas  # batches a replica's publisher dropped (each gap forgets the replica's blocks)
        self.unchained = [0] * replicas  # blocks left out: stored after a block the index never saw
        self.said: set = set()  # (replica, problem) already logged: a problem is logged once
        self._events = {"BlockStored": self.stored, "BlockRemoved": self.removed, "AllBlocksCleared": self.cleared}

    def apply(self, replica: int, seq: int, batch) -> None:
        """One decoded batch ([ts, events, dp_rank]) of `replica`'s publisher, numbered `seq`."""
        last = self.seq[replica]
        self.seq[replica] = seq
        if last >= 0 and seq != last + 1:
            self.gaps[replica] += 1
            self.say(replica, "gap", f"its publisher dropped batches {last + 1}..{seq - 1}: what it holds is forgotten")
            self.clear(replica)
        for ev in batch[1]:
            handle = self._events.get(ev.get("type"))
            if handle is not None and ev.get("medium") in (None, "GPU") and ev.get("group_idx") in (None, 0):
                handle(replica, ev)

    def say(self, replica: int, problem: str, text: str) -> None:
        if (replica, problem) not in self.said:
            self.said.add((replica, problem))
            log(f"replica {replica}'s KV-cache events: {text} (said once)")

    def stored(self, replica: int, ev: dict) -> None:
        if ev.get("kv_cache_spec_kind") not in FULL or any(ev.get("extra_keys") or ()):
            return  # a window's blocks, or blocks keyed by more than their tokens (LoRA, a cache salt, images)
        bs = int(ev.get("block_size") or 0)
        if bs <= 0:
            return
        if self.block_size and bs != self.block_size:
            self.say(replica, "block size", f"blocks of {bs} tokens, the other engines' {self.block_size}: ignored")
            return
        self.block_size = bs
        mine, bit = self.keys[replica], 1 << replica
        parent_hash = ev.get("parent_block_hash")
        parent: Optional[int] = None
        if parent_hash is not None:
            held = mine.get(_hashable(parent_hash))
            if held is None:
                self.unchained[replica] += len(ev.get("block_hashes") or ())
                return
            parent = held[0]
        keys = chain_keys(ev.get("token_ids") or (), bs, parent)
        holders = self.holders
        for h, key in zip(ev.get("block_hashes") or (), keys):
            held = mine.get(_hashable(h))
            if held is not None and held[0] == key:
                held[1] += 1
                continue
            mine[_hashable(h)] = [key, 1]
            holders[key] = holders.get(key, 0) | bit

    def removed(self, replica: int, ev: dict) -> None:
        mine = self.keys[replica]
        for h in ev.get("block_hashes") or ():
            held = mine.get(_hashable(h))
            if held is None:
                continue
            held[1] -= 1
            if held[1] <= 0:
                del mine[_hashable(h)]
                self._drop(replica, held[0])

    def cleared(self, replica: int, ev: dict) -> None:
        self.clear(replica)

    def clear(self, replica: int) -> None:
        """Forget every block `replica` holds."""
        mine, self.keys[replica] = self.keys[replica], {}
        for key, _ in mine.values():
            self._drop(replica, key)

    def _drop(self, replica: int, key: int) -> None:
        left = self.holders.get(key, 0) & ~(1 << replica)
        if left:
            self.holders[key] = left
        else:
            self.holders.pop(key, None)

    def blocks(self, replica: int) -> int:
        """Blocks the index credits `replica` with."""
        return len(self.keys[replica])


def _hashable(h):
    return bytes(h) if isinstance(h, (bytearray, memoryview, list)) else h


class Subscriber:
    """A thread that reads every replica's KV-cache events into `index` (a SUB socket per replica endpoint; "" = a
    replica that publishes nothing)."""

    def __init__(self, index: KvIndex, endpoints: Sequence[str]):
        self.index = index
        self.endpoints = list(endpoints)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> "Subscriber":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        import msgspec
        import zmq

        decode = msgspec.msgpack.Decoder().decode
        ctx = zmq.Context()
        poller, socks = zmq.Poller(), {}
        for replica, endpoint in enumerate(self.endpoints):
            if not endpoint:
                continue
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
            try:
                s.connect(endpoint)
            except zmq.ZMQError as e:  # a malformed endpoint: this replica is routed as `prefix` would route it
                self.index.say(replica, "connect", f"cannot subscribe to {endpoint} ({e})")
                s.close(linger=0)
                continue
            poller.register(s, zmq.POLLIN)
            socks[s] = replica
        try:
            if not socks:  # no replica publishes (zmq's poll on no sockets returns at once: a busy loop)
                self._stop.wait()
            while not self._stop.is_set():
                for s, _ in poller.poll(200):
                    self._drain(s, socks[s], decode, zmq)
        finally:
            for s in socks:
                s.close(linger=0)
            ctx.term()

    def _drain(self, sock, replica: int, decode, zmq) -> None:
        """Every batch waiting on `replica`'s socket, into the index.  A batch not understood is skipped, and what the
        replica holds forgotten (the batch may have evicted blocks)."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                _, seq, payload = frames
                self.index.apply(replica, int.from_bytes(seq, "big"), decode(payload))
            except Exception as e:
                self.index.say(replica, "batch", f"a batch not understood ({e!r}): skipped, its blocks forgotten")
                self.index.clear(replica)
