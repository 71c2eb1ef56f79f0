"""replay/timeline.py: segments and markers derived from records, escaping, and a screenshot."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from trio_kubelet.recording.records import (
    RECORD_ADAPTER,
    ContainerStart,
    DecisionRecord,
    EventRecord,
    Header,
    Record,
    StatusRecord,
    TeardownRecord,
)
from trio_kubelet.replay.timeline import (
    COLOURS,
    Segment,
    build_timeline,
    esc,
    render_timeline,
    timeline_html,
)

BASE = 5000.0  # trio time of the header
T0 = 1_700_000_000.0  # epoch at the header: 2023-11-14T22:13:20Z
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>&amp;'


def stamp(rel: float) -> str:
    """The API's whole-second timestamp of a relative time."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + rel, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def header() -> Header:
    return Header(t=BASE, agent_version="0.1.0", node="node-a", start_time=T0, config={})


def running(rel: float, cid: str, *, restarts: int = 0, ready: bool = True,
            last: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": {"running": {"startedAt": stamp(rel)}},
        "restartCount": restarts, "ready": ready, "containerID": f"containerd://{cid}",
    }
    if last:
        status["lastState"] = {"terminated": last}
    return status


def exited(code: int, cid: str, start: float, end: float, *, reason: str = "",
           message: str = "") -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": code, "startedAt": stamp(start), "finishedAt": stamp(end),
                            "containerID": f"containerd://{cid}",
                            "reason": reason or ("Completed" if code == 0 else "Error")}
    if message:
        term["message"] = message
    return term


def terminated(code: int, cid: str, start: float, end: float, *, restarts: int = 0,
               reason: str = "", message: str = "") -> dict[str, Any]:
    term = exited(code, cid, start, end, reason=reason, message=message)
    return {"state": {"terminated": term}, "restartCount": restarts, "ready": False,
            "containerID": f"containerd://{cid}"}


def waiting(reason: str, *, restarts: int = 0, message: str = "",
            last: dict[str, Any] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    status: dict[str, Any] = {"state": {"waiting": state}, "restartCount": restarts,
                              "ready": False}
    if last:
        status["lastState"] = {"terminated": last}
    return status


def status(rel: float, uid: str, pod: str, phase: str = "Running", *,
           init: dict[str, dict[str, Any]] | None = None,
           containers: dict[str, dict[str, Any]] | None = None) -> StatusRecord:
    body: dict[str, Any] = {"phase": phase}
    if init is not None:
        body["initContainerStatuses"] = [{"name": n, **s} for n, s in init.items()]
    if containers is not None:
        body["containerStatuses"] = [{"name": n, **s} for n, s in containers.items()]
    return StatusRecord(t=BASE + rel, uid=uid, pod=pod, status=body)


def pod_json(uid: str, name: str, containers: Sequence[str], init: Sequence[str] = (),
             sidecars: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "annotations": {"kubernetes.io/config.hash": f"h-{uid}"}},
        "spec": {
            "initContainers": [{"name": n, "image": "busybox", **(
                {"restartPolicy": "Always"} if n in sidecars else {})} for n in init],
            "containers": [{"name": n, "image": "busybox"} for n in containers],
        },
    }


def pod_set(rel: float, seq: int, *pods: dict[str, Any]) -> EventRecord:
    return EventRecord(t=BASE + rel, seq=seq,
                       event={"kind": "pod_set", "source": "file", "pods": list(pods)})


def decision(rel: float, uid: str, pod: str, *, reasons: Sequence[str] = (),
             start: Sequence[int] = (), starts: Sequence[ContainerStart] = (),
             create: bool = False, liveness: dict[str, str] | None = None) -> DecisionRecord:
    return DecisionRecord(
        t=BASE + rel, uid=uid, pod=pod, spec_seq=0, now=T0 + rel,
        observed={"uid": uid, "name": "", "namespace": "", "sandboxes": [], "containers": []},
        liveness=liveness or {},
        actions={"kill_pod": create, "create_sandbox": create, "sandbox_id": "", "attempt": 0,
                 "init_containers_to_start": [], "containers_to_start": list(start),
                 "containers_to_kill": {}, "ephemeral_containers_to_start": [],
                 "reasons": list(reasons)},
        starts=list(starts),
    )


