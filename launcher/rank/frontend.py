"""What global rank 0 does for a job with replicas > 1: wait for every replica leader, size the front end
(launcher.python_backend.responders), start the front end (launcher/frontend) on the public ports rank 0
reserved at the rendezvous, and wait until it answers ServerReady. launcher/rank/ calls
`start_for_rank0` once rank 0's own server is ready; the front end itself is given replica addresses
and ports, and knows nothing of ranks or run directories."""

from __future__ import annotations

import os
import time
from typing import Dict, List

from launcher.engines.registry import ENGINES
from launcher.frontend import FrontendConfig, FrontendProcess
from launcher.frontend.settings import serve_settings
from launcher.frontend.wire import log
from launcher.kv_events import connect_to
from launcher.paths import PACKAGE_ROOT
from launcher.ports import metrics_url
from launcher.python_backend.responders import responders
from launcher.rank.rendezvous import kv_address
from launcher.rundir import RunDir


def wait_leaders_ready(run_dir, ranks, token: str, deadline_s: float, alive=lambda: True, progress=None):
    """Rank 0: wait until every replica leader of `ranks` wrote ready_rank<N>.json (it answered a real request)
    carrying this rendezvous's `token` (no stale file from an earlier run); (seconds waited, {rank: the ports its
    server bound}: a leader whose port was taken meanwhile retried on others). Raises when a rank wrote a failure
    file, when `alive()` turns false, or at the deadline."""
    run = RunDir(run_dir)
    t0 = time.monotonic()
    last = 0.0
    while True:
        missing, bound = [], {}
        for rank in ranks:
            ready = run.read_ready(rank) or {}
            if token and ready.get("token") == token:
                bound[rank] = ready["ports"]
            else:
                missing.append(rank)
        if not missing:
            return time.monotonic() - t0, bound
        fails = run.failure_files()
        if fails:
            raise RuntimeError(
                f"{fails[0].stem.replace('failure_', '')} failed before every replica was ready ({fails[0]})"
            )
        if not alive():
            raise RuntimeError("this rank's own server exited while waiting for the other replicas")
        elapsed = time.monotonic() - t0
        if elapsed > deadline_s:
            raise TimeoutError(
                f"replica leaders (ranks {missing}) not ready after {deadline_s:.0f}s; raise serve.ready_timeout_s if loading is slow"
            )
        if progress and elapsed - last >= 5:
            last = elapsed
            progress(f"waiting for replica leaders {missing} ({elapsed:.0f}s)")
        time.sleep(0.2)


def frontend_config(spec, leaders: List[dict], bound: Dict[int, dict], ports: Dict[str, int], processes: int):
    """The front end's configuration: the replica leaders' `bound` ports, rank 0's public `ports`, the serve
    settings."""
    return FrontendConfig(
        [(i["addr"], bound[i["rank"]]["grpc_port"]) for i in leaders],
        host=spec.host,
        port=int(ports["grpc_port"]),
        metrics_port=int(ports["metrics_port"]),
        processes=processes,
        replica_metrics=[metrics_url(i["addr"], bound[i["rank"]].get("metrics_port")) for i in leaders],
        # one a replica, in the replicas' order ("": its engine publishes none)
        kv_events=[connect_to(i.get("kv_events", ""), i["addr"]) for i in leaders]
        if spec.serve.routing == "kv"
        else [],
        # disagg: where each prefill replica's engine serves keys and values, as the decode replicas reach it ("" for
        # a decode replica)
        kv_transfer=[
            kv_address(i.get("kv_transfer", ""), i["addr"]) if spec.role(r) == "prefill" else ""
            for r, i in enumerate(leaders)
        ]
        if spec.prefill_replicas
        else [],
        **serve_settings(
            spec.serve,
            ENGINES[spec.engine.name].continues_requests,
            spec.model_name,
            str(spec.model.tokenizer or spec.model.path or ""),
        ),
    )


