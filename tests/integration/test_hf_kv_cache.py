"""The hf engine's KV cache as a pool of blocks (launcher/hf/blocks.py) driven through the engine on CPU: the pool
sized from a memory budget and max_model_len from the model, greedy output equal to transformers' generate when the
pool runs out and requests are preempted, and a prompt that shares a prefix with an earlier one prefilling only the
rest, counted by the engine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.hf.engine import SamplingParams  # noqa: E402
from tests.integration.test_hf_engine import PROMPTS, collect, joined, make_engine  # noqa: E402

# the tiny model's KV cache: 4 layers x 2 KV heads x 64 dims x keys and values x 4 bytes (float32) a token
TINY_TOKEN_BYTES = 4 * 2 * 64 * 2 * 4


def test_the_pool_is_sized_from_the_budget_and_max_model_len_from_the_model(tiny_model_dir):
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4)
    r = eng.runner
    assert r.kv_cache_bytes <= 2**29 and r.num_blocks == 2**29 // (TINY_TOKEN_BYTES * r.block_size)  # 0.5 GiB on CPU
    assert eng.max_model_len == 2048  # the model's own (max_position_embeddings), not a fixed cap
    assert eng.features["kv_blocks"] == r.num_blocks - 1 and eng.features["prefix_caching"]
    # a pool smaller than the model's context: max_model_len is what one sequence can hold
    small = make_engine(
        tiny_model_dir, device="cpu", max_num_seqs=4, kv_cache_memory=40 * 16 * TINY_TOKEN_BYTES / 2**30
    )
    assert small.runner.num_blocks == 40 and small.max_model_len == 39 * 16
    with pytest.raises(ValueError, match="max_model_len 1024 is more than the KV-cache pool holds"):
        make_engine(
            tiny_model_dir,
            device="cpu",
            max_num_seqs=4,
            max_model_len=1024,
            kv_cache_memory=40 * 16 * TINY_TOKEN_BYTES / 2**30,
        )


def test_a_pool_too_small_for_every_request_preempts_and_the_answers_stay_generates(tiny_model_dir, reference):
    """Eight requests in a pool of 30 blocks of 4 tokens: decoding sequences take blocks as they grow, the pool runs
    out, the request admitted last gives its blocks back and is computed again later (its prompt and what it had
    generated): every answer is still transformers' greedy generate."""
    eng = make_engine(
        tiny_model_dir, device="cpu", max_num_seqs=8, block_size=4, kv_cache_memory=30 * 4 * TINY_TOKEN_BYTES / 2**30
    ).start()
    try:
        prompts = PROMPTS + ["One more prompt for the pool", "And another one, longer than that one was"]
        runs = [collect(eng, p, SamplingParams(max_tokens=24)) for p in prompts]
        for (done, outs), p in zip(runs, prompts):
            assert done.wait(120)
            assert joined(outs) == reference(p, 24)[::-1], p
        assert eng.stats.preempted > 0
        assert eng.scheduler.pool.num_free == eng.scheduler.pool.capacity  # every block back (cached or free)
    finally:
        eng.shutdown()


def test_a_shared_prefix_is_prefilled_once(tiny_model_dir, reference):
    """The second of two requests that share a long system prompt takes its cached blocks and prefills only its own
    suffix (the engine's counters: prompt tokens found cached, tokens prefilled); its answer is generate's.  With
    prefix caching off, it prefills everything."""
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    first, second = system + "What is rain?", system + "What is snow?"
    for caching in (True, False):
        eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, block_size=16, prefix_caching=caching).start()
        try:
            n2 = len(eng.tokenizer(second).input_ids)
            out1 = eng.generate(first, SamplingParams(max_tokens=8), timeout=60)
            prefilled = eng.stats.prefill_tokens
            out2 = eng.generate(second, SamplingParams(max_tokens=8), timeout=60)
            assert out1.token_ids == reference(first, 8)[0] and out2.token_ids == reference(second, 8)[0]
            cached = eng.stats.cached_prompt_tokens
            if caching:
                shared = len(eng.tokenizer(system).input_ids) // 16 * 16  # whole blocks of the shared prefix
                assert cached >= shared - 16 and cached % 16 == 0 and cached > 0
                assert eng.stats.prefill_tokens - prefilled == n2 - cached  # only the rest was prefilled
                assert 0 < eng.stats.prefix_hit_rate < 1
            else:
                assert cached == 0 and eng.stats.prefill_tokens - prefilled == n2
        finally:
            eng.shutdown()


