"""core/shutdown.py: the rounds of a graceful node shutdown, which pods go in which, their
grace; and admission refusing pods while the node shuts down."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
import trio.testing

from trio_kubelet.config import ConfigError, KubeletConfiguration, load_config_file
from trio_kubelet.core.admission import Rejection, admit
from trio_kubelet.core.shutdown import (
    NODE_SHUTDOWN,
    ShutdownRound,
    assign_rounds,
    pod_grace,
    shutdown_rounds,
    total_grace,
)
from trio_kubelet.events import Event, EvictPod, NodeConditions
from trio_kubelet.model.pod import Pod
from trio_kubelet.node.shutdown import NodeShutdownManager, ShutdownReports


def pod(name: str, **spec: Any) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
        }
    )


def test_two_periods_make_a_regular_and_a_critical_round() -> None:
    rounds = shutdown_rounds(30, 10, ())
    assert rounds == (ShutdownRound(0, 20), ShutdownRound(2_000_000_000, 10))
    assert total_grace(rounds) == 30


def test_no_rounds_without_a_period_or_with_a_critical_part_too_large() -> None:
    assert shutdown_rounds(0, 0, ()) == ()
    assert shutdown_rounds(10, 20, ()) == ()


def test_explicit_rounds_are_sorted_by_priority() -> None:
    rounds = shutdown_rounds(0, 0, [(100000, 5), (0, 20), (2_000_000_000, 10)])
    assert [r.priority for r in rounds] == [0, 100000, 2_000_000_000]


def test_each_pod_goes_to_the_highest_round_not_above_its_priority() -> None:
    rounds = shutdown_rounds(0, 0, [(0, 20), (1000, 10), (2_000_000_000, 5)])
    pods = [
        pod("default"),
        pod("negative", priority=-5),
        pod("exactly", priority=1000),
        pod("between", priority=5000),
        pod("critical", priority=2_000_001_000),
    ]
    groups = assign_rounds(rounds, pods)
    assert [(r.priority, [p.metadata.name for p in members]) for r, members in groups] == [
        (0, ["default", "negative"]),
        (1000, ["exactly", "between"]),
        (2_000_000_000, ["critical"]),
    ]


def test_a_pod_gets_the_rounds_grace_or_its_own_when_shorter() -> None:
    regular = ShutdownRound(0, 20)
    assert pod_grace(pod("long", terminationGracePeriodSeconds=60), regular) == 20
    assert pod_grace(pod("short", terminationGracePeriodSeconds=3), regular) == 3
    assert pod_grace(pod("default"), regular) == 20  # its default 30 s is longer


def test_no_new_pod_is_admitted_while_the_node_shuts_down() -> None:
    assert admit(pod("late"), [], {}, node_conditions=[NODE_SHUTDOWN]) == Rejection(
        "NodeShutdown", "Pod was rejected as the node is shutting down."
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
            "shutdownGracePeriodCriticalPods: 20s must be <= shutdownGracePeriod (10s)",
        ),
        ("shutdownGracePeriod: 500ms\n", "shutdownGracePeriod: 500ms must be either zero"),
        (
            "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n"
            "- {priority: 0, shutdownGracePeriodSeconds: 5}\n",
            "shutdownGracePeriodByPodPriority: cannot be given together",
        ),
        (
            "shutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: -1}\n",
            "shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds: must not be a "
            "negative number",
        ),
    ],
)
def test_bad_shutdown_settings_name_the_field(tmp_path: Any, body: str, message: str) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + body
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config_file(path)


# --- the shell: rounds run in order, each waits for its pods or its grace --------------------


class FakeNode:
    """Pods that stop ``stop_after`` seconds after they are told to."""

    def __init__(self, pods: list[Pod], stop_after: dict[str, float]) -> None:
        self.pods = pods
        self.stop_after = stop_after
        self.kills: list[tuple[str, int, str, float]] = []
        self.conditions: list[tuple[str, tuple[str, ...]]] = []

    def active_pods(self) -> list[Pod]:
        return list(self.pods)

    async def send(self, event: Event) -> None:
        """The sync loop's channel: the kills, and the conditions admission is told."""
        if isinstance(event, EvictPod):
            assert event.message == "Pod was terminated in response to imminent node shutdown."
            self.kills.append((event.pod_uid, event.grace, event.reason, trio.current_time()))
        elif isinstance(event, NodeConditions):
            self.conditions.append((event.source, tuple(event.conditions)))

    def stopped(self, uid: str) -> bool:
        killed = [when for who, _, _, when in self.kills if who == uid]
        return bool(killed) and trio.current_time() >= killed[0] + self.stop_after[uid]


async def test_rounds_stop_regular_pods_then_critical_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = KubeletConfiguration(shutdown_grace_period=30, shutdown_grace_period_critical_pods=10)
    manager = NodeShutdownManager(config, "n1")
    node = FakeNode(
        [
            pod("web", terminationGracePeriodSeconds=5),
            pod("stuck"),
            pod("dns", priority=2_000_001_000),
        ],
        {"web": 3, "stuck": 1000, "dns": 2},
    )
    reported: list[float] = []
    notified: list[bool] = []

    async def pods_stopped() -> None:
        reported.append(trio.current_time())

    manager.reports = ShutdownReports(lambda: notified.append(manager.shutting_down),
                                      pods_stopped)
    assert manager.shutdown_error() is None
    start = trio.current_time()
    await manager.shut_down(node, node.stopped, node.send)
    kills = {uid: (grace, reason, when - start) for uid, grace, reason, when in node.kills}
    assert kills["web"] == (5, "Terminated", 0) and kills["stuck"] == (20, "Terminated", 0)
    # "stuck" never stops: the critical round starts when the regular one's 20 s are up.
    assert kills["dns"] == (10, "Terminated", pytest.approx(20, abs=0.5))
    assert reported and reported[0] - start == pytest.approx(22, abs=0.5)
    assert notified == [True]
    assert manager.shutdown_error() == "node is shutting down"
    assert node.conditions == [("shutdown", ("NodeShutdown",))]  # admission is told first
