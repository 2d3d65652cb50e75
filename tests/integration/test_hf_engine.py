"""The hf engine driven directly (no Triton): correctness against transformers' generate, batching, control.

One engine (and one reference model) per module; the tiny random Llama from launcher.tiny.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.engines.hf.config import HFEngineArgs  # noqa: E402
from launcher.hf.detok import ByteLevelDecoder, TokenTable, WindowDecoder  # noqa: E402
from launcher.hf.engine import Engine, InvalidRequest, SamplingParams  # noqa: E402

PROMPTS = [
    "The quick brown fox",
    "Rain fell all night; by morning the streets were shining",
    "Hello",
    "Numbers, letters and symbols: a1, b2, c3; x + y = z; 100% of 42 is 42.",
    "Écoute: naïve café — 東京 🙂",
]


def own_blocks(runner):
    """Each slot its own blocks, one after another (slot s: blocks 1 + s * W on), as block tables the scheduler would
    send: for tests that drive the runner with steps of their own."""
    w = runner.max_blocks
    runner.apply_block_updates([(s, 0, list(range(1 + s * w, 1 + (s + 1) * w))) for s in range(runner.max_num_seqs)])


def slot_view(runner, pool, slots):
    """A layer's keys (or values) of `slots` as [len(slots), tokens, kv_heads, head_dim]: their blocks, in order."""
    return pool[runner.block_table[list(slots)]].flatten(1, 2)


def make_engine(path, **args) -> Engine:
    """The engine (not started) for HFEngineArgs(model_path=path, **args), built as the Triton model builds it."""
    return Engine.from_args(HFEngineArgs(model_path=str(path), **args))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=40, prefill_chunk=64).start()
    yield eng
    eng.shutdown()


def collect(engine, prompt, params, request_id=None, **kw):
    """Start a request (`kw`: add_request's keywords); returns (event, list of outputs)."""
    done = threading.Event()
    outs = []

    def cb(o):
        outs.append(o)
        if o.finished:
            done.set()

    engine.add_request(request_id or f"req-{random.random()}", prompt, params, cb, **kw)
    return done, outs


def joined(outs):
    return "".join(o.text for o in outs), [t for o in outs for t in o.token_ids]


# ------------------------------------------------------------------------------------------ correctness
def test_greedy_equals_generate_one_at_a_time(engine, reference):
    for prompt in PROMPTS:
        ids, text = reference(prompt, 24)
        out = engine.generate(prompt, SamplingParams(max_tokens=24), timeout=60)
        assert out.token_ids == ids, prompt
        assert out.text == text, prompt
        assert out.finish_reason == ("stop" if ids[-1] in engine.eos_token_ids else "length")


def test_greedy_equals_generate_batched(engine, reference):
    """All prompts at once, with different lengths and slots: batching must not change greedy output."""
    expected = [reference(p, 30) for p in PROMPTS]
    runs = [collect(engine, p, SamplingParams(max_tokens=30)) for p in PROMPTS]
    for (done, outs), (ids, text) in zip(runs, expected):
        assert done.wait(60)
        got_text, got_ids = joined(outs)
        assert got_ids == ids
        assert got_text == text


def test_chunked_prefill_equals_generate(tiny_model_dir, reference):
    """A prompt longer than max_prefill_tokens is prefilled over several steps, while another request decodes."""
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, prefill_chunk=7).start()
    try:
        long_prompt = " ".join(PROMPTS * 3)
        ids_a, text_a = reference(PROMPTS[0], 40)
        ids_b, text_b = reference(long_prompt, 20)
        done_a, outs_a = collect(eng, PROMPTS[0], SamplingParams(max_tokens=40))
        time.sleep(0.05)
        done_b, outs_b = collect(eng, long_prompt, SamplingParams(max_tokens=20))
        assert done_a.wait(60) and done_b.wait(60)
        assert joined(outs_a) == (text_a, ids_a)
        assert joined(outs_b) == (text_b, ids_b)
        assert eng.stats.prefill_tokens >= len(eng.tokenizer(long_prompt).input_ids)
    finally:
        eng.shutdown()


def test_group_first_chunks():
    from launcher.hf.runner import group_first_chunks

    assert group_first_chunks([7, 5, 6, 2]) == [[0, 2, 1, 3]]  # padding within half the padded tokens
    # one long prompt pads at most as many tokens as the group holds: 100+5 in one group, 4+3 in another
    assert group_first_chunks([100, 3, 4, 5]) == [[0, 3], [2, 1]]
    assert group_first_chunks([100, 3, 4, 5], waste=0.0) == [[0], [3], [2], [1]]
    assert group_first_chunks([9]) == [[0]]
    assert group_first_chunks([]) == []


def test_prompt_graph_padding_equals_the_unpadded_step(tiny_model_dir):
    """What a prompt graph replays (launcher.hf.graphs.prompt.PromptGraphs.body: one prompt padded to its bucket, pads writing to
    the spare slot, the last real token's logits kept) gives the logits and cache of the unpadded eager step.
    CUDA graphs need a GPU; the padded body runs here eagerly, as the capture records it (benchmark/gpu/
    decode_bandwidth.py checks greedy tokens through the captured graphs on one)."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=4, max_model_len=64)
    assert runner.prompt_graphs.limit == 0 and not runner.prompt_graphs.graphs  # no graphs off the GPU
    own_blocks(runner)
    prompt = list(range(40, 47))
    step = StepInputs([], [], [], [PrefillChunk(2, 0, len(prompt), True)], prompt, SamplingRows())
    with torch.inference_mode():
        unpadded = runner._run(step)
    cache = [(k.clone(), v.clone()) for k, v in runner.cache]
    for k, v in runner.cache:
        k.zero_(), v.zero_()
    rows, last = runner.prompt_graphs.inputs(step, 16)
    assert last == 6 and rows[2] == [2] * 7 + [4] * 9 and rows[1] == list(range(16))
    with torch.inference_mode():
        padded = runner.prompt_graphs.body(16, torch.tensor(rows), torch.tensor([last]))
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)
    for (k, v), (k0, v0) in zip(runner.cache, cache):
        torch.testing.assert_close(k[1:], k0[1:], rtol=1e-6, atol=1e-6)  # the slots' blocks: the same, nothing else
        torch.testing.assert_close(v[1:], v0[1:], rtol=1e-6, atol=1e-6)
        assert k[0].abs().sum() > 0  # the pads went to the null block, through the spare slot's table


def test_which_steps_replay_a_prompt_graph(tiny_model_dir):
    """One whole prompt, no decode rows, not longer than the limit -> the smallest bucket that holds it; anything
    else runs eagerly.  Buckets grow by at most 1.5x; the limit comes from the environment and is checked."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    assert HFModelRunner.prefill_buckets(2048) == [
        16,
        24,
        32,
        48,
        64,
        96,
        128,
        192,
        256,
        384,
        512,
        768,
        1024,
        1536,
        2048,
    ]
    assert HFModelRunner.prefill_buckets(100) == [16, 24, 32, 48, 64, 96, 100]
    assert HFModelRunner.prefill_buckets(10) == [10] and HFModelRunner.prefill_buckets(0) == []
    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=4, max_model_len=64)
    runner.prompt_graphs.graphs = {b: None for b in (16, 24, 32)}  # as if captured
    runner.prompt_graphs.limit = 30

    def step(*chunks, decode=()):
        return StepInputs(
            [d for d in decode],
            [1] * len(decode),
            [3] * len(decode),
            list(chunks),
            [1] * sum(c.length for c in chunks),
            SamplingRows(),
        )

    assert runner.prompt_graphs.key_for(step(PrefillChunk(0, 0, 7, True))) == 16
    assert runner.prompt_graphs.key_for(step(PrefillChunk(1, 0, 17, True))) == 24
    assert runner.prompt_graphs.key_for(step(PrefillChunk(1, 0, 30, True))) == 32
    for eager in (
        step(PrefillChunk(0, 0, 31, True)),  # past the limit
        step(PrefillChunk(0, 0, 7, True), decode=[1]),  # beside a decode row
        step(PrefillChunk(0, 0, 7, True), PrefillChunk(1, 0, 5, True)),  # two prompts
        step(PrefillChunk(0, 8, 7, True)),  # a later chunk (attends to the cache)
        step(PrefillChunk(0, 0, 7, False)),  # a chunk that does not end its prompt
        step(decode=[0]),
    ):
        assert runner.prompt_graphs.key_for(eager) is None
    with pytest.raises(ValueError, match="prefill_graphs=-1 is negative"):
        HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64, prefill_graphs=-1)


