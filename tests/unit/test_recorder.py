"""The recorder: lazy serialisation, redaction, rotation, a readable prefix after a crash."""

from __future__ import annotations

from pathlib import Path

import trio

from trio_kubelet.recording.recorder import REDACTED, Recorder, redact
from trio_kubelet.recording.records import Header, SnapshotRecord, StatusRecord
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.runtime.cri.runtime import v1


def header() -> Header:
    return Header(t=0.0, agent_version="test", node="n1", start_time=1_800_000_000.0,
                  config={}, sources=["file"])


def empty_snapshot() -> SnapshotRecord:
    return SnapshotRecord(pod_sets={"file": []}, spec_seqs={})


def status(t: float, uid: str = "u1") -> StatusRecord:
    return StatusRecord(t=t, uid=uid, pod="p_default", status={"phase": "Running"})


def test_redact_replaces_credentials_at_any_depth() -> None:
    request = {"image": {"image": "reg/app:1"},
               "auth": {"username": "me", "password": "hunter2", "auth": "bWU6aHVudGVyMg=="},
               "nested": [{"identityToken": "tok", "registryToken": ""}]}
    assert redact(request) == {
        "image": {"image": "reg/app:1"},
        "auth": REDACTED,  # the whole AuthConfig sits under the "auth" key of PullImageRequest
        "nested": [{"identityToken": REDACTED, "registryToken": ""}],
    }


async def test_pull_credentials_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, header())
    request = v1.PullImageRequest(
        image=v1.ImageSpec(image="reg.local/app:1"),
        auth=v1.AuthConfig(username="robot", password="s3cret-pw", auth="cm9ib3Q6czNjcmV0"),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run, empty_snapshot)
        recorder.cri_observer("PullImage", request, v1.PullImageResponse(image_ref="sha256:1"), 0.5)
        nursery.cancel_scope.cancel()
    text = path.read_text()
    assert "s3cret-pw" not in text and "cm9ib3Q6czNjcmV0" not in text
    assert "reg.local/app:1" in text


async def test_unfiltered_relists_are_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, header())
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run, empty_snapshot)
        recorder.cri_observer("ListContainers", v1.ListContainersRequest(),
                              v1.ListContainersResponse(), 0.001)
        selected = v1.ListContainersRequest(
            filter=v1.ContainerFilter(label_selector={"io.kubernetes.pod.uid": "u1"}))
        recorder.cri_observer("ListContainers", selected, v1.ListContainersResponse(), 0.001)
        nursery.cancel_scope.cancel()
    records = [r.record for r in read_recording(path).records]
    assert [r.kind for r in records] == ["header", "cri"]


async def test_records_are_serialised_by_the_flusher_not_by_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, header())
    built: list[float] = []

    def make() -> StatusRecord:
        built.append(trio.current_time())
        return status(1.0)

    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run, empty_snapshot)
        recorder.add(make)
        assert built == []  # adding costs an append, nothing more
        await trio.sleep(0.5)
        assert len(built) == 1
        nursery.cancel_scope.cancel()
    assert [r.record.kind for r in read_recording(path).records] == ["header", "status"]


async def test_rotation_starts_each_file_with_header_and_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, header(), max_bytes=2_000, keep=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run, empty_snapshot)
        for round_ in range(8):
            for i in range(15):
                recorder.add(lambda t=round_ * 100 + i: status(float(t)))
            recorder.flush()
        nursery.cancel_scope.cancel()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rec.jsonl", "rec.jsonl.1", "rec.jsonl.2", "rec.jsonl.3"]
    for name in files:
        kinds = [r.record.kind for r in read_recording(tmp_path / name).records]
        assert kinds[0] == "header"
        if name != "rec.jsonl.3":  # the oldest kept file may be the very first one
            assert kinds[1] == "snapshot", name
    newest = read_recording(path).records[0].record
    assert isinstance(newest, Header) and newest.rotated_from == "rec.jsonl.1"


async def test_a_cut_last_line_leaves_a_readable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, header())
    async with trio.open_nursery() as nursery:
        await nursery.start(recorder.run, empty_snapshot)
        for t in range(5):
            recorder.add(lambda t=t: status(float(t)))
        recorder.flush()
        nursery.cancel_scope.cancel()
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 25])  # the agent died in the middle of a write
    recording = read_recording(path)
    assert len(recording.records) == 5  # header + 4 complete statuses
    assert recording.warnings and "cut off" in recording.warnings[0]
