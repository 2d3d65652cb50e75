"""Every test in tests/integration is marked `integration` (`pytest -m integration` selects them)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(config.rootpath / "tests" / "integration"):
            item.add_marker(pytest.mark.integration)