def start_for_rank0(
    spec,
    run_dir,
    infos: List[dict],
    leaders: List[dict],
    host: str,
    own_ports: Dict[str, int],
    token: str,
    avoid=(),
    alive=lambda: True,
    say=log,
):
    """What global rank 0 does when replicas > 1, once its own server (on `own_ports`) is ready: wait for every
    other replica leader, start the front end on the public ports rank 0 reserved at the rendezvous, wait until it
    answers ServerReady (on fresh ports, none of `avoid`, where another process took them since the rendezvous).
    Returns (FrontendProcess, the endpoint.json fields it serves, {rank: the ports each
    leader's server bound})."""
    deadline_s = float(spec.serve.ready_timeout_s)
    t0 = time.monotonic()
    waited, bound = wait_leaders_ready(
        run_dir, [i["rank"] for i in leaders if i["rank"] != 0], token, deadline_s, alive, say
    )
    bound[0] = dict(own_ports)
    ports = infos[0]["frontend_ports"]
    # launcher.python_backend.responders' rule, from the processes sending each engine's responses; the CPUs are those
    # this rank may use
    processes = responders(
        spec.engine.device,
        len(os.sched_getaffinity(0)),
        ENGINES[spec.engine.name].response_processes(spec.engine),
        len(leaders),
    ).frontend_processes
    say(
        f"all {len(leaders)} replica leaders ready ({waited:.1f}s); starting the front end, {processes} process(es) "
        f"(replicas x engine.response_processes, at most half this rank's CPUs)"
    )
    cfg = frontend_config(spec, leaders, bound, ports, processes)
    env = dict(os.environ)
    root = str(PACKAGE_ROOT)  # `python -m launcher.frontend` from this checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = start_on_free_ports(
        cfg,
        env,
        avoid,
        lambda: max(30.0, deadline_s - (time.monotonic() - t0)),
        say,
        config_path=RunDir(run_dir).frontend_config,
    )
    say(
        f"front end READY on {host}:{cfg.port} for {len(leaders)} replicas; metrics http://{host}:{cfg.metrics_port}/metrics"
    )
    return (
        proc,
        {
            "url": f"grpc://{host}:{cfg.port}",
            "grpc_port": cfg.port,
            "http_port": None,  # the front end speaks gRPC only
            "metrics_port": cfg.metrics_port,
            "metrics_url": metrics_url(host, cfg.metrics_port),
            "frontend": {"pid": proc.proc.pid, "processes": processes},
        },
        bound,
    )


def start_on_free_ports(
    cfg: FrontendConfig, env, avoid, timeout_s, say=log, tries: int = 3, config_path=None
) -> FrontendProcess:
    """The front end started and ready. Something else on the node can take a public port between the rendezvous
    (which checked it free) and the front end's bind; the front end then exits, and it starts again on fresh ports
    (endpoint.json names the ones it serves on), as leaders do for their servers' ports.  `config_path`: where its
    config is written, each start rewriting it (None: a temporary file)."""
    from launcher.ports import pick_ports, port_holders

    for attempt in range(tries):
        proc = FrontendProcess(cfg, env=env, config_path=config_path).start()
        try:
            proc.wait_ready(timeout_s())
            return proc
        except RuntimeError:
            proc.stop()
            held = {p: port_holders(p) for p in (cfg.port, cfg.metrics_port) if p and port_holders(p)}
            if not held or attempt == tries - 1:
                raise
            fresh = pick_ports(
                cfg.host, {"grpc_port": 0, "metrics_port": 0}, avoid=[*avoid, cfg.port, cfg.metrics_port]
            )
            taken = "; ".join(f"port {p} is held by {', '.join(who)}" for p, who in held.items())
            say(f"the front end could not bind ({taken}); starting it again on {fresh}")
            cfg.port, cfg.metrics_port = fresh["grpc_port"], fresh["metrics_port"]
        except BaseException:
            proc.stop()
            raise
    raise AssertionError("unreachable")