def test_a_repeated_prompt_reuses_all_but_its_last_token(tiny_model_dir, reference):
    """The same prompt again: every full block is found, and at least one token is prefilled, whose logits give the
    first token (the answer is generate's)."""
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=2, block_size=4).start()
    try:
        prompt = PROMPTS[1]
        n = len(eng.tokenizer(prompt).input_ids)
        eng.generate(prompt, SamplingParams(max_tokens=4), timeout=60)
        before = eng.stats.prefill_tokens
        out = eng.generate(prompt, SamplingParams(max_tokens=4), timeout=60)
        assert out.token_ids == reference(prompt, 4)[0]
        assert eng.stats.cached_prompt_tokens == (n - 1) // 4 * 4
        assert eng.stats.prefill_tokens - before == n - (n - 1) // 4 * 4
    finally:
        eng.shutdown()


def test_prompts_continuing_a_cached_prefix_together_answer_as_generate(tiny_model_dir, reference):
    """Several requests sharing a cached prefix, added at once: their suffixes (of several lengths) prefill as
    continuation chunks, batched into one padded attention a layer where they land in one step; every answer is
    generate's and the prefix was served from the cache for each."""
    system = "You are a helpful assistant who answers in one short sentence. " * 4
    asks = ["What is rain?", "Why is the sky blue at noon and red at dusk?", "Hi", "Name three rivers of Europe."]
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=8, block_size=16).start()
    try:
        eng.generate(system + "Hello", SamplingParams(max_tokens=2), timeout=60)
        cached = eng.stats.cached_prompt_tokens
        started = [collect(eng, system + a, SamplingParams(max_tokens=8)) for a in asks]
        for (done, outs), ask in zip(started, asks):
            assert done.wait(60)
            assert joined(outs)[1] == reference(system + ask, 8)[0], ask
        shared = len(eng.tokenizer(system).input_ids) // 16 * 16
        assert eng.stats.cached_prompt_tokens - cached >= len(asks) * (shared - 16)
    finally:
        eng.shutdown()


def engine_with_paged_mixed_graphs(tiny_model_dir, limit: int, **args):
    """(engine not started, steps, arrive_together: test_hf_engine.record_steps's) on CPU whose runner is told it has
    mixed graphs of up to `limit` prompt tokens that take prompts starting anywhere: CPU has no CUDA graphs, so their
    body runs eagerly, with the paged prefill kernel's reference (the gather path, each token a decode row) in the
    kernel's place; the kernel itself is held to that reference in tests/unit/test_hf_paged_prefill.py."""
    from launcher.hf.paged_prefill import reference as paged_reference
    from tests.integration.test_hf_engine import record_steps

    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, **args)
    eng.runner.prefill_kernel = paged_reference
    eng.runner.mixed_graphs.limit, eng.runner.mixed_graphs.stand_in = limit, True
    return (eng, *record_steps(eng))


def test_prompts_after_a_cached_prefix_go_through_a_mixed_graph_alone_and_beside_the_decode_rows(
    tiny_model_dir, reference
):
    """Where the mixed graphs take prompts that start anywhere (the paged prefill kernel on a GPU), a prompt whose
    prefix is cached goes through one: at an idle engine in a step of its own (its decode rows all padding), and,
    arriving with another while a request decodes, both beside the decode row in one step queued ahead of the
    running one, as whole prompts do.  Without that kernel (CPU serving) they run eagerly, as before.  Stand-ins:
    engine_with_paged_mixed_graphs, mixed graphs of up to 128 prompt tokens."""
    from tests.integration.test_hf_engine import decoding_request

    system = "You are a helpful assistant who answers in one short sentence. " * 4
    eng, steps, arrive_together = engine_with_paged_mixed_graphs(tiny_model_dir, 128, block_size=16, prefill_chunk=256)
    eng.start()
    try:
        eng.generate(system + "Hello", SamplingParams(max_tokens=2), timeout=60)
        mark, cached = len(steps), eng.stats.cached_prompt_tokens
        out = eng.generate(system + "What is rain?", SamplingParams(max_tokens=6), timeout=60)
        assert out.token_ids == reference(system + "What is rain?", 6)[0]
        rest = len(eng.tokenizer(system + "What is rain?").input_ids) - (eng.stats.cached_prompt_tokens - cached)
        assert eng.stats.cached_prompt_tokens > cached and steps[mark] == (0, [rest]), steps[mark:]
        assert eng.stats.mixed_steps == 1  # its prompt step, decode rows all padding

        first = decoding_request(eng)
        asks = ["What is snow?", "Name three rivers of Europe."]
        cached = eng.stats.cached_prompt_tokens
        mark, two = arrive_together([system + a for a in asks], 6)
        for done, _ in two:
            assert done.wait(60)
        lengths = [len(eng.tokenizer(system + a).input_ids) for a in asks]
        assert eng.stats.cached_prompt_tokens - cached > 0
        prompt_steps = [st for st in steps[mark:] if st[1]]
        assert len(prompt_steps) == 1 and prompt_steps[0][0] == 1, steps[mark:]  # both beside the decode row
        assert sum(prompt_steps[0][1]) == sum(lengths) - (eng.stats.cached_prompt_tokens - cached)
        assert steps[mark] == prompt_steps[0] and steps.ahead[mark], (steps[mark:], steps.ahead[mark:])
        assert eng.stats.mixed_steps == 2
        assert first[0].wait(60)
        for (_, outs), a in zip(two, asks):
            assert joined(outs)[1] == reference(system + a, 6)[0], a
    finally:
        eng.shutdown()

    # without the kernel the same prompts are no mixed graph's: eager steps, the same answers
    eng = make_engine(tiny_model_dir, device="cpu", max_num_seqs=16, block_size=16, prefill_chunk=256)
    eng.runner.mixed_graphs.limit, eng.runner.mixed_graphs.stand_in = 128, True
    eng.start()
    try:
        eng.generate(system + "Hello", SamplingParams(max_tokens=2), timeout=60)
        out = eng.generate(system + "What is rain?", SamplingParams(max_tokens=6), timeout=60)
        assert out.token_ids == reference(system + "What is rain?", 6)[0] and eng.stats.cached_prompt_tokens > 0
        assert eng.stats.mixed_steps == 0
    finally:
        eng.shutdown()


