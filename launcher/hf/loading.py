"""Loading the `hf` engine's model: the weights onto the device (sharded first with tp > 1), the model's shape as the
runner sees it, and the slot KV cache sized from it.

Its own module: everything here runs once, before the first step, and decides what the rest of the runner works
with (device, dtype, this rank's kv heads, max_model_len, the cache); the step path (runner.py) only reads it.
HFModelRunner takes these methods from `ModelLoading`.
"""

from __future__ import annotations

import logging

from launcher.hf.attention import ATTN_NAME
from launcher.stage import announce

log = logging.getLogger("launcher.hf.runner")  # the runner's one logger, whichever of its modules logs


def use_llmlaunch_inductor_cache() -> None:
    """Inductor keeps what it compiled in /tmp by default, which a cluster node forgets between jobs; under the
    llmlaunch cache (in the home directory, which the nodes share) the next start of the same model and settings
    loads it instead of compiling again.  A directory the user chose stays.  (Importing Inductor, which loading a
    model does, writes its default into the environment; that one is replaced.)"""
    import os

    from launcher.paths import cache_root

    key, ours = "TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor")
    current = os.environ.get(key)
    if current is None:
        os.environ[key] = ours
        return
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # older torch
        from torch._inductor.runtime.runtime_utils import default_cache_dir
    if os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ[key] = ours


