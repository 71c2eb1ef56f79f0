"""replay.replayer and replay.cli: real recordings made in-process against the fake runtime.

The agent runs under trio's MockClock with the fake runtime on the same wall clock,
so a recording of a few virtual minutes (crash loops with growing back-off, a job
that succeeds, one that fails, init containers and a sidecar) takes a few seconds.
The recordings are made once per module and only read by the tests.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_kubelet.agent
from tests.net import free_port
from trio_kubelet.agent import run_agent
from trio_kubelet.cli import main, parse_run_options
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core import actions as core_actions
from trio_kubelet.core.observed import ContainerState, RuntimeContainer
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.recording.records import DecisionRecord, Record
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.replay.replayer import ReplayResult, replay, replay_in_virtual_time
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, in_process_opener

NODE = "n1"
T0 = 1_700_000_000.0
RUN_FOR = 100.0  # virtual seconds: crash-loop restarts at about 0, 10, 30 and 70 s

MANIFESTS = {
    "crash.yaml": """
        apiVersion: v1
        kind: Pod
        metadata: {name: crash}
        spec:
          restartPolicy: Always
          containers: [{name: app, image: busybox:1.36}]
    """,
    "onfail.yaml": """
        apiVersion: v1
        kind: Pod
        metadata: {name: onfail}
        spec:
          restartPolicy: OnFailure
          containers: [{name: job, image: busybox:1.36}]
    """,
    "never.yaml": """
        apiVersion: v1
        kind: Pod
        metadata: {name: never}
        spec:
          restartPolicy: Never
          containers: [{name: once, image: busybox:1.36}]
    """,
    "init.yaml": """
        apiVersion: v1
        kind: Pod
        metadata: {name: init}
        spec:
          initContainers:
            - {name: init-1, image: busybox:1.36}
            - {name: shipper, image: busybox:1.36, restartPolicy: Always}
          containers: [{name: main, image: busybox:1.36}]
    """,
    "greedy.yaml": """
        apiVersion: v1
        kind: Pod
        metadata: {name: greedy}
        spec:
          containers:
            - {name: hog, image: busybox:1.36, resources: {requests: {cpu: "4000"}}}
    """,
}
SCRIPTS = {
    ("crash", "app"): ContainerScript(exit_after=0.2, exit_code=1),
    ("onfail", "job"): ContainerScript(exit_after=0.5, exit_code=0),
    ("never", "once"): ContainerScript(exit_after=0.5, exit_code=1),
    ("init", "init-1"): ContainerScript(exit_after=0.3, exit_code=0),
}


async def _record(workdir: Path, flags: Sequence[str], event_stream: bool) -> None:
    manifests = workdir / "manifests"
    manifests.mkdir()
    for name, text in MANIFESTS.items():
        (manifests / name).write_text(textwrap.dedent(text))
    sock = workdir / "cri.sock"
    options = parse_run_options(
        [
            "--pod-manifest-path",
            str(manifests),
            "--container-runtime-endpoint",
            f"unix://{sock}",
            "--root-dir",
            str(workdir / "root"),
            "--pod-logs-dir",
            str(workdir / "logs"),
            "--hostname-override",
            NODE,
            "--address",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--healthz-port",
            "0",
            "--cgroups-per-qos=false",  # fake pods need no cgroups on the host
            *flags,
        ]
    )
    fake = FakeRuntime(TrioWallClock(epoch=T0).now, event_stream=event_stream)
    for (pod, container), script in SCRIPTS.items():
        fake.script(f"{pod}-{NODE}", container, script)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trio_kubelet.agent, "open_cri_client", in_process_opener(fake))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_agent, options)
            await trio.sleep(RUN_FOR)
            nursery.cancel_scope.cancel()


def make_recording(workdir: Path, *flags: str, event_stream: bool = False) -> None:
    """Run the agent for RUN_FOR virtual seconds with the runtime on the agent's wall clock
    (like containerd 1.6, or like 2.x with ``event_stream``)."""
    wall = TrioWallClock
    with pytest.MonkeyPatch.context() as patch:
        # One epoch for the agent and the fake, so runtime timestamps and "now" agree.
        patch.setattr(trio_kubelet.agent, "TrioWallClock", lambda: wall(epoch=T0))
        trio.run(_record, workdir, flags, event_stream,
                 clock=trio.testing.MockClock(autojump_threshold=0))


@dataclass(frozen=True)
class Recordings:
    plain: Path
    rotated: Path
    evented: Path  # made on a runtime with a container event stream


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    plain_dir = tmp_path_factory.mktemp("plain")
    make_recording(plain_dir, "--record", str(plain_dir / "rec.jsonl"))
    rotated_dir = tmp_path_factory.mktemp("rotated")
    make_recording(
        rotated_dir, "--record", str(rotated_dir / "rec.jsonl"), "--record-max-bytes", "40Ki"
    )
    evented_dir = tmp_path_factory.mktemp("evented")
    make_recording(evented_dir, "--record", str(evented_dir / "rec.jsonl"), event_stream=True)
    return Recordings(plain_dir / "rec.jsonl", rotated_dir / "rec.jsonl",
                      evented_dir / "rec.jsonl")


def replay_file(path: Path, **kwargs: object) -> ReplayResult:
    return replay(read_recording(path).records, **kwargs)  # type: ignore[arg-type]


def decision_lines(path: Path) -> list[tuple[int, dict[str, object]]]:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        data = json.loads(line)
        if data["kind"] == "decision":
            found.append((number, data))
    return found


def run_cli(*argv: str) -> int:
    return main(["replay", *argv])


# -- the real recording replays ---------------------------------------------------------------


def test_a_real_recording_replays_without_divergence(recordings: Recordings) -> None:
    result = replay_file(recordings.plain)

    assert result.divergence is None, result.divergence and result.divergence.diff
    pods = {entry.pod for entry in result.trace}
    names = ("crash", "onfail", "never", "init", "greedy")
    assert pods == {f"{name}-{NODE}_default" for name in names} | {"(node)"}
    summaries = [(entry.pod, entry.summary) for entry in result.trace]
    # The agent's container GC pass removed the crash loop's older dead instances.
    node = [summary for pod, summary in summaries if pod == "(node)"]
    assert result.gc_passes == len(node) >= 1
    assert all(summary.startswith("container GC: remove ") for summary in node), node
    assert result.admissions == 5
    assert ("crash-n1_default", "admit") in summaries
    greedy = [summary for pod, summary in summaries if pod == "greedy-n1_default"]
    assert len(greedy) == 1  # refused at admission: never synced
    assert greedy[0].startswith("reject: OutOfcpu: Node didn't have enough resource: cpu, ")
    assert ("init-n1_default", "create sandbox (attempt 0); start init-1") in summaries
    assert ("init-n1_default", "start shipper") in summaries
    assert ("init-n1_default", "start main") in summaries
    assert ("onfail-n1_default", "kill pod") in summaries
    assert ("never-n1_default", "kill pod") in summaries
    gates = [gate for entry in result.trace for gate in entry.gates]
    assert "app: back-off 10s, 9.0s left" in gates or any(
        g.startswith("app: back-off 10s,") for g in gates
    )
    assert any(g.startswith("app: back-off 40s,") for g in gates), gates
    assert result.gates > result.decisions / 4 > 0


def test_a_recording_with_the_event_stream_replays_and_shows_what_it_told(
    recordings: Recordings,
) -> None:
    events = [json.loads(line)["event"] for line in recordings.evented.read_text().splitlines()
              if json.loads(line)["kind"] == "event"]
    told = [(e["kind"], e.get("via", e.get("state"))) for e in events
            if e["kind"] in ("pleg", "event_stream")]
    opened = told.index(("event_stream", "open"))
    # Only the first relist, before the stream was open, may tell something; after that
    # every start and exit of the crash loop and the pods comes by the stream.
    assert {via for _, via in told[:opened]} <= {"relist"}
    after = Counter(told[opened + 1:])
    assert list(after) == [("pleg", "stream")] and after[("pleg", "stream")] > 10, after
    result = replay_file(recordings.evented)
    assert result.divergence is None, result.divergence and result.divergence.diff
    assert result.decisions > 10


def test_replay_recomputes_with_the_current_rules(
    recordings: Recordings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed rule in the core (OnFailure restarting a container that succeeded) diverges."""
    original = core_actions._should_restart

    def on_failure_like_always(
        container: Container, pod: Pod, instance: RuntimeContainer | None
    ) -> bool:
        if (
            pod.spec.restart_policy == "OnFailure"
            and instance is not None
            and instance.state is ContainerState.EXITED
        ):
            return True
        return original(container, pod, instance)

    monkeypatch.setattr(core_actions, "_should_restart", on_failure_like_always)
    result = replay_file(recordings.plain)

    divergence = result.divergence
    assert divergence is not None
    assert divergence.pod == "onfail-n1_default"
    assert divergence.reason == "the replayed actions differ from the recorded ones"
    assert divergence.expected["kill_pod"] is True and divergence.actual["kill_pod"] is False
    assert '-  "containers_to_start": [],' in divergence.diff
    assert '+    "start job: exited 0, policy OnFailure"' in divergence.diff
    lines = dict(decision_lines(recordings.plain))
    assert lines[divergence.line]["pod"] == "onfail-n1_default"
    assert divergence.event_index > 0