def test_a_long_prompts_last_chunk_goes_through_a_mixed_graph_queued_ahead(tiny_model_dir, reference):
    """A prompt longer than a step's prompt tokens (prefill_chunk) while a request decodes: its first chunk goes in an
    eager step beside the decode row; its last chunk, which starts part-way, goes beside the decode row through a
    mixed graph (the paged prefill kernel's) in the step queued behind that one, where it waited for the running
    step before.  Stand-ins: engine_with_paged_mixed_graphs; its answer is generate's."""
    from tests.integration.test_hf_engine import decoding_request

    prompt = PROMPTS[1] + " " + PROMPTS[3]
    eng, steps, arrive_together = engine_with_paged_mixed_graphs(
        tiny_model_dir, 128, prefill_chunk=32, prefix_caching=False
    )
    eng.start()
    try:
        n = len(eng.tokenizer(prompt).input_ids)
        assert 32 < n <= 64
        first = decoding_request(eng)
        before = eng.stats.mixed_steps
        mark, (run,) = arrive_together([prompt], 6)
        assert run[0].wait(60)
        prompt_steps = [(st, ahead) for st, ahead in zip(steps[mark:], steps.ahead[mark:]) if st[1]]
        assert [st for st, _ in prompt_steps] == [(1, [32]), (1, [n - 32])], steps[mark:]
        assert prompt_steps[1][1] and eng.stats.mixed_steps == before + 1  # queued ahead, through the mixed graph
        assert joined(run[1])[1] == reference(prompt, 6)[0]
        assert first[0].wait(60)
    finally:
        eng.shutdown()


def test_more_cached_prompts_than_a_mixed_graph_holds_go_through_mixed_graphs_a_step_at_a_time(
    tiny_model_dir, reference
):
    """Ten prompts after a cached prefix arrive together while a request decodes, more than one mixed graph holds
    (MIXED_PROMPTS): the first eight go beside the decode row in one mixed step, the other two beside the nine decode
    rows of the next, queued ahead, where all ten would have gone in one eager step (no wave graph takes prompts
    part-way).  Stand-ins: engine_with_paged_mixed_graphs; the answers are generate's."""
    from launcher.hf.runner import HFModelRunner
    from tests.integration.test_hf_engine import decoding_request

    system = "You are a helpful assistant who answers in one short sentence. " * 4
    asks = [f"Question {i}: what is {w}?" for i, w in enumerate("rain snow hail fog dew mist ice wind sun sky".split())]
    eng, steps, arrive_together = engine_with_paged_mixed_graphs(tiny_model_dir, 512, block_size=16, prefill_chunk=512)
    eng.start()
    try:
        eng.generate(system + "Hello", SamplingParams(max_tokens=2), timeout=60)
        first = decoding_request(eng)
        before = eng.stats.mixed_steps
        mark, runs = arrive_together([system + a for a in asks], 4)
        for done, _ in runs:
            assert done.wait(60)
        prompt_steps = [(st, ahead) for st, ahead in zip(steps[mark:], steps.ahead[mark:]) if st[1]]
        n = HFModelRunner.MIXED_PROMPTS  # the second step decodes the first eight too
        assert [(d, len(c)) for (d, c), _ in prompt_steps] == [(1, n), (1 + n, 2)], steps[mark:]
        assert prompt_steps[1][1] and eng.stats.mixed_steps == before + 2
        for (_, outs), a in zip(runs, asks):
            assert joined(outs)[1] == reference(system + a, 4)[0], a
        assert first[0].wait(60)
    finally:
        eng.shutdown()