def test_mixed_graph_body_equals_the_eager_step(tiny_model_dir):
    """What a mixed graph replays (launcher.hf.graphs.mixed.MixedGraphs.body: decode rows padded to their bucket by slot, then whole
    prompts packed and padded, each causal over its own tokens) gives the logits and cache of the unpadded eager
    step, in the step's row order, also with the decode tokens handed over on the device (a step queued ahead).
    CUDA graphs need a GPU; the body runs here eagerly, as the capture records it (benchmark/gpu/decode_bandwidth.py
    checks greedy tokens through the captured graphs on one)."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=4, max_model_len=64)
    assert runner.mixed_graphs.limit == 0 and not runner.mixed_graphs.graphs  # no graphs off the GPU
    own_blocks(runner)
    with torch.inference_mode():  # two sequences decoding, in slots 2 and 0
        for slot, prompt in ((2, list(range(60, 69))), (0, list(range(30, 34)))):
            runner._run(StepInputs([], [], [], [PrefillChunk(slot, 0, len(prompt), True)], prompt, SamplingRows()))
    prompts = {1: list(range(40, 47)), 3: list(range(80, 85))}
    step = StepInputs(
        [0, 2],
        [7, 11],
        [4, 9],
        [PrefillChunk(s, 0, len(p), True) for s, p in prompts.items()],
        [t for p in prompts.values() for t in p],
        SamplingRows(),
    )
    before = [(k.clone(), v.clone()) for k, v in runner.cache]
    with torch.inference_mode():
        eager = runner._run(step)
    after = [(k.clone(), v.clone()) for k, v in runner.cache]

    # as if captured (the body then runs without a graph)
    runner.mixed_graphs.limit, runner.mixed_graphs.stand_in = 32, True
    key = runner.mixed_graphs.key_for(step)
    assert key == (4, 64, 32)  # rows by slot up to 4 (a power of two), the cache length bucket, 12 tokens in 32
    values, kept, out = runner.mixed_graphs.inputs(step, 4, 32)
    assert values[2][:4] == [0, 4, 2, 4] and values[3][:4] == [5, 1, 10, 1]  # slot rows: padding to the spare slot
    assert values[3][4:] == [0] * 7 + [1] * 5 + [-1] * 20 and values[2][4 + 12 :] == [4] * 20
    assert kept == [0, 1, 2, 3, 10, 15] + [35] * 6 and out == [0, 2, 4, 5]
    for ids in (None, torch.tensor([7, 11])):  # decode tokens from the host, then from the device
        for (k, v), (k0, v0) in zip(runner.cache, before):
            k.copy_(k0), v.copy_(v0)
        ahead = (
            step
            if ids is None
            else StepInputs(
                step.decode_slots, [0, 0], step.decode_positions, step.prefill, step.prefill_tokens, step.sampling
            )
        )
        with torch.inference_mode():
            mixed = runner.mixed_graphs.replay(ahead, key, ids)
        torch.testing.assert_close(mixed, eager, rtol=1e-5, atol=1e-5)
        for (k, v), (k1, v1) in zip(runner.cache, after):
            torch.testing.assert_close(k[1:], k1[1:], rtol=1e-6, atol=1e-6)  # the slots' blocks: the same, nothing else
            torch.testing.assert_close(v[1:], v1[1:], rtol=1e-6, atol=1e-6)
            assert k[0].abs().sum() > 0  # the pads went to the null block


def test_which_steps_replay_a_mixed_graph(tiny_model_dir):
    """Decode rows and whole sampled prompts, at most MIXED_PROMPTS of them and the mixed-graph limit of tokens in
    all -> the decode bucket and the smallest packed size that holds them; anything else does not.  A negative limit is
    refused."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    assert HFModelRunner.mixed_buckets(512) == [32, 64, 128, 256, 512]
    assert HFModelRunner.mixed_buckets(100) == [32, 64, 100] and HFModelRunner.mixed_buckets(0) == []
    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=16, max_model_len=64)
    runner.mixed_graphs.limit = 48
    runner.mixed_graphs.graphs = {(r, 64, t): None for r in (1, 2, 4, 8, 16) for t in (32, 48)}  # as if captured

    def step(*chunks, decode=(0,)):
        return StepInputs(
            list(decode),
            [1] * len(decode),
            [3] * len(decode),
            list(chunks),
            [1] * sum(c.length for c in chunks),
            SamplingRows(),
        )

    def whole(*lengths):
        return [PrefillChunk(8 + i, 0, n, True) for i, n in enumerate(lengths)]

    assert runner.mixed_graphs.key_for(step(*whole(7))) == (1, 64, 32)
    assert runner.mixed_graphs.key_for(step(*whole(7, 30), decode=(2, 5))) == (8, 64, 48)
    assert runner.mixed_graphs.key_for(step(*whole(*[2] * 8), decode=(9,))) == (16, 64, 32)
    assert runner.mixed_prompts_fit([20, 28]) and not runner.mixed_prompts_fit([20, 29])
    for other in (
        step(*whole(7), decode=()),  # no decode rows: a prompt or wave graph
        step(decode=(0,)),  # no prompt: a decode graph
        step(*whole(20, 29)),  # past the limit
        step(*whole(*[2] * 9)),  # more prompts than a mixed graph keeps logits for
        step(PrefillChunk(8, 4, 7, True)),  # a later chunk (attends to the cache)
        step(PrefillChunk(8, 0, 7, False)),
    ):  # a chunk that does not end its prompt
        assert runner.mixed_graphs.key_for(other) is None
    runner.mixed_graphs.graphs.clear()
    assert runner.mixed_graphs.key_for(step(*whole(7))) is None and not runner.mixed_prompts_fit([7])  # none captured
    with pytest.raises(ValueError, match="mixed_graphs=-1 is negative"):
        HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64, mixed_graphs=-1)


class _Steps(list):
    """(decode rows, prompt chunk lengths) of each launched step; `.ahead[i]`: step i was launched while the step
    before it still had its tokens to give (queued behind it, overlap)."""

    def __init__(self):
        super().__init__()
        self.ahead: list[bool] = []


def record_steps(eng):
    """Spy on an engine not started yet: (steps, arrive_together).  steps gets (decode rows, prompt chunk lengths)
    of each launched step (see _Steps); arrive_together(prompts, n) holds the engine inside a step, queues the
    prompts (n new tokens each), lets it go and returns (index in steps of the first step after, their
    collectors), so that the scheduler sees them together."""
    steps, hold, held = _Steps(), threading.Event(), threading.Event()  # hold set: the next launch stops until cleared
    launch, wait = eng.runner.launch, eng.runner.wait
    unwaited = [0]  # steps launched whose tokens the engine has not taken yet

    def wait_spy(handle):
        unwaited[0] -= 1
        return wait(handle)

    def spy(step, **kw):
        steps.append((len(step.decode_tokens), [c.length for c in step.prefill]))
        steps.ahead.append(unwaited[0] > 0)
        unwaited[0] += 1
        if hold.is_set():
            held.set()
            while hold.is_set():
                time.sleep(0.005)
        return launch(step, **kw)

    def arrive_together(prompts, n):
        held.clear()
        hold.set()
        assert held.wait(30)
        mark = len(steps)
        runs = [collect(eng, p, SamplingParams(max_tokens=n)) for p in prompts]
        hold.clear()
        return mark, runs

    eng.runner.launch, eng.runner.wait = spy, wait_spy
    return steps, arrive_together


def engine_with_waves(tiny_model_dir, monkeypatch):
    """A CPU engine, not started, whose runner is told that waves of up to 4 prompts of up to 64 tokens have a wave
    graph (CPU has no CUDA graphs: its steps then run eagerly).  Prefix caching off: a prompt whose prefix is
    cached is no whole prompt for a graph, and these tests send the same prompts again."""
    from launcher.hf.runner import HFModelRunner

    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, prefill_chunk=256, prefix_caching=False)
    monkeypatch.setattr(HFModelRunner, "wave_rows", property(lambda self: (4,)))
    eng.runner.wave_graph_key = lambda lengths: (4, 64) if len(lengths) <= 4 and max(lengths) <= 64 else None
    return eng


def decoding_request(eng):
    """(event, outputs) of a request of 40 new tokens on the started engine, once it decodes."""
    first = collect(eng, PROMPTS[3], SamplingParams(max_tokens=40))
    while len(first[1]) < 2:
        time.sleep(0.01)
    return first


@pytest.mark.parametrize("alone", [4, 0])
def test_a_few_prompts_go_alone_through_their_graphs_a_wave_goes_together(tiny_model_dir, reference, alone):
    """Where prompt graphs exist (a GPU), up to PROMPTS_ALONE_MAX prompts that arrive while others decode are each
    prefilled alone (their graph) while the decode rows wait a step; more than that go in one step beside the
    decode rows; prompts_alone=0 turns it off.  Steps of a prompt alone are queued ahead, behind the
    step running.  Outputs stay those of generate.  CPU has no CUDA
    graphs: the runner is told that prompts up to 64 tokens have one (its steps then run eagerly here); the
    engine is held inside a step while requests arrive, so the scheduler sees them together."""
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, prefill_chunk=64, prompts_alone=alone)
    eng.runner.prompt_graphed = lambda length: length <= 64
    steps, arrive_together = record_steps(eng)
    eng.start()
    try:
        first = decoding_request(eng)
        mark, few = arrive_together(PROMPTS[:2], 8)
        for done, _ in few:
            assert done.wait(60)
        prompt_steps = [st for st in steps[mark:] if st[1]]
        lengths = sorted(len(eng.tokenizer(p).input_ids) for p in PROMPTS[:2])
        if alone:  # each prompt alone, no decode row beside it, queued behind the step running (it needs none of its
            # tokens), then the decode rows' turn queued behind that
            assert sorted(st[1][0] for st in prompt_steps) == lengths and all(
                st[0] == 0 and len(st[1]) == 1 for st in prompt_steps
            )
            assert steps.ahead[mark : mark + 3] == [True] * 3 and steps[mark + 2] == (3, []), steps[mark : mark + 3]
        else:  # both beside the decode row
            assert prompt_steps[0][0] == 1 and sorted(prompt_steps[0][1]) == lengths
        mark, wave = arrive_together(PROMPTS[:2] + PROMPTS[:2] + [PROMPTS[4]], 8)  # 5 > PROMPTS_ALONE_MAX
        for done, _ in wave:
            assert done.wait(60)
        wave_step = next(st for st in steps[mark:] if st[1])
        assert wave_step[0] >= 1 and len(wave_step[1]) == 5  # one step: the decode row(s) and all five prompts
        assert first[0].wait(60)
        expected = [(PROMPTS[3], 40)] + [(p, 8) for p in PROMPTS[:2] * 3 + [PROMPTS[4]]]
        for (_, outs), (p, n) in zip([first] + few + wave, expected, strict=True):
            assert [t for o in outs for t in o.token_ids] == reference(p, n)[0]
    finally:
        eng.shutdown()


def test_wave_graph_padding_equals_the_unpadded_step(tiny_model_dir):
    """What a wave graph replays (launcher.hf.graphs.prompt.WaveGraphs.body: several whole prompts, each in a row padded to the
    bucket, rows past them padding only, pads writing to the spare slot, each row's last real token kept) gives the
    logits and cache of the unpadded eager step.  The padded body runs here eagerly, as the capture records it
    (benchmark/gpu/decode_bandwidth.py checks greedy tokens through the captured graphs on a GPU)."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=8, max_model_len=64)
    own_blocks(runner)
    prompts = {0: list(range(40, 47)), 5: list(range(60, 76)), 2: [90, 91, 92]}  # slot -> prompt (7, 16, 3 tokens)
    step = StepInputs(
        [],
        [],
        [],
        [PrefillChunk(slot, 0, len(p), True) for slot, p in prompts.items()],
        [t for p in prompts.values() for t in p],
        SamplingRows(),
    )
    with torch.inference_mode():
        unpadded = runner._run(step)
    cache = [(k.clone(), v.clone()) for k, v in runner.cache]
    for k, v in runner.cache:
        k.zero_(), v.zero_()
    rows, keep = runner.wave_graphs.inputs(step, 4, 16)
    assert keep == [6, 31, 34, 63]  # each prompt's last token in its row of 16; the empty fourth row's last
    assert rows[1] == list(range(16)) * 4
    assert rows[2] == [0] * 7 + [8] * 9 + [5] * 16 + [2] * 3 + [8] * 13 + [8] * 16  # pads: the spare slot, 8
    assert rows[0][:7] == prompts[0] and rows[0][16:32] == prompts[5] and rows[0][32:35] == prompts[2]
    with torch.inference_mode():
        padded = runner.wave_graphs.body((4, 16), torch.tensor(rows), torch.tensor(keep))
    assert padded.shape[0] == 4
    torch.testing.assert_close(padded[:3], unpadded, rtol=1e-5, atol=1e-5)
    for (k, v), (k0, v0) in zip(runner.cache, cache):
        torch.testing.assert_close(k[1:], k0[1:], rtol=1e-6, atol=1e-6)  # the slots' blocks: the same, nothing else
        torch.testing.assert_close(v[1:], v0[1:], rtol=1e-6, atol=1e-6)
        assert k[0].abs().sum() > 0  # the pads went to the null block


def test_which_steps_replay_a_wave_graph(tiny_model_dir):
    """Two to 16 whole prompts and nothing else -> the smallest wave (2, 4, 8 or 16 rows) of the smallest bucket that
    holds the longest, if captured (rows x length within the prompt-graph limit); anything else runs eagerly.  The
    variable that turns waves off is checked."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    assert HFModelRunner.WAVE_ROWS == (2, 4, 8, 16)
    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=16, max_model_len=64)
    assert runner.wave_graphs.keys(128) == [
        (2, 16),
        (2, 24),
        (2, 32),
        (2, 48),
        (2, 64),
        (4, 16),
        (4, 24),
        (4, 32),
        (8, 16),
    ]
    assert runner.wave_rows == ()  # nothing captured off the GPU
    runner.prompt_graphs.graphs = {b: None for b in (16, 24, 32)}  # as if captured
    runner.wave_graphs.graphs = {key: None for key in runner.wave_graphs.keys(128)}
    runner.prompt_graphs.limit = 32
    assert runner.wave_rows == (2, 4, 8)

    def step(*chunks, decode=()):
        return StepInputs(
            [d for d in decode],
            [1] * len(decode),
            [3] * len(decode),
            list(chunks),
            [1] * sum(c.length for c in chunks),
            SamplingRows(),
        )

    def whole(*lengths):
        return [PrefillChunk(i, 0, n, True) for i, n in enumerate(lengths)]

    assert runner.wave_graphs.key_for(step(*whole(7, 5))) == (2, 16)
    assert runner.wave_graphs.key_for(step(*whole(7, 5, 1))) == (4, 16)
    assert runner.wave_graphs.key_for(step(*whole(7, 5, 20, 3))) == (4, 24)
    assert runner.wave_graphs.key_for(step(*whole(*[9] * 5))) == (8, 16)
    assert runner.wave_graph_key([30, 2]) == (2, 32)
    for eager in (
        step(*whole(7)),  # one prompt: its own prompt graph
        step(*whole(7, 5), decode=[9]),  # beside a decode row
        step(*whole(*[9] * 9)),  # more prompts than the largest wave captured
        step(*whole(*[20] * 5)),  # 8 rows of 24 tokens: past the limit of 128, not captured
        step(*whole(33, 2)),  # longer than any prompt graph
        step(*whole(40, 40)),  # 2 rows of 48 tokens: captured, but longer than the limit of 32
        step(PrefillChunk(0, 0, 7, True), PrefillChunk(1, 8, 7, True)),  # a later chunk
        step(PrefillChunk(0, 0, 7, True), PrefillChunk(1, 0, 5, False)),
    ):  # a chunk that is not the end
        assert runner.wave_graphs.key_for(eager) is None