def test_a_tampered_action_diverges_at_its_line(recordings: Recordings, tmp_path: Path) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = next(
        (n, d)
        for n, d in decision_lines(recordings.plain)
        if d["pod"] == "crash-n1_default"
        and d["actions"]["containers_to_start"]  # type: ignore[index]
        and n > 20
    )
    data["actions"]["containers_to_start"] = []  # type: ignore[index]
    lines[number - 1] = json.dumps(data) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))

    divergence = replay_file(tampered).divergence

    assert divergence is not None
    assert (divergence.line, divergence.pod) == (number, "crash-n1_default")
    assert '-  "containers_to_start": [],' in divergence.diff
    assert '+  "containers_to_start": [\n+    0\n+  ],' in divergence.diff


def admission_line(path: Path, pod: str) -> tuple[int, dict[str, object]]:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        data = json.loads(line)
        if data["kind"] == "admission" and data["pod"] == pod:
            return number, data
    raise AssertionError(f"no admission of {pod}")


@pytest.mark.parametrize(
    ("pod", "change"),
    [
        ("greedy-n1_default", {"reason": None, "message": None}),  # recorded as admitted
        ("greedy-n1_default", {"allocatable": {"cpu": "5000", "pods": "110"}}),  # it fits now
        ("crash-n1_default", {"allocatable": {"cpu": "2", "pods": "0"}}),  # no room
    ],
)
def test_a_tampered_admission_diverges(
    recordings: Recordings, tmp_path: Path, pod: str, change: dict[str, object]
) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = admission_line(recordings.plain, pod)
    lines[number - 1] = json.dumps({**data, **change}) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))

    divergence = replay_file(tampered).divergence

    assert divergence is not None
    assert (divergence.line, divergence.pod) == (number, pod)
    assert divergence.reason == "the replayed admission differs from the recorded one"


