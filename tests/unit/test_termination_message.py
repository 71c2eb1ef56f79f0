"""Termination messages: which text an exited container's status carries, and its limits.

The choice is pure (``core.observed.wants_log_tail``, ``core.phase.exit_message``); the
reading is ``runtime/inspect.py``'s, once per exited container.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_kubelet.core.observed import (
    MAX_TERMINATION_LOG_BYTES,
    MAX_TERMINATION_LOG_LINES,
    MAX_TERMINATION_MESSAGE_BYTES,
    ContainerState,
    RuntimeContainer,
    RuntimePodStatus,
    wants_log_tail,
)
from trio_kubelet.core.phase import (
    MAX_POD_TERMINATION_MESSAGE_BYTES,
    compute_pod_status,
    exit_message,
)
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.runtime import inspect, labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import ContainerScript, serve_fake_runtime
from trio_kubelet.runtime.inspect import (
    TerminationMessages,
    inspect_pod,
    read_log_tail,
    read_message_file,
    termination_message,
)

FALLBACK = "FallbackToLogsOnError"
UID = "9c0d3f11-5555-4000-8000-000000000001"


def make_pod(containers: int = 1, policy: str = "File", path: str = "/dev/termination-log") -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": "job", "namespace": "default", "uid": UID},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": f"c{i}",
                        "image": "busybox",
                        "terminationMessagePolicy": policy,
                        "terminationMessagePath": path,
                    }
                    for i in range(containers)
                ],
            },
        }
    )


def exited(
    name: str = "c0", *, message: str = "", left: str = "", code: int = 1, cid: str = "a1"
) -> RuntimeContainer:
    return RuntimeContainer(
        id=cid,
        name=name,
        state=ContainerState.EXITED,
        exit_code=code,
        reason="Error",
        message=message,
        termination_message=left,
        started_at=1.0,
        finished_at=2.0,
    )


def log_line(text: str, stream: str = "stdout") -> str:
    return f"2024-05-01T10:00:00.000000001Z {stream} F {text}\n"


# -- the choice (pure) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, code, reason, written, expected",
    [
        (FALLBACK, 1, "Error", "", True),
        (FALLBACK, 137, "OOMKilled", "", True),
        (FALLBACK, 1, "Error", "wrote this", False),  # the container's own words win
        (FALLBACK, 0, "Completed", "", False),  # only for failures
        (FALLBACK, 128, "ContainerCannotRun", "", False),  # never ran: no log to read
        ("File", 1, "Error", "", False),
    ],
)
def test_when_the_log_tail_stands_in_for_the_message(
    policy: str, code: int, reason: str, written: str, expected: bool
) -> None:
    assert wants_log_tail(policy, code, reason, written) is expected


def test_the_message_follows_the_runtimes_own() -> None:
    pod = make_pod()
    assert exit_message(pod, exited(left="disk full")) == "disk full"
    assert (
        exit_message(pod, exited(message="runc: oom", left="disk full")) == "runc: oom: disk full"
    )
    assert exit_message(pod, exited(message="runc: oom")) == "runc: oom"
    assert exit_message(pod, exited()) == ""


def test_a_pods_messages_share_twelve_kib() -> None:
    pod = make_pod(containers=3)
    share = MAX_POD_TERMINATION_MESSAGE_BYTES // 3
    long = "x" * 5000
    assert exit_message(pod, exited(left=long)) == "x" * share
    assert exit_message(make_pod(), exited(left=long)) == long  # one container: 12 KiB
    # Cutting never leaves half a character.
    wide = "é" * share
    cut = exit_message(pod, exited(left=wide))
    assert len(cut.encode()) <= share and set(cut) == {"é"}


def test_the_terminated_state_carries_the_message() -> None:
    pod = make_pod()
    runtime = RuntimePodStatus(uid=UID, containers=(exited(left="bye", code=3),))
    status = compute_pod_status(pod, runtime, now=10.0)
    terminated = status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.message == "bye" and terminated.exit_code == 3
    assert status.phase == "Failed"


# -- reading ------------------------------------------------------------------------------------


def test_the_file_is_read_from_its_end_up_to_4096_bytes(tmp_path: Path) -> None:
    file = tmp_path / "msg"
    file.write_bytes(b"a" * 1000 + b"b" * MAX_TERMINATION_MESSAGE_BYTES)
    assert read_message_file(file) == "b" * MAX_TERMINATION_MESSAGE_BYTES
    file.write_text("short\n")
    assert read_message_file(file) == "short\n"
    assert read_message_file(tmp_path / "missing") == ""
    assert read_message_file(tmp_path).startswith("Error on reading termination log")


async def test_the_log_tail_is_the_last_80_lines_within_2048_bytes(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text(
        "".join(log_line(f"line {i}", "stderr" if i % 2 else "stdout") for i in range(100))
    )
    tail = await read_log_tail(log)
    assert tail.splitlines() == [f"line {i}" for i in range(100 - MAX_TERMINATION_LOG_LINES, 100)]
    log.write_text("".join(log_line(f"{i:03d}" + "y" * 96) for i in range(50)))
    tail = await read_log_tail(log)
    assert len(tail.encode()) == MAX_TERMINATION_LOG_BYTES and tail.endswith(
        "049" + "y" * 96 + "\n"
    )
    missing = await read_log_tail(tmp_path / "gone.log")
    assert missing.startswith("Error on reading termination message from logs")


def status_with(
    tmp_path: Path,
    *,
    code: int,
    written: str,
    reason: str = "Error",
    container_path: str = "/dev/termination-log",
) -> v1.ContainerStatus:
    file = tmp_path / "termination"
    file.write_text(written)
    log = tmp_path / "0.log"
    log.write_text(log_line("first") + log_line("panic: the end", "stderr"))
    return v1.ContainerStatus(
        id="c-1",
        state=v1.ContainerState.CONTAINER_EXITED,
        exit_code=code,
        reason=reason,
        mounts=[
            v1.Mount(container_path="/data", host_path=str(tmp_path)),
            v1.Mount(container_path=container_path, host_path=str(file)),
        ],
        log_path=str(log),
    )


async def test_the_file_mounted_at_the_path_is_the_message(tmp_path: Path) -> None:
    spec = make_pod().spec.containers[0]
    assert await termination_message(status_with(tmp_path, code=1, written="boom"), spec) == "boom"
    relative = make_pod(path="tmp/why").spec.containers[0]  # mounted as an absolute path
    status = status_with(tmp_path, code=1, written="why", container_path="/tmp/why")
    assert await termination_message(status, relative) == "why"
    # File policy: an empty file is an empty message, whatever the log holds.
    assert await termination_message(status_with(tmp_path, code=1, written=""), spec) == ""


async def test_fallback_to_logs_on_error(tmp_path: Path) -> None:
    spec = make_pod(policy=FALLBACK).spec.containers[0]
    failed = status_with(tmp_path, code=2, written="")
    assert await termination_message(failed, spec) == "first\npanic: the end\n"
    wrote = status_with(tmp_path, code=2, written="own words")
    assert await termination_message(wrote, spec) == "own words"
    succeeded = status_with(tmp_path, code=0, written="")
    assert await termination_message(succeeded, spec) == ""
    no_path = Container.model_validate(
        {"name": "c0", "terminationMessagePath": "", "terminationMessagePolicy": FALLBACK}
    )
    assert await termination_message(failed, no_path) == "first\npanic: the end\n"


async def test_each_exited_container_is_read_once(tmp_path: Path) -> None:
    messages = TerminationMessages()
    spec = make_pod().spec.containers[0]
    status = status_with(tmp_path, code=1, written="first read")
    assert await messages.read(status, spec) == "first read"
    (tmp_path / "termination").write_text("changed")
    assert await messages.read(status, spec) == "first read"  # not read again
    messages.keep_only(["c-1", "c-2"])
    assert len(messages) == 1
    messages.keep_only(["c-2"])  # c-1 is gone: forgotten
    assert len(messages) == 0
    assert await messages.read(status, spec) == "changed"


async def test_a_message_from_the_log_is_read_again_only_when_the_log_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []

    async def counted(path: Path) -> str:
        reads.append(path)
        return await read_log_tail(path)

    monkeypatch.setattr(inspect, "read_log_tail", counted)
    messages = TerminationMessages()
    spec = make_pod(policy=FALLBACK).spec.containers[0]
    status = status_with(tmp_path, code=1, written="")
    assert await messages.read(status, spec) == "first\npanic: the end\n"
    assert await messages.read(status, spec) == "first\npanic: the end\n"
    assert len(reads) == 1
    # The runtime was still copying the last output when it reported the exit.
    with (tmp_path / "0.log").open("a") as file:
        file.write(log_line("flushed late"))
    assert await messages.read(status, spec) == "first\npanic: the end\nflushed late\n"
    assert len(reads) == 2


async def test_inspect_pod_reads_exited_containers_only(tmp_path: Path) -> None:
    pod = make_pod(containers=2)
    files = {name: tmp_path / name for name in ("c0", "c1")}
    for file in files.values():
        file.write_text("")
    sock = tmp_path / "cri.sock"
    async with serve_fake_runtime(sock) as fake, open_cri_client(f"unix://{sock}") as client:
        fake.add_image("busybox")
        fake.script("job", "c0", ContainerScript(exit_after=0.0, exit_code=1))
        sandbox_config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name="job", uid=UID, namespace="default"),
            labels=labels.sandbox_labels(UID, "job", "default", {}),
        )
        sandbox = await client.run_pod_sandbox(sandbox_config)
        for name, file in files.items():
            config = v1.ContainerConfig(
                metadata=v1.ContainerMetadata(name=name),
                image=v1.ImageSpec(image="busybox"),
                labels=labels.container_labels(UID, "job", "default", name),
                mounts=[v1.Mount(container_path="/dev/termination-log", host_path=str(file))],
            )
            await client.start_container(
                await client.create_container(sandbox, config, sandbox_config)
            )
        for file in files.values():
            file.write_text("written before the end")
        messages = TerminationMessages()
        runtime = await inspect_pod(client, UID, pod=pod, messages=messages)
        by_name = {c.name: c for c in runtime.containers}
        assert by_name["c0"].state is ContainerState.EXITED
        assert by_name["c0"].termination_message == "written before the end"
        assert by_name["c1"].termination_message == ""  # still running: not read
        assert len(messages) == 1
        plain = await inspect_pod(client, UID)  # without the pod: nothing read
        assert all(c.termination_message == "" for c in plain.containers)
