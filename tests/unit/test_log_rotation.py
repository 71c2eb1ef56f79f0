"""Container log rotation: the pure plan, and the shell over the fake runtime."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_container_gc_shell import WEB, Node, node
from tests.unit.test_sync_loop import ListRecorder, replay_through_file
from trio_kubelet.core.log_rotation import RotationPolicy, plan_rotation
from trio_kubelet.reconcile.log_rotation import ContainerLogRotation
from trio_kubelet.recording.records import LogRotationRecord
from trio_kubelet.runtime.errors import CRIError, StatusCode

POLICY = RotationPolicy(max_size=100, max_files=4)
STAMP = "20261128-101500"


def test_under_the_size_or_switched_off_nothing_happens() -> None:
    assert plan_rotation("0.log", 99, ["0.log"], POLICY, STAMP) is None
    off = RotationPolicy(max_size=-1, max_files=5)
    assert plan_rotation("0.log", 10**9, ["0.log"], off, STAMP) is None


def test_the_first_rotation_only_renames() -> None:
    plan = plan_rotation("0.log", 100, ["0.log"], POLICY, STAMP)
    assert plan is not None
    assert (plan.remove, plan.compress, plan.rotate_to) == ((), (), f"0.log.{STAMP}")


def test_older_rotations_are_compressed_the_oldest_removed_leftovers_cleared() -> None:
    siblings = [
        "0.log",
        "0.log.20261128-100000.gz",
        "0.log.20261128-100100.gz",
        "0.log.20261128-100200.gz",  # a compression that finished but kept its source:
        "0.log.20261128-100200",
        "0.log.20261128-100300",  # the newest rotated file, still plain
        "0.log.20261128-100300.tmp",  # an interrupted compression
        "1.log",  # another instance's log: not this one's business
        "1.log.20261128-090000",
    ]
    plan = plan_rotation("0.log", 250, siblings, POLICY, STAMP)
    assert plan is not None
    assert plan.remove == (
        "0.log.20261128-100200",
        "0.log.20261128-100300.tmp",
        "0.log.20261128-100000.gz",
        "0.log.20261128-100100.gz",
    )
    assert plan.compress == ("0.log.20261128-100300",)
    assert plan.rotate_to == f"0.log.{STAMP}"


def test_a_second_rotation_in_the_same_second_waits() -> None:
    assert plan_rotation("0.log", 500, ["0.log", f"0.log.{STAMP}"], POLICY, STAMP) is None


@given(
    stamps=st.lists(st.integers(0, 10**6), unique=True, max_size=12),
    compressed=st.lists(st.booleans(), min_size=12, max_size=12),
    max_files=st.integers(2, 8),
)
def test_after_a_rotation_at_most_max_files_remain(
    stamps: list[int], compressed: list[bool], max_files: int
) -> None:
    siblings = {"0.log"} | {
        f"0.log.{stamp:08d}-000000" + (".gz" if packed else "")
        for stamp, packed in zip(stamps, compressed, strict=False)
    }
    policy = RotationPolicy(max_size=1, max_files=max_files)
    plan = plan_rotation("0.log", 1, siblings, policy, "99999999-000000")
    assert plan is not None
    left = (siblings - set(plan.remove)) | {plan.rotate_to}
    assert len(left) <= max_files
    assert not set(plan.compress) & set(plan.remove)
    plain_rotated = {n for n in left - set(plan.compress) if n != "0.log"}
    assert {n for n in plain_rotated if not n.endswith(".gz")} == {plan.rotate_to}


async def running_log(n: Node) -> tuple[str, Path]:
    """A running container "main" of pod web and the path of its live log."""
    (cid,) = await n.instances(WEB, "web", await n.sandbox(WEB, "web"), 1, last_running=True)
    return cid, n.log_dir(WEB, "web") / "main" / "0.log"


async def test_rotation_renames_compresses_and_has_the_runtime_reopen(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    recorder = ListRecorder()
    async with node(tmp_path) as n:
        cid, live = await running_log(n)
        rotation = ContainerLogRotation(n.client, POLICY, pod_logs_dir=n.logs, clock=n.wall.now,
                                        recorder=recorder)
        live.write_bytes(b"a" * 99)
        assert await rotation.rotate_logs() == 0 and not recorder.records
        live.write_bytes(b"b" * 150)
        assert await rotation.rotate_logs() == 1
        await trio.sleep(1)
        live.write_bytes(b"c" * 150)  # the runtime's new file, full again
        assert await rotation.rotate_logs() == 1

        names = sorted(p.name for p in live.parent.iterdir())
        assert names[0] == "0.log" and len(names) == 3, names
        older, newest = names[1], names[2]
        assert older.endswith(".gz") and not newest.endswith(".gz")
        assert gzip.decompress((live.parent / older).read_bytes()) == b"b" * 150
        assert (live.parent / newest).read_bytes() == b"c" * 150
        assert n.fake.calls["ReopenContainerLog"] == 2, cid

    records = recorder.records
    assert [type(r) for r in records] == [LogRotationRecord, LogRotationRecord]
    assert records[1].compressed == [records[0].rotate_to]
    result = replay_through_file(records, tmp_path)
    assert result.ok and result.log_rotations == 2
    altered = records[1].model_copy(update={"policy": (100, 2)})  # keep no older file
    assert replay_through_file([altered], tmp_path).divergence is not None


class ReopenFailsOnce:
    """The CRI client, whose first ReopenContainerLog fails as a restarting runtime's would."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def reopen_container_log(self, container_id: str) -> None:
        if not self.failed:
            self.failed = True
            raise CRIError("ReopenContainerLog", StatusCode.UNAVAILABLE, "runtime restarting")
        await self._client.reopen_container_log(container_id)


async def test_a_failed_reopen_puts_the_log_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with node(tmp_path) as n:
        _, live = await running_log(n)
        live.write_bytes(b"x" * 200)
        client = ReopenFailsOnce(n.client)
        rotation = ContainerLogRotation(client, POLICY, pod_logs_dir=n.logs, clock=n.wall.now)
        assert await rotation.rotate_logs() == 0
        assert sorted(p.name for p in live.parent.iterdir()) == ["0.log"]
        assert live.read_bytes() == b"x" * 200
        assert "Failed to rotate the log default_web_" in caplog.text
        assert "runtime restarting" in caplog.text
        assert await rotation.rotate_logs() == 1, "the next round tries again"
        assert n.fake.calls["ReopenContainerLog"] == 1