def test_a_wave_of_prompts_goes_in_steps_of_its_own_taking_turns_with_the_decode_rows(
    tiny_model_dir, reference, monkeypatch
):
    """Where wave graphs exist (a GPU), two or more waiting prompts go in steps of prompts only, as many as the
    largest wave graph that fits holds; decode rows sit out such a step, then get one of their own before the next
    wave step.  All of them are queued ahead, behind the step running.  Outputs stay those of generate.  CPU has no
    CUDA graphs: the runner is told that waves of up
    to 4 prompts of up to 64 tokens have one (its steps then run eagerly here); the engine is held inside a step
    while requests arrive, so the scheduler sees them together."""
    eng = engine_with_waves(tiny_model_dir, monkeypatch)
    steps, arrive_together = record_steps(eng)
    eng.start()
    try:
        first = decoding_request(eng)
        wave_prompts = PROMPTS[:4] + PROMPTS[:3] + [PROMPTS[4]]  # 8 > PROMPTS_ALONE_MAX
        mark, wave = arrive_together(wave_prompts, 8)
        for done, _ in wave:
            assert done.wait(60)
        assert first[0].wait(60)
        lengths = [len(eng.tokenizer(p).input_ids) for p in wave_prompts]
        after = steps[mark:]  # from the step after the one held
        # a wave step of 4 (the decode row waits), the decode rows' turn (5 now), the next wave step of 4
        assert after[0] == (0, lengths[:4]) and after[1] == (5, []), after[:4]
        assert after[2] == (0, lengths[4:]), after[:4]
        # each queued behind the step before, without waiting for its tokens: the waves need none of them, and the
        # decode rows' turn takes the wave's first tokens on the device and the waiting row's last from the host
        assert steps.ahead[mark : mark + 4] == [True] * 4, steps.ahead[mark : mark + 4]
        expected = [(PROMPTS[3], 40)] + [(p, 8) for p in wave_prompts]
        for (_, outs), (p, n) in zip([first] + wave, expected, strict=True):
            assert [t for o in outs for t in o.token_ids] == reference(p, n)[0]
    finally:
        eng.shutdown()


def test_prompts_that_fit_a_mixed_graph_go_beside_the_decode_rows(tiny_model_dir, reference, monkeypatch):
    """Where mixed graphs exist (a GPU), prompts that arrive while others decode go in the decode rows' step, all of
    them in one step when they fit one graph (MIXED_PROMPTS prompts, the mixed-graph limit of tokens): the decode
    rows wait no step of prompts.  More than fit go as before (here, prompt graphs are not there: one eager step
    beside the decode rows).  Outputs stay those of generate, and the engine counts its mixed steps.  CPU has no CUDA graphs: the
    runner is told that it has mixed graphs for up to 64 prompt tokens (their body then runs eagerly here); the
    engine is held inside a step while requests arrive, so the scheduler sees them together."""
    # prefix caching off: the prompts are sent again, and a prompt whose prefix is cached is no whole prompt for a graph
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, prefill_chunk=256, prefix_caching=False)
    eng.runner.mixed_graphs.limit, eng.runner.mixed_graphs.stand_in = 64, True
    steps, arrive_together = record_steps(eng)
    eng.start()
    try:
        first = decoding_request(eng)
        lengths = [len(eng.tokenizer(p).input_ids) for p in PROMPTS]
        mark, two = arrive_together(PROMPTS[:2], 8)
        for done, _ in two:
            assert done.wait(60)
        prompt_steps = [st for st in steps[mark:] if st[1]]
        assert prompt_steps == [(1, lengths[:2])], steps[mark:]  # one step: the decode row and both prompts
        # queued behind the step held, its decode token following on the device, its prompts' from the host
        assert steps[mark] == (1, lengths[:2]) and steps.ahead[mark], (steps[mark:], steps.ahead[mark:])
        assert eng.stats.mixed_steps == 1 and eng.stats.prompt_steps == 2  # (the first request's own prompt step)
        mark, many = arrive_together(PROMPTS * 2, 6)  # more prompt tokens than 64
        for done, _ in many:
            assert done.wait(60)
        assert sum(lengths) * 2 > 64
        prompt_steps = [st for st in steps[mark:] if st[1]]
        assert prompt_steps[0] == (1, lengths * 2), steps[mark:]  # eager, as before mixed graphs
        assert first[0].wait(60)
        expected = [(PROMPTS[3], 40)] + [(p, 8) for p in PROMPTS[:2]] + [(p, 6) for p in PROMPTS * 2]
        for (_, outs), (p, n) in zip([first] + two + many, expected, strict=True):
            assert [t for o in outs for t in o.token_ids] == reference(p, n)[0]
    finally:
        eng.shutdown()


