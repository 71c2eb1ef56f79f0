"""The fuzz tier: generated and known-hostile manifests through the static source and the model.

Whatever a manifest holds, reading it must return (no exception, no hang: each within the
parse budget), and give either pods that are valid as the API server sees them, or
refusals that say where the problem is. 10,000 generated manifests run in the suite.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.manifests import HOSTILE, manifests
from trio_kubelet.model.pod import Pod
from trio_kubelet.model.validation import validate_pod
from trio_kubelet.sources.manifest_decode import PARSE_BUDGET_SECONDS
from trio_kubelet.sources.static_files import ParsedManifest, load_manifests, parse_manifest

NODE = "fuzz-node"
FUZZED_MANIFESTS = 10_000

# A refusal names a field of the document (or the item of a PodList), or is about the
# document or the manifest as a whole.
_WHERE = r"^(document \d+(, |: ))?(items\[\d+\][.:] ?)?"
_NAMES_A_FIELD = re.compile(_WHERE + r"(apiVersion|kind|metadata|spec|items|x-anchor)\b")
_WHOLE = re.compile(
    _WHERE + r"(expected a mapping \(a Pod or PodList\)|unsupported (kind|apiVersion) "
    r"|not UTF-8 text|no pod manifest in file|more than \d+ documents|invalid (YAML|JSON)"
    r"|file is larger than|duplicate pod "
    r"|(\[\d+\])*(\.\.\.)?:? ?(more than|nested deeper|reading took))")


def check(result: ParsedManifest) -> None:
    """Valid pods or refusals that say where (an empty PodList: neither), never an internal
    error."""
    assert not (result.pods and result.problems)
    for pod in result.pods:
        assert validate_pod(pod) == []
        assert Pod.model_validate(pod.to_api()).to_api() == pod.to_api()
    for problem in result.problems:
        assert not problem.reason.startswith("cannot be read:"), problem.reason
        assert _NAMES_A_FIELD.match(problem.reason) or _WHOLE.match(problem.reason), (
            problem.reason)


# Hypothesis costs some milliseconds per example whatever is drawn, more than reading a
# manifest: each example is a batch of manifests.
BATCH = 10


@settings(max_examples=FUZZED_MANIFESTS // BATCH, deadline=PARSE_BUDGET_SECONDS * BATCH * 1000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(manifests, min_size=BATCH, max_size=BATCH))
def test_fuzzed_manifests(batch: list[tuple[str, bytes]]) -> None:
    for suffix, data in batch:
        location = "/etc/kubernetes/manifests/fuzz" + suffix
        check(parse_manifest(data, location, NODE, suffix=suffix))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_shapes_through_the_source(tmp_path: Path, name: str) -> None:
    suffix, data = HOSTILE[name]
    (tmp_path / f"{name}{suffix}").write_bytes(data)
    began = time.monotonic()
    scan = load_manifests(tmp_path, NODE)
    assert time.monotonic() - began < PARSE_BUDGET_SECONDS * 2  # no hang; bench/ measures
    check(ParsedManifest(scan.pods, scan.problems))
    assert scan.problems, "every known hostile shape is refused"
