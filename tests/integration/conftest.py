"""Integration-test fixtures: the private containerd (tests/containerd_fixture.py), cleaned up
after every test, and the `integration` marker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd, containerd

__all__ = ["Containerd", "containerd"]  # the session fixture; Containerd for type annotations

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration gets the `integration` marker (-m 'not integration')."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def clean_runtime(containerd: Containerd) -> Iterator[None]:
    """Each integration test starts from, and leaves, an empty k8s.io namespace."""
    yield
    containerd.reset()