def status_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(number, data) for number, line in enumerate(path.read_text().splitlines(), start=1)
            if (data := json.loads(line))["kind"] == "status"]


def test_every_published_status_is_re_decided(recordings: Recordings) -> None:
    """The statuses the workers published are recorded with their inputs and recomputed:
    synced ones by compute_pod_status, the refused pod's by rejected_status."""
    statuses = status_lines(recordings.plain)
    result = replay_file(recordings.plain)

    assert result.ok and result.statuses == len(statuses) > 10
    decided = {data["decided"] for _, data in statuses}
    assert decided == {"sync", "rejected"}
    failed = [d for _, d in statuses if d["pod"] == "greedy-n1_default"]
    assert failed and failed[0]["decided"] == "rejected"


@pytest.mark.parametrize(
    "change",
    [
        {"observed": {"uid": "x", "name": "", "namespace": "", "sandboxes": [],
                      "containers": []}},  # the runtime had nothing: still creating
        {"now": 0.0},  # other times in the conditions
        {"host_ip": "10.9.9.9"},
    ],
)
def test_a_tampered_status_input_diverges(
    recordings: Recordings, tmp_path: Path, change: dict[str, object]
) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = next((n, d) for n, d in status_lines(recordings.plain)
                        if d["decided"] == "sync" and d["pod"] == "onfail-n1_default"
                        and d["status"].get("phase") == "Running")
    lines[number - 1] = json.dumps({**data, **change}) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))

    divergence = replay_file(tampered).divergence

    assert divergence is not None
    assert (divergence.line, divergence.pod) == (number, "onfail-n1_default")
    assert divergence.reason == "the replayed pod status differs from the recorded one"


