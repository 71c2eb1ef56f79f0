"""docs/install.md, followed step by step in a scratch directory standing for `/`: a wheel
built from the checkout and installed into a fresh virtualenv, the bootstrap kubeconfig, the
KubeletConfiguration and the flags file, the systemd unit and its drop-in; the drop-in's
command line (rendered as systemd would, paths moved under the scratch root) joins the node to
the join control plane, which then runs a pod on it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import (
    PODS,
    AgentProcess,
    Api,
    condition,
    joining_node_admin,
    pod_manifest,
    unmount_under,
)
from tests.e2e.conftest import ControlPlane
from tests.net import free_port

REPO = Path(__file__).resolve().parents[2]
UNIT_DIR = REPO / "packaging" / "systemd"
NODE = "install-node"
# The directories docs/install.md writes to, moved under the scratch root.
SYSTEM_DIRS = ("/etc/", "/var/", "/opt/")


def rooted(root: Path, text: str) -> str:
    """``text`` with every path in SYSTEM_DIRS moved under ``root``."""
    for prefix in SYSTEM_DIRS:
        text = re.sub(rf"(?<![\w/.]){re.escape(prefix)}", f"{root}{prefix}", text)
    return text


def read_environment_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = " ".join(shlex.split(value))
    return values


def render_exec_start(root: Path, unit: Path, drop_in: Path) -> list[str]:
    """The command systemd runs for ``unit`` with ``drop_in``: the last ExecStart, its
    ``$VAR``s from Environment= and EnvironmentFile= (a leading '-': optional), split on
    whitespace as systemd splits unbraced variables."""
    environment: dict[str, str] = {}
    exec_start = ""
    for source in (unit, drop_in):
        for line in source.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "Environment":
                name, _, setting = value.strip('"').partition("=")
                environment[name] = setting
            elif key == "EnvironmentFile":
                path = Path(rooted(root, value.removeprefix("-")))
                if path.exists():
                    environment.update(read_environment_file(path))
                else:
                    assert value.startswith("-"), f"{value} is required but missing"
            elif key == "ExecStart":
                exec_start = value
    words = []
    for word in exec_start.split():
        if word.startswith("$"):
            words += environment.get(word[1:], "").split()
        else:
            words.append(word)
    return [rooted(root, word) for word in words]


@pytest.fixture
def api(join_control_plane: ControlPlane) -> Iterator[Api]:
    with joining_node_admin(join_control_plane, NODE) as admin:
        yield admin


# An operator's shell, not the test's: a PYTHONPATH naming this checkout's src/ (with its
# egg-info) would make pip take trio-kubelet for installed already and skip it.
OPERATOR_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(*argv: str | Path) -> None:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, env=OPERATOR_ENV
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_install_md_brings_a_node_into_the_cluster(
    join_control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> None:
    root = tmp_path / "root"
    # 1. Install: a wheel of the checkout into a fresh virtualenv (dependencies from PyPI).
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        REPO,
    )
    (wheel,) = (tmp_path / "dist").glob("trio_kubelet-*.whl")
    venv = root / "opt" / "trio-kubelet"
    run(sys.executable, "-m", "venv", venv)
    run(
        venv / "bin" / "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--prefer-binary",
        wheel,
    )
    run(venv / "bin" / "trio-kubelet", "--version")

    # 2. Credentials to join with.
    kubernetes = root / "etc" / "kubernetes"
    (kubernetes / "pki").mkdir(parents=True)
    shutil.copy(join_control_plane.bootstrap_kubeconfig, kubernetes / "bootstrap-kubelet.conf")
    os.chmod(kubernetes / "bootstrap-kubelet.conf", 0o600)
    shutil.copy(join_control_plane.ca, kubernetes / "pki" / "ca.crt")

    # 3. Configure: the documented config.yaml (paths under the scratch root) and flags file.
    document = (REPO / "docs" / "install.md").read_text()
    config = re.search(r"```yaml\n(apiVersion: kubelet.*?)```", document, re.S)
    assert config is not None
    (root / "var" / "lib" / "kubelet").mkdir(parents=True)
    (root / "var" / "lib" / "kubelet" / "config.yaml").write_text(rooted(root, config.group(1)))
    (root / "etc" / "default").mkdir()
    flags = [
        f"--container-runtime-endpoint={containerd.endpoint}",
        "--node-ip=127.0.0.1",
        f"--hostname-override={NODE}",
        # Not the host's: the scratch root's directories and a free port.
        f"--root-dir={root}/var/lib/kubelet",
        f"--pod-logs-dir={root}/var/log/pods",
        f"--pod-manifest-path={root}/etc/kubernetes/manifests",
        f"--port={free_port()}",
        "--healthz-port=0",
    ]
    (root / "etc" / "kubernetes" / "manifests").mkdir()
    (root / "etc" / "default" / "kubelet").write_text(f'KUBELET_EXTRA_ARGS="{" ".join(flags)}"\n')

    # 4. The unit and its drop-in, and the command line they make.
    system = root / "etc" / "systemd" / "system"
    (system / "trio-kubelet.service.d").mkdir(parents=True)
    shutil.copy(UNIT_DIR / "trio-kubelet.service", system)
    drop_in = system / "trio-kubelet.service.d" / "10-trio-kubelet.conf"
    shutil.copy(UNIT_DIR / "trio-kubelet.service.d" / "10-trio-kubelet.conf", drop_in)
    argv = render_exec_start(root, system / "trio-kubelet.service", drop_in)
    assert argv[0] == f"{venv}/bin/trio-kubelet"
    assert f"--kubeconfig={root}/etc/kubernetes/kubelet.conf" in argv

    # 5. Start it (as systemd would) and check.
    agent = AgentProcess(args=argv, log=tmp_path / "agent.log")
    agent.process = subprocess.Popen(
        argv,
        stdout=agent.log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=OPERATOR_ENV,
    )
    try:
        api.wait(
            f"/api/v1/nodes/{NODE}",
            lambda node: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in ((node or {}).get("status") or {}).get("conditions") or []
            ),
            timeout=120,
            what="the installed node Ready",
        )
        api.create(
            PODS, pod_manifest("installed", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
        )
        api.wait(
            f"{PODS}/installed",
            lambda p: condition(p, "Ready") == "True",
            timeout=90,
            what="a pod on the installed node",
        )
        assert (kubernetes / "kubelet.conf").exists()
        assert (root / "var" / "lib" / "kubelet" / "pki" / "kubelet-client-current.pem").exists()
    finally:
        agent.stop()
        print(agent.text()[-5000:])
        unmount_under(root)