def resync(rel: float, seq: int) -> EventRecord:
    return EventRecord(t=BASE + rel, seq=seq, event={"kind": "resync"})


def spans(segments: list[Segment]) -> list[tuple[float, float, str, str]]:
    return [(round(s.start, 2), round(s.end, 2), s.state, s.label) for s in segments]


# -- segment derivation -------------------------------------------------------------------------


def test_consecutive_statuses_become_merged_segments_until_teardown() -> None:
    pod = "crash_default"
    records: list[Record] = [
        header(),
        status(1, "u1", pod, containers={"c": running(1, "a")}),
        status(3, "u1", pod, containers={"c": running(1, "a")}),  # same state: merged
        status(4, "u1", pod, containers={"c": terminated(1, "a", 1, 4)}),
        status(5, "u1", pod, containers={"c": waiting(
            "CrashLoopBackOff", last=exited(1, "a", 1, 4))}),
        status(15, "u1", pod, containers={"c": running(15, "b", restarts=1,
                                                       last=exited(1, "a", 1, 4))}),
        TeardownRecord(t=BASE + 20, uid="u1", pod=pod),
        resync(25, 0),
    ]
    timeline = build_timeline(records)
    assert timeline.duration == 25
    (only,) = timeline.pods
    (lane,) = only.lanes
    assert (lane.name, lane.kind) == ("c", "container")
    assert spans(lane.segments) == [
        (1, 4, "running", "running"),
        (4, 5, "failed", "exit 1 (Error)"),
        (5, 15, "backoff", "CrashLoopBackOff"),
        (15, 20, "running", "running"),
    ]
    assert [(m.t, m.kind) for m in lane.markers] == [(15, "restart")]
    assert "restartCount 0 → 1" in lane.markers[0].details
    assert spans(only.phases) == [(1, 20, "running", "Running")]
    assert [m.kind for m in only.markers] == ["teardown"]
    assert only.display_name == "default/crash"


def test_an_exit_seen_only_in_last_state_is_inferred_from_finished_at() -> None:
    pod = "p_ns"
    records: list[Record] = [
        header(),
        status(1, "u", pod, containers={"c": running(1, "a")}),
        # finishedAt 3 s (whole second: drawn at 3.5 s), never seen as a terminated state
        status(6, "u", pod, containers={"c": waiting(
            "CrashLoopBackOff", message="back-off 10s", last=exited(2, "a", 1, 3))}),
        status(16, "u", pod, containers={"c": running(16, "b", restarts=1,
                                                      last=exited(2, "a", 1, 3))}),
        # a fast restart: exit at 20, the new instance at 21, one status at 22.4
        status(22.4, "u", pod, containers={"c": running(21, "c", restarts=2,
                                                        last=exited(2, "b", 16, 20))}),
    ]
    (lane,) = build_timeline(records).pods[0].lanes
    assert spans(lane.segments) == [
        (1, 3.5, "running", "running"),
        (3.5, 6, "failed", "exit 2 (Error)"),
        (6, 16, "backoff", "CrashLoopBackOff"),
        (16, 20.5, "running", "running"),
        (20.5, 21.5, "failed", "exit 2 (Error)"),
        (21.5, 22.4, "running", "running"),
    ]
    assert any("inferred" in d for d in lane.segments[1].details)
    assert "back-off 10s" in lane.segments[2].details
    assert [(m.t, m.kind) for m in lane.markers] == [(16, "restart"), (21.5, "restart")]