def test_a_failed_step_fails_its_requests_and_the_step_queued_behind_it_and_the_engine_serves_on(
    tiny_model_dir, reference, monkeypatch
):
    """A wave step launched behind a decode step fails to launch: the decode step's request and the wave's prompts
    end with an error (their steps were scheduled as if both ran); the prompts that were still waiting, and requests
    after, are served as generate serves them.  CPU: the runner is told that waves have graphs, as above."""
    eng = engine_with_waves(tiny_model_dir, monkeypatch)
    _, arrive_together = record_steps(eng)
    launch, failed = eng.runner.launch, []

    def failing(step, **kw):
        if not failed and not step.decode_tokens and len(step.prefill) == 4:
            failed.append(step)
            raise RuntimeError("device fault")
        return launch(step, **kw)

    eng.runner.launch = failing
    eng.start()
    try:
        first = decoding_request(eng)
        wave_prompts = PROMPTS[:4] + PROMPTS[:3] + [PROMPTS[4]]
        _, wave = arrive_together(wave_prompts, 8)
        for finished, _ in [first] + wave:
            assert finished.wait(60)
        assert len(failed) == 1
        for _, outs in [first] + wave[:4]:
            assert outs[-1].finish_reason == "error" and "device fault" in outs[-1].error
        for (_, outs), p in zip(wave[4:], wave_prompts[4:], strict=True):
            assert [t for o in outs for t in o.token_ids] == reference(p, 8)[0]
        after = eng.generate(PROMPTS[1], SamplingParams(max_tokens=12), timeout=60)
        assert after.token_ids == reference(PROMPTS[1], 12)[0] and eng.num_running == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_grouped_prefill_equals_one_at_a_time(tiny_model_dir, attn):
    """Prompts prefilled together (one padded attention call per group, beside a decode token) give the same
    logits and the same cache as each prompt prefilled alone."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(
        str(tiny_model_dir), device="cpu", max_num_seqs=8, max_model_len=64, attn_implementation=attn
    )
    own_blocks(runner)
    prompts = [list(range(10, 17)), list(range(30, 35)), list(range(50, 56)), [70, 71], list(range(80, 120))]

    def step(chunks_of, decode=()):
        chunks = [PrefillChunk(slot, 0, len(p), True) for slot, p in chunks_of]
        return StepInputs(
            [d[0] for d in decode],
            [d[1] for d in decode],
            [d[2] for d in decode],
            chunks,
            [t for _, p in chunks_of for t in p],
            SamplingRows(),
        )

    def logits_of(st):
        from launcher.hf.attention import tls
        from launcher.hf.step import prepare_step

        ctx, ids, pos, idx = prepare_step(
            st, runner.device, runner.num_kv_heads, runner.block_table, runner.block_size, runner.dtype, runner.eager
        )
        tls.ctx, tls.cache = ctx, runner.cache
        try:
            with torch.inference_mode():
                return runner.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=idx).logits[0], ctx
        finally:
            tls.ctx = None

    alone = []
    for slot, p in enumerate(prompts):
        lg, ctx = logits_of(step([(slot, p)]))
        assert not ctx.groups
        alone.append(lg[-1])
    cache_alone = [(slot_view(runner, k, range(5)), slot_view(runner, v, range(5))) for k, v in runner.cache]
    for k, v in runner.cache:
        k.zero_(), v.zero_()
    # slot 7 decodes beside the group (its prompt token sits at position 0)
    together, ctx = logits_of(step(list(enumerate(prompts)), decode=[(7, 5, 0)]))
    assert [len(g[4]) for g in ctx.groups] == [40 + 7, 6 + 5 + 2]  # two padded groups, no chunk alone
    for i, lg in enumerate(alone):
        torch.testing.assert_close(together[1 + i], lg, rtol=1e-4, atol=1e-4)
    for (k, v), (k0, v0) in zip(runner.cache, cache_alone):
        torch.testing.assert_close(slot_view(runner, k, range(5)), k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(slot_view(runner, v, range(5)), v0, rtol=1e-5, atol=1e-5)


def test_compiled_model_equals_generate_and_compiles_only_at_start(tiny_model_dir, reference):
    """torch_compile=True (on by default on one GPU), here on the CPU: prompts prefilled in chunks of 7 while
    others decode, one at a time and together, give generate's greedy tokens; every compiled form is made
    when the engine starts (warm_up), none while it serves, and kept in the llmlaunch cache."""
    from torch._dynamo.utils import counters

    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, prefill_chunk=7, torch_compile="true").start()
    try:
        assert eng.runner.use_compile, eng.runner.compile_error
        from launcher.hf.reporting import describe_features

        assert describe_features(eng.features).startswith("torch_compile on (")
        # what Inductor compiled is kept in the llmlaunch cache (shared by a cluster's nodes), not in /tmp
        import os

        from launcher.paths import cache_root

        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache_root() / "inductor")
        assert any((cache_root() / "inductor").iterdir())
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 3  # the general form, one output row, one token
        # alone: its first chunks are steps with no output row (the case where Inductor would drop the attention)
        out = eng.generate(PROMPTS[3], SamplingParams(max_tokens=20), timeout=60)
        assert (out.token_ids, out.text) == reference(PROMPTS[3], 20)
        runs = [(reference(p, 20), collect(eng, p, SamplingParams(max_tokens=20))) for p in PROMPTS]
        for (ids, text), (done, outs) in runs:
            assert done.wait(120)
            assert joined(outs) == (text, ids)
        assert counters["stats"]["unique_graphs"] == graphs, "compiled while serving"
    finally:
        eng.shutdown()


def test_prompts_are_encoded_by_the_backend_with_the_tokenizer_calls_ids_and_fall_back_where_they_could_differ(
    engine, tiny_model_dir
):
    """launcher.hf.encode.PromptEncoder: a fast tokenizer's prompts go straight to the tokenizers backend's `encode_batch`
    (which gives the GIL up while it encodes, as the tokenizer's call does, without the call's Python around it), and
    the ids are the tokenizer call's.  Where they could differ (truncation set on the backend by
    another caller, a tokenizer class whose call does more than the backend) prompts go through the call, and the
    engine's log line says why.  The GIL's hand-over itself is measured, not asserted here."""
    from transformers import AutoTokenizer

    from launcher.hf.encode import PROBES, PromptEncoder
    from launcher.hf.reporting import describe_features

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = PromptEncoder(tok)
    assert enc.backend is tok._tokenizer and enc.why_not == ""
    texts = PROMPTS + list(PROBES) + [f"{tok.bos_token}{PROMPTS[0]}{tok.eos_token} and more", "word " * 300]
    want = tok(texts).input_ids
    assert [enc(t) for t in texts] == want
    for n in (1, 2, len(texts)):
        assert enc.many(texts[:n]) == want[:n], n

    # which backend call: encode_batch, for one text too (a recording stand-in for the backend, wrapping the real one)
    used = []

    class Recording:
        def __getattr__(self, name):
            attr = getattr(tok._tokenizer, name)
            if name in ("encode", "encode_batch"):

                def call(*a, **kw):
                    used.append(name)
                    return attr(*a, **kw)

                return call
            return attr

    enc.backend = Recording()
    assert enc(texts[0]) == want[0] and enc.many(texts[:3]) == want[:3] and used == ["encode_batch"] * 2
    enc.backend = tok._tokenizer

    # another caller left truncation on the backend: the call (which resets it) is used, so the ids stay whole
    long_text = "word " * 300
    assert len(tok(long_text, truncation=True, max_length=5).input_ids) == 5
    assert tok._tokenizer.truncation is not None and enc._usable() is None
    assert enc(long_text) == want[-1]
    assert tok._tokenizer.truncation is None and enc._usable() is tok._tokenizer

    # a tokenizer class whose call does more than its backend (here: lower-cases the text) keeps its call
    class Lowering(type(tok)):
        def _encode_plus(self, text, *a, **kw):
            lower = [t.lower() for t in text] if isinstance(text, list) else text.lower()
            return super()._encode_plus(lower, *a, **kw)

    lowering = Lowering.from_pretrained(tiny_model_dir)
    enc2 = PromptEncoder(lowering)
    assert enc2.backend is None and enc2.why_not.startswith("the backend's ids differ from the tokenizer's call on ")
    assert enc2("Hello World") == lowering("Hello World").input_ids == tok("hello world").input_ids

    # the engine's log line names the way prompts take, and why not the backend
    assert f"prompts: tokenizer call ({enc2.why_not})" in describe_features(
        dict(engine.features, prompt_encode=enc2.why_not)
    )
    assert "prompts: backend encode" in describe_features(engine.features)


def test_a_model_that_cannot_be_compiled_still_serves(tiny_model_dir, reference, monkeypatch):
    """torch.compile failing (no C compiler, an op Inductor cannot lower...) must not stop the engine: it
    says why (compile_error, the server's READY line) and serves uncompiled.  The failure is injected at
    torch.compile's boundary: a compiled function that raises when first called, as Inductor does."""
    from launcher.hf.reporting import describe_features

    def failing_compile(fn, **kwargs):
        def compiled(*args, **kw):
            raise RuntimeError("InductorError: no working C compiler")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, torch_compile="true").start()
    try:
        assert not eng.runner.use_compile
        assert describe_features(eng.features).startswith(
            "torch_compile failed (RuntimeError: InductorError: no working C compiler), "
        )
        out = eng.generate(PROMPTS[0], SamplingParams(max_tokens=16), timeout=60)
        assert (out.token_ids, out.text) == reference(PROMPTS[0], 16)
    finally:
        eng.shutdown()


def one_at_a_time(eng):
    """`eng` (not started) stepping one at a time: no step is queued behind a running one, each waits for the tokens
    of the step before (the reference the overlapped schedule is checked against)."""
    schedule = eng.scheduler.schedule
    eng.scheduler.schedule = lambda ahead_of=None: None if ahead_of is not None else schedule()
    return eng


def test_overlapped_steps_give_the_same_outputs(tiny_model_dir):
    """overlap: the next decode step is queued, its tokens passed on the device, before the host has seen the last
    step's.  Against the same engine stepping one at a time, the same requests at once give
    the same outputs: greedy, seeded sampling, penalties, a stop string, end_id with min_tokens (where a row
    ends a step early and its extra token must be dropped), and max_tokens of 1, 2 and 3 and one filling the
    context to max_model_len (where a row must not be run past its end)."""
    engines = {
        flag: make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, max_model_len=128) for flag in (False, True)
    }
    one_at_a_time(engines[False])
    for eng in engines.values():
        eng.start()
    try:
        ref = engines[False]
        full = ref.generate(PROMPTS[0], SamplingParams(max_tokens=30, ignore_eos=True))
        ids = ref.generate(PROMPTS[1], SamplingParams(max_tokens=30, ignore_eos=True)).token_ids
        first = next(i for i, t in enumerate(ids) if i >= 3 and t not in ids[:i])  # a token new at place >= 3
        end = ids[first]
        requests = [(p, SamplingParams(max_tokens=30)) for p in PROMPTS]
        requests += [
            (p, SamplingParams(max_tokens=25, temperature=0.9, top_p=0.9, seed=7 + i))
            for i, p in enumerate(PROMPTS[:2])
        ]
        requests += [
            (PROMPTS[2], SamplingParams(max_tokens=30, presence_penalty=1.5, frequency_penalty=0.5, ignore_eos=True)),
            (PROMPTS[0], SamplingParams(max_tokens=30, ignore_eos=True, stop=(full.text[8:12],))),
            # EOS banned for exactly the tokens before `end`'s first place: ends there
            (PROMPTS[1], SamplingParams(max_tokens=30, end_id=end, min_tokens=first)),
        ]
        requests += [(PROMPTS[3], SamplingParams(max_tokens=n, ignore_eos=True)) for n in (1, 2, 3)]
        requests += [
            (PROMPTS[2], SamplingParams(max_tokens=128 - len(ref.tokenizer(PROMPTS[2]).input_ids), ignore_eos=True))
        ]
        results = {}
        for flag, eng in engines.items():
            runs = [collect(eng, p, params) for p, params in requests]
            for done, _ in runs:
                assert done.wait(60)
            results[flag] = [(joined(outs), outs[-1].finish_reason) for _, outs in runs]
        assert results[True] == results[False]
        (_, got), reason = results[True][-5]  # the end_id request: ended by its end id, at its first place
        assert reason == "stop" and got == ids[: first + 1]
        assert all(reason == "length" for _, reason in results[True][-4:])
        assert engines[True].stats.ahead_steps > 0 and engines[False].stats.ahead_steps == 0
    finally:
        for eng in engines.values():
            eng.shutdown()


def test_overlap_with_arrivals_waiting_requests_and_prompt_chunks(tiny_model_dir, reference):
    """Overlap under a closed loop: each finished request sends the next one from its callback (on the engine
    thread, so it arrives while a step runs), one request more than the slots waits for a slot from the start,
    and prompts are longer than a step's prompt budget (prefilled in chunks).  Greedy outputs equal `generate`
    and the engine stepping one at a time."""
    requests = [(PROMPTS[i % len(PROMPTS)], 4 + (3 * i) % 11) for i in range(12)]
    results = {}
    engines = {
        flag: make_engine(tiny_model_dir, device="cpu", max_num_seqs=3, prefill_chunk=6) for flag in (False, True)
    }
    one_at_a_time(engines[False])
    for eng in engines.values():
        eng.start()
    try:
        for flag, eng in engines.items():
            outs = {i: [] for i in range(len(requests))}
            done = threading.Event()
            sent = [0]

            def send(eng=eng, sent=sent):
                i = sent[0]
                sent[0] += 1
                eng.add_request(
                    f"r{i}", requests[i][0], SamplingParams(max_tokens=requests[i][1]), lambda o, i=i: on_output(i, o)
                )

            def on_output(i, o, outs=outs, sent=sent, send=send, done=done):
                outs[i].append(o)
                if o.finished:
                    if sent[0] < len(requests):
                        send()
                    if all(v and v[-1].finished for v in outs.values()):
                        done.set()

            for _ in range(4):
                send()
            assert done.wait(120)
            results[flag] = [joined(outs[i]) for i in range(len(requests))]
        assert results[True] == results[False]
        for (prompt, n), (text, ids) in zip(requests, results[True]):
            assert (ids, text) == reference(prompt, n), (prompt, n)
        assert engines[True].stats.ahead_steps > 0
    finally:
        for eng in engines.values():
            eng.shutdown()


def test_a_row_ending_by_length_leaves_the_overlapped_steps_without_stopping_them(tiny_model_dir, reference):
    """Two requests, one of 3 tokens and one of 12: every decode step is queued ahead, with its tokens from the
    step before, including past the short one's end (it is left out of the step after its last token, which
    does not wait for the host), and both outputs equal `generate`."""
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4).start()
    launches = []  # (prompt tokens in the step?, launched ahead?)
    launch = eng.runner.launch

    def recording_launch(step, prev=None, prev_rows=None):
        launches.append((bool(step.prefill), prev is not None))
        return launch(step, prev=prev, prev_rows=prev_rows)

    eng.runner.launch = recording_launch
    try:
        runs = [collect(eng, PROMPTS[i], SamplingParams(max_tokens=n, ignore_eos=True)) for i, n in ((0, 3), (1, 12))]
        for done, _ in runs:
            assert done.wait(60)
        decode_steps = [ahead for prefill, ahead in launches if not prefill]
        assert len(decode_steps) >= 10 and all(decode_steps), launches
        for (prompt, n), (_, outs) in zip(((PROMPTS[0], 3), (PROMPTS[1], 12)), runs):
            assert joined(outs)[1] == reference(prompt, n)[0]
    finally:
        eng.shutdown()


