"""The CUDA graph families of the hf engine (launcher/hf/graphs/) through their shared capture and replay.

CUDA graphs need a GPU.  Here a stand-in records what a capture records (the body, with the buffers it was captured
with) and a replay runs that body again into the captured output tensor, which is what a replay computes.  So the
families' keys, buffers, input loading, output rows and failure handling run as they do on a GPU
(benchmark/gpu/decode_bandwidth.py checks greedy tokens through the real graphs on one).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.hf.graphs.family import GraphFamily  # noqa: E402
from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs  # noqa: E402


class _Replayed:
    def __init__(self, body, out):
        self.body, self.out = body, out

    def replay(self):
        self.out.copy_(self.body())


def _graphed_runner(tiny_model_dir, monkeypatch, fail_at=None):
    """A CPU runner with graphs on (decode buckets of 1-8 rows, prompt graphs up to 32 tokens, one wave of 2 x 16,
    mixed graphs of 32 prompt tokens), captured through the stand-in; capture number `fail_at` raises."""
    captures = []

    def capture(family, body):
        captures.append(family.kind)
        if len(captures) == fail_at:
            raise RuntimeError("no capture here")
        body(), body()
        out = body()
        return _Replayed(body, out), out

    monkeypatch.setattr(GraphFamily, "_capture_graph", capture)
    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=8, max_model_len=64)
    runner.use_graphs = True  # as on a GPU
    runner._allocate_cache(None, runner.block_size)
    runner.prompt_graphs.limit, runner.mixed_graphs.limit = 32, 32
    counts = (runner.capture_graphs(), runner.capture_prefill_graphs(32), runner.capture_mixed_graphs())
    return runner, counts, captures


def _steps(runner):
    """(last_graph, logits) of each step of a script that goes through every family, and eager steps between."""
    seen, logits = [], []
    sample = runner.sampler.sample
    runner.sampler.sample = lambda lg, sampling, resets: (logits.append(lg.clone()), sample(lg, sampling, resets))[1]
    pos = {}
    # every slot's blocks, out of order across the pool: a sequence's tokens are wherever its block table says
    order = list(range(1, 8 * 4 + 1))
    order = order[::3] + order[1::3] + order[2::3]
    updates = []

    def step(decode=(), chunks=()):
        st = StepInputs(
            [s for s, _ in decode],
            [t for _, t in decode],
            [pos[s] for s, _ in decode],
            [c for c, _ in chunks],
            [t for _, ts in chunks for t in ts],
            SamplingRows(),
            block_updates=list(updates),
        )
        updates.clear()
        return st

    def whole(slot, tokens, start=0, sample=True):
        if slot not in pos:
            updates.append((slot, 0, order[slot * 4 : slot * 4 + 4]))
        pos[slot] = start + len(tokens)
        return PrefillChunk(slot, start, len(tokens), sample), tokens

    def go(st, prev=None, rows=None):
        handle = runner.launch(st, prev=prev, prev_rows=rows)
        runner.wait(handle)
        seen.append(runner.last_graph)
        for s in st.decode_slots:
            pos[s] += 1
        return handle

    go(step(chunks=[whole(0, list(range(10, 17)))]))  # one prompt: its prompt graph
    go(step(chunks=[whole(1, list(range(20, 25))), whole(2, list(range(30, 42)))]))  # two: the wave graph
    h = go(step(decode=[(0, 5), (1, 6), (2, 7)]))  # decode rows: a decode graph
    h = go(step(decode=[(0, 0), (1, 0), (2, 0)]), prev=h)  # their tokens from the step before, on the device
    h = go(step(decode=[(2, 9), (0, 8)], chunks=[whole(3, list(range(50, 58))), whole(5, [60, 61, 62])]))  # mixed
    go(
        step(decode=[(0, 0), (2, 0), (3, 0), (1, 4)], chunks=[whole(6, list(range(70, 75)))]),
        prev=h,
        rows=[1, 0, 2, -1],
    )  # mixed, decode tokens from the device, one from the host
    go(step(decode=[(5, 3), (6, 2)]))  # decode rows on slots 5 and 6 only: padded rows between
    go(step(decode=[(0, 1)], chunks=[whole(7, list(range(80, 120)), sample=False)]))  # past the mixed limit: eager
    go(step(chunks=[whole(7, list(range(120, 130)), start=40)]))  # a later chunk: eager
    h = go(step(decode=[(0, 1)]))
    go(step(chunks=[whole(4, list(range(11, 19)))]), prev=h)  # queued behind a step: no prompt graph
    return seen, logits


def test_every_family_replays_the_eager_steps(tiny_model_dir, monkeypatch):
    """Steps through the decode, prompt, wave and mixed graphs (decode tokens from the host and from the device)
    give the logits and cache of the same steps run eagerly, and each says which graph ran it; the sequences' blocks
    lie out of order in the pool."""
    eager = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=8, max_model_len=64)
    assert not eager.use_graphs
    want_graphs, want = _steps(eager)
    assert set(want_graphs) == {None}
    runner, counts, _ = _graphed_runner(tiny_model_dir, monkeypatch)
    assert counts == (4, 4, 4)  # decode rows 1, 2, 4, 8 x length 64; prompts 16, 24, 32 + wave 2 x 16; mixed 4 x 32
    graphs, logits = _steps(runner)
    assert graphs == ["prompt", "wave", "decode", "decode", "mixed", "mixed", "decode", None, None, "decode", None]
    assert len(logits) == len(want)
    for got, expected in zip(logits, want):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for (k, v), (k0, v0) in zip(runner.cache, eager.cache):  # block 0 is where graphs' padded rows write
        torch.testing.assert_close(k[1:], k0[1:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v[1:], v0[1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fail_at, kind, counts, left",
    [
        (2, "decode", (0, 0, 0), {"decode": 1, "prompt": 0, "wave": 0, "mixed": 0}),
        (6, "prompt", (4, 0, 4), {"decode": 4, "prompt": 0, "wave": 0, "mixed": 4}),
        (8, "wave", (4, 0, 4), {"decode": 4, "prompt": 0, "wave": 0, "mixed": 4}),
        (10, "mixed", (4, 4, 0), {"decode": 4, "prompt": 3, "wave": 1, "mixed": 0}),
    ],
)
def test_a_failed_capture_turns_off_its_family_and_those_that_need_it(
    tiny_model_dir, monkeypatch, fail_at, kind, counts, left
):
    """A decode capture that fails turns graphs off (mixed graphs, captured per decode bucket, then none); a prompt
    or wave capture drops both (they share the prompt-graph limit), decode and mixed graphs stay; a mixed one drops
    the mixed graphs only.  The error is kept where the engine reports it, and steps run eagerly instead."""
    runner, got, captures = _graphed_runner(tiny_model_dir, monkeypatch, fail_at)
    assert captures[fail_at - 1] == kind and got == counts
    assert {
        f.kind: len(f.graphs)
        for f in (runner.decode_graphs, runner.prompt_graphs, runner.wave_graphs, runner.mixed_graphs)
    } == left
    errors = {"decode": runner.graph_error, "prompt": runner.prefill_graph_error, "mixed": runner.mixed_graph_error}
    failed = "prompt" if kind == "wave" else kind  # prompt and wave graphs report one error
    assert errors == {k: "RuntimeError: no capture here" if k == failed else "" for k in errors}
    assert runner.use_graphs == (kind != "decode")
    assert runner.prompt_graphed(20) == (kind == "mixed")
    assert runner.mixed_prompts_fit([10, 12]) == (kind in ("prompt", "wave"))