def test_a_tampered_gate_diverges(recordings: Recordings, tmp_path: Path) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = next(
        (n, d)
        for n, d in decision_lines(recordings.plain)
        if any(not s["allowed"] for s in d["starts"])  # type: ignore[attr-defined]
    )
    data["starts"][0]["remaining"] += 0.5  # type: ignore[index]
    lines[number - 1] = json.dumps(data) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))

    divergence = replay_file(tampered).divergence

    assert divergence is not None and divergence.line == number
    assert divergence.reason == "starts[0]: the replayed crash-loop gate of app differs"
    assert divergence.expected["remaining"] == pytest.approx(divergence.actual["remaining"] + 0.5)


def test_a_decision_whose_spec_is_missing_is_a_divergence(
    recordings: Recordings, tmp_path: Path
) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    kept = [line for line in lines if '"kind":"pod_set"' not in line]
    first_cut = next(json.loads(line)["seq"] for line in lines if '"kind":"pod_set"' in line)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(kept))

    result = replay_file(cut)

    assert result.divergence is not None
    assert f"set by event seq {first_cut} is not in the recording" in result.divergence.reason
    assert result.trace[0].summary == "(pod spec unknown)"


def test_each_rotated_file_replays_on_its_own(recordings: Recordings) -> None:
    newest = recordings.rotated
    older = sorted(newest.parent.glob("rec.jsonl.*"))
    assert older, "the recording was not rotated; lower --record-max-bytes"
    first = read_recording(newest).records
    assert first[0].record.kind == "header" and first[1].record.kind == "snapshot"
    decided = 0
    for path in (newest, *older):
        result = replay_file(path)
        assert result.divergence is None, (path, result.divergence)
        decided += result.decisions
    # Which file the later decisions land in depends on when resyncs fall; together
    # the files hold them all.
    assert decided > 0


# -- filters and explain -----------------------------------------------------------------------


def test_until_stops_at_a_virtual_time(recordings: Recordings) -> None:
    full = replay_file(recordings.plain)
    early = replay_file(recordings.plain, until=20.0)

    assert 0 < early.decisions < full.decisions
    assert all(entry.t <= 20.0 for entry in early.trace)
    assert early.end <= 20.0 < full.end


@pytest.mark.parametrize("name", ["crash", "crash-n1", "crash-n1_default", "default/crash"])
def test_pod_keeps_only_that_pods_decisions(recordings: Recordings, name: str) -> None:
    result = replay_file(recordings.plain, pod=name)

    assert result.decisions > 0
    assert {entry.pod for entry in result.trace} == {"crash-n1_default"}


def test_explain_gives_the_inputs_and_the_reasons(recordings: Recordings) -> None:
    result = replay_file(recordings.plain, pod="crash", explain=True)

    restarts = [e for e in result.trace if any(r.startswith("restart app:") for r in e.reasons)]
    assert restarts
    reasons = [r for e in restarts for r in e.reasons]
    assert "restart app: exited 1, policy Always, no back-off yet; next back-off 10s" in reasons
    assert "restart app: exited 1, policy Always, back-off 10s elapsed; next back-off 20s" in (
        reasons
    )
    assert "start app: exited 1, policy Always" in reasons  # recorded by the core
    inputs = restarts[1].inputs
    assert inputs[0] == "restartPolicy: Always"
    assert "app: exited 1 (Error), restarts 1, finished 10.0s ago (1 older instance)" in inputs
    waits = [r for e in result.trace for r in e.reasons if r.startswith("wait app:")]
    assert waits and waits[0].startswith("wait app: exited 1, policy Always, back-off 10s, ")


async def test_the_virtual_clock_follows_the_recording(
    recordings: Recordings, autojump_clock: trio.testing.MockClock
) -> None:
    records = read_recording(recordings.plain).records
    start = trio.current_time()

    result = await replay_in_virtual_time(records, until=50.0)

    assert trio.current_time() - start == pytest.approx(result.end)
    assert 45.0 < result.end <= 50.0
    assert result.divergence is None


# -- the command -------------------------------------------------------------------------------