def test_oom_kills_are_dark_red_segments_with_a_marker() -> None:
    records: list[Record] = [
        header(),
        status(1, "u", "p_ns", containers={"m": running(1, "a")}),
        status(8, "u", "p_ns", containers={"m": terminated(137, "a", 1, 7, reason="OOMKilled")}),
        status(9, "u", "p_ns", containers={"m": terminated(137, "a", 1, 7, reason="OOMKilled")}),
        status(10, "u", "p_ns", containers={"m": running(10, "b", restarts=1, last=exited(
            137, "a", 1, 7, reason="OOMKilled"))}),
        status(12, "u", "p_ns", containers={"m": waiting(
            "CrashLoopBackOff", restarts=1, last=exited(137, "b", 10, 11, reason="OOMKilled"))}),
    ]
    (lane,) = build_timeline(records).pods[0].lanes
    assert spans(lane.segments) == [
        (1, 8, "running", "running"),
        (8, 10, "oomkilled", "OOMKilled (exit 137)"),
        (10, 11.5, "running", "running"),
        (11.5, 12, "oomkilled", "OOMKilled (exit 137)"),
    ]
    assert [(m.t, m.kind) for m in lane.markers] == [(8, "oom"), (10, "restart"), (11.5, "oom")]


def test_lanes_follow_spec_order_with_sidecars_and_waiting_reasons() -> None:
    spec = pod_json("u", "web", ["main", "helper"], init=["setup", "proxy"], sidecars=("proxy",))
    records: list[Record] = [
        header(),
        pod_set(0, 0, spec),
        status(1, "u", "web_default", "Pending",
               init={"setup": running(1, "s"), "proxy": waiting("PodInitializing")},
               containers={"helper": waiting("PodInitializing"),
                           "main": waiting("PodInitializing")}),
        status(2, "u", "web_default", "Running",
               init={"setup": terminated(0, "s", 1, 2), "proxy": running(2, "p", ready=False)},
               containers={"helper": running(2, "h"), "main": running(2, "m")}),
        status(4, "u", "web_default", "Running",
               init={"setup": terminated(0, "s", 1, 2), "proxy": running(2, "p")},
               containers={"helper": running(2, "h"), "main": running(2, "m")}),
        resync(6, 1),
    ]
    pod = build_timeline(records).pods[0]
    assert [(lane.name, lane.kind) for lane in pod.lanes] == [
        ("setup", "init"), ("proxy", "sidecar"), ("main", "container"), ("helper", "container"),
    ]
    setup, proxy, main, _ = pod.lanes
    assert spans(setup.segments) == [(1, 2, "running", "running"),  # never "not ready"
                                     (2, 6, "succeeded", "exit 0 (Completed)")]
    assert spans(proxy.segments) == [(1, 2, "waiting", "PodInitializing"),
                                     (2, 4, "unready", "running, not ready"),
                                     (4, 6, "running", "running")]
    assert spans(main.segments) == [(1, 2, "waiting", "PodInitializing"),
                                    (2, 6, "running", "running")]
    assert spans(pod.phases) == [(1, 2, "waiting", "Pending"), (2, 6, "running", "Running")]
    assert [m.summary for m in pod.markers] == ["pod added by source file"]


def test_decisions_become_markers_with_reasons_and_gates() -> None:
    spec = pod_json("u", "crash", ["crasher"])
    gate = ContainerStart(container="crasher", key="k", prior_delay=10.0, prior_update=T0,
                          allowed=False, remaining=7.5, delay=10.0)
    records: list[Record] = [
        header(),
        pod_set(0, 0, spec),
        decision(0.1, "u", "crash_default", create=True, start=[0],
                 reasons=["kill pod and create sandbox (attempt 0): no sandbox exists",
                          "start crasher: new sandbox"],
                 starts=[ContainerStart(container="crasher", key="k", allowed=True)]),
        decision(2, "u", "crash_default"),  # nothing to do
        decision(5, "u", "crash_default", start=[0], starts=[gate],
                 reasons=["start crasher: exited 1, policy Always"],
                 liveness={"abc": "failure"}),
    ]
    pod = build_timeline(records).pods[0]
    assert pod.idle_syncs == [2]
    assert [m.kind for m in pod.markers] == ["spec", "start", "probe", "backoff"]
    _, created, probe, held = pod.markers
    assert created.kind == "start"
    assert created.summary == "sync at 0.10 s: create sandbox (attempt 0); start crasher"
    assert "• start crasher: new sandbox" in created.details
    assert held.kind == "backoff"
    assert held.summary == "sync at 5.00 s: back-off crasher (7.50 s left)"
    assert "• start crasher: exited 1, policy Always" in held.details
    assert "• crasher: held back, 7.50 s left of a 10.0 s back-off" in held.details
    assert probe.summary == "liveness probe of abc: failure"  # no lane runs abc: on the pod row


