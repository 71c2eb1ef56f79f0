"""Developer and CI sessions: tests, lint, typecheck, protos, demo, bench, e2e, cgroupv2,
conformance.

Sessions run in the current interpreter (no virtualenvs): `scripts/bootstrap` installs the
project with its test and dev extras once, and CI does not download everything a second time.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "protos", "tests"]
# CI runs `nox -s lint typecheck protos tests` and must stop at the first failing session.
nox.options.stop_on_first_error = True

ROOT = Path(__file__).resolve().parent
PYTHON = sys.executable
# The tests that read or write cgroups, run on cgroup v2 by `nox -s cgroupv2`.
CGROUPV2_TESTS = [
    "tests/integration/test_qos_cgroups.py",
    "tests/integration/test_sampler_containerd.py",
    "tests/integration/test_eviction_containerd.py",
    "tests/integration/test_pod_errors.py::test_memory_limit_exceeded_is_oom_killed",
]
# Held while tests run containerd: two agents on one machine remove each other's pod cgroups,
# and the VM's emulated CPUs are this machine's.
INTEGRATION_LOCK = os.environ.get(
    "TRIO_KUBELET_INTEGRATION_LOCK", "/tmp/trio-kubelet-integration.lock"
)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, property, scenario and integration tests (integration needs root + containerd).

    Arguments after `--` replace the default path: `nox -s tests -- tests/integration -x`.
    """
    session.run(PYTHON, "-m", "pytest", "-q", "--ignore=tests/e2e", *(session.posargs or ["tests"]))


PY313_TESTS = [
    "tests/unit", "tests/property", "tests/scenarios",
    # The agent as a process (`python -m trio_kubelet`) and in-process on a real containerd.
    "tests/integration/test_agent_restart.py", "tests/integration/test_static_pods.py",
]


#: What runs on containerd 2.x as well: pod lifecycle, agent restarts, the PLEG, log rotation
#: (ReopenContainerLog).
CONTAINERD2_TESTS = [
    "tests/integration/test_static_pods.py", "tests/integration/test_lifecycle_containerd.py",
    "tests/integration/test_agent_restart.py", "tests/integration/test_pleg_containerd.py",
    "tests/integration/test_log_rotation_containerd.py",
]


@nox.session
def integration_containerd2(session: nox.Session) -> None:
    """The pod-lifecycle, restart and PLEG integration tests on containerd 2.x.

    The first run on a machine builds containerd 2.x with Go (scripts/build-containerd2,
    ~6 min, cached). Arguments after `--` replace the paths.
    """
    session.run(PYTHON, "-m", "pytest", "-q", *(session.posargs or CONTAINERD2_TESTS),
                env={"TRIO_KUBELET_CONTAINERD": "2"})


@nox.session
def py313(session: nox.Session) -> None:
    """The unit, property and scenario tiers and two containerd modules on Python 3.13.

    The project is installed with `pip install '.[test]'` (not editable) into a 3.13
    virtualenv under ~/.cache/trio-kubelet, so the tests run what a user's install gets.
    Needs `python3.13` on PATH or pyenv's 3.13. Arguments after `--` replace the paths.
    """
    # pyenv's own build first: its `python3.13` shim on PATH fails unless 3.13 is selected.
    candidates = [*sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.13*/bin/python3.13")),
                          reverse=True), shutil.which("python3.13")]
    interpreter = next((c for c in candidates if c and _runs(c)), None)
    if interpreter is None:
        session.error("no Python 3.13: install one (pyenv has 3.13.0 on these machines)")
    cache = Path(os.environ.get("TRIO_KUBELET_CACHE", Path.home() / ".cache/trio-kubelet"))
    python = cache / "py313" / "bin" / "python"
    if not python.exists():
        session.run(interpreter, "-m", "venv", str(python.parents[1]), external=True)
    session.run(str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                f"{ROOT}[test]", external=True)
    session.run(str(python), "-m", "pytest", "-q", *(session.posargs or PY313_TESTS),
                external=True)


def _runs(interpreter: str) -> bool:
    return subprocess.run([interpreter, "-c", ""], capture_output=True).returncode == 0