def test_requests_waiting_for_a_slot_leave_the_decode_steps_queued_ahead(tiny_model_dir, reference):
    """Two slots, three requests at once: the third waits for the slot of the first (6 tokens) while the first two
    decode.  Every decode-only step is still queued ahead (a full engine keeps its overlap); the third is prefilled
    once the first has ended, and all outputs equal `generate`."""
    wanted = ((0, 6), (1, 16), (2, 6))
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=2).start()
    launches = []  # (prompt tokens in the step?, launched ahead?, a request waiting for a slot meanwhile?)
    launch, gate = eng.runner.launch, threading.Lock()

    def recording_launch(step, prev=None, prev_rows=None):
        with gate:  # held while the requests are added: the engine takes the second and third together
            launches.append((bool(step.prefill), prev is not None, bool(eng.scheduler.waiting)))
        return launch(step, prev=prev, prev_rows=prev_rows)

    eng.runner.launch = recording_launch
    try:
        with gate:
            runs = [collect(eng, PROMPTS[i], SamplingParams(max_tokens=n, ignore_eos=True)) for i, n in wanted]
        for done, _ in runs:
            assert done.wait(60)
        # the decode steps while the third request waited for a slot
        waiting = [ahead for prefill, ahead, waited in launches if waited and not prefill]
        # the first of them may follow the step during which the second and third arrived: a step is not queued
        # ahead while requests wait in the inbox (they are taken in first), so that one starts behind nothing
        assert len(waiting) >= 3 and all(waiting[1:]), launches
        last_prefill = max(i for i, (prefill, _, _) in enumerate(launches) if prefill)
        assert all(ahead for prefill, ahead, _ in launches[last_prefill + 1 :] if not prefill), launches
        for (i, n), (_, outs) in zip(wanted, runs):
            assert joined(outs)[1] == reference(PROMPTS[i], n)[0]
    finally:
        eng.shutdown()


@pytest.mark.parametrize("mode, eager_cudnn", [("graphs", False), ("off", False), ("all", True)])
def test_eager_steps_keep_off_cudnn_attention(tiny_model_dir, monkeypatch, mode, eager_cudnn):
    """cudnn_attention: every attention call of an eager step runs with cuDNN's SDPA backend disabled (graphs, off)
    or with torch's choice (all), the other backends stay on, and the flags are restored after the step (a capture
    and other code in the process keep torch's choice).  Observed from inside torch's SDPA, on the CPU, where the
    same flags are set (the kernel choice itself is a GPU matter)."""
    import torch.nn.functional as F

    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=4, max_model_len=64, cudnn_attention=mode)
    own_blocks(runner)
    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kw):
        seen.append(
            (
                torch.backends.cuda.cudnn_sdp_enabled(),
                torch.backends.cuda.flash_sdp_enabled(),
                torch.backends.cuda.mem_efficient_sdp_enabled(),
                torch.backends.cuda.math_sdp_enabled(),
            )
        )
        return sdpa(*args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    prompt = list(range(10, 17))
    runner.execute(StepInputs([], [], [], [PrefillChunk(0, 0, len(prompt), True)], prompt, SamplingRows()))
    runner.execute(StepInputs([0], [5], [len(prompt)], [], [], SamplingRows()))
    assert len(seen) == 2 * runner.num_layers
    assert set(seen) == {(eager_cudnn and before, True, True, True)}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    assert runner.cudnn_attention == mode


def test_cudnn_attention_defaults_to_graphs_and_is_checked(tiny_model_dir):
    from launcher.hf.runner import HFModelRunner

    assert (
        HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64).cudnn_attention == "graphs"
    )
    with pytest.raises(ValueError, match="cudnn_attention 'sometimes' is not one of graphs, all, off"):
        HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64, cudnn_attention="sometimes")


def test_eager_attention_equals_generate(tiny_model_dir, reference):
    eng = make_engine(
        tiny_model_dir, device="cpu", max_num_seqs=4, attn_implementation="eager", prefill_chunk=5
    ).start()
    try:
        runs = [(reference(p, 16), collect(eng, p, SamplingParams(max_tokens=16))) for p in PROMPTS[:3]]
        for (ids, text), (done, outs) in runs:
            assert done.wait(60)
            assert joined(outs) == (text, ids)
    finally:
        eng.shutdown()


def test_32_concurrent_requests_get_their_token_counts(engine):
    runs = []
    for i in range(32):
        n = 8 + (i * 7) % 41
        runs.append(
            (n, *collect(engine, PROMPTS[i % len(PROMPTS)] + f" {i}", SamplingParams(max_tokens=n, ignore_eos=True)))
        )
    for n, done, outs in runs:
        assert done.wait(120)
        assert outs[-1].finish_reason == "length"
        assert outs[-1].output_tokens == n
        assert len(joined(outs)[1]) == n
        assert [o.output_tokens for o in outs] == list(range(1, n + 1))  # one output per token, cumulative counts
    assert engine.num_running == 0


def test_streamed_deltas_equal_whole_text(engine):
    done, outs = collect(engine, PROMPTS[4], SamplingParams(max_tokens=48, ignore_eos=True))
    assert done.wait(60)
    text, ids = joined(outs)
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)


# ------------------------------------------------------------------------------------------ control
def test_abort_stops_within_a_step_and_frees_the_slot(engine):
    done, outs = collect(engine, PROMPTS[1], SamplingParams(max_tokens=1500, ignore_eos=True), "to-abort")
    while len(outs) < 3:
        time.sleep(0.005)
    engine.abort("to-abort")
    assert done.wait(10)
    assert outs[-1].finish_reason == "cancelled"
    assert outs[-1].output_tokens < 1500
    assert engine.num_running == 0
    assert len(engine.scheduler.free) == engine.max_num_seqs  # every slot is free again
    # the engine keeps serving
    assert engine.generate("Hello", SamplingParams(max_tokens=4), timeout=30).output_tokens == 4


def test_abort_of_a_waiting_request(tiny_model_dir):
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=1).start()
    try:
        done_a, outs_a = collect(eng, "Hello", SamplingParams(max_tokens=200, ignore_eos=True), "a")
        done_b, outs_b = collect(eng, "Hello", SamplingParams(max_tokens=5), "b")  # waits for the only slot
        eng.abort("b")
        assert done_b.wait(10)
        assert outs_b[-1].finish_reason == "cancelled" and outs_b[-1].output_tokens == 0
        eng.abort("a")
        assert done_a.wait(10)
    finally:
        eng.shutdown()


@pytest.mark.parametrize(
    "params, prompt, message",
    [
        (SamplingParams(max_tokens=0), "Hi", "max_tokens must be >= 1"),
        (SamplingParams(max_tokens=100000), "Hi", "exceeds the model limit"),
        (SamplingParams(max_tokens=10), "word " * 2100, "exceeds the model context"),
        (SamplingParams(max_tokens=10, temperature=-1), "Hi", "temperature must be >= 0"),
        (SamplingParams(max_tokens=10, top_p=0), "Hi", "top_p must be in (0, 1]"),
        (SamplingParams(max_tokens=10, end_id=10**6), "Hi", "end_id"),
        (SamplingParams(max_tokens=10), "", "empty"),
    ],
)
def test_bad_requests_fail_alone(engine, params, prompt, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        engine.add_request(f"bad-{message}", prompt, params, lambda o: None)
    assert engine.generate("Hello", SamplingParams(max_tokens=3), timeout=30).output_tokens == 3


def test_duplicate_request_id_is_rejected(engine):
    done, _ = collect(engine, "Hello", SamplingParams(max_tokens=50, ignore_eos=True), "dup")
    with pytest.raises(InvalidRequest, match="already running"):
        engine.add_request("dup", "Hello", SamplingParams(max_tokens=5), lambda o: None)
    engine.abort("dup")
    assert done.wait(10)


# ------------------------------------------------------------------------------------------ sampling controls
def test_stop_words(engine):
    prompt = PROMPTS[0]
    full = engine.generate(prompt, SamplingParams(max_tokens=40, ignore_eos=True)).text
    stop = full[10:14]
    cut = full.index(stop)
    done, outs = collect(engine, prompt, SamplingParams(max_tokens=40, ignore_eos=True, stop=(stop, "never-seen")))
    assert done.wait(30)
    text, _ = joined(outs)
    assert text == full[:cut]
    assert outs[-1].finish_reason == "stop"
    assert all(stop not in o.text for o in outs)


def test_min_tokens_delays_stop_words(engine):
    full = engine.generate(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True)).text
    out = engine.generate(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True, stop=(full[:3],), min_tokens=40))
    assert out.finish_reason == "length" and out.text == full


def test_end_id_and_min_tokens(engine):
    ids = engine.generate(PROMPTS[1], SamplingParams(max_tokens=30, ignore_eos=True)).token_ids
    end = ids[5]
    first = ids.index(end)
    out = engine.generate(PROMPTS[1], SamplingParams(max_tokens=30, end_id=end))
    assert out.finish_reason == "stop" and out.output_tokens == first + 1 and out.token_ids == ids[: first + 1]
    out = engine.generate(PROMPTS[1], SamplingParams(max_tokens=30, end_id=end, min_tokens=first + 3))
    assert out.output_tokens >= first + 3
    assert end not in out.token_ids[: first + 3]


def test_seeded_sampling_is_repeatable(engine):
    p = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    a = engine.generate(PROMPTS[0], p)
    b = engine.generate(PROMPTS[0], p)
    c = engine.generate(PROMPTS[0], SamplingParams(**{**p.__dict__, "seed": 99}))
    greedy = engine.generate(PROMPTS[0], SamplingParams(max_tokens=24, ignore_eos=True))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert a.token_ids != greedy.token_ids


def continued(engine, prompt, p, upto):
    """The request run whole, then again with its first `upto` settled tokens as continue_ids (a stream moved to
    another server there): (whole, the continuation's outputs)."""
    whole = engine.generate(prompt, p)
    done, outs = collect(
        engine, prompt, SamplingParams(**{**p.__dict__, "continue_ids": tuple(whole.token_ids[:upto])})
    )
    assert done.wait(60)
    return whole, outs


@pytest.mark.parametrize(
    "params",
    [
        dict(max_tokens=40, ignore_eos=True),
        dict(max_tokens=40, ignore_eos=True, temperature=1.0, top_p=0.9, seed=7),
        dict(max_tokens=40, ignore_eos=True, repetition_penalty=1.3, presence_penalty=0.5),
    ],
    ids=["greedy", "seeded", "penalties"],
)
def test_a_continued_request_goes_on_as_if_it_had_not_moved(engine, params):
    """continue_ids (the front end's migration): the tokens after them, their text and the counts are those of the
    request run whole; a seeded request's draws skip the continued tokens', so it is reproduced too."""
    for prompt in PROMPTS[:2]:
        whole, outs = continued(engine, prompt, SamplingParams(**params), 15)
        text, ids = joined(outs)
        assert ids == whole.token_ids[15:], prompt
        first = engine.generate(prompt, SamplingParams(**{**params, "max_tokens": 15}))
        assert first.text + text == whole.text, prompt
        assert [o.output_tokens for o in outs][-1] == 40 and outs[0].output_tokens == 16
        assert {o.input_tokens for o in outs} == {whole.input_tokens}


