"""The typed hand-offs between processes (launcher/handoff/): RankEnv's variables and endpoint.json's record read back
what was written, their names are the ones the servers' python models read, and a record that is not one is refused
naming what is wrong."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.errors import LaunchError
from launcher.handoff.endpoint import EndpointRecord
from launcher.handoff.rank_env import RankEnv, local_launcher_env
from launcher.rundir import RunDir
from tests.endpoints import endpoint_record
from tests.unit.test_structure import import_graph

# The names are a contract: model_repository/*/1/model.py reads some literally, and a profile's setup lines may
# read LLMLAUNCH_RUN_DIR.
NAMES = {
    "rank": "_LLMLAUNCH_RANK",
    "world_size": "_LLMLAUNCH_WORLD_SIZE",
    "local_rank": "_LLMLAUNCH_LOCAL_RANK",
    "node_rank": "_LLMLAUNCH_NODE_RANK",
    "nnodes": "_LLMLAUNCH_NNODES",
    "job_id": "_LLMLAUNCH_JOB_ID",
    "die_with_launcher": "_LLMLAUNCH_DIE_WITH_LAUNCHER",
    "replica": "_LLMLAUNCH_REPLICA",
    "group_rank": "_LLMLAUNCH_GROUP_RANK",
    "group_size": "_LLMLAUNCH_GROUP_SIZE",
    "leader_addr": "_LLMLAUNCH_LEADER_ADDR",
    "dist_port": "_LLMLAUNCH_DIST_PORT",
    "kv_events": "_LLMLAUNCH_KV_EVENTS",
    "kv_transfer": "_LLMLAUNCH_KV_TRANSFER",
    "run_dir": "LLMLAUNCH_RUN_DIR",
    "drain_reason": "_LLMLAUNCH_DRAIN_REASON",
    "python": "_LLMLAUNCH_PYTHON",
    "root": "_LLMLAUNCH_ROOT",
    "engine_ld_library_path": "_LLMLAUNCH_ENGINE_LD_LIBRARY_PATH",
}

FULL = RankEnv(
    rank=3,
    world_size=4,
    local_rank=1,
    node_rank=1,
    nnodes=2,
    job_id="4242",
    die_with_launcher=True,
    replica=1,
    group_rank=1,
    group_size=2,
    leader_addr="10.0.0.2",
    dist_port=29555,
    kv_events="tcp://*:5557",
    kv_transfer="10.0.0.2:8006",
    run_dir="/jobs/run",
    drain_reason="job 4242 is draining",
    python="/venv/bin/python",
    root="/src/llmlaunch",
    engine_ld_library_path="",
)


def test_each_field_has_its_variable_unchanged():
    assert {f.name: RankEnv.var(f.name) for f in dataclasses.fields(RankEnv)} == NAMES


def test_rank_env_round_trips_through_the_environment():
    environ = FULL.to_environ()
    assert environ == {
        "_LLMLAUNCH_RANK": "3",
        "_LLMLAUNCH_WORLD_SIZE": "4",
        "_LLMLAUNCH_LOCAL_RANK": "1",
        "_LLMLAUNCH_NODE_RANK": "1",
        "_LLMLAUNCH_NNODES": "2",
        "_LLMLAUNCH_JOB_ID": "4242",
        "_LLMLAUNCH_DIE_WITH_LAUNCHER": "1",
        "_LLMLAUNCH_REPLICA": "1",
        "_LLMLAUNCH_GROUP_RANK": "1",
        "_LLMLAUNCH_GROUP_SIZE": "2",
        "_LLMLAUNCH_LEADER_ADDR": "10.0.0.2",
        "_LLMLAUNCH_DIST_PORT": "29555",
        "_LLMLAUNCH_KV_EVENTS": "tcp://*:5557",
        "_LLMLAUNCH_KV_TRANSFER": "10.0.0.2:8006",
        "LLMLAUNCH_RUN_DIR": "/jobs/run",
        "_LLMLAUNCH_DRAIN_REASON": "job 4242 is draining",
        "_LLMLAUNCH_PYTHON": "/venv/bin/python",
        "_LLMLAUNCH_ROOT": "/src/llmlaunch",
        "_LLMLAUNCH_ENGINE_LD_LIBRARY_PATH": "",  # set and empty: the engine runs without one
    }
    assert RankEnv.from_environ({**environ, "PATH": "/bin", "SLURM_PROCID": "0"}) == FULL  # others are not its
    assert (
        RankEnv.from_environ(dataclasses.replace(FULL, die_with_launcher=False).to_environ()).die_with_launcher is False
    )


def test_unset_fields_are_neither_written_nor_made_up():
    """Each hand-off writes what it knows; a reader sees None for what nobody said."""
    assert RankEnv().to_environ() == {} and RankEnv.from_environ({}) == RankEnv()
    assert RankEnv(drain_reason="r").to_environ() == {"_LLMLAUNCH_DRAIN_REASON": "r"}
    env = RankEnv.from_environ({"_LLMLAUNCH_GROUP_RANK": "0"})
    assert env.group_rank == 0 and env.group_size is None and env.dist_port is None and env.kv_events is None


def test_the_local_launchers_table_is_what_a_rank_reads_as_its_place():
    from launcher.rank.topology import read_topology

    environ = local_launcher_env(1, 2, 1, "777").to_environ()
    assert set(environ) == {NAMES[k] for k in ("rank", "world_size", "local_rank", "node_rank", "nnodes", "job_id")} | {
        NAMES["die_with_launcher"]
    }
    topo = read_topology(environ)
    assert (topo.launcher, topo.rank, topo.world_size, topo.local_rank, topo.job_id) == ("local", 1, 2, 1, "777")
    # inside an allocation (`srun llmlaunch`), the Slurm task's variables are the allocation's, not the rank's
    inside = read_topology({**environ, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "9"})
    assert (inside.launcher, inside.rank, inside.world_size, inside.job_id) == ("local", 1, 2, "777")
    assert read_topology({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "9"}).launcher == "slurm"


def test_a_rank_hands_its_server_its_place_and_its_copy():
    """rank_environment: the 12 variables of the rank's place in the job and its model copy, read back whole."""
    from launcher.cli import plan
    from launcher.rank.rendezvous import RankContext
    from launcher.rank.topology import rank_environment

    _, spec = plan(["cluster=local_slurm", "engine=hf", "tp=2", "nodes=2", "replicas=2"])
    me = spec.ranks[3]  # replica 1's worker, on node 1
    ctx = RankContext(rank=me, job_id="88", leader_addr="10.0.0.3", dist_port=29500, hosts=())
    env = rank_environment(spec, ctx, "/jobs/run", None)
    assert RankEnv.from_environ(env) == RankEnv(
        rank=3,
        world_size=4,
        local_rank=me.local_rank,
        node_rank=me.node,
        nnodes=2,
        job_id="88",
        replica=1,
        group_rank=1,
        group_size=2,
        leader_addr="10.0.0.3",
        dist_port=29500,
        run_dir="/jobs/run",
    )
    assert len(env) == 12  # no KV events without serve.routing=kv, no GPU slice without the launcher's GPUs
    leader = dataclasses.replace(ctx, rank=spec.ranks[2], kv_events="tcp://*:5557")
    assert RankEnv.from_environ(rank_environment(spec, leader, "/jobs/run", None)).kv_events == "tcp://*:5557"


