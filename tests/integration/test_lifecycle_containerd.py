"""Lifecycle hooks and termination messages on containerd (node conformance style)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import trio

from tests.integration.harness import RunningAgent, container, running, running_agent
from trio_kubelet.model.pod import ContainerStateTerminated, Pod

pytestmark = pytest.mark.integration

# PID 1 reports SIGTERM on stdout and exits; a preStop hook writes to PID 1's stdout first.
TRAPS_TERM = "trap 'echo TERM; exit 0' TERM; echo started; while true; do sleep 0.2; done"
PRE_STOP_TO_LOG = "echo preStop > /proc/1/fd/1"
# The same order, written to a file on the host (a torn-down pod's logs are removed).
TRAPS_TERM_TO_FILE = "trap 'echo TERM >> /host/order; exit 0' TERM; while true; do sleep 0.2; done"

FALLBACK_MESSAGE = "starting\npanic: oops\n"


def terminated(pod: Pod, name: str) -> ContainerStateTerminated:
    state = container(pod, name).state.terminated
    assert state is not None, container(pod, name)
    return state


async def output_once(
    agent: RunningAgent, pod: Pod, name: str, restart: int, done: Callable[[list[str]], bool]
) -> list[str]:
    """A container's stdout once ``done`` holds for it (the runtime may still be writing the
    last lines when it reports the exit), or as it is after 10 s."""
    with trio.move_on_after(10):
        while not done(agent.output(pod, name, restart)):
            await trio.sleep(0.2)
    return agent.output(pod, name, restart)


async def test_pre_stop_runs_before_sigterm_when_a_changed_container_is_killed(
    containerd, tmp_path
):
    manifest = """\
        apiVersion: v1
        kind: Pod
        metadata: {{name: hooks}}
        spec:
          terminationGracePeriodSeconds: 10
          containers:
          - name: app
            image: busybox:1.36
            command: ["sh", "-c", "{command}"]
            env: [{{name: VERSION, value: "{version}"}}]
            lifecycle:
              preStop:
                exec: {{command: ["sh", "-c", "{pre_stop}"]}}
        """
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write(
            "hooks.yaml", manifest.format(command=TRAPS_TERM, version=1, pre_stop=PRE_STOP_TO_LOG)
        )
        before = container(await agent.wait_for("hooks", lambda p: running(p, "app")), "app")
        # A changed spec restarts the container: compute_pod_actions kills the old one.
        agent.write(
            "hooks.yaml", manifest.format(command=TRAPS_TERM, version=2, pre_stop=PRE_STOP_TO_LOG)
        )
        pod = await agent.wait_for(
            "hooks",
            lambda p: running(p, "app") and container(p, "app").container_id != before.container_id,
            timeout=60,
        )
        last = container(pod, "app").last_state.terminated
        assert last is not None and last.exit_code == 0, last  # it left on SIGTERM, in its grace
        output = await output_once(agent, pod, "app", before.restart_count, lambda o: "TERM" in o)
        assert output == ["started", "preStop", "TERM"]


async def test_pre_stop_runs_before_sigterm_when_the_pod_is_torn_down(containerd, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    order = shared / "order"
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write(
            "bye.yaml",
            f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: bye}}
            spec:
              terminationGracePeriodSeconds: 10
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "{TRAPS_TERM_TO_FILE}"]
                volumeMounts: [{{name: host, mountPath: /host}}]
                lifecycle:
                  preStop:
                    exec: {{command: ["sh", "-c", "echo preStop >> /host/order; sleep 1"]}}
              volumes:
              - {{name: host, hostPath: {{path: {shared}, type: Directory}}}}
            """,
        )
        await agent.wait_for("bye", lambda p: running(p, "app"))
        (agent.manifests / "bye.yaml").unlink()
        await agent.wait_gone("bye", timeout=60)
        assert order.read_text().split() == ["preStop", "TERM"]


async def test_failing_post_start_kills_the_container_and_it_restarts(containerd, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="trio_kubelet.kube_events")
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write(
            "post.yaml",
            f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: post}}
            spec:
              terminationGracePeriodSeconds: 5
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "{TRAPS_TERM}"]
                lifecycle:
                  postStart:
                    exec: {{command: ["false"]}}
            """,
        )
        pod = await agent.wait_for(
            "post", lambda p: container(p, "app").restart_count >= 1, timeout=90
        )
        # It would run for ever: the hook's failure is what stopped it (how fast depends on
        # whether its shell had set its SIGTERM trap when the kill came).
        assert container(pod, "app").last_state.terminated is not None
        events = [r.getMessage() for r in caplog.records if r.name == "trio_kubelet.kube_events"]
        assert any("FailedPostStartHook: PostStartHook failed" in e for e in events), events
        assert any("Killing: FailedPostStartHook" in e for e in events), events
        hook_logs = [r.getMessage() for r in caplog.records if "postStart hook" in r.getMessage()]
        assert any("command 'false' exited with 1" in m for m in hook_logs), hook_logs


async def test_termination_messages_from_the_file_and_from_the_log(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write(
            "msg.yaml",
            """\
            apiVersion: v1
            kind: Pod
            metadata: {name: msg}
            spec:
              restartPolicy: Never
              containers:
              - name: file
                image: busybox:1.36
                command: ["sh", "-c", "echo 'bad config: no port' > /dev/termination-log; exit 1"]
              - name: custom
                image: busybox:1.36
                command: ["sh", "-c", "printf done > /tmp/why; exit 0"]
                terminationMessagePath: /tmp/why
              - name: fallback
                image: busybox:1.36
                # stdout and stderr reach the log through separate pipes: the pause keeps
                # the two lines in order in the file.
                command: ["sh", "-c", "echo starting; sleep 1; echo 'panic: oops' >&2; exit 2"]
                terminationMessagePolicy: FallbackToLogsOnError
              - name: fallback-ok
                image: busybox:1.36
                command: ["sh", "-c", "echo all good"]
                terminationMessagePolicy: FallbackToLogsOnError
            """,
        )
        await agent.wait_for("msg", lambda p: p.status.phase == "Failed", timeout=60)
        # The log's last lines may land just after the exit is reported; a later sync reads
        # them again (a file's message is final at the exit).
        pod = await agent.wait_for(
            "msg", lambda p: terminated(p, "fallback").message == FALLBACK_MESSAGE, timeout=90
        )
        file = terminated(pod, "file")
        assert (file.exit_code, file.message) == (1, "bad config: no port\n")
        assert terminated(pod, "custom").message == "done"
        assert terminated(pod, "fallback").exit_code == 2
        assert terminated(pod, "fallback-ok").message is None  # a success never reads the log
