"""recording.registry: every decision a recording holds has its kind, which replay dispatches on."""

from __future__ import annotations

from typing import get_args

from trio_kubelet.recording.records import (
    CRIRecord,
    EventRecord,
    Header,
    Record,
    SnapshotRecord,
    TeardownRecord,
)
from trio_kubelet.recording.registry import KINDS

# What a recording holds beside decisions: the inputs replay rebuilds state from, and facts.
NOT_DECISIONS = {Header, EventRecord, SnapshotRecord, CRIRecord, TeardownRecord}


def test_every_decision_record_has_exactly_one_kind() -> None:
    records = set(get_args(get_args(Record)[0]))
    assert set(KINDS) == records - NOT_DECISIONS
    assert all(kind.record is record for record, kind in KINDS.items())
    assert len(set(KINDS.values())) == len(KINDS)