def test_records_out_of_order_and_without_header() -> None:
    records: list[Record] = [
        status(3, "u", "p_ns", containers={"c": terminated(0, "a", 1, 3)}),
        status(1, "u", "p_ns", containers={"c": running(1, "a")}),
    ]
    timeline = build_timeline(records)  # time 0 is the first record's
    assert timeline.node == "" and timeline.start_time is None
    assert timeline.duration == 2
    # without a header there is no epoch for lastState times, and nothing after the exit
    assert spans(timeline.pods[0].lanes[0].segments) == [(0, 2, "running", "running")]
    assert "node</b> unknown" in timeline_html(timeline)


def test_failed_relists_and_manifest_problems_are_node_events() -> None:
    records: list[Record] = [
        header(),
        EventRecord(t=BASE + 1, seq=0, event={"kind": "relist", "ok": False, "error": "refused"}),
        EventRecord(t=BASE + 2, seq=1, event={"kind": "relist", "ok": False, "error": "refused"}),
        EventRecord(t=BASE + 4, seq=2, event={"kind": "relist", "ok": True}),
        EventRecord(t=BASE + 5, seq=3, event={
            "kind": "pod_set", "source": "file", "pods": [],
            "problems": [{"file": "bad.yaml", "reason": "spec.containers: required"}]}),
    ]
    timeline = build_timeline(records)
    assert spans(timeline.node_segments) == [(1, 4, "failed", "runtime unreachable")]
    (problem,) = timeline.node_markers
    assert problem.summary == "manifest problem in bad.yaml"


def test_the_container_event_streams_changes_are_node_markers() -> None:
    lost = "CRI GetContainerEvents failed: UNAVAILABLE: connection lost"
    records: list[Record] = [
        header(),
        EventRecord(t=BASE + 1, seq=0, event={"kind": "event_stream", "state": "open"}),
        EventRecord(t=BASE + 5, seq=1, event={"kind": "event_stream", "state": "closed",
                                              "error": lost}),
        EventRecord(t=BASE + 6, seq=2, event={"kind": "pleg", "pod_uid": "u", "via": "relist",
                                              "type": "ContainerDied", "container_id": "c"}),
    ]
    timeline = build_timeline(records)
    assert [(m.t, m.kind, m.summary, m.details) for m in timeline.node_markers] == [
        (1, "stream", "container event stream open: relists are the safety net", ()),
        (5, "stream", "container event stream lost: relisting every second", (lost,)),
    ]
    assert "container event stream lost" in timeline_html(timeline)


# -- escaping and size --------------------------------------------------------------------------