def resolve_dtype(dtype: str, device_type: str, config):
    """auto: float32 on CPU, else the checkpoint's half type (bfloat16 when it says float32)."""
    import torch

    if dtype in (None, "", "auto"):
        if device_type == "cpu":
            return torch.float32  # bf16 matmuls are slow on most CPUs
        cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(cfg, str):
            cfg = getattr(torch, cfg, None)
        return cfg if cfg in (torch.float16, torch.bfloat16) else torch.bfloat16
    names = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
    value = getattr(torch, names.get(dtype, dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, float16, bfloat16")
    return value


class ModelLoading:
    """The loading part of HFModelRunner: `_load_model` sets device, dtype, tp, tp_group, model, fused, config and
    the model's shape (num_layers, num_kv_heads, head_dim, vocab_size, max_model_len); `_allocate_cache` the cache."""

    def _load_model(self, model_path, device, dtype, max_model_len, tp, tp_group, tp_timeout_s, torch_compile) -> None:
        """Load `model_path` onto `device` (auto: cuda where there is one) in `dtype` (resolve_dtype); tp > 1: join
        the tensor-parallel group (`tp_group`, or one from the rank's environment timing out after `tp_timeout_s`)
        and shard the model on the host before moving it.  max_model_len: None for the model's context, capped at a
        sliding window (and, once the pool is sized, at what one sequence can hold: `_allocate_cache`).  torch_compile=False leaves the Inductor cache directory alone."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from launcher.hf import fuse as hf_fuse

        if device in (None, "", "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if torch_compile is not False:
            use_llmlaunch_inductor_cache()
        config = AutoConfig.from_pretrained(model_path)
        self.dtype = resolve_dtype(dtype, self.device.type, config)
        announce(f"hf engine: loading {model_path} ({str(self.dtype).replace('torch.', '')}) on {self.device}")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, attn_implementation="sdpa")
        # switch every (sub)config to our attention after loading: loading validates the name against the
        # built-in list in some transformers versions, the forward only looks it up in AttentionInterface.
        for cfg in (model.config, getattr(model.config, "text_config", None)):
            if cfg is not None:
                cfg._attn_implementation = ATTN_NAME
        text_cfg = getattr(model.config, "text_config", None) or model.config
        self.tp = int(tp or 1)
        self.tp_group = None
        if self.tp > 1:
            from launcher.hf import tp as hf_tp

            hf_tp.check_divisible(text_cfg, self.tp)  # before joining the group: a clear error, no hang
            if self.device.type == "cuda" and self.device.index is None:
                # set_device needs an index.  Ranks that see several GPUs (no per-rank CUDA_VISIBLE_DEVICES)
                # take one per local rank; a rank given its own GPU sees it as cuda:0.
                import os

                from launcher.handoff.rank_env import RankEnv

                local = RankEnv.from_environ(os.environ).local_rank or 0
                self.device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # before the process group: NCCL uses the current device
            self.tp_group = tp_group or hf_tp.TPGroup(self.tp, device_type=self.device.type, timeout=tp_timeout_s)
            hf_tp.shard_model(model, text_cfg, self.tp_group)  # on the host, before moving the shard
        self.model = model.to(self.device).eval()
        # after sharding: a rank fuses its own shards; on the device: the concatenation is a device copy
        self.fused = hf_fuse.fuse_projections(self.model)
        self.config = model.config
        self.num_layers = text_cfg.num_hidden_layers
        # kv heads of this rank (all of them with tp=1): the cache and our attention only see these
        self.num_heads = text_cfg.num_attention_heads // self.tp  # query heads of this rank
        self.num_kv_heads = (getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads) // self.tp
        self.head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
        self.vocab_size = text_cfg.vocab_size
        limit = getattr(text_cfg, "max_position_embeddings", None) or 2048
        # Sliding-window layers attend to the last `window` tokens only; our attention is full, which is the same
        # thing as long as no sequence is longer than the window.
        window = getattr(text_cfg, "sliding_window", None)
        if window and (getattr(text_cfg, "use_sliding_window", True) or getattr(text_cfg, "layer_types", None)):
            limit = min(limit, int(window))
        self.model_len = limit  # the model's own context
        self.max_model_len_asked = int(max_model_len or 0)  # the user's limit; 0: none
        self.max_model_len = int(max_model_len) if max_model_len else limit
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's context of {limit} tokens")

    # bytes of the pool on CPU unless kv_cache_memory says: a laptop's share, 11,000 of the default model's tokens
    CPU_KV_CACHE = 2**29
    GPU_KV_SHARE = 0.85  # of the GPU memory free once the weights are loaded, unless kv_cache_memory says

    def _allocate_cache(self, budget: float | None, block_size: int) -> None:
        """The KV-cache pool (launcher.hf.blocks): `budget` bytes (None: CPU_KV_CACHE on CPU, GPU_KV_SHARE of the free
        GPU memory) in blocks of `block_size` tokens, per layer keys and values [blocks, block_size, kv_heads,
        head_dim]; the block tables [max_num_seqs + spare rows, blocks a sequence may hold], all null (block 0).
        max_model_len is capped at what one sequence can hold in the pool.  With tp > 1 every rank takes the
        smallest pool of the group, so that the leader's block ids are valid on every rank."""
        import torch

        if block_size < 1 or 256 % block_size:
            raise ValueError(f"block_size {block_size} must divide 256 (1, 2, 4, ..., 256); 16 is the usual choice")
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        per_token = self.num_layers * self.num_kv_heads * self.head_dim * itemsize * 2
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = self.GPU_KV_SHARE * free
            else:
                budget = self.CPU_KV_CACHE
        num_blocks = int(budget // (per_token * block_size))
        if self.tp_group is not None:
            num_blocks = min(self.tp_group.all_gather(num_blocks))
        if num_blocks < 2:
            raise ValueError(
                f"the KV-cache pool of {budget / 2**30:.2f} GiB holds {num_blocks} blocks of {block_size} tokens "
                f"({per_token * block_size / 2**20:.1f} MiB each for this model): give the engine more "
                f"(kv_cache_memory, in GiB)"
            )
        pool_tokens = (num_blocks - 1) * block_size  # block 0 is the null block
        if self.max_model_len > pool_tokens:
            if self.max_model_len_asked:
                raise ValueError(
                    f"max_model_len {self.max_model_len} is more than the KV-cache pool holds ({pool_tokens} tokens "
                    f"in {budget / 2**30:.2f} GiB): lower max_model_len or raise kv_cache_memory"
                )
            self.max_model_len = pool_tokens
        self.block_size, self.num_blocks = block_size, num_blocks
        self.kv_cache_bytes = num_blocks * block_size * per_token
        self.max_blocks = -(-self.max_model_len // block_size)  # blocks one sequence may hold
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        self._pool_maps = []  # CPU: the anonymous mappings under the pool (kept alive with it)
        self.cache = [(self._zeros(shape), self._zeros(shape)) for _ in range(self.num_layers)]
        # one row per slot, and the spare row padded rows of a graph use: its blocks are the null block
        self.block_table = torch.zeros(self.max_num_seqs + 1, self.max_blocks, dtype=torch.long, device=self.device)
        full = pool_tokens // self.max_model_len
        log.info(
            "hf engine: KV cache %d blocks x %d tokens = %d tokens, %.2f GiB; max_model_len %d (%d sequences of "
            "that length fit)",
            num_blocks - 1,
            block_size,
            pool_tokens,
            num_blocks * block_size * per_token / 2**30,
            self.max_model_len,
            full,
        )

    def _zeros(self, shape):
        """A zeroed pool tensor.  On CPU over an anonymous mapping: its pages are zeros the OS hands out only when
        first written, so the pool costs the memory of the blocks used so far, not its size from the start (a
        masked-out position must still read as a number, which a zero page is).  Blocks freed stay cached (prefix
        caching) while untouched ones are taken first, so under a long load the whole pool becomes resident."""
        import math
        import mmap

        import torch

        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        buf = mmap.mmap(-1, math.prod(shape) * itemsize)
        self._pool_maps.append(buf)
        return torch.frombuffer(buf, dtype=self.dtype).view(shape)

    def read_blocks(self, blocks: list[int]):
        """Keys and values of pool blocks `blocks`, [layers, 2, blocks, block_size, kv_heads, head_dim], copied to
        the host (launcher.hf.kv_transfer.KVPrefix.data)."""
        import torch

        idx = torch.tensor(blocks, dtype=torch.long, device=self.device)
        k0 = self.cache[0][0]
        out = torch.empty((len(self.cache), 2, len(blocks), *k0.shape[1:]), dtype=k0.dtype, device=self.device)
        for layer, (k, v) in enumerate(self.cache):  # gathered once, into place
            torch.index_select(k, 0, idx, out=out[layer, 0])
            torch.index_select(v, 0, idx, out=out[layer, 1])
        return out.cpu()

    def write_blocks(self, blocks: list[int], data) -> None:
        """Pool blocks `blocks` take keys and values `data` (as read_blocks gives them), in stream order: a step
        launched after this reads them written."""
        import torch

        idx = torch.tensor(blocks, dtype=torch.long, device=self.device)
        data = data.to(self.device, non_blocking=True)
        for layer, (k, v) in enumerate(self.cache):
            k.index_copy_(0, idx, data[layer, 0])
            v.index_copy_(0, idx, data[layer, 1])

    def apply_block_updates(self, updates) -> None:
        """A step's block-table changes ((slot, from block index, block ids)), in one host->device copy."""
        import torch

        if not updates:
            return
        rows, cols, vals = [], [], []
        for slot, start, blocks in updates:
            rows.extend([slot] * len(blocks))
            cols.extend(range(start, start + len(blocks)))
            vals.extend(blocks)
        idx = torch.tensor([rows, cols, vals], dtype=torch.long).to(self.device, non_blocking=True)
        self.block_table[idx[0], idx[1]] = idx[2]

    def _layer_idx_check(self) -> None:
        idx = sorted(
            getattr(m, "layer_idx", -1)
            for m in self.model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")
        )
        if idx and idx != list(range(self.num_layers)):
            raise ValueError(
                f"unsupported architecture: attention layer indices {idx[:8]}... do not match {self.num_layers} layers"
            )
