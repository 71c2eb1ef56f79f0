"""Every curated recording in scenarios/ replays to its recorded decisions.

Each directory under scenarios/ is one scenario: a README.md saying what it shows and a
recording.jsonl made by `python scripts/record_scenarios.py NAME` on a real containerd.
`trio-kubelet replay FILE --check` recomputes every decision and crash-loop gate of the
recording with the pure core; any difference — a rule of compute_pod_actions or of the
back-off changed — fails here. A changed rule that is meant is re-recorded, and the
recording's diff is the review of the behaviour change.

A scenario listed in PENDING has a README only: what it will show once its feature exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_kubelet.cli import main
from trio_kubelet.recording.records import DecisionRecord
from trio_kubelet.replay.reader import read_recording

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
RECORDING = "recording.jsonl"
PENDING: dict[str, str] = {}  # scenario -> why it has no recording yet
DIRECTORIES = sorted(path for path in SCENARIOS.iterdir() if path.is_dir())
RECORDED = [path for path in DIRECTORIES if path.name not in PENDING]


def _ids(path: Path) -> str:
    return path.name


def test_there_are_scenarios() -> None:
    assert len(RECORDED) >= 10, [path.name for path in RECORDED]


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_ids)
def test_replays_without_divergence(directory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recording = directory / RECORDING
    if directory.name in PENDING:
        assert not recording.exists(), f"{directory.name} has a recording: take it off PENDING"
        pytest.skip(PENDING[directory.name])
    rerecord = f"python scripts/record_scenarios.py {directory.name}"
    assert recording.is_file(), f"no {RECORDING} (record it: {rerecord})"
    status = main(["replay", str(recording), "--check"])
    output = capsys.readouterr()
    # The divergence report (with its diff) ends the output; the trace before it can be long.
    assert status == 0, f"replay --check exited {status}\n{output.out[-6000:]}{output.err}"
    assert "no divergence" in output.out


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_ids)
def test_has_readme(directory: Path) -> None:
    readme = directory / "README.md"
    assert readme.is_file(), f"{directory.name} has no README.md"
    assert directory.name in readme.read_text(encoding="utf-8").splitlines()[0]


@pytest.mark.parametrize("directory", RECORDED, ids=_ids)
def test_recording_has_decisions(directory: Path) -> None:
    recording = read_recording(directory / RECORDING)
    assert not recording.warnings, recording.warnings
    decisions = [item for item in recording.records if isinstance(item.record, DecisionRecord)]
    assert decisions, f"{directory.name}: the recording holds no decision"


def test_index_lists_every_scenario() -> None:
    index = (SCENARIOS / "README.md").read_text(encoding="utf-8")
    missing = [path.name for path in DIRECTORIES if f"[{path.name}]({path.name}/)" not in index]
    assert not missing, f"scenarios/README.md does not link {missing}"
