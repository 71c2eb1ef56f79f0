"""Requests and limits → cgroup settings (core/resources.py)."""

from __future__ import annotations

from trio_kubelet.core.resources import LinuxResources, linux_resources
from trio_kubelet.model.pod import Container


def resources(requests: dict | None = None, limits: dict | None = None) -> LinuxResources:
    return linux_resources(Container.model_validate({
        "name": "c", "image": "i",
        "resources": {"requests": requests or {}, "limits": limits or {}},
    }))


def test_best_effort_gets_minimum_shares_and_no_limits():
    assert resources() == LinuxResources(2, 0, 0, 0)


def test_cpu_request_sets_shares_and_limit_sets_quota():
    got = resources({"cpu": "250m"}, {"cpu": "1500m", "memory": "128Mi"})
    assert got == LinuxResources(256, 150_000, 100_000, 128 * 1024 * 1024)


def test_missing_cpu_request_falls_back_to_limit():
    assert resources(limits={"cpu": "2"}).cpu_shares == 2048


def test_tiny_values_are_clamped():
    got = resources({"cpu": "1m"}, {"cpu": "1m"})
    assert (got.cpu_shares, got.cpu_quota) == (2, 1000)
