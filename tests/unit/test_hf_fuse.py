"""Fused q/k/v and gate/up projections (launcher/hf/fuse.py): the same logits, one product per group.

Real transformers models with random weights, on CPU: the tiny Llama of launcher.tiny and tiny configs of other
families whose layers differ where fusion could go wrong (Qwen2: q/k/v biases; Qwen3: q/k norms between the
products and the heads; Mistral).
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.engines.hf.config import HFEngineArgs  # noqa: E402
from launcher.hf import fuse as hf_fuse  # noqa: E402
from launcher.hf.engine import Engine, SamplingParams  # noqa: E402
from launcher.hf.reporting import describe_features  # noqa: E402


def tiny_config(family: str, vocab: int = 512):
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True)
    if family == "qwen2":  # q/k/v with biases, o without
        return transformers.Qwen2Config(**common)
    if family == "qwen3":  # RMS norms on q and k per head, after the products
        return transformers.Qwen3Config(**common, head_dim=16)
    if family == "mistral":
        return transformers.MistralConfig(**common)
    raise AssertionError(family)


def random_model(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        for p in model.parameters():  # biases start at zero: make them count
            if p.dim() == 1:
                p.data.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_projections_give_the_same_logits(family):
    model = random_model(tiny_config(family))
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        ref = model(ids).logits
        counts = hf_fuse.fuse_projections(model)
        out = model(ids).logits
    layers = model.config.num_hidden_layers
    assert counts == {"q_proj+k_proj+v_proj": layers, "gate_proj+up_proj": layers}
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert hf_fuse.recomputed(model) == 0  # every part took its columns of the product its group computed once
    attn = model.model.layers[0].self_attn
    assert attn.fused_qkv.weight.shape[0] == attn.q_proj.out_features + 2 * attn.k_proj.out_features
    # one copy of each weight: the fused ones replace the separate ones
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in random_model(tiny_config(family)).parameters()
    )


def test_traced_forward_has_one_product_per_group():
    """What torch.compile sees (Dynamo's graph, fullgraph): per layer one product for q/k/v, o, one for gate/up,
    down, then the LM head: 4 per layer + 1 instead of 7 per layer + 1."""

    def linears(model) -> int:
        seen = []

        def backend(gm, example_inputs):
            seen.append(
                sum(
                    1
                    for n in gm.graph.nodes
                    if n.op == "call_function" and n.target in (torch.nn.functional.linear, torch._C._nn.linear)
                )
            )
            return gm.forward

        torch._dynamo.reset()
        fn = torch.compile(lambda ids: model(ids).logits, backend=backend, fullgraph=True)
        with torch.inference_mode():
            out = fn(torch.arange(3, 20)[None])
        return seen[0], out

    model = random_model(tiny_config("qwen3"))
    layers = model.config.num_hidden_layers
    separate, ref = linears(model)
    assert separate == 7 * layers + 1
    hf_fuse.fuse_projections(model)
    fused, out = linears(model)
    assert fused == 4 * layers + 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_a_part_called_on_another_input_computes_its_product_again(caplog):
    """A layer that does not call its siblings on the same tensor still gets the right numbers (slower, logged
    once); groups whose modules cannot share one product are left alone."""
    lin = torch.nn.Linear

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = lin(8, 8), lin(8, 4), lin(8, 4)
            self.gate_proj, self.up_proj = lin(8, 6), lin(6, 6)  # different inputs: not fusable

        def forward(self, x):
            return (
                self.q_proj(x).sum(-1)
                + self.k_proj(x * 2).sum(-1)
                + self.v_proj(x).sum(-1)
                + self.up_proj(self.gate_proj(x)).sum(-1)
            )

    torch.manual_seed(0)
    m = Odd().eval()
    x = torch.randn(3, 8)
    with torch.inference_mode():
        ref = m(x)
        counts = hf_fuse.fuse_projections(m)
        assert counts == {"q_proj+k_proj+v_proj": 1, "gate_proj+up_proj": 0}
        assert isinstance(m.gate_proj, lin) and isinstance(m.up_proj, lin)
        with caplog.at_level(logging.WARNING, logger="launcher.hf.fuse"):
            for _ in range(3):
                torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)
    assert hf_fuse.recomputed(m) > 0
    assert [r.message for r in caplog.records if "computed again" in r.message] == [
        "hf engine: fused q_proj+k_proj+v_proj: k_proj was called on another input than its siblings; its product is "
        "computed again (correct, slower)"
    ]


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_engine_of_another_family_fused_equals_generate(tiny_model_dir, tmp_path, family):
    """The engine end to end (scheduler, slot attention, fused projections) on a model that is not a Llama, greedy
    against transformers' generate on the unfused model, and the features line that names what was fused."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = tiny_config(family, vocab=len(tok))
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model = random_model(config, seed=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = ["The quick brown fox", "Rain fell all night", "Hello"]
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12, do_sample=False
            )
            refs.append(out[0, ids.shape[1] :].tolist())
    args = HFEngineArgs(model_path=str(tmp_path), device="cpu", dtype="float32", max_num_seqs=4)
    eng = Engine.from_args(args).start()
    try:
        got = [eng.generate(p, SamplingParams(max_tokens=12, ignore_eos=True), timeout=60).token_ids for p in prompts]
        features = eng.features
    finally:
        eng.shutdown()
    assert got == refs, family
    assert "projections fused (q+k+v x2, gate+up x2)" in describe_features(features)
    # a model with nothing fusable (no layer fused) says so
    unfused = {k: 0 for k in features["fused"]}
    assert "projections unfused" in describe_features(dict(features, fused=unfused))
