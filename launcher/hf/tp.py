"""Tensor parallelism for the `hf` engine: the TensorRT-LLM leader pattern.

One process per rank.  Rank 0 (the leader) runs the whole `Engine` (scheduler,
tokenizer, sampling, request I/O); every step it broadcasts the step's
`StepInputs` (plain Python lists) to the worker ranks, and then every rank runs
`HFModelRunner.execute` on its own shard of the model.  Workers run `launcher.hf.worker.run_worker`:
a loop that receives `StepInputs` and executes them; they never see requests.

Sharding (Megatron style, done here on the loaded HF model, no transformers tp_plan):
* q/k/v and gate/up projections are column-parallel: each rank keeps heads
  [r*H/tp, (r+1)*H/tp) and kv heads [r*KVH/tp, ...), and 1/tp of the MLP's
  intermediate features.  Our attention (launcher.hf.attention) and the slot KV cache then
  simply see H/tp query heads and KVH/tp kv heads: the cache per rank is 1/tp.
* o and down projections are row-parallel: each rank multiplies its slice of
  the input features, then an `all_reduce(SUM)` gives every rank the full output
  (bias added once, after the reduction).
* Embeddings, norms and lm_head stay replicated.
tp must divide the attention heads, the kv heads and the MLP intermediate size
(checked when the model is sharded, with a clear error).

Sampling: only the leader samples.  Workers call the model with no logits rows
(`logits_to_keep` empty), so they never compute the lm_head nor keep sampler or
penalty state; the leader's tokens come back to its scheduler, which feeds them
in the next broadcast `StepInputs`.  Nothing random is needed on workers.

Overlap (as with tp=1): the leader queues the next decode step before the last
one's tokens reach the host.  It broadcasts that step as (AHEAD, StepInputs) with
placeholder decode tokens, then the tokens themselves as a device tensor over
NCCL (`broadcast_tensor`, in stream order after the step that sampled them), so
workers never wait for the leader's host either.

CUDA graphs (GPU): each rank captures the same decode and prompt graphs, NCCL
all-reduces inside, at warm-up: the leader broadcasts (WARM_UP, plan) and every
rank runs `HFModelRunner.warm_up`, comparing plans before and graph counts after.
A step then replays a graph or runs eagerly on every rank alike, chosen from the
StepInputs alone.  torch.compile (on for GPUs, as with tp=1) traces the
all-reduce as a functional collective.

Process group: `torch.distributed` with init_method tcp://LEADER_ADDR:DIST_PORT,
world = group size, rank = group rank (env LLMLAUNCH_* set by launcher.rank).
gloo on CPU; on GPU nccl for the all_reduces plus a gloo group for the
(pickled, host-side) StepInputs broadcast.  Collectives have a timeout
(the engine's `tp_timeout_s`, default 120 s) so a hung or dead rank fails the
job instead of hanging it; the idle leader broadcasts a heartbeat every
timeout/4 so idle workers do not time out.  Any failure of a step with tp > 1
is fatal for the engine (the ranks cannot be trusted to be in step any more).
"""

from __future__ import annotations

import datetime
import logging
import os

from launcher.engines.hf.config import DEFAULTS
from launcher.handoff.rank_env import RankEnv

log = logging.getLogger(__name__)

PING = "ping"  # heartbeat of an idle leader
STOP = "stop"  # the leader shuts down: workers leave their loop
WARM_UP = "warm_up"  # (WARM_UP, plan): compile and capture with the leader (HFModelRunner.warm_up)
AHEAD = "ahead"  # (AHEAD, StepInputs): a step launched ahead; its decode tokens follow on the device (overlap)


