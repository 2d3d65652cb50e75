"""A prompt's keys and values moved from one hf engine's KV cache to another's: the part of disaggregated serving
that is the engine's.

A prefill engine computes a prompt and keeps its full blocks in its prefix cache (launcher/hf/blocks.py); the blocks
of the prompt's longest cached prefix leave it as a `KVPrefix` (`Engine.export_prefix`): the tokens they hold, their
chained keys (the prefix cache's, launcher.kv_events.chain_keys) and, per layer, the keys and values of those blocks.
A decode engine given the same prompt with that KVPrefix (`Engine.add_request(..., kv_prefix=...)`) first stores the
blocks in its own prefix cache, findable by the same keys, then admits the request as any other: the prefix is found
cached and only the rest of the prompt (at least its last token, whose logits give the first token) is computed.  A
prefix the decode pool has no room for is not stored, and the request computes its whole prompt: slower, never wrong.

`to_bytes`/`from_bytes` are the wire form (a JSON header, then the tensor's raw bytes): what crosses a socket between
two engine processes."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import torch

from launcher.hf.blocks import block_hashes

_HEADER = struct.Struct("<I")  # the JSON header's length in bytes


@dataclass(frozen=True)
class KVPrefix:
    """The cached blocks of a prompt's prefix, from one engine, for another running the same model."""

    tokens: tuple  # the token ids the blocks hold: a whole number of blocks from the prompt's start
    block_size: int  # tokens a block (both engines must use the same: the keys are per block)
    # keys and values, [layers, 2 (keys, values), blocks, block_size, kv_heads, head_dim], on the host
    data: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return len(self.tokens) // self.block_size

    @property
    def keys(self) -> list[int]:
        """The blocks' chained keys: the prefix cache's."""
        return block_hashes(list(self.tokens), self.block_size)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def shape_problem(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype) -> str:
        """Why this prefix cannot go into a pool of that shape ("" when it can): another model, another tensor-parallel
        shard or another block size computed it."""
        want = (num_layers, 2, self.num_blocks, block_size, num_kv_heads, head_dim)
        if self.block_size != block_size:
            return f"its blocks hold {self.block_size} tokens and this engine's {block_size}: give both one block_size"
        if len(self.tokens) % self.block_size:
            return f"it holds {len(self.tokens)} tokens, not a whole number of {self.block_size}-token blocks"
        if tuple(self.data.shape) != want:
            return (
                f"its keys and values are {tuple(self.data.shape)} and this engine's pool takes {want} "
                "(layers, keys and values, blocks, block size, KV heads, head size): both engines must serve one "
                "model at one tensor-parallel size"
            )
        if self.data.dtype != dtype:
            return f"its keys and values are {self.data.dtype} and this engine's pool {dtype}: give both one dtype"
        return ""

    def wire_parts(self) -> tuple[bytes, memoryview]:
        """The wire form as (header, payload): the header (its length, then JSON padded to 8 bytes, so the payload
        after it is aligned for any dtype) and the keys and values' own bytes, not copied."""
        header = json.dumps(
            {
                "tokens": list(self.tokens),
                "block_size": self.block_size,
                "shape": list(self.data.shape),
                "dtype": str(self.data.dtype).replace("torch.", ""),
            }
        ).encode()
        header += b" " * (-(_HEADER.size + len(header)) % 8)
        return _HEADER.pack(len(header)) + header, memoryview(self.data.contiguous().view(-1).view(torch.uint8).numpy())

    def to_bytes(self) -> bytes:
        header, payload = self.wire_parts()
        return header + payload.tobytes()

    @classmethod
    def from_buffer(cls, buf: bytearray) -> "KVPrefix":
        """The KVPrefix of a wire form, its keys and values a view of `buf` (not copied: `buf` must stay as it is)."""
        (n,) = _HEADER.unpack_from(buf)
        head = json.loads(bytes(buf[_HEADER.size : _HEADER.size + n]))
        dtype = getattr(torch, head["dtype"])
        start = _HEADER.size + n
        if start == len(buf):  # no block was cached: torch.frombuffer takes no empty buffer
            return cls(tuple(head["tokens"]), int(head["block_size"]), torch.empty(head["shape"], dtype=dtype))
        data = torch.frombuffer(buf, dtype=torch.uint8, offset=start).view(dtype).view(head["shape"])
        return cls(tuple(head["tokens"]), int(head["block_size"]), data)

    @classmethod
    def from_bytes(cls, buf: bytes) -> "KVPrefix":
        return cls.from_buffer(bytearray(buf))