def test_check_passes_on_a_real_recording(
    recordings: Recordings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(str(recordings.plain), "--check") == 0

    out = capsys.readouterr().out
    result = replay_file(recordings.plain)
    assert out.splitlines()[-1] == (
        f"replay OK: {result.decisions} decisions, {result.admissions} admissions, "
        f"{result.evictions} evictions, {result.gc_passes} GC passes, "
        f"{result.log_rotations} log rotations, "
        f"{result.gates} gates, {result.statuses} pod statuses re-checked, no divergence"
    )
    assert "s  init-n1_default  create sandbox (attempt 0); start init-1\n" in out


def test_check_fails_with_the_divergence(
    recordings: Recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = decision_lines(recordings.plain)[3]
    data["actions"]["reasons"] = ["made up"]  # type: ignore[index]
    lines[number - 1] = json.dumps(data) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))

    assert run_cli(str(tampered), "--check") == 1

    out = capsys.readouterr().out
    assert f"replay DIVERGED at line {number} (after " in out
    assert f"pod {data['pod']}: the replayed actions differ" in out
    assert '-    "made up"' in out
    assert run_cli(str(tampered)) == 0  # without --check the trace is the product


def test_explain_prints_inputs_under_each_decision(
    recordings: Recordings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(str(recordings.plain), "--pod", "crash", "--explain", "--until", "40s") == 0

    out = capsys.readouterr().out.splitlines()
    assert all("crash-n1_default" in line for line in out if not line.startswith("      "))
    assert "              restartPolicy: Always" in out
    assert any(line.startswith("              why: restart app: exited 1") for line in out)


def test_a_bad_recording_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "decision"}\n')

    assert run_cli(str(bad), "--check") == 2

    captured = capsys.readouterr()
    assert captured.err == (
        f"trio-kubelet: error: {bad}:1: a recording starts with a header, "
        'but this line is a "decision" record\n'
    )
    assert run_cli(str(tmp_path / "absent.jsonl")) == 2
    assert "absent.jsonl: No such file or directory" in capsys.readouterr().err


def test_a_malformed_decision_input_is_an_error_naming_its_line(
    recordings: Recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recordings.plain.read_text().splitlines(keepends=True)
    number, data = decision_lines(recordings.plain)[2]
    del data["observed"]["sandboxes"]  # type: ignore[attr-defined]
    lines[number - 1] = json.dumps(data) + "\n"
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines))

    assert run_cli(str(broken), "--check") == 2

    assert capsys.readouterr().err == (
        f'trio-kubelet: error: {broken}:{number}: observed: "sandboxes" is missing\n'
    )


def test_a_cut_off_recording_replays_with_a_warning(
    recordings: Recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = recordings.plain.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) // 2].rsplit("\n", 1)[0] + "\n" + '{"t": 12.5, "kind": "dec')

    assert run_cli(str(cut), "--check") == 0

    captured = capsys.readouterr()
    assert "trio-kubelet: warning: " in captured.err and "the last line is cut off" in captured.err
    assert "replay OK: " in captured.out


def test_timeline_is_rendered_by_the_timeline_module(
    recordings: Recordings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rendered: list[tuple[int, Path]] = []

    def render_timeline(records: Sequence[Record], out: Path) -> None:
        assert records[0].kind == "header"
        out.write_text("<html></html>")
        rendered.append((len(records), out))

    module = types.ModuleType("trio_kubelet.replay.timeline")
    module.render_timeline = render_timeline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trio_kubelet.replay.timeline", module)
    out = tmp_path / "timeline.html"

    assert run_cli(str(recordings.plain), "--timeline", str(out)) == 0

    total = len(recordings.plain.read_text().splitlines())
    assert rendered == [(total, out)]
    assert capsys.readouterr().out.endswith(f"timeline written to {out}\n")
    assert run_cli(str(recordings.plain), "--timeline", str(tmp_path / "no" / "t.html")) == 2
    assert "trio-kubelet: error: cannot write the timeline to " in capsys.readouterr().err


def test_decision_records_carry_what_the_replay_needs(recordings: Recordings) -> None:
    """Guards the recorder side of the contract the replayer relies on."""
    records = [r.record for r in read_recording(recordings.plain).records]
    decisions = [r for r in records if isinstance(r, DecisionRecord)]
    assert decisions and all(d.spec_seq >= 0 for d in decisions)
    assert any(s.prior_delay is not None for d in decisions for s in d.starts)