def test_ids_settle_only_with_the_text_that_completes_them(engine):
    """Output.settled counts the tokens whose text is out: not those held back (a character's first bytes, a stop
    string's start), so the ids sent up to it always match the text sent, and it reaches every token at the end."""
    p = SamplingParams(max_tokens=60, ignore_eos=True, stop=("zzzz",))
    held = 0
    for prompt in PROMPTS:
        done, outs = collect(engine, prompt, p)
        assert done.wait(60)
        text_so_far, ids_so_far = "", []
        for o in outs:
            text_so_far += o.text
            ids_so_far += o.token_ids
            held += o.settled < len(ids_so_far)
            dec = engine._table.decoder(engine._encode(prompt))
            assert "".join(dec.push(t) for t in ids_so_far[: o.settled]) + dec.flush() == text_so_far, prompt
        assert outs[-1].settled == len(ids_so_far) == 60
    assert held, "no output held text back: the check above saw only the easy case"


def test_continue_ids_are_checked(engine):
    with pytest.raises(InvalidRequest, match="nothing left to generate"):
        engine.add_request("c1", "Hi", SamplingParams(max_tokens=2, continue_ids=(5, 6)), lambda o: None)
    with pytest.raises(InvalidRequest, match=r"continue_ids must be in \[0, "):
        engine.add_request("c2", "Hi", SamplingParams(max_tokens=8, continue_ids=(10**9,)), lambda o: None)
    with pytest.raises(InvalidRequest, match="leave return_prompt_log_probs out"):
        engine.add_request(
            "c3", "Hi", SamplingParams(max_tokens=8, continue_ids=(5,), prompt_logprobs=0), lambda o: None
        )


def test_top_k_1_is_greedy(engine):
    greedy = engine.generate(PROMPTS[2], SamplingParams(max_tokens=16, ignore_eos=True))
    k1 = engine.generate(PROMPTS[2], SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.5, top_k=1, seed=5))
    assert k1.token_ids == greedy.token_ids


def test_penalties_reduce_repetition(engine):
    base = engine.generate(PROMPTS[2], SamplingParams(max_tokens=40, ignore_eos=True)).token_ids
    pen = engine.generate(
        PROMPTS[2],
        SamplingParams(
            max_tokens=40, ignore_eos=True, presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=3.0
        ),
    ).token_ids
    assert len(set(pen)) > len(set(base))


def test_bad_words(engine):
    tok = engine.tokenizer
    ids = engine.generate(PROMPTS[1], SamplingParams(max_tokens=30, ignore_eos=True)).token_ids
    # a generated token that is a word on its own (decodes and re-encodes to itself)
    banned = next(t for t in ids if tok(tok.decode([t]), add_special_tokens=False).input_ids == [t])
    out = engine.generate(PROMPTS[1], SamplingParams(max_tokens=30, ignore_eos=True, bad_words=(tok.decode([banned]),)))
    assert banned not in out.token_ids


def test_sampled_and_greedy_requests_share_a_batch(engine, reference):
    ids, text = reference(PROMPTS[3], 20)
    runs = [collect(engine, PROMPTS[3], SamplingParams(max_tokens=20, temperature=0.9, seed=i)) for i in range(6)]
    done, outs = collect(engine, PROMPTS[3], SamplingParams(max_tokens=20))
    assert done.wait(60) and all(d.wait(60) for d, _ in runs)
    assert joined(outs) == (text, ids)


# ------------------------------------------------------------------------------------------ detokenizer units
def test_incremental_detokenizers_match_decode(engine):
    tok = engine.tokenizer
    rng = random.Random(0)
    table = TokenTable(tok)
    assert table.byte_table is not None  # the tiny tokenizer is byte-level BPE: the fast path is used
    window = TokenTable(tok, force_window=True)
    for trial in range(30):
        ids = [rng.randrange(engine.vocab_size) for _ in range(rng.randrange(1, 60))]
        if trial % 3 == 0:  # valid multi-byte text split across tokens
            ids = tok("é東京🙂 naïve ☕ x" * 3, add_special_tokens=False).input_ids
        expected = tok.decode(ids, skip_special_tokens=True)
        for dec in (table.decoder([]), window.decoder([])):
            text = "".join(dec.push(t) for t in ids) + dec.flush()
            if isinstance(dec, ByteLevelDecoder):
                assert text == expected, ids
            else:
                assert isinstance(dec, WindowDecoder)
                assert text.replace("\ufffd", "") == expected.replace("\ufffd", ""), ids


def test_step_statistics_split_the_loop_time(engine):
    """EngineStats time every step: launch + wait fit inside the loop's wall time, the split's host part is the
    rest, each decode token and prompt token is counted; off the GPU nothing is timed on a GPU."""
    from launcher.python_backend.timings import engine_step_split

    before = engine.stats_dict()
    n = 6
    t0 = time.monotonic()
    outs = [engine.generate(f"{PROMPTS[0]} {i}", SamplingParams(max_tokens=5, ignore_eos=True)) for i in range(n)]
    wall = time.monotonic() - t0  # one request at a time: their times to a first token fit inside it
    assert all(o.output_tokens == 5 for o in outs)
    deadline = time.monotonic() + 5  # a step's wall time is counted after its outputs went out
    while engine.stats_dict()["wall_s"] == before["wall_s"] and time.monotonic() < deadline:
        time.sleep(0.01)
    after = engine.stats_dict()
    d = {k: after[k] - before[k] for k in after}
    assert d["steps"] >= 5 and d["decode_tokens"] == 4 * n  # the first token of each comes from its prefill
    assert d["prefill_tokens"] == sum(len(engine.tokenizer(f"{PROMPTS[0]} {i}").input_ids) for i in range(n))
    assert 0 < d["launch_s"] + d["wait_s"] <= d["wall_s"]
    assert d["gpu_steps"] == d["gpu_gaps"] == 0 and d["gpu_s"] == 0 and d["gpu_idle_s"] == 0
    split = engine_step_split(before, after)
    assert split["steps"] == d["steps"] and split["host_ms"] >= 0 and "gpu_ms" not in split
    assert abs(split["launch_ms"] + split["wait_ms"] + split["host_ms"] - split["step_ms"]) < 1e-3
    # per request: each one admitted and given its first token once, the wait for a slot inside the wait for it
    assert d["admitted"] == d["first_tokens"] == n
    assert 0 <= d["queued_s"] < d["to_first_token_s"] < wall, (d, wall)
    assert 0 <= split["queue_ms"] < split["first_token_ms"]
    assert engine_step_split(after, after) is None


def test_engine_process_matches_engine(tiny_model_dir, engine):
    from launcher.hf.client import EngineProcess

    ep = EngineProcess(
        HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=4, stream_interval_ms=50)
    ).start()
    try:
        want = engine.generate(PROMPTS[0], SamplingParams(max_tokens=60, ignore_eos=True))
        done, outs = collect(ep, PROMPTS[0], SamplingParams(max_tokens=60, ignore_eos=True))
        assert done.wait(60)
        assert joined(outs) == (want.text, want.token_ids)
        # output_interval merges tokens: the first token alone and at once, then pieces, then the end
        assert outs[0].output_tokens == 1 and len(outs) < 60 and outs[-1].output_tokens == 60
        with pytest.raises(InvalidRequest, match="max_tokens must be >= 1"):
            ep.add_request("bad", "Hi", SamplingParams(max_tokens=0), lambda o: None)
        done, outs = collect(ep, "word " * 3000, SamplingParams(max_tokens=4))  # only the tokenizer sees this
        assert done.wait(30)
        assert outs[-1].finish_reason == "error" and "exceeds the model context" in outs[-1].error
        done, outs = collect(ep, PROMPTS[0], SamplingParams(max_tokens=1000, ignore_eos=True), "p-abort")
        while not outs:
            time.sleep(0.01)
        ep.abort("p-abort")
        assert done.wait(10) and outs[-1].finish_reason == "cancelled"
        # the engine's step statistics come back too: sent when the engine goes idle
        deadline = time.monotonic() + 5
        while ep.stats_dict().get("decode_tokens", 0) < 59 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = ep.stats_dict()
        assert stats["decode_tokens"] >= 59 and stats["wall_s"] >= stats["launch_s"] + stats["wait_s"] > 0, stats
    finally:
        ep.shutdown()


def test_add_requests_tokenizes_text_prompts_in_one_call(engine, reference, monkeypatch):
    """Engine.add_requests: the text prompts go to the prompt encoder in one call (token-id prompts and empty ones do
    not), each request gets what add_request would give it, and a refused one (empty, too long, bad parameters) does
    not keep the others out."""
    calls = []
    encoder = engine._encode

    class Counting:
        def __call__(self, text):
            calls.append(text)
            return encoder(text)

        def many(self, texts):
            calls.append(list(texts))
            return encoder.many(texts)

    monkeypatch.setattr(engine, "_encode", Counting())
    tokenizer = engine.tokenizer
    results = {i: (threading.Event(), []) for i in range(6)}

    def on_output(i):
        def cb(out):
            results[i][1].append(out)
            if out.finished:
                results[i][0].set()

        return cb

    ids = tokenizer(PROMPTS[2]).input_ids
    requests = [
        ("t0", PROMPTS[0], SamplingParams(max_tokens=8)),
        ("t1", "", SamplingParams(max_tokens=8)),
        ("t2", ids, SamplingParams(max_tokens=8)),
        ("t3", "word " * 3000, SamplingParams(max_tokens=8)),
        ("t4", PROMPTS[1], SamplingParams(max_tokens=0)),
        ("t5", PROMPTS[4], SamplingParams(max_tokens=8)),
    ]
    refused = engine.add_requests(
        [(rid, prompt, params, on_output(i)) for i, (rid, prompt, params) in enumerate(requests)]
    )
    assert calls == [[PROMPTS[0], "word " * 3000, PROMPTS[1], PROMPTS[4]]]  # one call, the non-empty texts
    assert [type(r).__name__ if r else None for r in refused] == [
        None,
        "InvalidRequest",
        None,
        "InvalidRequest",
        "InvalidRequest",
        None,
    ]
    assert "the prompt is empty" in str(refused[1]) and "exceeds the model context" in str(refused[3])
    assert "max_tokens must be >= 1" in str(refused[4])
    for i, prompt in ((0, PROMPTS[0]), (2, PROMPTS[2]), (5, PROMPTS[4])):
        assert results[i][0].wait(60)
        assert joined(results[i][1])[1] == reference(prompt, 8)[0]


