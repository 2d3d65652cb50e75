"""Every test in tests/unit is marked `unit` (`pytest -m unit` selects them), and none may start a server:
launcher.triton.TritonServer.start (which every tritonserver the launcher, the fixture models and the stand-ins
start goes through) raises, and the local Slurm cluster fixture fails. A test that needs either belongs in
tests/integration.

No unit test has a GPU: Triton kernels (launcher.hf.paged_decode) run in Triton's interpreter, which Triton only
enters when TRITON_INTERPRET is set before it is first imported (its library functions are made at import), so it
is set here, at collection, before any test imports it.  An engine never uses a kernel under it
(launcher.hf.warmup)."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

from launcher import triton


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(config.rootpath / "tests" / "unit"):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def no_servers(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise RuntimeError(
            "a unit test started a tritonserver (launcher.triton.TritonServer.start); "
            "move the test to tests/integration"
        )

    monkeypatch.setattr(triton.TritonServer, "start", refuse)


@pytest.fixture(scope="session")
def local_slurm():
    raise RuntimeError("a unit test asked for the local Slurm cluster; move the test to tests/integration")