# ------------------------------------------------------------------------------------------ the engine thread's side
def prefix_problem(runner, prefix: KVPrefix | None, prompt_ids: list[int]) -> str:
    """Why `prefix` cannot go into `runner`'s pool for this prompt, or why this engine moves no keys and values at
    all (prefix None: an export); "" when it can."""
    if runner.tp > 1:
        return (
            f"moving keys and values between engines needs tp=1 (this engine is tp={runner.tp}): serve the prefill "
            "and decode roles at tp=1"
        )
    if prefix is None:
        return ""
    why = prefix.shape_problem(runner.num_layers, runner.num_kv_heads, runner.head_dim, runner.block_size, runner.dtype)
    if why:
        return f"kv_prefix cannot be used here: {why}"
    if list(prefix.tokens) != list(prompt_ids[: len(prefix.tokens)]):
        return (
            f"kv_prefix holds {len(prefix.tokens)} tokens that are not the prompt's first ones: it was computed for "
            "another prompt"
        )
    return ""


def read_prefix(runner, pool, prompt: list[int]) -> KVPrefix:
    """Engine.export_prefix on the engine thread: the cached blocks of the prompt's first (len - 1) // block_size
    blocks, as far as each is cached, read while held (no eviction can reuse them meanwhile)."""
    bs = runner.block_size
    blocks, _ = pool.match(prompt, (len(prompt) - 1) // bs)
    try:
        if blocks:
            data = runner.read_blocks(blocks)
        else:
            data = torch.empty((runner.num_layers, 2, 0, bs, runner.num_kv_heads, runner.head_dim), dtype=runner.dtype)
    finally:
        pool.free(blocks)
    return KVPrefix(tuple(prompt[: len(blocks) * bs]), bs, data)


def store_prefix(runner, pool, prefix: KVPrefix) -> int:
    """A prefix from another engine into this one's prefix cache (the engine thread, before its request is added);
    returns the prompt tokens stored.  The blocks not cached here already are taken from the pool, written and
    published under their keys, then let go: findable until evicted, least recently freed last, so the request
    admitted next finds them.  No room in the pool: nothing is stored and the request computes its whole prompt."""
    bs, keys = prefix.block_size, prefix.keys
    held = pool.take(keys)  # the blocks cached here already stay while new ones are taken
    missing = [i for i, b in enumerate(held) if b is None]
    new = (pool.allocate(len(missing)) if missing else None) or []
    try:
        if new:  # all of them (none cached here): the moved tensor as it is, no copy of it made
            runner.write_blocks(new, prefix.data if len(missing) == len(keys) else prefix.data[:, :, missing])
            for b, i in zip(new, missing):
                pool.publish([b], [keys[i]], prefix.tokens[i * bs : (i + 1) * bs], keys[i - 1] if i else None)
    finally:
        pool.free([b for b in held if b is not None] + new)
    return len(new) * bs


# ------------------------------------------------------------------------------------------ between engine processes
# One exchange a connection: the decode side sends its prompt (JSON: text or token ids, length-prefixed), the prefill
# side answers with a status byte and a length-prefixed body: KVPrefix.to_bytes, or an error's text.
_LEN = struct.Struct("<Q")
_OK, _ERROR = b"K", b"E"
FETCH_TIMEOUT_S = 30.0  # a prefill engine that takes longer is given up on: the decode engine computes the prompt


def _send(sock, status: bytes, *parts) -> None:
    """One message: the status, the body's length, then its parts as they are (a prefix's keys and values go from
    their tensor to the socket, no copy made)."""
    first, rest = (bytes(parts[0]), parts[1:]) if parts else (b"", ())
    sock.sendall(status + _LEN.pack(sum(len(p) for p in parts)) + first)  # small parts in one write: no Nagle wait
    for part in rest:
        sock.sendall(part)


def _recv_exactly(sock, n: int) -> bytearray:
    """`n` bytes, received straight into one buffer."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if not k:
            raise ConnectionError(f"the connection closed {n - got} bytes short of {n}")
        got += k
    return buf


def _recv(sock) -> tuple[bytes, bytearray]:
    status = bytes(_recv_exactly(sock, 1))
    (n,) = _LEN.unpack(_recv_exactly(sock, _LEN.size))
    return status, _recv_exactly(sock, n)


def serve_prefixes(engine, address: str):
    """A prefill engine's side (the engine process, RankEnv.kv_transfer set): a thread that answers each connection
    to `address` (host:port) with the KVPrefix of the prompt it sends (Engine.export_prefix, on the engine thread).
    Returns the server; `shutdown()` stops it."""
    import socketserver
    import threading

    from launcher.hf.encode import PromptEncoder

    encode = PromptEncoder(engine.tokenizer)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                _, body = _recv(self.request)
                prompt = json.loads(body)["prompt"]
                ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
                _send(self.request, _OK, *engine.export_prefix(ids).wire_parts())
            except Exception as exc:  # this exchange's failure: the decode side computes the prompt itself
                try:
                    _send(self.request, _ERROR, f"{type(exc).__name__}: {exc}".encode())
                except OSError:
                    pass

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    host, _, port = address.rpartition(":")
    server = Server((host.strip("[]"), int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="kv-transfer", daemon=True).start()
    return server


def fetch_prefix(address: str, prompt, timeout_s: float = FETCH_TIMEOUT_S) -> KVPrefix:
    """A decode engine's side: the KVPrefix of `prompt` (text or token ids) from the prefill engine at `address`.
    Raises OSError (unreachable, closed) or RuntimeError (the prefill side's error)."""
    import socket

    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
        _send(sock, _OK, json.dumps({"prompt": prompt}).encode())
        status, body = _recv(sock)
    if status != _OK:
        raise RuntimeError(f"the prefill engine at {address}: {body.decode(errors='replace')}")
    return KVPrefix.from_buffer(body)


class PrefixFetcher:
    """A decode engine's requests with a `kv_from` (the engine process's reader hands them here, so no fetch holds
    up the others): on a thread of a small pool each takes its prompt's prefix from the prefill engine, then goes to
    the engine with it.  A prefix that cannot be had or used (unreachable, evicted, another shape) is logged and the
    request goes without it: the engine computes the whole prompt."""

    THREADS = 4  # transfers at once; more wait their turn

    def __init__(self, engine, log):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self.engine = engine
        self.log = log
        self.pool = ThreadPoolExecutor(self.THREADS, thread_name_prefix="kv-fetch")
        self.lock = threading.Lock()
        self.fetching: set[str] = set()  # request ids whose prefix is on its way
        self.aborted: set[str] = set()  # of those, the ones cancelled meanwhile

    def add(self, request_id: str, prompt, params, on_output, on_refused) -> None:
        """Queue one request; `on_refused(exc)` where the engine refuses it (InvalidRequest: its own error)."""
        with self.lock:
            self.fetching.add(request_id)
        self.pool.submit(self._add, request_id, prompt, params, on_output, on_refused)

    def abort(self, request_id: str) -> bool:
        """Cancel a request whose prefix is on its way (True): it reaches the engine and is cancelled there at
        once, ending as any cancelled request does."""
        with self.lock:
            if request_id not in self.fetching:
                return False
            self.aborted.add(request_id)
            return True

    def _add(self, request_id, prompt, params, on_output, on_refused) -> None:
        import time

        began = time.monotonic()
        try:
            prefix = fetch_prefix(params.kv_from, prompt)
        except Exception as exc:
            self.log.warning("kv_from %s: %s; computing the whole prompt", params.kv_from, exc)
            prefix = None
        self._count(prefix, time.monotonic() - began)
        try:
            try:
                self.engine.add_request(request_id, prompt, params, on_output, kv_prefix=prefix)
            except ValueError as exc:  # InvalidRequest: the prefix's problem, or the request's own (raised again)
                if prefix is None:
                    raise
                self.log.warning("kv_from %s: %s; computing the whole prompt", params.kv_from, exc)
                self.engine.add_request(request_id, prompt, params, on_output)
        except Exception as exc:
            on_refused(exc)
        finally:
            with self.lock:
                self.fetching.discard(request_id)
                aborted = request_id in self.aborted
                self.aborted.discard(request_id)
        if aborted:
            self.engine.abort(request_id)

    def _count(self, prefix, seconds: float) -> None:
        """One fetch in the engine's totals (EngineStats.kv_transfer*: llmlaunch_kv_transfer* on the metrics port);
        the pool's threads count under the lock, the engine thread only reads them."""
        stats = self.engine.stats
        with self.lock:
            if prefix is None:
                stats.kv_transfer_failures += 1
                return
            stats.kv_transfers += 1
            stats.kv_transfer_bytes += prefix.nbytes
            stats.kv_transfer_s += seconds

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
