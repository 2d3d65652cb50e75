"""One vLLM engine core with several front ends (`AsyncLLM` clients), as `vllm serve --api-server-count N` runs it.

The served vLLM model (launcher/engines/vllm/model.py, `engine.frontends`) and its in-process yardstick
(benchmark/engine_yardstick.py --frontends) build the same layout through these functions: whoever starts the
core calls `launch_core` (vLLM's own `launch_core_engines` for N clients; it returns once the core has loaded and
said it is ready), and every front end k builds `client(...)` on the address pair `info["inputs"][k]` /
`info["outputs"][k]`. The core sends each request's outputs to the client that sent it. A client may bind its
sockets after the core is up: the core's ready message and outputs wait in its queues.
"""

from __future__ import annotations


def vllm_kwargs(kwargs: dict) -> dict:
    """AsyncEngineArgs' keyword arguments with the config fields given as mappings (model.json, KV events) made into
    vLLM's config objects.  The served model passes the mappings between processes, and each process that builds
    an engine config (the engine core's, every front end's) makes the objects of its own."""
    out = dict(kwargs)
    if isinstance(out.get("kv_events_config"), dict):
        from vllm.config.kv_events import KVEventsConfig

        out["kv_events_config"] = KVEventsConfig(**out["kv_events_config"])
    if isinstance(out.get("kv_transfer_config"), dict):
        from vllm.config.kv_transfer import KVTransferConfig

        out["kv_transfer_config"] = KVTransferConfig(**out["kv_transfer_config"])
    return out


def engine_config(kwargs: dict, count: int, rank: int):
    """(AsyncEngineArgs, VllmConfig) of front end `rank` of `count` (-1: the process that only launches the core),
    as vLLM's API servers set `_api_process_count` / `_api_process_rank`."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = AsyncEngineArgs(**kwargs)
    args._api_process_count, args._api_process_rank = count, rank
    return args, args.create_engine_config(UsageContext.ENGINE_CONTEXT)


def launch_core(args, config, count: int) -> tuple:
    """Start the engine core for `count` clients; ((process manager, coordinator), the clients' addresses)."""
    from vllm.v1.engine.utils import get_engine_zmq_addresses, launch_core_engines
    from vllm.v1.executor import Executor

    addresses = get_engine_zmq_addresses(config, count)
    with launch_core_engines(config, Executor.get_class(config), not args.disable_log_stats, addresses, count) as (
        manager,
        coordinator,
        addresses,
        _,
    ):
        pass
    info = {
        "inputs": list(addresses.inputs),
        "outputs": list(addresses.outputs),
        "stats": addresses.frontend_stats_publish_address,
    }
    return (manager, coordinator), info


def client(
    config,
    count: int,
    index: int,
    info: dict,
    stats: bool,
    log_stats: bool,
    kv_usage=None,
    transfers=None,
    steps=None,
):
    """Front end `index`'s AsyncLLM (on the running event loop) of the core `info` describes.  `stats`: keep the
    requests' statistics (each RequestOutput's metrics: its queue and first-token stamps, which the served model's
    first-token split reads); `log_stats`: also log the engine's and publish its Prometheus figures (one front end
    does, or each would log its own share); kv_usage: a counters.Latest given the engine's KV-cache use as its
    scheduler statistics come (engine_stats_logger); transfers: a counters.KVTransfers given the KV connector's
    transfers in the statistics this front end receives, and steps a counters.EngineSteps given the engine steps they
    report (vLLM sends each step's to one front end: the front ends' sums are the engine's)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    addresses = {"input_address": info["inputs"][index], "output_address": info["outputs"][index]}
    if info.get("stats"):
        addresses["stats_update_address"] = info["stats"]
    # vLLM keeps request statistics where it logs them, or where it has a logger of its own to give them to: a
    # logger that only keeps the engine's figures keeps the statistics without a second log
    loggers = [engine_stats_logger(kv_usage, transfers, steps)] if kv_usage is not None and stats else None
    return AsyncLLM.from_vllm_config(
        config,
        client_addresses=addresses,
        client_count=count,
        client_index=index,
        disable_log_stats=not (stats and log_stats),
        stat_loggers=loggers,
    )


def engine_stats_logger(latest, transfers=None, steps=None):
    """A vLLM stat logger class (StatLoggerBase, as vLLM 0.25 defines it) that logs nothing and keeps the engine's
    figures for the served model's metrics port, from each call vLLM's output handler makes with a batch of outputs:
    `latest` (a counters.Latest) the share of the KV cache in use (SchedulerStats.kv_cache_usage; gpu_cache_usage in
    older releases), which the model sets as llmlaunch_engine_kv_cache_usage (serve.autoscale.signal=kv_cache);
    `transfers` (a counters.KVTransfers, where given) the KV connector's transfers of the step
    (SchedulerStats.kv_connector_stats): llmlaunch_kv_transfer*; `steps` (a counters.EngineSteps, where given) the
    engine step the scheduler statistics stand for and the batch's tokens (IterationStats): llmlaunch_engine_steps and
    the rest of VLLM_STEP_COUNTERS.  vLLM's own log of them stops when it serves more than one front end; these
    counters do not."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class EngineStatsLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, *args, **kwargs):
            usage = getattr(scheduler_stats, "kv_cache_usage", getattr(scheduler_stats, "gpu_cache_usage", None))
            if usage is not None:
                latest.set(usage)
            moved = getattr(scheduler_stats, "kv_connector_stats", None)
            if transfers is not None and moved:
                transfers.add_vllm(moved)
            if steps is not None:
                steps.add_vllm(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    return EngineStatsLogger


def stop_core(core) -> None:
    """Shut down what `launch_core` started."""
    for part in core:
        if part is not None:
            part.shutdown()
