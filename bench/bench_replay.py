"""Replay speed: ``trio-kubelet replay --check`` over a 100,000-record recording, end to end.

The recording is real, then stretched: the agent runs in this process for a few virtual
minutes (trio MockClock) against the fake CRI runtime with a mix of pods (crash loops,
jobs that succeed or fail under each restart policy, init containers with a sidecar,
long runners), recording with ``--record``. That recording's body is then repeated with
shifted times, fresh event seqs and fresh pod UIDs until it holds ``--records`` records,
so every repetition is a new generation of the same pods and every decision still
re-checks exactly. The mix of record kinds is the agent's own (mostly CRI calls).

The timed part is ``trio_kubelet.cli.main(["replay", FILE, "--check"])``: reading and
validating every line, rebuilding the pod specs, recomputing every decision and gate
under the virtual clock, and printing the trace (to a buffer). Prints one JSON object.

Usage: ``python bench/bench_replay.py [--records 100000] [--keep FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

import trio_kubelet.agent
from trio_kubelet.cli import main as kubelet_main
from trio_kubelet.cli import parse_run_options
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, in_process_opener

NODE = "bench"
EPOCH = 1_700_000_000.0
RECORD_FOR = 600.0  # virtual seconds of the source recording

# name: (restartPolicy, init containers, containers, {container: script})
PODS: dict[str, tuple[str, list[dict[str, Any]], list[str], dict[str, ContainerScript]]] = {
    "crash": ("Always", [], ["app"], {"app": ContainerScript(exit_after=0.2, exit_code=1)}),
    "crash-two": (
        "Always",
        [],
        ["app", "helper"],
        {"app": ContainerScript(exit_after=3.0, exit_code=2)},
    ),
    "retry": ("OnFailure", [], ["job"], {"job": ContainerScript(exit_after=1.0, exit_code=1)}),
    "done": ("OnFailure", [], ["job"], {"job": ContainerScript(exit_after=0.5, exit_code=0)}),
    "never": ("Never", [], ["once"], {"once": ContainerScript(exit_after=0.5, exit_code=1)}),
    "web": ("Always", [], ["server", "metrics"], {}),
    "init": (
        "Always",
        [{"name": "init-1"}, {"name": "init-2"}, {"name": "shipper", "restartPolicy": "Always"}],
        ["main"],
        {
            "init-1": ContainerScript(exit_after=0.3, exit_code=0),
            "init-2": ContainerScript(exit_after=0.3, exit_code=0),
        },
    ),
    "sidecar-job": (
        "Never",
        [{"name": "proxy", "restartPolicy": "Always"}],
        ["work"],
        {"work": ContainerScript(exit_after=5.0, exit_code=0)},
    ),
}


def _manifest(name: str, policy: str, init: list[dict[str, Any]], containers: list[str]) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": policy,
            "initContainers": [{"image": "busybox:1.36", **c} for c in init],
            "containers": [{"name": c, "image": "busybox:1.36"} for c in containers],
        },
    }
    return json.dumps(pod)  # JSON is YAML


async def _run_agent(workdir: Path) -> None:
    manifests = workdir / "manifests"
    manifests.mkdir()
    for name, (policy, init, containers, _) in PODS.items():
        (manifests / f"{name}.yaml").write_text(_manifest(name, policy, init, containers))
    sock = workdir / "cri.sock"
    options = parse_run_options(
        [
            "--pod-manifest-path",
            str(manifests),
            "--container-runtime-endpoint",
            f"unix://{sock}",
            "--cgroups-per-qos=false",  # fake pods: no cgroups on the host
            "--root-dir",
            str(workdir / "root"),
            "--pod-logs-dir",
            str(workdir / "logs"),
            "--hostname-override",
            NODE,
            "--record",
            str(workdir / "source.jsonl"),
        ]
    )
    fake = FakeRuntime(_agent_clock().now)
    for pod, (_, _, _, scripts) in PODS.items():
        for container, script in scripts.items():
            fake.script(f"{pod}-{NODE}", container, script)
    agent: Any = trio_kubelet.agent
    original, agent.open_cri_client = agent.open_cri_client, in_process_opener(fake)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run_agent, options)
            await trio.sleep(RECORD_FOR)
            nursery.cancel_scope.cancel()
    finally:
        agent.open_cri_client = original


def _agent_clock() -> TrioWallClock:
    return TrioWallClock(epoch=EPOCH)


def record_source(workdir: Path) -> Path:
    """A real recording of the agent against the fake runtime (agent and fake on one epoch)."""
    agent: Any = trio_kubelet.agent
    original = agent.TrioWallClock
    agent.TrioWallClock = _agent_clock
    try:
        trio.run(_run_agent, workdir, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        agent.TrioWallClock = original
    return workdir / "source.jsonl"


def _renamer(fresh: dict[str, str]) -> Callable[[re.Match[str]], str]:
    return lambda match: fresh[match.group(0)]


def stretch(source: Path, target: Path, count: int) -> dict[str, int]:
    """Write ``count`` records: the source's header, then its body again and again."""
    header, *body = source.read_text().splitlines()
    records = [json.loads(line) for line in body]
    uids = sorted(
        {
            pod["metadata"]["uid"]
            for r in records
            if r["kind"] == "event"
            for pod in r["event"].get("pods", ())
        }
    )
    span = max(r["t"] for r in records) - json.loads(header)["t"] + 1.0
    seqs = max(r["seq"] for r in records if r["kind"] == "event") + 1
    kinds: dict[str, int] = {}
    with target.open("w") as out:
        out.write(header + "\n")
        written = 1
        generation = 0
        while written < count:
            fresh = {uid: hashlib.md5(f"{uid}/{generation}".encode()).hexdigest() for uid in uids}
            pattern = re.compile("|".join(map(re.escape, fresh)))
            for data in records:
                if written == count:
                    break
                text = json.dumps(data, separators=(",", ":"))
                shifted = json.loads(pattern.sub(_renamer(fresh), text))
                shifted["t"] += generation * span
                if shifted["kind"] == "event":
                    shifted["seq"] += generation * seqs
                elif shifted["kind"] in ("decision", "status", "admission") and (
                    shifted.get("spec_seq", -1) >= 0
                ):
                    shifted["spec_seq"] += generation * seqs
                if shifted["kind"] == "admission":
                    shifted["admitted"] = {
                        uid: seq + generation * seqs for uid, seq in shifted["admitted"].items()
                    }
                out.write(json.dumps(shifted, separators=(",", ":")) + "\n")
                kinds[shifted["kind"]] = kinds.get(shifted["kind"], 0) + 1
                written += 1
            generation += 1
    return kinds


def time_replay(path: Path) -> tuple[float, int, str]:
    trace = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(trace):
        status = kubelet_main(["replay", str(path), "--check"])
    return time.perf_counter() - started, status, trace.getvalue().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="also keep the stretched recording here")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        workdir = Path(tmp)
        source = record_source(workdir)
        source_records = len(source.read_text().splitlines())
        big = args.keep or workdir / "replay.jsonl"
        kinds = stretch(source, big, args.records)
        seconds, status, verdict = time_replay(big)
        size = big.stat().st_size
    if status != 0:
        sys.exit(f"replay --check failed ({status}): {verdict}")
    decisions, gates = (int(n) for n in re.findall(r"(\d+) (?:decisions|gates)", verdict))
    print(
        json.dumps(
            {
                "records": args.records,
                "seconds": round(seconds, 3),
                "records_per_s": round(args.records / seconds),
                "decisions": decisions,
                "gates": gates,
                "mb": round(size / 2**20, 1),
                "kinds": kinds,
                "source_records": source_records,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
