"""A tensor-parallel worker rank of the hf engine (group rank > 0): its shard of the model, running every step the
leader broadcasts (launcher/hf/tp.py has the group and the protocol), in the engine process launcher/hf/client.py
starts for a worker's model instance."""

from __future__ import annotations

import logging
import os
import sys
import threading

from launcher.engines.hf.config import DEFAULTS, HFEngineArgs
from launcher.hf.runner import HFModelRunner
from launcher.hf.tp import AHEAD, STOP, WARM_UP, TPGroup

log = logging.getLogger(__name__)


def run_worker(
    model_path: str,
    tp: int,
    device: str = "auto",
    dtype: str = "auto",
    max_num_seqs: int = 64,
    max_model_len: int | None = None,
    attn_implementation: str = "sdpa",
    kv_cache_memory: float | None = None,
    block_size: int = DEFAULTS.block_size,
    threads: int | None = None,
    on_ready=None,
    group: TPGroup | None = None,
    cudnn_attention: str | None = None,
    cuda_graphs: bool | None = None,
    torch_compile: bool | None = None,
    prefill_graphs: int | None = None,
    tp_timeout_s: float | None = None,
    **_ignored,
) -> None:
    """A worker rank: build the runner on this rank's shard, then execute every StepInputs the leader
    broadcasts until it says stop; when the leader warms up (compiles, captures CUDA graphs) the worker does the
    same steps with it.  Raises (after the collective timeout at the latest) when the leader dies."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    runner = HFModelRunner(
        model_path,
        device=device,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        attn_implementation=attn_implementation,
        kv_cache_memory=kv_cache_memory,
        block_size=block_size,
        tp=tp,
        tp_group=group,
        cudnn_attention=cudnn_attention,
        cuda_graphs=cuda_graphs,
        torch_compile=torch_compile,
        prefill_graphs=prefill_graphs,
        **({} if tp_timeout_s is None else {"tp_timeout_s": tp_timeout_s}),
    )
    if runner.tp_group.rank == 0:
        raise ValueError("run_worker runs the worker ranks (group rank > 0); rank 0 runs the Engine")
    if on_ready is not None:
        on_ready(runner)
    tpg = runner.tp_group
    steps = 0
    try:
        while True:
            step = tpg.broadcast(None)
            if isinstance(step, tuple) and step[0] == WARM_UP:
                runner.warm_up(step[1]["max_prefill_tokens"])
                continue
            if isinstance(step, tuple) and step[0] == AHEAD:
                runner.execute(step[1], sample=False, ahead=True)
                steps += 1
                continue
            if isinstance(step, str):
                if step == STOP:
                    log.info("hf tp worker %d: leader stopped after %d steps", tpg.rank, steps)
                    return
                continue  # PING
            runner.execute(step, sample=False)
            steps += 1
    finally:
        tpg.close()


def serve(conn, args: HFEngineArgs) -> int:
    """A tensor-parallel worker rank's engine process: `run_worker` on a thread; exits when it ends or the parent goes."""
    lock = threading.Lock()
    ready = threading.Event()

    def on_ready(runner) -> None:
        ready.set()
        with lock:
            conn.send(
                (
                    "ready",
                    {
                        "max_model_len": runner.max_model_len,
                        "max_num_seqs": runner.max_num_seqs,
                        "vocab_size": runner.vocab_size,
                        "device": str(runner.device),
                        "dtype": str(runner.dtype).replace("torch.", ""),
                        "pid": os.getpid(),
                        "role": "worker",
                        "tp_rank": runner.tp_group.rank,
                    },
                )
            )

    def work() -> None:
        code = 0
        try:
            run_worker(args.model_path, on_ready=on_ready, threads=args.torch_threads or None, **args.runner_kwargs())
        except BaseException as exc:
            code = 3
            log.error("hf tp worker failed: %r", exc)
            if not ready.is_set():
                try:
                    with lock:
                        conn.send(("error", f"{type(exc).__name__}: {exc}"))
                except OSError:
                    pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # leader stopped (0) or failed (3): this process ends either way

    threading.Thread(target=work, name="hf-tp-worker", daemon=True).start()
    try:
        while conn.recv()[0] != "stop":
            pass
    except (EOFError, OSError):
        pass
    return 0
