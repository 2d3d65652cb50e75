"""Stand-in: vllm.v1.engine.async_llm.AsyncLLM (tests only; see tests/standins/_standin.py).

Same shape as vLLM's: `AsyncLLM.from_engine_args(engine_args)`, `async generate(prompt,
sampling_params, request_id)` yielding RequestOutput (DELTA kind: only new text/tokens),
which aborts the request when the consumer closes it (GeneratorExit/CancelledError), and
`async abort(request_id)`, `shutdown()`.
"""

import asyncio
import dataclasses
import os
import time
from types import SimpleNamespace

import _standin
from vllm.outputs import CompletionOutput, RequestOutput, RequestStateStats
from vllm.sampling_params import RequestOutputKind

ENGINE = "vllm"


# the stand-in's KV cache: a running request holds this share of it (vLLM reports SchedulerStats.kv_cache_usage)
KV_SHARE_PER_REQUEST = 0.125
# what the stand-in's connector reports for one read of a prefill's blocks (NixlKVConnectorStats' figures)
KV_BYTES_PER_BLOCK = 32768
KV_TRANSFER_S = 0.002


class AsyncLLM:
    def __init__(self, engine_args, log_stats: bool = True, stat_loggers=None, vllm_config=None):
        self.engine_args = engine_args
        # vLLM builds each custom stat logger per engine and gives it scheduler statistics as the engine core steps
        self.loggers = [factory(vllm_config, 0) for factory in stat_loggers or ()]
        self.running = 0
        self.log_stats = log_stats  # keeps request statistics (RequestOutput.metrics), as vLLM's
        self.model_config = SimpleNamespace(max_model_len=engine_args.max_model_len or 4096)
        self.aborted = set()
        self.errored = False
        self.moved = None  # NIXL's figures of the reads not yet in a step's statistics (kv_connector_stats.data)
        # a KV connector reads its side channel from the environment as it starts (vllm.envs, NixlConnector)
        side = [os.environ.get(k) for k in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")]
        self.side_channel = (side[0] or "localhost", int(side[1] or 5600))
        # and UCX its transports (what NIXL's reads may use: CUDA IPC's GETs)
        ucx = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
        _standin.record(
            ENGINE, "init", args=dataclasses.asdict(engine_args), side_channel=list(self.side_channel), ucx=ucx
        )

    @classmethod
    def from_engine_args(cls, engine_args, start_engine_loop=True, usage_context=None, stat_loggers=None):
        asyncio.get_running_loop()  # the real one starts its output handler on the running loop
        return cls(engine_args, not engine_args.disable_log_stats or bool(stat_loggers), stat_loggers)

    @classmethod
    def from_vllm_config(
        cls,
        vllm_config,
        start_engine_loop=True,
        usage_context=None,
        stat_loggers=None,
        enable_log_requests=False,
        aggregate_engine_logging=False,
        disable_log_stats=False,
        client_addresses=None,
        client_count=1,
        client_index=0,
    ):
        """A client of an engine core started elsewhere (launch_core_engines), as vLLM's API servers build it."""
        asyncio.get_running_loop()
        if client_addresses is not None and not {"input_address", "output_address"} <= set(client_addresses):
            raise ValueError(f"client_addresses needs input_address and output_address, got {sorted(client_addresses)}")
        _standin.record(
            ENGINE,
            "client",
            client_index=client_index,
            client_count=client_count,
            addresses=client_addresses,
            disable_log_stats=disable_log_stats,
            stat_loggers=[c.__name__ for c in stat_loggers or ()],
            api_process_rank=vllm_config.api_process_rank,
        )
        # vLLM keeps request statistics where it logs them, or where custom stat loggers were given; it builds each
        # logger per engine (an incomplete logger fails there as here)
        return cls(vllm_config.engine_args, not disable_log_stats or bool(stat_loggers), stat_loggers, vllm_config)

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        sp = sampling_params
        _standin.record(
            ENGINE,
            "generate",
            request_id=request_id,
            prompt=prompt,
            sampling={
                k: (v.name if isinstance(v, RequestOutputKind) else v) for k, v in dataclasses.asdict(sp).items()
            },
        )
        if sp.output_kind != RequestOutputKind.DELTA:
            raise ValueError("stand-in supports output_kind=DELTA only (what llmlaunch uses)")
        stop = [sp.stop] if isinstance(sp.stop, str) else (sp.stop or [])
        ids = _standin.prompt_ids(prompt)
        words, start = _standin.continued(prompt)
        cached = _standin.cached_tokens(words)
        self._read_blocks(sp)
        # the engine core's stamps: queued as the request arrives, its first token when the script makes it
        stats = RequestStateStats(arrival_time=time.time(), queued_ts=time.monotonic()) if self.log_stats else None
        self.running += 1
        prompt_step = True  # the request's first output comes from the step that prefilled its prompt
        try:
            async for text, tok, finish in _standin.script(
                words,
                sp.max_tokens,
                sp.min_tokens,
                sp.ignore_eos,
                stop,
                cancelled=lambda: request_id in self.aborted,
                start=start,
            ):
                if stats is not None:
                    stats.last_token_ts = time.monotonic()
                    stats.first_token_ts = stats.first_token_ts or stats.last_token_ts
                    prefilled = (len(ids), len(ids) - cached, time.time() - stats.arrival_time) if prompt_step else None
                    self._record(prefilled, generated=int(tok is not None))
                prompt_step = False
                yield RequestOutput(
                    request_id,
                    prompt,
                    ids,
                    None,
                    [CompletionOutput(0, text, [tok] if tok is not None else [], finish_reason=finish)],
                    finished=finish is not None,
                    metrics=stats,
                    num_cached_tokens=cached,
                    kv_transfer_params=self._transfer(sp, request_id, len(ids)) if finish is not None else None,
                )
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        finally:
            self.running -= 1

    def _transfer(self, sp, request_id, n_prompt):
        """NixlConnector's request_finished, as vLLM 0.25's pull scheduler answers: a prefill for a remote decode
        returns where its blocks wait (this engine's side channel); others, and engines without a connector, None."""
        params = (sp.extra_args or {}).get("kv_transfer_params")
        config = self.engine_args.kv_transfer_config
        if config is None or not params or not params.get("do_remote_decode"):
            return None
        host, port = self.side_channel
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(max(1, n_prompt // 16)))],
            "remote_engine_id": config.engine_id,
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": self.engine_args.tensor_parallel_size,
            "remote_num_tokens": n_prompt,
        }

    def _read_blocks(self, sp):
        """A decode with a prefill's kv_transfer_params reads its blocks (NIXL on a GPU): the next step's statistics
        report the read as NixlKVConnectorStats does, its bytes the handle's blocks'."""
        params = (sp.extra_args or {}).get("kv_transfer_params") or {}
        if self.engine_args.kv_transfer_config is None or not params.get("do_remote_prefill"):
            return
        blocks = sum(len(b) for b in params.get("remote_block_ids") or ())
        self.moved = self.moved or {k: [] for k in ("transfer_duration", "bytes_transferred", "num_failed_transfers")}
        self.moved["transfer_duration"].append(KV_TRANSFER_S)
        self.moved["bytes_transferred"].append(blocks * KV_BYTES_PER_BLOCK)

    def _record(self, prefilled, generated: int):
        """A step's statistics to the stat loggers, as vLLM's output handler gives them: its SchedulerStats and the
        IterationStats of its outputs.  The stand-in steps each request on its own: a step is one request's prompt
        (`prefilled`: its tokens, those computed, not the prefix cache's, and the seconds to its first token) or one
        decode row; `generated` is the tokens it made (none for its EOS, an output without a token).  It runs every
        request it has at once, so none waits; with cudagraph_metrics a decode step replays a FULL graph and a
        prompt's step runs PIECEWISE, as vLLM's FULL_AND_PIECEWISE mode does."""
        usage = min(1.0, self.running * KV_SHARE_PER_REQUEST)
        moved, self.moved = self.moved, None
        total, computed, to_first = prefilled or (0, 0, None)
        graph = None
        if self.engine_args.cudagraph_metrics:  # CUDAGraphStat: the stand-in pads nothing
            tokens = computed if prefilled else 1
            graph = SimpleNamespace(
                num_unpadded_tokens=tokens,
                num_padded_tokens=tokens,
                num_paddings=0,
                runtime_mode="PIECEWISE" if prefilled else "FULL",
            )
        outputs = SimpleNamespace(
            num_generation_tokens=generated,
            num_prompt_tokens=total,
            prompt_token_stats=SimpleNamespace(computed=computed, cached_tokens=total - computed, total=total),
            time_to_first_tokens_iter=[to_first] if prefilled else [],
        )
        for logger in self.loggers:
            stats = SimpleNamespace(
                kv_cache_usage=usage,
                num_running_reqs=self.running,
                num_waiting_reqs=0,
                num_skipped_waiting_reqs=0,
                kv_connector_stats=moved,
                cudagraph_stats=graph,
            )
            logger.record(stats, outputs)

    async def abort(self, request_id, internal=False):
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if rid not in self.aborted:
                self.aborted.add(rid)
                _standin.record(ENGINE, "abort", request_id=rid)

    def shutdown(self, timeout=None):
        _standin.record(ENGINE, "shutdown")
