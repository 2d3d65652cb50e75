"""`serve.routing=kv` (launcher/frontend/kv_index.py, launcher/frontend/routing.py's KvRouting) fed by real ZMQ sockets.

The events are built as vLLM 0.25 publishes them (vllm/distributed/kv_events.py: a KVEventBatch encoded with msgspec as
the array [ts, events, dp_rank], each event a map tagged by "type", the engine's block hashes as 32-byte strings),
which is vLLM's API boundary: vLLM itself needs a GPU and runs on the GPU machine (docs/performance/routing.md).  The hf
engine's own publisher (launcher.kv_events.Publisher) sends the same, and its events are tested from the real engine
in tests/integration/test_frontend.py."""

from __future__ import annotations

import hashlib
import os
import time

import msgspec
import pytest
import zmq

from launcher.frontend.kv_index import KvIndex, Subscriber
from launcher.frontend.prompt_tokens import PromptTokens, cuts
from launcher.frontend.replica import Replica
from launcher.frontend.routing import KvRouting, make_routing
from launcher.kv_events import TOPIC, Publisher, chain_keys, connect_to, endpoint_for, removed, stored

BS = 4


def _vllm_hash(parent: bytes, tokens) -> bytes:
    """A stand-in for vLLM's block hash (sha256 over the parent's hash and the tokens): only its shape matters, bytes
    the front end cannot compute itself."""
    return hashlib.sha256(parent + repr(tuple(tokens)).encode()).digest()


def _vllm_stored(tokens, parent: bytes | None = None, **extra) -> tuple[dict, list]:
    hashes, p = [], parent or b""
    for b in range(len(tokens) // BS):
        p = _vllm_hash(p, tokens[b * BS : (b + 1) * BS])
        hashes.append(p)
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }
    return ev, hashes


def _batch(*events):
    return msgspec.msgpack.decode(msgspec.msgpack.encode([time.time(), list(events), 0]))


def test_stored_blocks_chain_by_their_tokens_whatever_the_engines_hash():
    idx = KvIndex(2)
    toks = list(range(12))
    ev, hashes = _vllm_stored(toks)
    idx.apply(0, 0, _batch(ev))
    # the hf engine's own keys are the chain keys themselves
    idx.apply(1, 0, _batch(stored(chain_keys(toks[:8], BS), None, toks[:8], BS)))
    keys = chain_keys(toks, BS)
    assert [idx.holders.get(k) for k in keys] == [0b11, 0b11, 0b01]
    # a later event continues the chain from the engine's hash of its parent block
    more, _ = _vllm_stored(list(range(12, 16)), parent=hashes[-1])
    idx.apply(0, 1, _batch(more))
    assert idx.holders[chain_keys(list(range(16)), BS)[-1]] == 0b01
    # removed: that replica no longer holds the block; cleared: nothing it held
    idx.apply(1, 1, _batch(removed([keys[1]])))
    assert [idx.holders.get(k) for k in keys[:2]] == [0b11, 0b01]
    idx.apply(0, 2, _batch({"type": "AllBlocksCleared"}))
    assert idx.holders == {keys[0]: 0b10} and idx.blocks(0) == 0


def test_blocks_the_index_cannot_key_by_tokens_alone_are_left_out():
    idx = KvIndex(1)
    ev, _ = _vllm_stored(list(range(4, 12)), parent=b"x" * 32)  # its parent was stored before the front end listened
    idx.apply(0, 0, _batch(ev))
    lora, _ = _vllm_stored(list(range(8)), extra_keys=[("adapter",), None])  # keyed by more than tokens
    idx.apply(0, 1, _batch(lora))
    other, _ = _vllm_stored(list(range(8)), group_idx=1)  # another KV-cache group (a sliding-window layer's)
    idx.apply(0, 2, _batch(other))
    assert idx.holders == {} and idx.unchained == [2]


