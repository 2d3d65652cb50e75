"""The front end's routing policies (launcher/frontend/routing.py) over real Replica objects (their loads set as the
front end sets them, no server behind them): prefix routing keeps a conversation and a shared prefix on one replica,
spreads new prefixes, lets a hot prefix spill past its load bound, and agrees across worker processes."""

from __future__ import annotations

import pytest

from launcher.domains import ROUTINGS
from launcher.frontend.replica import Replica
from launcher.frontend.routing import (
    BLOCK_BYTES,
    REGISTRY,
    LeastOutstanding,
    PrefixRouting,
    block_keys,
    make_routing,
    prompt_of,
    routing_keys,
)

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and name your sources. " * 12).encode()


def _replicas(n: int = 4):
    return [Replica(i, "127.0.0.1", 9000 + i) for i in range(n)]


def _send(routing, reps, prompt: bytes, hold: bool = False):
    """Route one request; `hold` keeps it in flight (its replica's load stays one higher)."""
    rep = routing.pick(reps, (), prompt)
    if hold:
        rep.track(1)
    return rep


def test_every_policy_is_named_where_the_config_checks_it():
    assert sorted(REGISTRY) == sorted(ROUTINGS)
    assert isinstance(make_routing("prefix"), PrefixRouting)
    with pytest.raises(ValueError, match="routing 'radix': not a policy; use one of"):
        make_routing("radix")


def test_block_keys_are_equal_exactly_as_far_as_two_texts_agree():
    a = block_keys(SYSTEM + b"What colour is the sky?")
    b = block_keys(SYSTEM + b"Name a prime number, please, and say why it is one.")
    shared = len(SYSTEM) // BLOCK_BYTES
    assert a[:shared] == b[:shared] and len(a) >= shared
    assert block_keys(b"x" + SYSTEM)[:shared] != a[:shared]  # a key covers every byte before it
    assert block_keys(b"short") == []


def test_least_outstanding_takes_the_fewest_in_flight_and_skips_down_and_excluded():
    reps = _replicas(3)
    reps[0].track(2)
    reps[1].track(1)
    policy = LeastOutstanding()
    assert policy.pick(reps) is reps[2]
    reps[2].mark_down("gone")
    assert policy.pick(reps) is reps[1]
    assert policy.pick(reps, exclude=[reps[1]]) is reps[0]
    reps[0].mark_down("gone")
    reps[1].mark_down("gone")
    assert policy.pick(reps) is None


def test_a_conversations_turns_and_a_shared_system_prompt_stay_on_one_replica():
    reps, policy = _replicas(), PrefixRouting()
    history = SYSTEM + b"User: what is the capital of France?\n"
    first = _send(policy, reps, history)
    for turn in range(5):  # each turn sends the whole history once the last was answered; others keep running
        _send(policy, reps, f"unrelated request {turn} ".encode() * 20, hold=True)
        history += f"Assistant: Paris.\nUser: and number {turn}?\n".encode() * 3
        assert _send(policy, reps, history) is first
    # the front end's counters: every turn after the first was predicted to find the history before it
    assert 0 < first.predicted_blocks < first.prompt_blocks


def test_new_prefixes_spread_and_two_front_end_processes_agree_where_each_goes():
    """Each worker process has its own index; a prefix neither has seen goes where its first block's rendezvous
    hash ranks highest, so both send it to the same replica."""
    reps = _replicas()
    one, two = PrefixRouting(), PrefixRouting()
    chosen = []
    for g in range(32):
        prompt = f"group {g}: ".encode() + SYSTEM
        a, b = one.pick(reps, (), prompt), two.pick(reps, (), prompt)
        assert a is b
        chosen.append(a.index)
    assert set(chosen) == {0, 1, 2, 3}  # 32 prefixes over 4 replicas: every one gets some


def test_a_hot_prefix_spills_to_another_replica_past_its_load_bound_which_then_holds_it_too():
    reps, policy = _replicas(2), PrefixRouting()
    home = _send(policy, reps, SYSTEM + b"q0", hold=True)
    other = reps[1 - home.index]
    placed = [home]
    for q in range(1, 6):  # every request of the hot prefix stays in flight
        placed.append(_send(policy, reps, SYSTEM + f"q{q}".encode(), hold=True))
    assert other in placed  # the bound: at most 1.25 x (mean + 1) in flight on one
    loads = [home.load(), other.load()]
    assert max(loads) - min(loads) <= 2, loads
    # the replica it spilled to holds the prefix now: with both equally free, either may take it, by its match
    spilled = policy.matched(block_keys(SYSTEM + b"q9"), reps)
    assert spilled.get(other.index, 0) >= len(SYSTEM) // BLOCK_BYTES