def test_engine_process_takes_a_burst_of_requests_together(tiny_model_dir, engine):
    """Requests sent back to back are read by the engine process as they come, several at a time, and go to the
    engine through add_requests (one tokenizer call, checked in-process above): each still gets its own outputs,
    a refused one its error, and an abort that follows its add in the burst cancels it."""
    from launcher.hf.client import EngineProcess

    ep = EngineProcess(HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=8)).start()
    try:
        want = {p: engine.generate(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in PROMPTS}
        runs = {}
        for i, prompt in enumerate(PROMPTS * 2):
            runs[i] = collect(ep, prompt, SamplingParams(max_tokens=12, ignore_eos=True), f"b{i}")
        bad = collect(ep, "word " * 3000, SamplingParams(max_tokens=4), "b-long")
        gone = collect(ep, PROMPTS[0], SamplingParams(max_tokens=1000, ignore_eos=True), "b-abort")
        ep.abort("b-abort")
        for i, prompt in enumerate(PROMPTS * 2):
            assert runs[i][0].wait(60)
            assert joined(runs[i][1]) == (want[prompt].text, want[prompt].token_ids), i
        assert bad[0].wait(30) and bad[1][-1].finish_reason == "error"
        assert "exceeds the model context" in bad[1][-1].error
        assert gone[0].wait(30) and gone[1][-1].finish_reason == "cancelled"
    finally:
        ep.shutdown()


def test_instances_share_one_engine_process(tiny_model_dir, engine, tmp_path):
    """Several model instances (Triton stub processes) share one engine: the first starts it with `listen`, the
    others attach.  Request ids may repeat across instances; each gets only its own outputs; an instance that
    detaches has its running requests aborted while the others go on; when the first stops, the attached ones
    see the engine gone."""
    from launcher.hf.client import EngineProcess

    sock = str(tmp_path / "engine.sock")
    owner = EngineProcess(
        HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=8), listen=sock
    ).start()
    a = b = None
    try:
        a = EngineProcess.attach(sock, startup_timeout=30).start()
        b = EngineProcess.attach(sock, startup_timeout=30).start()
        assert a.info["pid"] == b.info["pid"] == owner.info["pid"] and a.max_model_len == owner.max_model_len
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        want = [engine.generate(p, params) for p in PROMPTS[:3]]
        runs = [collect(ep, p, params, "r1") for ep, p in zip((owner, a, b), PROMPTS[:3])]  # the same id thrice
        for (done, outs), w in zip(runs, want):
            assert done.wait(60)
            assert joined(outs) == (w.text, w.token_ids) and outs[-1].finish_reason == "length"
        # b leaves while a request of its runs: that request is aborted, a's keeps going to its end
        long = SamplingParams(max_tokens=1800, ignore_eos=True)
        done_a, outs_a = collect(a, PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True), "x")
        done_b, outs_b = collect(b, PROMPTS[1], long, "x")
        while not outs_b:
            time.sleep(0.01)
        b.shutdown()
        assert done_a.wait(60) and outs_a[-1].finish_reason == "length" and outs_a[-1].output_tokens == 40
        deadline = time.monotonic() + 30
        while owner.stats_dict().get("finished", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = owner.stats_dict()  # b's request ended (aborted) long before its 1,800 tokens
        assert stats["finished"] == 5 and stats["decode_tokens"] < 1000, stats
        assert not a.stats_dict()  # engine statistics go to the first instance only
        # the first instance stops: the engine ends; an attached instance's running request ends cancelled (as
        # the first's would) and new ones are refused
        done_a, outs_a = collect(a, PROMPTS[2], long, "y")
        while not outs_a:
            time.sleep(0.01)
        owner.shutdown()
        assert done_a.wait(30) and outs_a[-1].finish_reason == "cancelled"
        deadline = time.monotonic() + 10
        while not a._dead and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(RuntimeError, match="shared hf engine"):
            a.add_request("z", "Hi", params, lambda o: None)
        assert not os.path.exists(sock)  # the socket went with the engine
    finally:
        for ep in (b, a, owner):
            if ep is not None:
                ep.shutdown()


def test_engine_process_hands_over_the_prompts_of_each_ready_instance(tiny_model_dir, engine, tmp_path):
    """Requests that three model instances sent while the engine process's reader was busy go to the engine in one
    hand-over an instance (one tokenizer call each), counted in the engine's intake statistics; each gets its own
    outputs.  The reader is kept busy by a real prompt of two million characters (~0.8 s to tokenize here; refused
    after, as too long for the model)."""
    from launcher.hf.client import EngineProcess

    sock = str(tmp_path / "engine.sock")
    owner = EngineProcess(
        HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=8), listen=sock
    ).start()
    a = b = None
    try:
        a = EngineProcess.attach(sock, startup_timeout=30).start()
        b = EngineProcess.attach(sock, startup_timeout=30).start()
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        want = [engine.generate(p, params) for p in PROMPTS[:3]]
        long = collect(owner, "word " * 400_000, params, "long")
        time.sleep(0.1)  # the reader has it and is tokenizing it
        runs = [collect(ep, p, params, "r") for ep, p in zip((owner, a, b), PROMPTS[:3])]
        assert long[0].wait(60) and "exceeds the model context" in long[1][-1].error
        for (done, outs), w in zip(runs, want):
            assert done.wait(60)
            assert joined(outs) == (w.text, w.token_ids)
        deadline = time.monotonic() + 30
        while owner.stats_dict().get("finished", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = owner.stats_dict()
        assert stats["intake_requests"] == 4, stats
        assert stats["intake_calls"] == 4, stats
    finally:
        for ep in (b, a, owner):
            if ep is not None:
                ep.shutdown()


def test_engine_process_sends_first_outputs_ahead():
    """The engine process's outputs of a step go to each model instance's connection with the ids it gave; the
    connections whose share holds a request's first output (times set) are sent to first, so a first token does not
    wait for the other instances' pickling and sending.  Real pipes; `Recorder` only notes the order of the sends."""
    from multiprocessing import Pipe

    from launcher.hf.multiplexer import Peers as _Peers

    order = []

    class Recorder:
        def __init__(self, k, conn):
            self.k, self.conn = k, conn

        def send(self, msg):
            order.append(self.k)
            self.conn.send(msg)

    ends = [Pipe() for _ in range(3)]
    peers = _Peers(Recorder(0, ends[0][0]))
    for k in (1, 2):
        assert peers.add(Recorder(k, ends[k][0])) == k
    middle = lambda rid: (rid, "x", [5], 3, 2, None, None, None)  # noqa: E731
    first = ("2/7", "y", [6], 3, 1, None, None, (1.0, 2.0))
    peers.send_outputs([("a", "z", [4], 3, 9, "length", None, None), middle("1/3"), first, middle("2/8")])
    assert order == [2, 0, 1]
    assert ends[2][1].recv() == [("7",) + first[1:], ("8", "x", [5], 3, 2, None, None, None)]
    assert ends[1][1].recv() == [("3", "x", [5], 3, 2, None, None, None)]
    assert ends[0][1].recv() == [("a", "z", [4], 3, 9, "length", None, None)]


def test_attaching_with_no_engine_process_fails_clearly(tmp_path):
    """No engine ever listens: a clear error after the timeout.  The starting instance failed and said why: that
    reason at once, not after the timeout."""
    from launcher.hf.client import EngineProcess

    sock = str(tmp_path / "none.sock")
    with pytest.raises(RuntimeError, match="no hf engine process to attach to .* within 1 s"):
        EngineProcess.attach(sock, startup_timeout=1).start()
    EngineProcess.write_attach_failure(sock, "ValueError: the KV cache needs 9.0 GiB")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="starts the shared hf engine process failed: ValueError: the KV cache"):
        EngineProcess.attach(sock, startup_timeout=600).start()
    assert time.monotonic() - t0 < 5
    EngineProcess.write_attach_failure(sock, None)
    assert not os.path.exists(sock + ".failed")