@nox.session
def cgroupv2(session: nox.Session) -> None:
    """The cgroup integration tests on cgroup v2, in a QEMU VM (scripts/cgroupv2-vm; root; slow).

    Arguments after `--` replace the default tests: `nox -s cgroupv2 -- tests/integration/x.py`.
    junit.xml and console.log land in the directory the session prints.
    """
    out = tempfile.mkdtemp(prefix="tk-cgroupv2-", dir="/tmp")
    session.log(f"results in {out}")
    pytest = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out}/junit.xml"]
    session.run(
        PYTHON, "scripts/cgroupv2-vm", "--out", out, "--lock", INTEGRATION_LOCK,
        # This interpreter, not a pyenv shim: every process start costs ~25x more under TCG.
        "--env", f"PYTHON={PYTHON}",
        "--env", f"PATH={Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "--", *pytest, *(session.posargs or CGROUPV2_TESTS),
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    # scripts/control-plane, scripts/cgroupv2-vm and scripts/conformance have no .py suffix: ruff
    # checks them only when named.
    paths = [
        "src", "tests", "scripts", "scripts/control-plane", "scripts/cgroupv2-vm",
        "scripts/conformance", "bench",
    ]
    session.run(PYTHON, "-m", "ruff", "check", *paths, "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.run(PYTHON, "-m", "mypy", "src", "scripts/control-plane")
    # One run each: mypy takes suffix-less scripts for one module named __main__.
    session.run(PYTHON, "-m", "mypy", "scripts/cgroupv2-vm")
    session.run(PYTHON, "-m", "mypy", "scripts/conformance")


@nox.session
def protos(session: nox.Session) -> None:
    """The generated CRI code in the tree matches protos/ (regenerate: scripts/gen_protos.py)."""
    session.run(PYTHON, "scripts/gen_protos.py", "--check")


@nox.session
def demo(session: nox.Session) -> None:
    session.run("bash", "scripts/demo", *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Run every bench/bench_*.py; each prints its numbers as JSON."""
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    if not scripts:
        session.log("no benchmarks in bench/ yet")
        return
    for script in scripts:
        output = session.run(PYTHON, str(script), *session.posargs, silent=True)
        print(output, end="" if isinstance(output, str) and output.endswith("\n") else "\n")


@nox.session
def e2e(session: nox.Session) -> None:
    """End-to-end tests against a real etcd + kube-apiserver (tests/e2e, scripts/control-plane).

    The first run on a machine builds kube-apiserver and etcd (scripts/build-control-plane).
    """
    if not any((ROOT / "tests" / "e2e").glob("**/test_*.py")):
        session.log("no e2e tests in tests/e2e yet")
        return
    session.run(PYTHON, "-m", "pytest", "-q", "tests/e2e", *session.posargs)


@nox.session
def scenarios(session: nox.Session) -> None:
    """Re-record scenarios/ on a private containerd (root), then replay them all.

    `nox -s scenarios -- crash-loop-backoff oom-kill` re-records only those.
    """
    session.run(PYTHON, "scripts/record_scenarios.py", *session.posargs)
    session.run(PYTHON, "-m", "pytest", "-q", "tests/scenarios")


@nox.session
def conformance(session: nox.Session) -> None:
    """Kubernetes' NodeConformance e2e suite against this checkout's kubelet (scripts/conformance;
    root; ~40 min with 3 processes on 2 cores; the first run on a machine builds the suite,
    kube-proxy and CoreDNS).

    Without arguments the full selection runs and docs/conformance.md is rewritten; arguments
    after `--` go to scripts/conformance instead: `nox -s conformance -- --focus 'host IP'`.
    """
    args = session.posargs or ["--doc", str(ROOT / "docs" / "conformance.md")]
    session.run(PYTHON, "scripts/conformance", "run", "--lock", INTEGRATION_LOCK, *args)


@nox.session
def conformance_ci(session: nox.Session) -> None:
    """The CI tier of the NodeConformance suite (scripts/conformance --tier ci): the specs of
    the kubelet's everyday paths, on the same one-node cluster, in its own directory; fails if
    any does not pass. Root; the first run on a machine builds the suite (docs/conformance.md).
    """
    session.run(
        PYTHON, "scripts/conformance", "run", "--tier", "ci", "--procs", "3",
        "--dir", "/tmp/tk-conformance-ci", "--lock", INTEGRATION_LOCK, *session.posargs,
    )  # fmt: skip
