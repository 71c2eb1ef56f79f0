"""core/container_ids.py: the status form ``<runtime>://<id>`` and the bare runtime id."""

from __future__ import annotations

import pytest

from trio_kubelet.core.container_ids import runtime_id, status_container_id


def test_round_trip() -> None:
    assert status_container_id("containerd", "abc") == "containerd://abc"
    assert status_container_id("cri-o", "c1") == "cri-o://c1"
    assert runtime_id(status_container_id("containerd", "abc")) == "abc"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        ("", ""),
        ("abc", "abc"),  # already bare: unchanged
        ("containerd://", "containerd://"),  # no id after the prefix: unchanged
        ("docker://a://b", "a://b"),  # only the first separator is the runtime's
    ],
)
def test_runtime_id_edge_cases(value: str | None, expected: str) -> None:
    assert runtime_id(value) == expected