def test_tiny_model_folder(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from launcher.tiny import ensure_tiny_model

    small = dict(layers=1, hidden=64, heads=2, kv_heads=1, intermediate=64, vocab=300)
    path = ensure_tiny_model(cache_dir=tmp_path, **small)
    assert ensure_tiny_model(cache_dir=tmp_path, **small) == path  # reused, same hash
    assert ensure_tiny_model(cache_dir=tmp_path, **{**small, "seed": 1}) != path
    cfg, tok = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert cfg.vocab_size == len(tok) == 300 and cfg.num_key_value_heads == 1
    assert tok.bos_token and tok.eos_token and tok.pad_token and not getattr(tok, "chat_template", None)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs left
    with pytest.raises(TypeError, match="unknown tiny-model settings"):
        ensure_tiny_model(cache_dir=tmp_path, hidden_size=8)


def test_overhead_benchmark_with_output_lengths_of_their_own(tiny_model_dir):
    """benchmark/overhead.py --max-tokens-min: each request generates exactly its own drawn length (so requests end
    apart and their successors arrive one by one), every round the same ones; a range upside down is refused."""
    import json
    import random
    import subprocess
    import sys

    args = [
        sys.executable,
        "-m",
        "benchmark.overhead",
        "--model",
        str(tiny_model_dir),
        "--paths",
        "direct",
        "--concurrency",
        "3",
        "--rounds",
        "2",
        "--requests-per-stream",
        "2",
        "--max-tokens",
        "12",
    ]
    proc = subprocess.run(args + ["--max-tokens-min", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["max_tokens_min"] == 2 and out["max_tokens"] == 12
    rng = random.Random(3)  # the script's draw for C=3: 6 requests
    lengths = [rng.randint(2, 12) for _ in range(6)]
    assert len(set(lengths)) > 1
    row = out["runs"][0]
    assert row["direct_round_tokens"] == [sum(lengths)] * 2 and len(row["direct_rounds"]) == 2
    bad = subprocess.run(args + ["--max-tokens-min", "20"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-tokens-min 20 must be between 1 and --max-tokens (12)" in bad.stderr


def test_overhead_benchmark_stopped_by_sigterm_prints_the_loads_it_finished(tiny_model_dir):
    """benchmark/overhead.py cut by SIGTERM (timeout(1), a lent machine's time limit) in its second load: the first
    load's row is still printed, "interrupted" says where it stopped, and it exits 128 + 15.  The signal goes once
    the second load's first round is logged: its second round (300 tokens a request) keeps it running long enough to
    be cut there.  The signal comes as timeout(1) sends it: to the process, then to its whole process
    group, the process again among them (a second SIGTERM that killed it outright lost a GPU run's JSON)."""
    import json
    import signal
    import subprocess
    import sys

    args = [
        sys.executable,
        "-m",
        "benchmark.overhead",
        "--model",
        str(tiny_model_dir),
        "--paths",
        "direct",
        "--concurrency",
        "1",
        "2",
        "--rounds",
        "2",
        "--requests-per-stream",
        "2",
        "--max-tokens",
        "300",
        "--warmup-tokens",
        "2",
    ]
    import os
    import time

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    try:
        for line in proc.stderr:  # the first load is done, the second is in its second round
            seen.append(line)
            if line.startswith("[overhead] C=2 round 1: "):
                break
        else:
            raise AssertionError("".join(seen)[-2000:])
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)  # (timeout(1) sends the second at once; here the first has been handled by then)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    doc = json.loads(out)
    assert [row["concurrency"] for row in doc["runs"]] == [1]
    assert doc["runs"][0]["direct_round_tokens"] == [600, 600]
    assert doc["interrupted"] == "SIGTERM after 1 of 2 loads"
    assert "interrupted: SIGTERM after 1 of 2 loads" in err


_TWO_SIGTERMS = """
import os, signal, sys, time
from launcher.testing.sigterm import SIGTERM_GRACE_S, stop_on_sigterm

signal.signal(signal.SIGTERM, stop_on_sigterm)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt:
    print("stopping", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # timeout(1)'s second, to the process group: the same stop
time.sleep(0.1)
print("still stopping", flush=True)
time.sleep(SIGTERM_GRACE_S)
os.kill(os.getpid(), signal.SIGTERM)  # one sent later kills as usual
time.sleep(5)
print("not killed", flush=True)
"""


def test_a_second_sigterm_soon_after_the_first_does_not_kill_the_overhead_benchmark():
    """The handler benchmark/overhead.py installs for SIGTERM (launcher.testing.sigterm): the first unwinds like
    Ctrl-C; a second within SIGTERM_GRACE_S (timeout(1) signals its command, then the command's process group) is
    ignored, so the servers still stop and the finished loads are still printed; one later kills as usual."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _TWO_SIGTERMS], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:2] == ["stopping", "still stopping"], proc.stderr[-2000:]
    assert proc.returncode == -signal.SIGTERM and "not killed" not in proc.stdout


@pytest.mark.triton
def test_overhead_benchmark_open_loop_gives_every_path_the_same_arrivals(tiny_model_dir, tmp_path):
    """benchmark/overhead.py --request-rate: an open loop in-process, in an engine process and through a real
    tritonserver with two client processes, each path sending the 16 requests at the times
    launcher.bench.runner.arrival_times draws (so no round ends before the last arrival); the served first token is
    split as in a closed loop, the mean number of requests in flight and the server's CPU a token by role are
    reported, and the table on stderr has a line for the rate with the TTFT serving added.  A rate of 0, a server
    parameter without a value and no client process are refused before anything starts."""
    import importlib.util
    import json
    import subprocess
    import sys

    from launcher.bench.runner import LoadSpec, arrival_times

    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    args = [
        sys.executable,
        "-m",
        "benchmark.overhead",
        "--model",
        str(tiny_model_dir),
        "--paths",
        "direct",
        "served",
        "--rounds",
        "1",
        "--max-tokens",
        "4",
        "--warmup-tokens",
        "2",
        "--client-processes",
        "2",
    ]
    proc = subprocess.run(
        args
        + [
            "--paths",
            "direct",
            "process",
            "served",
            "--request-rate",
            "12",
            "--open-seconds",
            "1",
            "--request-param",
            "final_counts_only=true",
            "--json",
            str(tmp_path / "out.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert json.loads((tmp_path / "out.json").read_text()) == out
    assert out["request_params"] == {"final_counts_only": True}
    (row,) = out["runs"]  # no closed loop by default once a rate is given
    assert row["request_rate"] == 12 and row["concurrency"] is None and row["requests"] == 16
    last = max(arrival_times(LoadSpec(request_rate=12, num_requests=16, processes=2, seed=12), 16))
    assert last > 0.5  # 16 requests at 12/s: the last one about 1.3 s in
    for path in ("direct", "process", "served"):
        assert row[f"{path}_round_tokens"] == [64]
        assert 64 / row[f"{path}_tokens_per_s"] >= last  # paced: the round lasted past the last arrival
        assert row[f"{path}_in_flight_mean"] > 0 and row[f"{path}_ttft_ms_p50"] > 0
    assert row["served_first_token_ms"]["engine"] > 0 and row["served_first_token_ms"]["send"] > 0
    assert "ttft_added_ms_p50" in row and "ratio" in row and "process_ratio" in row
    assert "rate=12/s: direct" in proc.stderr
    # the server's CPU a token is split by role: tritonserver, its stubs, the engine process (which decodes here, so
    # it used more than a clock tick; the roles' processes themselves: tests/integration/test_bench.py); the parts add up
    cpu = row["cpu_us_per_token"]
    roles = cpu["server_by_role"]
    assert set(roles) == {"tritonserver", "stubs", "engine", "other"} and roles["engine"] > 0, roles
    assert abs(sum(roles.values()) - cpu["server"]) <= 0.5 + 0.01 * cpu["server"], (roles, cpu["server"])
    # the table: a header, then a line for the rate with the TTFT added and the server's CPU by role
    lines = proc.stderr.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["load"])
    assert "TTFT p50 in/served" in lines[head] and "served/in" in lines[head]
    line = lines[head + 1].split()
    assert line[0] == "12/s" and f"{row['ttft_added_ms_p50']:.2f}" in line
    assert line[-1] == "+".join(f"{roles[k]:.0f}" for k in ("tritonserver", "stubs", "engine"))
    for extra, message in (
        (["--request-rate", "0"], "--request-rate 0: a rate is a number of requests/s above 0"),
        (["--server-param", "cuda_graphs"], "'cuda_graphs': write KEY=VALUE"),
        (["--client-processes", "0"], "--client-processes 0: a count of processes is 1 or more"),
    ):
        bad = subprocess.run(args + extra, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr and "starting tritonserver" not in bad.stderr, bad.stderr[
            -1000:
        ]


def test_prompts_alone_zero_is_kept_and_a_negative_one_refused_before_the_model_loads(tiny_model_dir, tmp_path):
    """prompts_alone=0 (no prompt goes alone through its prompt graphs) is kept as given; a negative count is refused
    before the model loads."""
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=2, prompts_alone=0)
    assert eng.scheduler._prompts_alone == 0
    nothing = tmp_path / "no-model"  # refused before loading: a model that is not there is never looked at
    with pytest.raises(ValueError, match="prompts_alone=-1 is negative"):
        make_engine(nothing, device="cpu", max_num_seqs=2, prompts_alone=-1)


# ------------------------------------------------------------------------------------------ log probabilities
def test_log_probabilities_equal_the_models_own(tiny_model_dir):
    """Each new token's and each prompt token's log probability and top k are transformers' log_softmax of the same
    positions (float32), with the prompt prefilled in chunks and its prefix cached by a request before it (a request
    that asks for its prompt's log probabilities computes the whole prompt)."""
    from transformers import AutoModelForCausalLM

    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, prefill_chunk=7).start()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    try:
        prompt = " ".join(PROMPTS[:2])
        eng.generate(prompt, SamplingParams(max_tokens=2), timeout=60)  # caches the prompt's full blocks
        out = eng.generate(prompt, SamplingParams(max_tokens=6, logprobs=3, prompt_logprobs=2), timeout=60)
        ids = eng.tokenizer(prompt).input_ids
        full = torch.tensor([ids + out.token_ids])
        with torch.inference_mode():
            ref = model(full).logits[0].float().log_softmax(-1)
        rows = out.prompt_logprobs
        assert len(rows) == len(ids) and rows.ids[0] == [ids[0]] and rows.lps[0][0] != rows.lps[0][0]  # NaN
        assert len(out.logprobs) == len(out.token_ids) == 6
        for p in range(1, full.shape[1]):
            part, at, k = (rows, p, 2) if p < len(ids) else (out.logprobs, p - len(ids), 3)
            got_ids, got_lps = part.ids[at], part.lps[at]
            assert got_ids[0] == full[0, p].item()
            assert abs(got_lps[0] - ref[p - 1, full[0, p]].item()) < 1e-4
            top = ref[p - 1].topk(k)
            assert got_ids[1:] == top.indices.tolist()
            assert max(abs(a - b) for a, b in zip(got_lps[1:], top.values.tolist())) < 1e-4
        # the same tokens as without log probabilities: asking changes nothing of the answer
        assert eng.generate(prompt, SamplingParams(max_tokens=6), timeout=60).token_ids == out.token_ids
    finally:
        eng.shutdown()


def test_a_token_id_prompt_answers_as_its_text_does(engine):
    ids = engine.tokenizer(PROMPTS[1]).input_ids
    by_text = engine.generate(PROMPTS[1], SamplingParams(max_tokens=8), timeout=60)
    by_ids = engine.generate(ids, SamplingParams(max_tokens=8), timeout=60)
    assert by_ids.token_ids == by_text.token_ids and by_ids.input_tokens == len(ids)
    with pytest.raises(InvalidRequest, match="prompt token ids must be in"):
        engine.generate([engine.vocab_size + 5], SamplingParams(max_tokens=2), timeout=60)


def test_the_engine_profile_benchmark_runs_closed_loops_and_splits_the_steps(tiny_model_dir, tmp_path, capsys):
    """benchmark/gpu/engine_profile.py, whose GPU profile docs/performance/hf.md takes, run here on the CPU: every
    concurrency's streams make tokens and the engine's step split covers them, the profiled window's too (the kernel
    table needs a GPU); each stream's requests end before the next concurrency starts; a concurrency given twice runs
    on prompts new to the prefix cache; a bad --set is refused naming the key."""
    from benchmark.gpu.engine_profile import kind_of, main, prompt_seeds

    out = tmp_path / "p.json"
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--concurrency", "1", "3"]
    # the window opens as the profiled run starts, so it holds steps however fast the machine
    argv += ["--requests-per-stream", "2", "--warm-s", "0", "--profile-s", "0.3", "--new", "8", "--prompt-len", "8"]
    assert main(argv + ["--json", str(out), "--set", "prefix_caching=false"]) == 0
    doc = json.loads(out.read_text())
    assert doc["sets"] == {"prefix_caching": "false"} and doc["features"]["prefix_caching"] is False
    assert [r["concurrency"] for r in doc["rows"]] == [1, 3]
    for row in doc["rows"]:
        assert row["tokens_per_s"] > 0 and row["split"]["steps"] > 0 and "errors" not in row
        # TPOT: a request's mean gap; ITL: the p50 over every gap (8 new tokens: 7 gaps a request)
        assert row["tpot_ms_p50"] > 0 and row["itl_ms_p50"] > 0
        assert row["split"]["decode_rows"] <= row["concurrency"]
        # the profiled window's own steps (the kernel table is per step of it)
        assert row["profiled"]["steps"] > 0 and row["profiled"]["decode_rows"] <= row["concurrency"]
    capsys.readouterr()
    with pytest.raises(ValueError, match="no argument max_seqs"):
        main(argv + ["--set", "max_seqs=4"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        main(argv + ["--set", "mixed_graphs"])
    # a concurrency given twice is a repeat on prompts of its own: with the prefix cache on, prompts of whole blocks
    # it already held would have skipped their prefill (40 tokens: two 16-token blocks cacheable)
    again = ["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--concurrency", "2", "2"]
    again += ["--requests-per-stream", "2", "--profile-s", "0", "--new", "4", "--prompt-len", "40"]
    assert main(again + ["--json", str(out), "--set", "prefix_caching=true"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [2, 2]
    assert [r["split"]["prefix_hit_rate"] for r in rows] == [0.0, 0.0]
    assert prompt_seeds(2, 0) != prompt_seeds(2, 1) and set(prompt_seeds(2, 0)).isdisjoint(prompt_seeds(4, 0))
    capsys.readouterr()
    assert kind_of("sm90_xmma_gemm_bf16") == "gemm" and kind_of("paged_decode") == "attention"
    assert kind_of("triton_per_fused_add_mean_0") == "fused" and kind_of("Memcpy DtoD") == "copy"
    assert kind_of("at::native::argmax_kernel") == "other"
    # the kernel table a GPU run prints, from the profiler's events (their fields as torch.profiler gives them)
    from types import SimpleNamespace

    from benchmark.gpu.engine_profile import kernel_table

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name="nvjet_gemm", device_type=cuda, device_time_total=300.0)] * 4
    events += [SimpleNamespace(name="paged_decode", device_type=cuda, device_time_total=100.0)] * 2
    events += [SimpleNamespace(name="aten::mm", device_type=cpu, device_time_total=0.0)]
    table = kernel_table(SimpleNamespace(events=lambda: events), steps=2, top=1)
    assert table["gpu_ms_per_step"] == 0.7 and table["kernels_per_step"] == 3.0
    assert table["kinds_ms_per_step"] == {"gemm": 0.6, "attention": 0.1}
    assert table["top"] == [{"name": "nvjet_gemm", "kind": "gemm", "per_step": 2.0, "us_per_step": 600.0}]
