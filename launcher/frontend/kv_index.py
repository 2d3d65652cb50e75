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


class KvIndex:
    """Token block key -> bit mask of the replicas whose engines hold it, from their events."""

    def __init__(self, replicas: int):
        self.holders: Dict[int, int] = {}  # chain key -> bit mask of replicas
        self.keys: List[dict] = [{} for _ in range(replicas)]  # per replica: the engine's block hash -> chain key
        self.block_size = 0  # the engines' block size, from their first BlockStored (0: none seen yet)
        self.seq = [-1] * replicas  # the last batch's sequence number per replica
        self.gaps = [0] * replicas  # batches a replica's publisher dropped (each gap forgets the replica's blocks)
        self.unchained = [0] * replicas  # blocks left out: stored after a block the index never saw

    def apply(self, replica: int, seq: int, batch) -> None:
        """One decoded batch ([ts, events, dp_rank]) of `replica`'s publisher, numbered `seq`."""
        last = self.seq[replica]
        self.seq[replica] = seq
        if last >= 0 and seq != last + 1:
            self.gaps[replica] += 1
            self.clear(replica)
        for ev in batch[1]:
            kind = ev.get("type")
            if kind == "BlockStored":
                self.stored(replica, ev)
            elif kind == "BlockRemoved":
                self.removed(replica, ev.get("block_hashes") or ())
            elif kind == "AllBlocksCleared":
                self.clear(replica)

    def stored(self, replica: int, ev: dict) -> None:
        if ev.get("group_idx") not in (None, 0) or any(ev.get("extra_keys") or ()):
            return  # another KV-cache group's blocks, or blocks keyed by more than their tokens
        bs = int(ev.get("block_size") or 0)
        if bs <= 0:
            return
        if self.block_size and bs != self.block_size:
            log(f"replica {replica}'s engine stores blocks of {bs} tokens, the others {self.block_size}: ignored")
            return
        self.block_size = bs
        mine, bit = self.keys[replica], 1 << replica
        parent_hash = ev.get("parent_block_hash")
        parent: Optional[int] = None
        if parent_hash is not None:
            parent = mine.get(_hashable(parent_hash))
            if parent is None:
                self.unchained[replica] += len(ev.get("block_hashes") or ())
                return
        hashes = ev.get("block_hashes") or ()
        keys = chain_keys(ev.get("token_ids") or (), bs, parent)
        holders = self.holders
        for h, key in zip(hashes, keys):
            mine[_hashable(h)] = key
            holders[key] = holders.get(key, 0) | bit

    def removed(self, replica: int, hashes: Sequence) -> None:
        mine, keep = self.keys[replica], ~(1 << replica)
        holders = self.holders
        for h in hashes:
            key = mine.pop(_hashable(h), None)
            if key is None:
                continue
            left = holders.get(key, 0) & keep
            if left:
                holders[key] = left
            else:
                holders.pop(key, None)

    def clear(self, replica: int) -> None:
        self.removed(replica, list(self.keys[replica]))

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
            s.connect(endpoint)
            poller.register(s, zmq.POLLIN)
            socks[s] = replica
        try:
            if not socks:  # no replica publishes (zmq's poll on no sockets returns at once: a busy loop)
                self._stop.wait()
            while not self._stop.is_set():
                for s, _ in poller.poll(200):
                    while True:
                        try:
                            _, seq, payload = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            self.index.apply(socks[s], int.from_bytes(seq, "big"), decode(payload))
                        except Exception as e:  # a batch this reader does not understand: say so, keep reading
                            log(f"replica {socks[s]}'s KV-cache events: a batch not understood ({e!r}); skipped")
        finally:
            for s in socks:
                s.close(linger=0)
            ctx.term()
