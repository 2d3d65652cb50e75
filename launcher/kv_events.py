"""KV-cache events: which blocks an engine's prefix cache holds, published as they change, so the front end's `kv`
routing (launcher/frontend/kv_index.py) knows where a prompt's prefix lives instead of guessing from where it sent it.

The wire format is vLLM's (`kv_events_config` with publisher "zmq", vllm/distributed/kv_events.py), so one subscriber
reads vLLM and the hf engine alike: a ZMQ PUB socket sends each batch as three frames (topic, the batch's sequence
number as 8 bytes big-endian, a msgpack payload).  The payload is the array [ts, events, data_parallel_rank]; each
event a map tagged by "type":
    BlockStored      block_hashes, parent_block_hash (None for a prompt's first block), token_ids (block_size per
                     block, in order), block_size, ...: blocks became findable in the prefix cache
    BlockRemoved     block_hashes: blocks evicted, no longer findable
    AllBlocksCleared the whole cache was dropped
The engine's block hashes are its own (vLLM's are seeded per process); a subscriber keys blocks by their token ids.

Where a replica leader's engine publishes (`endpoint_for`): a unix socket in the user's private directory where the
whole job runs on one machine (nobody else can read the prompts' tokens off it), else a TCP port on every interface,
as the job's internal tritonservers bind.  launcher/rank reserves it when `serve.routing=kv` and passes it to the
leader's server as _LLMLAUNCH_KV_EVENTS.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, List, Optional, Sequence

from launcher.handoff.rank_env import RankEnv

TOPIC = "kv"  # the topic every publisher of a job sends on


def chain_keys(tokens: Sequence[int], block_size: int, parent: Optional[int] = None, start: int = 0) -> List[int]:
    """The chained keys of the full blocks of `tokens` from block `start` on (`parent`: the key of block start-1; None
    for a prompt's first block): key i hashes key i-1 and block i's tokens, so equal keys mean equal prefixes.  The
    chain starts from 0, not None (whose hash is its address before Python 3.12), and Python hashes ints and tuples of
    them without a seed, so an engine and a front end that cut the same tokens get the same keys."""
    parent = 0 if parent is None else parent
    out = []
    for b in range(start, len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[b * block_size : (b + 1) * block_size])))
        out.append(parent)
    return out


def endpoint_for(loopback: bool, port: int, private_dir: str = "") -> str:
    """The endpoint a replica leader's engine binds: a unix socket (`private_dir`, this process's id: one leader
    rank a process) when every rank runs on this machine, else TCP `port` on every interface."""
    if loopback:
        return f"ipc://{os.path.join(private_dir, f'kv-events-{os.getpid()}.ipc')}"
    return f"tcp://*:{int(port)}"


def connect_to(endpoint: str, addr: str) -> str:
    """Where a subscriber reaches the publisher bound to `endpoint` on the host `addr`."""
    return endpoint.replace("tcp://*:", f"tcp://{addr}:", 1)


def vllm_config(endpoint: str) -> dict:
    """vLLM's `kv_events_config` engine argument that publishes on `endpoint` (vLLM binds endpoints with "*" or
    ipc://, and connects to others)."""
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC}


# ------------------------------------------------------------------------------------------------ the hf engine's side
def stored(block_keys: Sequence[int], parent: Optional[int], tokens: Sequence[int], block_size: int) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": list(block_keys),
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(block_keys: Iterable[int]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(block_keys), "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


class Publisher:
    """A ZMQ PUB socket bound to `endpoint` that sends batches of events (dicts as `stored`/`removed` make) in vLLM's
    framing.  Sends never block: with no subscriber or a slow one, ZMQ drops batches beyond its high-water mark and the
    subscriber sees the gap in the sequence numbers.  One thread uses it (the engine's)."""

    def __init__(self, endpoint: str, hwm: int = 100_000):
        import msgspec
        import zmq

        self.endpoint = endpoint
        self._encode = msgspec.msgpack.Encoder().encode
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.set_hwm(hwm)
        if endpoint.startswith("ipc://") and os.path.exists(endpoint[6:]):
            os.unlink(endpoint[6:])  # a socket file a killed process left
        self._sock.bind(endpoint)
        self._topic = TOPIC.encode()
        self._seq = 0

    def send(self, events: List[dict]) -> None:
        if not events:
            return
        payload = self._encode([time.time(), events, None])
        try:
            self._sock.send_multipart((self._topic, self._seq.to_bytes(8, "big"), payload), flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass  # the subscriber sees the sequence gap
        self._seq += 1

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
        remove_socket_file(self.endpoint)


def remove_socket_file(endpoint: str) -> None:
    """An ipc:// endpoint's socket file, once its publisher is gone (ZMQ leaves it; vLLM's publisher too)."""
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://") :])
        except OSError:
            pass


def publisher_from_env() -> Optional[Publisher]:
    """The publisher a replica leader's engine runs where launcher/rank asked for one (serve.routing=kv), else None."""
    endpoint = RankEnv.from_environ(os.environ).kv_events
    return Publisher(endpoint) if endpoint else None