def test_a_number_that_is_not_one_is_refused_naming_the_variable():
    with pytest.raises(LaunchError, match=r"_LLMLAUNCH_DIST_PORT='x': not a whole number"):
        RankEnv.from_environ({"_LLMLAUNCH_DIST_PORT": "x"})


def test_endpoint_record_round_trips_through_the_run_dir(tmp_path):
    run = RunDir(tmp_path)
    for record in (
        endpoint_record(),
        endpoint_record(frontend=None, http_port=8000, replicas=endpoint_record().replicas[:1]),
    ):
        run.write_endpoint(record)
        assert run.read_endpoint() == record
        assert EndpointRecord.from_json(record.to_json()) == record
    doc = json.loads(run.endpoint_path.read_text())
    assert doc["frontend"] is None and doc["replicas"][0] == {
        "replica": 0,
        "addr": "10.0.0.1",
        "grpc_port": 41001,
        "metrics_url": "http://10.0.0.1:41003/metrics",
    }
    assert set(doc) == {f.name for f in dataclasses.fields(EndpointRecord)}


@pytest.mark.parametrize(
    "change,why",
    [
        (lambda d: d.pop("token"), r"missing fields \['token'\]"),
        (lambda d: d.update(extra=1), r"unknown fields \['extra'\]"),
        (lambda d: d.update(grpc_port="8001"), r"grpc_port: '8001' is not a whole number"),
        (lambda d: d.update(grpc_port=True), r"grpc_port: True is not a whole number"),
        (lambda d: d.update(url=None), r"url: None is not a string"),
        (lambda d: d.update(ranks={"rank": 0}), r"ranks: \{'rank': 0\} is not a list"),
        (lambda d: d["replicas"][1].pop("addr"), r"replicas\[1\]: missing fields \['addr'\]"),
        (lambda d: d.update(frontend={"pid": 1}), r"frontend: missing fields \['processes'\]"),
    ],
)
def test_a_file_that_is_no_record_is_refused_naming_what_is_wrong(tmp_path, change, why):
    run = RunDir(tmp_path)
    doc = endpoint_record().to_dict()
    change(doc)
    run.endpoint_path.write_text(json.dumps(doc))
    with pytest.raises(LaunchError, match=why) as e:
        run.read_endpoint()
    assert str(run.endpoint_path) in str(e.value) and "fix:" in str(e.value)
    with pytest.raises(LaunchError, match="a list where an object of EndpointRecord was expected"):
        EndpointRecord.from_dict([])


def test_handoff_imports_only_the_lowest_layer_and_the_local_launcher_starts_ranks_by_name():
    """Every layer may use launcher.handoff; the local launcher starts ranks as programs (`python -m launcher.rank`),
    so the launch layer does not import the rank layer."""
    graph = import_graph()
    for module in (m for m in graph if m.startswith("launcher.handoff")):
        assert graph[module] <= {"launcher.errors", "launcher.paths", "launcher.handoff.rank_env"}, module
    assert not [m for m in graph["launcher.schedulers.local"] if m.startswith("launcher.rank")]