class TPGroup:
    """This process's place in a tensor-parallel group; `all_reduce` and the StepInputs broadcast."""

    def __init__(
        self,
        size: int,
        rank: int | None = None,
        addr: str | None = None,
        port: int | None = None,
        device_type: str = "cpu",
        timeout: float | None = None,
    ):
        import torch
        import torch.distributed as dist

        env = RankEnv.from_environ(os.environ)  # what launcher.rank says of this rank's model copy
        self.size = int(size)
        self.rank = int(rank if rank is not None else env.group_rank or 0)
        if env.group_size and rank is None and env.group_size != self.size:
            raise ValueError(
                f"tp={self.size} but this model copy has {env.group_size} ranks ({RankEnv.var('group_size')})"
            )
        addr = addr or env.leader_addr or "127.0.0.1"
        port = int(port or env.dist_port or 0)
        if not port:
            raise ValueError(
                f"tensor parallelism needs the leader's port: set {RankEnv.var('dist_port')} "
                "(launcher.rank does) or pass port="
            )
        self.timeout = float(timeout if timeout is not None else DEFAULTS.tp_timeout_s)
        td = datetime.timedelta(seconds=self.timeout)
        backend = "nccl" if device_type == "cuda" else "gloo"
        log.info(
            "hf tp: rank %d/%d joining tcp://%s:%d (%s, timeout %.0f s)",
            self.rank,
            self.size,
            addr,
            port,
            backend,
            self.timeout,
        )
        dist.init_process_group(
            backend, init_method=f"tcp://{addr}:{port}", world_size=self.size, rank=self.rank, timeout=td
        )
        self.group = None  # default group for all_reduce
        self.ctrl = dist.new_group(backend="gloo", timeout=td) if backend != "gloo" else None
        self._dist = dist
        self._torch = torch

    def all_reduce(self, t):
        """Sum `t` over the ranks.  Eagerly (and in a CUDA graph capture) in place; inside torch.compile through
        the functional collective, which Dynamo traces (the in-place call would break the graph)."""
        if self._torch.compiler.is_compiling():
            from torch.distributed import _functional_collectives as funcol

            return funcol.all_reduce(t, "sum", self.group or self._dist.group.WORLD)
        self._dist.all_reduce(t, group=self.group)
        return t

    def broadcast_tensor(self, t):
        """The leader's tensor `t` into every rank's `t` (same shape and dtype), on the device's stream."""
        self._dist.broadcast(t, src=0, group=self.group)
        return t

    def all_gather(self, obj) -> list:
        """Every rank's obj, in rank order (host side, over the gloo group)."""
        out = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def broadcast(self, obj):
        """Leader: send obj; workers: pass None, get the leader's obj."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self.ctrl)
        return box[0]

    def close(self) -> None:
        try:
            self._dist.destroy_process_group()
        except Exception:  # best effort at exit
            pass


# ------------------------------------------------------------------------------------------- sharding
class _RowParallelLinear:
    """Factory for a row-parallel replacement of an nn.Linear (imports torch lazily)."""

    @staticmethod
    def make(linear, rank: int, size: int, tp: TPGroup):
        import torch
        import torch.nn.functional as F

        class RowParallelLinear(torch.nn.Module):
            def __init__(self):
                super().__init__()
                n = linear.in_features // size
                self.weight = torch.nn.Parameter(
                    linear.weight.data[:, rank * n : (rank + 1) * n].contiguous(), requires_grad=False
                )
                self.bias = linear.bias
                self.in_features, self.out_features = n, linear.out_features

            def forward(self, x):
                y = tp.all_reduce(F.linear(x, self.weight))
                if self.bias is not None:
                    y = y + self.bias
                return y

        return RowParallelLinear()


def _column(linear, rank: int, size: int) -> None:
    import torch

    n = linear.out_features // size
    linear.weight = torch.nn.Parameter(linear.weight.data[rank * n : (rank + 1) * n].contiguous(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias.data[rank * n : (rank + 1) * n].contiguous(), requires_grad=False)
    linear.out_features = n


def check_divisible(text_cfg, size: int) -> None:
    heads = text_cfg.num_attention_heads
    kv = getattr(text_cfg, "num_key_value_heads", None) or heads
    inter = getattr(text_cfg, "intermediate_size", None)
    bad = [
        f"{what} ({n})"
        for what, n in (("attention heads", heads), ("kv heads", kv), ("MLP intermediate size", inter))
        if n and n % size
    ]
    if bad:
        raise ValueError(
            f"tp={size} does not divide the model's {', '.join(bad)}; "
            f"use a tp that divides {heads} attention heads and {kv} kv heads"
        )


def shard_model(model, text_cfg, tp: TPGroup) -> None:
    """Shard a loaded Llama-family model in place (attention q/k/v/o_proj, MLP gate/up/down_proj)."""
    size, rank = tp.size, tp.rank
    check_divisible(text_cfg, size)
    attns = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    mlps = [m for m in model.modules() if hasattr(m, "down_proj") and hasattr(m, "up_proj")]
    if not attns or len(mlps) != len(attns):
        raise ValueError(
            f"unsupported architecture for tensor parallelism ({type(model).__name__}): the hf engine "
            f"shards decoder layers with q/k/v/o_proj attention and gate/up/down_proj MLPs; use tp=1"
        )
    for a in attns:
        if not all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise ValueError(
                f"unsupported attention {type(a).__name__} for tensor parallelism "
                f"(needs separate q/k/v/o_proj); use tp=1"
            )
        for n in ("q_proj", "k_proj", "v_proj"):
            _column(getattr(a, n), rank, size)
        a.o_proj = _RowParallelLinear.make(a.o_proj, rank, size, tp)
        for n in ("num_heads", "num_key_value_heads"):  # some versions keep these counts on the module
            if isinstance(getattr(a, n, None), int):
                setattr(a, n, getattr(a, n) // size)
    for m in mlps:
        for n in ("gate_proj", "up_proj"):
            if hasattr(m, n):
                _column(getattr(m, n), rank, size)
        m.down_proj = _RowParallelLinear.make(m.down_proj, rank, size, tp)
