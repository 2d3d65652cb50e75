"""Every test in tests/unit is marked `unit` (`pytest -m unit` selects them), and none may start a server:
launcher.triton.TritonServer.start (which every tritonserver the launcher, the fixture models and the stand-ins
start goes through) raises, and the local Slurm cluster fixture fails. A test that needs either belongs in
tests/integration."""

import pytest

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
