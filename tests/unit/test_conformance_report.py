"""scripts/conformance's report: every selected spec's outcome from the suite's junit, the
reason beside each one that did not pass, and the suite's own failures."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "conformance"


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("conformance_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader("conformance_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["conformance_script"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


conformance = _load()

PASSED = "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]"
FAILED = "[sig-node] Pods should support pod readiness gates [NodeConformance]"
SKIPPED = "[sig-node] Sysctls [LinuxOnly] should reject invalid sysctls [NodeConformance]"
NOT_RUN = "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [NodeConformance]"

JUNIT = f"""<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5">
  <testsuite name="Kubernetes e2e suite" tests="5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" time="1.5"/>
    <testcase name="[It] {PASSED}" classname="Kubernetes e2e suite" time="12.2"/>
    <testcase name="[It] {FAILED}" classname="Kubernetes e2e suite" time="11.9">
      <failure type="failed">&gt; Enter [It] should support pod readiness gates
[FAILED] Expect pod(pods-1/pod-ready)'s Ready condition to be false initially.
In [It] at: k8s.io/kubernetes@v1.36.3/test/e2e/common/node/pods.go:822
      </failure>
    </testcase>
    <testcase name="[It] {SKIPPED}" classname="Kubernetes e2e suite" time="0.1">
      <skipped message="skipped - Only supported for providers [gce]"/>
    </testcase>
    <testcase name="[SynchronizedAfterSuite]" classname="Kubernetes e2e suite" time="0.3">
      <failure type="failed">[FAILED] namespaces left behind</failure>
    </testcase>
  </testsuite>
</testsuites>
"""


@pytest.fixture
def junit(tmp_path: Path) -> Path:
    path = tmp_path / "junit_01.xml"
    path.write_text(JUNIT)
    return path


def test_every_selected_spec_gets_its_outcome(junit: Path) -> None:
    results, suite = conformance.outcomes(junit, [PASSED, FAILED, SKIPPED, NOT_RUN])
    by_name = {result.name: result for result in results}
    assert [result.name for result in results] == [PASSED, FAILED, SKIPPED, NOT_RUN]
    assert by_name[PASSED].state == "passed"
    assert by_name[PASSED].seconds == pytest.approx(12.2)
    assert by_name[FAILED].state == "failed"
    assert by_name[FAILED].message.startswith(
        "[FAILED] Expect pod(pods-1/pod-ready)'s Ready condition to be false initially."
    )
    assert (by_name[SKIPPED].state, by_name[SKIPPED].message) == (
        "skipped",
        "Only supported for providers [gce]",
    )
    assert by_name[NOT_RUN].state == "not run"
    assert [(node.name, node.message) for node in suite] == [
        ("[SynchronizedAfterSuite]", "[FAILED] namespaces left behind")
    ]


def test_no_junit_means_nothing_ran(tmp_path: Path) -> None:
    results, suite = conformance.outcomes(tmp_path / "missing.xml", [PASSED])
    assert [(result.name, result.state) for result in results] == [(PASSED, "not run")]
    assert suite == []


def test_markdown_counts_and_reasons(junit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        conformance,
        "known_reasons",
        lambda: [{"spec": "pod readiness gates", "kind": "kubelet", "why": "gates ignored"}],
    )
    results, suite = conformance.outcomes(junit, [PASSED, FAILED, SKIPPED, NOT_RUN])
    text = conformance.markdown(results, suite, {"focus": "`x|y`"})
    assert "- focus: `x|y`" in text
    assert (
        "selected: **4** — passed **1**, failed **1**, skipped **1**, excluded **0**, "
        "not run **1**"
    ) in text
    failed_row = next(line for line in text.splitlines() if FAILED in line)
    assert "| failed | 12 | **kubelet**: gates ignored — failure: [FAILED] Expect" in failed_row
    passed_row = next(line for line in text.splitlines() if PASSED in line)
    assert passed_row.endswith("| passed | 12 |  |")
    assert "[SynchronizedAfterSuite]: [FAILED] namespaces left behind" in text


def test_markdown_lists_the_exclusions_with_their_reasons(
    junit: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = {"spec": "(root,0644,tmpfs)", "kind": "environment", "exclude": True, "why": "no tmpfs"}
    monkeypatch.setattr(conformance, "known_reasons", lambda: [entry])
    results, suite = conformance.outcomes(junit, [PASSED, NOT_RUN], ["(root,0644,tmpfs)"])
    text = conformance.markdown(results, suite, {})
    assert "passed **1**, failed **0**, skipped **0**, excluded **1**, not run **0**" in text
    assert text.endswith("- `(root,0644,tmpfs)` (environment): no tmpfs\n")


def test_an_excluded_spec_that_did_not_run_is_excluded(junit: Path) -> None:
    results, _ = conformance.outcomes(junit, [PASSED, NOT_RUN], ["(root,0644,tmpfs)", "host IP"])
    assert [(result.name, result.state) for result in results] == [
        (PASSED, "passed"),  # an exclusion that ran anyway keeps its outcome
        (NOT_RUN, "excluded"),
    ]


def test_exclusions_are_skipped_as_literal_text() -> None:
    skip = conformance.skip_with(r"\[Serial\]", ["(root,0644,tmpfs)", "a.b [x]"])
    assert skip == r"\[Serial\]|\(root,0644,tmpfs\)|a\.b\ \[x\]"
    assert conformance.skip_with("s", []) == "s"


def test_the_reasons_file_is_well_formed() -> None:
    for entry in conformance.known_reasons():
        assert set(entry) - {"exclude"} == {"spec", "kind", "why"}, entry
        assert entry["kind"] in {"kubelet", "harness", "environment"}, entry
        # Only a reason outside the kubelet may leave a spec out of the run.
        assert not entry.get("exclude") or entry["kind"] == "environment", entry


def test_a_focused_rerun_is_reported_beside_the_spec_and_counted(
    junit: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conformance, "known_reasons", lambda: [])
    results, suite = conformance.outcomes(junit, [PASSED, FAILED, NOT_RUN])
    rerun = conformance.Rerun(
        {"trio-kubelet commit": "abc1234", "focus": "`readiness gates`"},
        [conformance.Outcome(FAILED, "passed", 9.0, "")],
    )
    text = conformance.markdown(results, suite, {}, [rerun])
    assert "passed **1**, failed **1**" in text  # the run's own counts stay
    assert "- passed or excluded counting the focused reruns below: **2**" in text
    failed_row = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "| failed | 12 | rerun 1: **passed** — [FAILED] Expect" in failed_row
    assert "## Focused rerun 1\n\n- trio-kubelet commit: abc1234\n" in text
    assert f"| {FAILED} | passed | 9 |  |" in text
