"""hollow.py and runtime/fake_commands.py: many agents in one process over fake runtimes whose
containers do what their commands say, under trio's MockClock (no API server: static pods)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_kubelet.cli import main
from trio_kubelet.config import build_agent_options
from trio_kubelet.hollow import HollowOptions, node_options, pod_network, run_hollow
from trio_kubelet.node.registration import MachineFacts
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import DEFAULT_SCRIPT, ContainerScript, FakeRuntime
from trio_kubelet.runtime.fake_commands import script_for, script_for_argv

MACHINE = MachineFacts(num_cores=4, memory_bytes=8 * 2**30, ephemeral_storage_bytes=100 * 2**30)


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        ([], DEFAULT_SCRIPT),  # the image's entrypoint
        (["/agnhost", "netexec"], DEFAULT_SCRIPT),  # a server
        (["sleep", "5"], ContainerScript(exit_after=5.0)),
        (["/bin/sleep", "1m", "30"], ContainerScript(exit_after=90.0)),
        (["sleep", "infinity"], DEFAULT_SCRIPT),
        (["sleep", "soon"], ContainerScript(exit_after=0.0, exit_code=1)),
        (["true"], ContainerScript(exit_after=0.0)),
        (["false"], ContainerScript(exit_after=0.0, exit_code=1)),
        (["sh", "-c", "exit 3"], ContainerScript(exit_after=0.0, exit_code=3)),
        (["/bin/sh", "-c", "echo hi; sleep 2 && sleep 3; exit 7"],
         ContainerScript(exit_after=5.0, exit_code=7)),
        (["bash", "-c", "sleep 1\nfalse"], ContainerScript(exit_after=1.0, exit_code=1)),
        (["sh", "-c", "while true; do sleep 1; done"], DEFAULT_SCRIPT),
        (["sh", "-c", "echo start; nginx -g 'daemon off;'"], DEFAULT_SCRIPT),
        (["sh", "-c", "exit nope"], ContainerScript(exit_after=0.0, exit_code=2)),
        (["sh", "-c", "echo 'unterminated"], ContainerScript(exit_after=0.0, exit_code=2)),
        (["sh", "-c", "exit 256"], ContainerScript(exit_after=0.0, exit_code=0)),
    ],
)
def test_command_semantics(argv: list[str], script: ContainerScript) -> None:
    assert script_for_argv(argv) == script


def test_command_and_args_are_read_together() -> None:
    config = v1.ContainerConfig(command=["sh", "-c"], args=["sleep 4; exit 1"])
    assert script_for(config) == ContainerScript(exit_after=4.0, exit_code=1)


def _options(tmp_path: Path, nodes: int, **kwargs: object) -> HollowOptions:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "job.yaml").write_text(textwrap.dedent("""
        apiVersion: v1
        kind: Pod
        metadata: {name: job}
        spec:
          restartPolicy: Never
          containers:
          - {name: work, image: busybox:1.36, command: [sh, -c, "sleep 30; exit 3"]}
          - {name: server, image: nginx:1.27}
    """))
    base = build_agent_options(
        overrides={
            "staticPodPath": ("--pod-manifest-path", str(manifests)),
            "cgroupsPerQOS": ("hollow", False),
            "resolvConf": ("hollow", ""),
            "healthzPort": ("hollow", 0),
        },
        root_dir=tmp_path / "scratch",
        hostname_override="hollow-0",
    )
    return HollowOptions(base=base, nodes=nodes, scratch=base.root_dir, **kwargs)  # type: ignore[arg-type]


def test_each_node_has_its_own_name_address_directories_and_port(tmp_path: Path) -> None:
    options = _options(tmp_path, 3, port_base=20000, record_dir=tmp_path / "rec")
    nodes = [node_options(options, i) for i in range(3)]
    assert [n.node_name for n in nodes] == ["hollow-0", "hollow-1", "hollow-2"]
    assert [n.node_ip for n in nodes] == ["172.16.0.1", "172.16.0.2", "172.16.0.3"]
    assert [n.config.port for n in nodes] == [20000, 20001, 20002]
    assert nodes[1].root_dir == options.scratch / "hollow-1"
    assert nodes[1].config.pod_logs_dir == str(options.scratch / "hollow-1" / "logs")
    assert nodes[2].record == tmp_path / "rec" / "hollow-2.jsonl"
    # The rest of the configuration is the one parsed once.
    assert nodes[2].config.static_pod_path == options.base.config.static_pod_path
    assert options.base.config.pod_logs_dir == "/var/log/pods"  # the base is not changed
    assert [pod_network(i) for i in (0, 1, 300)] == [
        "10.64.0.0/24", "10.64.1.0/24", "10.65.44.0/24"]


async def test_every_node_runs_its_pods_on_its_own_runtime(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    options = _options(tmp_path, 3)
    async with trio.open_nursery() as nursery:
        runtimes: dict[str, FakeRuntime] = await nursery.start(
            lambda task_status: run_hollow(
                options, machine=MACHINE, signals=False, task_status=task_status)
        )
        await trio.sleep(60)
        assert sorted(runtimes) == ["hollow-0", "hollow-1", "hollow-2"]
        for name, fake in runtimes.items():
            listed = fake.list_containers(v1.ListContainersRequest()).containers
            states = {c.metadata.name: c.state for c in listed}
            # The job container ran 30 s and exited 3; the server still runs; once each.
            assert states == {"work": v1.ContainerState.CONTAINER_EXITED,
                              "server": v1.ContainerState.CONTAINER_RUNNING}, name
            work = next(c for c in listed if c.metadata.name == "work")
            status = fake.container_status(v1.ContainerStatusRequest(work.id)).status
            assert status.exit_code == 3
            assert (status.finished_at - status.started_at) / 1e9 == pytest.approx(30, abs=2)
            sandbox = fake.list_pod_sandbox(v1.ListPodSandboxRequest()).items
            assert len(sandbox) == 1
            # Each runtime gives addresses from its own network.
            index = int(name.rsplit("-", 1)[1])
            ip = fake.pod_sandbox_status(
                v1.PodSandboxStatusRequest(sandbox[0].id)).status.network.ip
            assert ip == f"10.64.{index}.2"
            # Nothing measured the host: no sampler, no image GC, no eviction monitor.
            assert fake.calls["ImageFsInfo"] == 0
            assert fake.calls["ListContainerStats"] == 0
        nursery.cancel_scope.cancel()
    # Pod logs went to each node's own scratch directory, nowhere else.
    for name in runtimes:
        logs = list((options.scratch / name / "logs").iterdir())
        assert len(logs) == 1 and logs[0].name.startswith("default_job-")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0"], "--nodes: must be positive (got 0)"),
        (["--nodes", "2", "--name-prefix", "Hollow_"],
         '--name-prefix: "Hollow_" does not make valid node names'),
        (["--nodes", "2", "--port-base", "70000"], "--port-base: must be a port"),
        (["--nodes", "2", "--start-rate", "-1"], "--start-rate: must not be negative"),
        (["--nodes", "16385"], "--nodes: at most 16384 (got 16385)"),
    ],
)
def test_bad_hollow_flags_name_the_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert main(["hollow", "--kubeconfig", str(kubeconfig), *argv]) == 2
    assert message in capsys.readouterr().err