def test_esc_escapes_markup_and_drops_control_characters() -> None:
    assert esc('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert esc("bell\x07nul\x00") == "bell\ufffdnul\ufffd"
    assert esc("lone \udc80 surrogate") == "lone ? surrogate"
    assert esc("tab\tnew\nline") == "tab\tnew\nline"


def test_hostile_text_cannot_inject_markup(tmp_path: Path) -> None:
    pod = f"{HOSTILE}_ns"
    records: list[Record] = [
        Header(t=BASE, agent_version=HOSTILE, node=HOSTILE, start_time=T0, config={}),
        status(1, "u<1>", pod, containers={HOSTILE: running(1, "a")}),
        status(4, "u<1>", pod, containers={HOSTILE: terminated(
            3, "a", 1, 4, reason=HOSTILE, message=HOSTILE)}),
        status(5, "u<1>", pod, containers={HOSTILE: waiting(HOSTILE, message=HOSTILE)}),
        decision(6, "u<1>", pod, reasons=[HOSTILE + "\n</title><script>"]),
    ]
    out = tmp_path / "t.html"
    render_timeline(records, out)
    page = out.read_text(encoding="utf-8")
    assert page.count("<script>") == 1  # ours
    assert "<img" not in page
    assert "</title><script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&amp;amp;" in page
    # every <title> closes before any other tag opens: no markup inside tooltips
    for body in re.findall(r"<title>(.*?)</title>", page, flags=re.S):
        assert "<" not in body and ">" not in body


def test_page_is_self_contained() -> None:
    page = timeline_html(build_timeline([header()]))
    assert not re.search(r"""(?:src|href)\s*=|@import|url\((?!#)|https?:""", page)
    assert "No pod statuses" in page


def test_hundreds_of_pods_over_a_long_recording_stay_small() -> None:
    """300 steady pods and a crash loop at the 5-minute back-off cap, for a day."""
    day, pods = 86_400, 300
    records: list[Record] = [header()]
    idle = decision(0, "u", "p")
    for i in range(pods):
        uid, name = f"u{i}", f"pod-{i}_default"
        records += [
            StatusRecord.model_construct(  # model_construct: skip validation, keep the test fast
                t=BASE + rel, uid=uid, pod=name, kind="status",
                status={"phase": "Running", "containerStatuses": [
                    {"name": "c", **running(1, f"c{i}")}]})
            for rel in range(1, day, 1800)
        ]
        records += [idle.model_copy(update={"t": BASE + rel, "uid": uid, "pod": name})
                    for rel in range(2, day, 300)]
    crash, rel, restarts = "crash_default", 1.0, 0
    while rel < day:
        records += [
            status(rel, "crash", crash, containers={"c": running(rel, f"x{restarts}",
                                                                 restarts=restarts)}),
            status(rel + 2, "crash", crash, containers={"c": terminated(
                1, f"x{restarts}", rel, rel + 2, restarts=restarts)}),
            status(rel + 3, "crash", crash, containers={"c": waiting(
                "CrashLoopBackOff", restarts=restarts,
                last=exited(1, f"x{restarts}", rel, rel + 2))}),
        ]
        rel, restarts = rel + 303, restarts + 1
    timeline = build_timeline(records)
    assert len(timeline.pods) == pods + 1
    steady = timeline.pods[:pods]
    assert all(len(p.lanes[0].segments) == 1 and len(p.phases) == 1 for p in steady)
    assert all(len(p.idle_syncs) == 288 for p in steady)
    # running, exit 1, back-off per restart; the last back-off begins as the recording ends
    assert len(timeline.pods[-1].lanes[0].segments) == 3 * restarts - 1
    size = len(timeline_html(timeline).encode())
    assert size < 1_000_000, size


# -- the page in a real browser -----------------------------------------------------------------


def synthetic_recording() -> list[Record]:
    """A crash loop, an init+sidecar pod and an OOM kill, as the agent would record them."""
    crash = pod_json("crash", "crashloop", ["crasher"])
    init = pod_json("init", "init-and-sidecar", ["main"], init=["init-1", "log-shipper"],
                    sidecars=("log-shipper",))
    oom = pod_json("oom", "memory-hog", ["hog"])
    records: list[Record] = [header(), pod_set(0, 0, crash, init, oom)]
    cp, ip, op = "crashloop_default", "init-and-sidecar_default", "memory-hog_default"
    records += [
        decision(0.1, "crash", cp, create=True, start=[0], reasons=["start crasher: new sandbox"],
                 starts=[ContainerStart(container="crasher", key="k", allowed=True)]),
        status(0.5, "crash", cp, "Pending", containers={"crasher": waiting("ContainerCreating")}),
    ]
    start, restarts, delay, cid = 1.0, 0, 10.0, 0
    while start < 80:
        last = exited(1, f"c{cid - 1}", start - delay - 3, start - delay) if cid else None
        records.append(status(start, "crash", cp, containers={
            "crasher": running(start, f"c{cid}", restarts=restarts, last=last)}))
        records.append(status(start + 3, "crash", cp, containers={"crasher": terminated(
            1, f"c{cid}", start, start + 3, restarts=restarts, message=HOSTILE)}))
        records.append(decision(start + 4, "crash", cp, start=[0],
                                reasons=["start crasher: exited 1, policy Always"],
                                starts=[ContainerStart(container="crasher", key="k",
                                                       allowed=False, remaining=delay,
                                                       prior_delay=delay, delay=delay)]))
        records.append(status(start + 4, "crash", cp, containers={"crasher": waiting(
            "CrashLoopBackOff", restarts=restarts, message=f"back-off {delay:.0f}s restarting",
            last=exited(1, f"c{cid}", start, start + 3))}))
        start += 4 + delay
        restarts, delay, cid = restarts + 1, delay * 2, cid + 1
    records += [
        status(1, "init", ip, "Pending", init={"init-1": running(1, "i1"),
                                               "log-shipper": waiting("PodInitializing")},
               containers={"main": waiting("PodInitializing")}),
        status(4, "init", ip, "Pending", init={"init-1": terminated(0, "i1", 1, 4),
                                               "log-shipper": running(4, "ls")},
               containers={"main": waiting("PodInitializing")}),
        status(5, "init", ip, "Running", init={"init-1": terminated(0, "i1", 1, 4),
                                               "log-shipper": running(4, "ls")},
               containers={"main": running(5, "mn")}),
        status(1.5, "oom", op, containers={"hog": running(1.5, "o1")}),
        status(30, "oom", op, "Running", containers={"hog": terminated(
            137, "o1", 1.5, 30, reason="OOMKilled")}),
        status(40, "oom", op, containers={"hog": running(40, "o2", restarts=1, last=exited(
            137, "o1", 1.5, 30, reason="OOMKilled"))}),
        TeardownRecord(t=BASE + 75, uid="oom", pod=op),
        resync(90, 1),
    ]
    return records


def test_records_survive_a_json_round_trip() -> None:
    records = synthetic_recording()
    again = [RECORD_ADAPTER.validate_json(RECORD_ADAPTER.dump_json(r)) for r in records]
    assert timeline_html(build_timeline(again)) == timeline_html(build_timeline(records))


def chromium_binary() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed, but CI installs it (scripts/bootstrap)")
        pytest.skip("chromium is not installed (apt-get install chromium fonts-dejavu-core)")
    return binary


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB/RGBA non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        chunk, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if chunk == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif chunk == b"IDAT":
            idat += body
        elif chunk == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + (left + previous[i]) // 2) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                up = previous[i]
                corner = previous[i - channels] if i >= channels else 0
                pa, pb, pc = abs(up - corner), abs(left - corner), abs(left + up - 2 * corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 0xFF
        previous = line
        rgb = bytearray(line)
        if channels == 4:
            del rgb[3::4]  # drop alpha
        rows.append(bytes(rgb))
    return width, height, rows


def colour_histogram(rows: list[bytes]) -> Counter[bytes]:
    return Counter(row[x:x + 3] for row in rows for x in range(0, len(row), 3))


def count_colour(histogram: Counter[bytes], hex_colour: str, tolerance: int = 4) -> int:
    want = bytes.fromhex(hex_colour.lstrip("#"))
    return sum(n for rgb, n in histogram.items()
               if all(abs(rgb[k] - want[k]) <= tolerance for k in range(3)))


def test_screenshot_shows_the_lanes_in_colour(tmp_path: Path) -> None:
    binary = chromium_binary()
    page, png = tmp_path / "timeline.html", tmp_path / "timeline.png"
    render_timeline(synthetic_recording(), page)
    profile = tmp_path / "profile"
    result = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--window-size=1400,900",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert png.exists(), f"no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
    width, height, rows = read_png(png)
    assert (width, height) == (1400, 900)
    # below the header, legend and time axis (whose swatches must not count)
    lanes = colour_histogram(rows[160:])
    for state, pixels in (("running", 20_000), ("backoff", 5_000), ("succeeded", 10_000),
                          ("failed", 500), ("oomkilled", 1_000)):
        found = count_colour(lanes, COLOURS[state])
        assert found > pixels, (state, found)