def test_removals_count_copies_and_only_the_first_groups_gpu_blocks_count():
    """vLLM may cache two blocks under one hash (two requests computed them at once) and removes each copy by
    itself; blocks of another KV-cache group, of a sliding window or off the GPU (an offloading connector's) are not
    the prefix cache a prompt finds whole."""
    idx = KvIndex(1)
    ev, hashes = _vllm_stored(list(range(8)))
    idx.apply(0, 0, _batch(ev, ev))  # two copies
    keys = chain_keys(list(range(8)), BS)
    idx.apply(0, 1, _batch({"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}))
    assert [idx.holders.get(k) for k in keys] == [1, 1]  # one copy left
    for other in ({"group_idx": 1}, {"medium": "CPU"}):  # not this group's, not the GPU's: no change
        idx.apply(0, idx.seq[0] + 1, _batch({"type": "BlockRemoved", "block_hashes": hashes, **other}))
    assert [idx.holders.get(k) for k in keys] == [1, 1]
    idx.apply(0, idx.seq[0] + 1, _batch({"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}))
    assert idx.holders == {}
    window, _ = _vllm_stored(list(range(8)), kv_cache_spec_kind="sliding_window")
    offloaded, _ = _vllm_stored(list(range(8)), medium="CPU")
    full, _ = _vllm_stored(list(range(8)), kv_cache_spec_kind="full_attention", group_idx=0)
    idx.apply(0, idx.seq[0] + 1, _batch(window, offloaded))
    assert idx.holders == {}
    idx.apply(0, idx.seq[0] + 1, _batch(full))
    assert [idx.holders.get(k) for k in keys] == [1, 1]


def test_a_gap_in_a_replicas_sequence_numbers_forgets_what_it_holds():
    idx = KvIndex(2)
    ev, _ = _vllm_stored(list(range(8)))
    idx.apply(0, 5, _batch(ev))  # the first batch seen need not be number 0
    idx.apply(1, 0, _batch(ev))
    idx.apply(0, 7, _batch())  # batch 6 was dropped: its removals may be lost
    assert idx.gaps == [1, 0] and idx.blocks(0) == 0 and idx.blocks(1) == 2
    assert set(idx.holders.values()) == {0b10}


def test_events_reach_the_index_over_zmq_from_vllms_framing_and_the_hf_engines_publisher(tmp_path):
    eps = [f"ipc://{tmp_path}/vllm.ipc", f"ipc://{tmp_path}/hf.ipc"]
    ctx = zmq.Context()
    vllm = ctx.socket(zmq.PUB)  # as vLLM's ZmqEventPublisher sends: topic, 8-byte big-endian sequence, payload
    vllm.bind(eps[0])
    hf = Publisher(eps[1])
    idx = KvIndex(2)
    sub = Subscriber(idx, eps).start()
    try:
        toks = list(range(8))
        ev, _ = _vllm_stored(toks)
        deadline = time.monotonic() + 10
        seq = 0
        while idx.blocks(0) + idx.blocks(1) < 4 and time.monotonic() < deadline:  # PUB drops until SUB has joined
            vllm.send_multipart(
                [TOPIC.encode(), seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), [ev], 0])]
            )
            hf.send([stored(chain_keys(toks, BS), None, toks, BS)])
            seq += 1
            time.sleep(0.05)
        assert [idx.holders.get(k) for k in chain_keys(toks, BS)] == [0b11, 0b11]
    finally:
        sub.stop()
        vllm.close(linger=0)
        ctx.term()
        hf.close()
    assert not os.path.exists(f"{tmp_path}/hf.ipc")  # the hf engine's socket file goes with it


def test_a_batch_not_understood_is_skipped_and_the_subscriber_reads_on(tmp_path):
    """Two frames instead of three, then a payload that is no batch: each logged once, the replica's blocks forgotten
    (the batch may have evicted some), and the next good batch still read."""
    ep = f"ipc://{tmp_path}/e.ipc"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(ep)
    idx = KvIndex(1)
    sub = Subscriber(idx, [ep]).start()
    toks = list(range(8))
    good = msgspec.msgpack.encode([time.time(), [stored(chain_keys(toks, BS), None, toks, BS)], None])
    try:
        deadline = time.monotonic() + 10
        while not idx.blocks(0) and time.monotonic() < deadline:
            pub.send_multipart([TOPIC.encode(), (0).to_bytes(8, "big"), good])
            time.sleep(0.05)
        for bad in ([TOPIC.encode(), b"x"], [TOPIC.encode(), (1).to_bytes(8, "big"), b"\xc1"]):
            pub.send_multipart(bad)
        deadline = time.monotonic() + 10
        while idx.blocks(0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert idx.blocks(0) == 0 and {p for _, p in idx.said} == {"batch"}
        pub.send_multipart([TOPIC.encode(), (2).to_bytes(8, "big"), good])
        deadline = time.monotonic() + 10
        while not idx.blocks(0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert idx.blocks(0) == 2 and sub._thread.is_alive()
    finally:
        sub.stop()
        pub.close(linger=0)
        ctx.term()


def test_the_prompt_is_cut_into_token_blocks_before_its_last_token(tiny_model_dir):
    from transformers import AutoTokenizer

    text = "the quick brown fox jumps over the lazy dog " * 6
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(text).input_ids  # as the hf engine tokenizes a text prompt
    assert PromptTokens(tiny_model_dir).keys(text.encode(), BS) == chain_keys(ids[:-1], BS)
    assert PromptTokens(tiny_model_dir).keys(text.encode(), 0) == []  # no engine has said its block size yet


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_remembered_pieces_add_up_to_the_whole_prompts_tokens(model, tiny_model_dir, smollm2_dir):
    """Conversations whose turns each send the whole history, on the tiny model's tokenizer and SmolLM2's (GPT-2's
    kind): every prompt's tokens from the pieces remembered of earlier ones equal tokenizing it whole."""
    import random

    tokens_dir = str(tiny_model_dir if model == "tiny" else smollm2_dir)
    tokens = PromptTokens(tokens_dir)
    assert tokens.pieces_add_up
    rng = random.Random(3)
    words = "the a river stone, cloud. lamp\n orbit 42 maple's quartz  harbor violet? 3.5 x\t(y) -- z".split(" ")
    for _ in range(12):
        history = "System: " + " ".join(rng.choice(words) for _ in range(rng.randint(20, 600)))
        for _ in range(3):
            history += " User: " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 150))) + "\nAssistant:"
            assert tokens.ids(history.encode()) == tokens.whole(history.encode())
    assert len(tokens.memo) > 100
    # text other than ASCII, and llmlaunch-bench's random prompts (random token ids decoded: any bytes), too
    from launcher.bench.datasets import TokenCounter, load_prefix

    texts = ["Émile's café serves crème brûlée; ça va? " * 30]
    texts += [s.prompt for s in load_prefix(24, TokenCounter(tokens_dir), seed=1, groups=4, prefix_len=512)]
    for text in texts:
        assert tokens.ids(text.encode()) == tokens.whole(text.encode())


def test_a_long_prompt_is_cut_where_a_piece_may_end_and_a_small_memo_forgets_pieces_mid_chain(smollm2_dir):
    from launcher.frontend.prompt_tokens import MAX_PROMPT_BYTES

    tokens = PromptTokens(str(smollm2_dir), memo_pieces=8)
    words = "alpha beta gamma, delta 42 epsilon; zeta eta theta iota kappa lambda mu. ".encode()
    long = words * (MAX_PROMPT_BYTES // len(words) + 40)
    ids = tokens.ids(long)
    end = cuts(long, 1, MAX_PROMPT_BYTES + 1)[0]
    assert MAX_PROMPT_BYTES - 100 < end <= MAX_PROMPT_BYTES
    assert ids == tokens.whole(long[:end])  # the whole prompt's tokens up to the cut, none cut in two
    assert len(tokens.memo) == 8  # the oldest pieces went: a later prompt takes the run left from its start
    for extra in (b"", b" and more words here"):
        text = words * 30 + extra
        assert tokens.ids(text) == tokens.whole(text)


def test_a_tokenizer_whose_pieces_do_not_add_up_tokenizes_every_prompt_whole(tmp_path):
    """Llama 2's kind: its normalizer puts "▁" before the whole text, so a piece tokenized apart would get one too."""
    from tokenizers import Tokenizer, models, normalizers

    chars = sorted(set("▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\n\t"))
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(["<unk>", *chars])}, merges=[], unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.save(str(tmp_path / "tokenizer.json"))
    tokens = PromptTokens(str(tmp_path))
    assert not tokens.pieces_add_up
    text = b"hello world, said the model " * 40
    assert tokens.ids(text) == tokens.whole(text) and not tokens.memo


def test_pieces_end_at_a_space_between_a_word_and_a_word_inside_their_block():
    text = b"ab cd" + b"x" * 20 + b" 12 ef" + b"." * 40
    # block 1 [16, 32): not at 25 (" 12": no letter after it), at 28 (" ef": after a digit, before a letter);
    # block 2 [32, 48) has no space: its piece is empty, ending where block 1's did
    assert cuts(text, 3, 16) == [2, 28, 28]
    assert cuts(b"a  b" + b"." * 12, 1, 16) == [0]  # two spaces: neither is a place to cut
    assert cuts(b"a" * 15 + b" b", 1, 16) == [0]  # the letter after the space is past the block
    assert cuts("é b caf".encode() + b"." * 10, 1, 16) == [4]  # not after "é" (no ASCII letter): after "b"


def test_kv_routing_goes_where_the_engines_hold_the_prefix_not_where_it_was_sent(tiny_model_dir):
    routing = make_routing("kv", ["", ""], tiny_model_dir)
    assert isinstance(routing, KvRouting)
    reps = [Replica(i, "127.0.0.1", 9000 + i) for i in range(2)]
    conversation = ("You are a careful assistant who answers briefly. " * 10).encode()
    first = routing.pick(reps, (), conversation)
    # before any engine said what it holds, a prompt goes where its text was sent, as `prefix` sends it
    assert routing.pick(reps, (), conversation + b" and more") is first
    assert first.predicted_blocks == 0
    # the other replica's engine computed the prefix (say it served it while the first was busy): it draws it now
    other = reps[1 - first.index]
    ids = routing.blocks.tokenizer.encode(conversation.decode()).ids
    routing.kv.apply(other.index, 0, _batch(stored(chain_keys(ids, 16), None, ids[: len(ids) // 16 * 16], 16)))
    assert routing.kv.block_size == 16
    rep = routing.pick(reps, (), conversation + b" one more question?")
    assert rep is other and rep.predicted_blocks == len(ids) // 16 and rep.prompt_blocks > rep.predicted_blocks
    # evicted there: the prefix no longer draws requests to it (where its text was sent decides again)
    routing.kv.apply(other.index, 1, _batch(removed(chain_keys(ids, 16))))
    before = other.predicted_blocks
    assert routing.pick(reps, (), conversation + b" one more question?") is first
    assert other.predicted_blocks == before and first.predicted_blocks == 0
    # a prompt shorter than a text block that an engine holds goes there, not to the least loaded
    short = "Hi there, what is new today? Tell me more."
    sids = routing.blocks.tokenizer.encode(short).ids
    assert len(short) < 256 and len(sids) > 17
    routing.kv.apply(other.index, 2, _batch(stored(chain_keys(sids, 16)[:1], None, sids[:16], 16)))
    first.track(-first.in_flight)
    other.track(3)  # busier, within its bound
    assert routing.pick(reps, (), short.encode()) is other


def test_kv_routing_needs_the_tokenizer_and_says_where_its_events_come_from(tmp_path):
    with pytest.raises(ValueError, match="needs the model's tokenizer folder"):
        make_routing("kv", ["ipc:///x"], "")
    with pytest.raises(SystemExit, match="tokenizer.json, which did not load"):
        make_routing("kv", ["ipc:///x"], str(tmp_path))
    assert endpoint_for(False, 5557) == "tcp://*:5557"
    assert connect_to("tcp://*:5557", "10.0.0.7") == "tcp://10.0.0.7:5557"
    local = endpoint_for(True, 0, str(tmp_path))
    assert local.startswith(f"ipc://{tmp_path}/kv-events-") and connect_to(local, "10.0.0.7") == local


def test_a_subscriber_with_no_publisher_to_read_sleeps():
    """Replicas whose engines publish nothing (""): the thread waits for its stop instead of spinning on an empty
    poll, which would take the GIL from the front end's event loop."""
    sub = Subscriber(KvIndex(2), ["", ""]).start()
    try:
        time.sleep(0.5)
        used = time.clock_gettime(time.pthread_getcpuclockid(sub._thread.ident))
        assert used < 0.05, f"the idle subscriber used {used:.3f} s of CPU in 0.5 s"
    finally:
        sub.stop()
    assert not sub._thread.is_alive()


def test_the_capacity_benchmarks_stand_in_engines_churn_blocks_the_index_keeps_up_with(tmp_path):
    """benchmark/servers.py's publishers for `frontend_capacity --routing kv`: a second's worth of blocks held at any
    time, every batch read (no gap), so the measured front end's subscriber does an engine's work."""
    from benchmark.servers import kv_churn

    ep = f"ipc://{tmp_path}/churn.ipc"
    pub = Publisher(ep)
    idx = KvIndex(1)
    sub = Subscriber(idx, [ep]).start()
    time.sleep(0.3)  # the SUB joins before the churn starts (PUB drops what precedes)
    try:
        with kv_churn([pub], 1000):
            time.sleep(2.5)
            assert 900 <= idx.blocks(0) <= 1100 and idx.gaps == [0] and idx.unchained == [0], (idx.blocks(0), idx.gaps)
    finally:
        sub.stop()
        pub.close()