def test_excluded_and_down_replicas_are_never_picked_by_prefix():
    reps, policy = _replicas(2), PrefixRouting()
    home = _send(policy, reps, SYSTEM)
    assert _send(policy, reps, SYSTEM, hold=False) is home
    assert policy.pick(reps, exclude=[home], prompt=SYSTEM) is not home
    home.mark_down("its stream failed")
    assert policy.pick(reps, (), SYSTEM) is not home
    for r in reps:
        r.mark_down("gone")
    assert policy.pick(reps, (), SYSTEM) is None


def test_a_prompt_shorter_than_a_block_goes_to_the_least_loaded():
    reps, policy = _replicas(3), PrefixRouting()
    reps[0].track(3)
    reps[2].track(1)
    assert policy.pick(reps, (), b"Hi") is reps[1]


def test_the_index_forgets_the_least_recently_used_keys_past_its_bound():
    reps, policy = _replicas(2), PrefixRouting(index_blocks=20)
    for g in range(10):
        _send(policy, reps, f"group {g} ".encode() + SYSTEM)
    assert len(policy.index) == 20
    recent = block_keys(b"group 9 " + SYSTEM)
    assert all(k in policy.index for k in recent[-10:])


def test_a_sessions_requests_stay_on_its_replica_until_it_passes_its_bound():
    """Prompts that share nothing, one session id: the replica of the session's last request, while that replica
    carries no more than its bound; past it the session moves, and stays where it moved."""
    reps, policy = _replicas(2), PrefixRouting()
    home = policy.pick(reps, (), b"first question " * 30, "chat-7")
    for q in range(6):
        assert policy.pick(reps, (), f"unrelated {q} ".encode() * 40, "chat-7") is home
    home.track(5)  # others' requests load it past 1.25 x (mean + 1)
    moved = policy.pick(reps, (), b"next question " * 30, "chat-7")
    assert moved is not home
    home.track(-5)
    assert policy.pick(reps, (), b"and the next " * 30, "chat-7") is moved


def test_a_new_session_goes_to_the_same_replica_from_every_front_end_process():
    reps, one, two = _replicas(), PrefixRouting(), PrefixRouting()
    chosen = set()
    for n in range(16):
        a = one.pick(reps, (), b"Hi", f"session-{n}")
        assert two.pick(reps, (), b"Hi", f"session-{n}") is a
        chosen.add(a.index)
    assert chosen == {0, 1, 2, 3}


def test_sessions_are_remembered_up_to_a_bound_oldest_out_first():
    reps, policy = _replicas(2), PrefixRouting(sessions=3)
    for n in range(5):
        policy.pick(reps, (), b"hello " * 50, f"s{n}")
    assert list(policy.sessions) == ["s2", "s3", "s4"]


def test_the_prompt_is_read_from_a_request_as_clients_send_it():
    from tritonclient.grpc import service_pb2

    from launcher.client.request import Generation, build_request

    req = build_request("m", Generation("The capital of France é", max_tokens=4), "r1")
    assert prompt_of(service_pb2.ModelInferRequest.FromString(req.SerializeToString())) == (
        "The capital of France é".encode()
    )
    assert prompt_of(service_pb2.ModelInferRequest()) == b""
    with_session = build_request("m", Generation("Hi there", max_tokens=4), "r2", {"session_id": "chat-7"})
    parsed = service_pb2.ModelInferRequest.FromString(with_session.SerializeToString())
    assert routing_keys(parsed) == (b"Hi there", "chat-7")
    assert routing_keys(service_pb2.ModelInferRequest.FromString(req.SerializeToString()))[1] == ""
    # llmlaunch-bench's multi-turn conversations: the session travels with the Generation
    own = build_request("m", Generation("Hi", max_tokens=4, session="s0-c3"), "r3", {"final_counts_only": True})
    parsed = service_pb2.ModelInferRequest.FromString(own.SerializeToString())
    assert routing_keys(parsed) == (b"Hi", "s0-c3") and parsed.parameters["final_counts_only"].bool_param


def test_the_bench_sends_a_conversations_session_to_the_openai_api_as_its_header():
    import json

    from launcher.bench.openai_stream import request_builder
    from launcher.client.request import Generation

    build = request_builder(chat=False)
    req = build("m", Generation("Hi", max_tokens=4, session="s0-c3"), "r1", None)
    assert req.headers == {"X-Session-ID": "s0-c3"} and "session" not in json.loads(req.body)
    assert build("m", Generation("Hi", max_tokens=4), "r2", None).headers is None
