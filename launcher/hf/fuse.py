"""One matrix product where HF's decoder layers run several on the same input: q/k/v and gate/up.

Why: at batch 1 a decode step's products read every weight once, and the small ones do it badly.
On an H100 the 1.24 B Llama's k and v projections
(2048 x 512) ran at 0.4 TB/s and q at 1.4 TB/s, where the large products reach 2.5-2.9 TB/s:
each is a kernel too short to fill the GPU.  Concatenating a layer's q, k and v weights
([q; k; v], one [2048 + 512 + 512, 2048] matrix) makes one product of the size that runs
near the copy bandwidth; gate and up the same ([gate; up]).  Every step shape gains: decode
rows, prompt chunks, waves, eager or replayed in a CUDA graph, compiled or not.

How, without rewriting the model's forward: HF's attention calls
`self.q_proj(h)`, `self.k_proj(h)`, `self.v_proj(h)` one after the other on the same
tensor `h` (Llama, Mistral, Qwen2/3, Gemma, Granite, OLMo2 alike, in every transformers
version since 4.x), and its MLP `self.gate_proj(x)`, `self.up_proj(x)`.  Each of those
modules is replaced by a `_Part` of one `FusedLinear`: the first part called with `h`
computes the whole product and keeps it; the others, called with the same tensor `h`
(checked by identity), take their columns of it, and the last one drops it.  A part called
with another input computes the product again: always correct, only slower, and logged once.
torch.compile traces the keeping and the identity checks (plain Python state), so the
compiled graph holds one product and the slices, nothing else.

Tensor parallelism: `fuse_projections` runs after `launcher.hf.tp.shard_model`, so a rank fuses its own
column shards of q, k, v (and gate, up); the row-parallel o/down projections are untouched.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# the groups fused: (the FusedLinear's name in the layer, the sibling modules the layer calls on the same input)
GROUPS = (("fused_qkv", ("q_proj", "k_proj", "v_proj")), ("fused_gate_up", ("gate_proj", "up_proj")))


def _make_classes():
    import torch
    import torch.nn.functional as F

    class FusedLinear(torch.nn.Module):
        """The concatenated weight (and bias) of a group; its parts are the group's former modules."""

        def __init__(self, linears, names):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.cat([m.weight.data for m in linears]), requires_grad=False)
            has_bias = linears[0].bias is not None
            self.bias = (
                torch.nn.Parameter(torch.cat([m.bias.data for m in linears]), requires_grad=False) if has_bias else None
            )
            self.names = tuple(names)
            self.in_features = linears[0].in_features
            self.out_features = int(self.weight.shape[0])
            # [(input, product, parts taken) kept from the first part's call until every part took its columns, or
            # None; eager calls where a part's input was not the one kept (see _Part.forward)].  A list, not
            # attributes: torch.compile traces a list's item writes as side effects of plain Python state.
            self.state = [None, 0]

        def extra_repr(self) -> str:
            return f"{'+'.join(self.names)}: in_features={self.in_features}, out_features={self.out_features}"

    class _Part(torch.nn.Module):
        """Columns [lo, hi) of a FusedLinear's product: stands where nn.Linear `name` was."""

        def __init__(self, group, index: int, lo: int, hi: int):
            super().__init__()
            object.__setattr__(self, "group", group)  # not a submodule: the weight belongs to the layer once
            self.index, self.lo, self.hi = index, lo, hi
            self.in_features, self.out_features = group.in_features, hi - lo

        def forward(self, x):
            g = self.group
            state = g.state
            pending = state[0]
            if pending is None or pending[0] is not x or self.index in pending[2]:
                if pending is not None and not torch.compiler.is_compiling():
                    state[1] += 1
                    if state[1] == 1:
                        log.warning(
                            "hf engine: fused %s: %s was called on another input than its siblings; its "
                            "product is computed again (correct, slower)",
                            "+".join(g.names),
                            g.names[self.index],
                        )
                pending = (x, F.linear(x, g.weight, g.bias), ())
            taken = pending[2] + (self.index,)
            # the last part drops the kept product: nothing outlives the layer (nor leaves a compiled graph)
            state[0] = None if len(taken) == len(g.names) else (pending[0], pending[1], taken)
            return pending[1][..., self.lo : self.hi]

        def extra_repr(self) -> str:
            return f"{self.group.names[self.index]} = columns [{self.lo}, {self.hi}) of the fused product"

    return FusedLinear, _Part


_classes = functools.cache(_make_classes)  # torch is imported on first use, the classes made once


def _fusable(linears) -> bool:
    import torch

    first = linears[0]
    return (
        all(type(m) is torch.nn.Linear for m in linears)  # not quantized or tensor-parallel replacements
        and len({(m.in_features, m.weight.dtype, m.weight.device) for m in linears}) == 1
        and len({m.bias is None for m in linears}) == 1
        and first.weight.dim() == 2
    )


def fuse_projections(model) -> dict:
    """Replace each layer's q/k/v (gate/up) nn.Linear siblings by parts of one FusedLinear, in place.
    Returns {"q_proj+k_proj+v_proj": layers fused, "gate_proj+up_proj": ...}; a group whose modules differ in
    input size, dtype, device or bias (or are not plain nn.Linear) is left as it is."""
    FusedLinear, Part = _classes()
    counts = {"+".join(names): 0 for _, names in GROUPS}
    for parent in list(model.modules()):
        for attr, names in GROUPS:
            linears = [getattr(parent, n, None) for n in names]
            if any(m is None for m in linears) or not _fusable(linears):
                continue
            group = FusedLinear(linears, names)
            setattr(parent, attr, group)
            lo = 0
            for i, (name, m) in enumerate(zip(names, linears)):
                hi = lo + m.out_features
                setattr(parent, name, Part(group, i, lo, hi))
                lo = hi
            counts["+".join(names)] += 1
    return counts


def recomputed(model) -> int:
    """Eager calls, so far, where a fused group's product had to be computed twice for one layer call."""
    FusedLinear, _ = _classes()
    return sum(m.state[1] for m in model.modules() if isinstance(m, FusedLinear))
