"""The Go kubelet's container GC flags on our command line."""

from __future__ import annotations

import pytest

from trio_kubelet.cli import UsageError, parse_run_options
from trio_kubelet.core.container_gc import GCPolicy


def test_defaults_are_the_go_kubelets() -> None:
    options = parse_run_options(["--hostname-override", "n"])
    assert options.container_gc == GCPolicy(min_age=0.0, max_per_pod_container=1,
                                            max_containers=-1)


def test_the_three_flags_set_the_policy() -> None:
    options = parse_run_options([
        "--hostname-override", "n",
        "--minimum-container-ttl-duration", "1m30s",
        "--maximum-dead-containers-per-container", "3",
        "--maximum-dead-containers", "100",
    ])
    assert options.container_gc == GCPolicy(min_age=90.0, max_per_pod_container=3,
                                            max_containers=100)
    options = parse_run_options(["--hostname-override", "n",
                                 "--maximum-dead-containers-per-container", "-1"])
    assert options.container_gc.max_per_pod_container == -1, "no limit"


@pytest.mark.parametrize(("flag", "value", "error"), [
    ("--minimum-container-ttl-duration", "-1s", "must not be negative"),
    ("--minimum-container-ttl-duration", "soon", "invalid duration"),
    ("--maximum-dead-containers", "many", "invalid integer"),
])
def test_bad_values_are_refused_naming_the_flag(flag: str, value: str, error: str) -> None:
    with pytest.raises(UsageError, match=f"{flag}: .*{error}"):
        parse_run_options(["--hostname-override", "n", f"{flag}={value}"])
