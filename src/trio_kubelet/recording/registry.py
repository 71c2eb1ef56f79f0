"""Every decision kind, by the type of its record: what the replayer dispatches on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from trio_kubelet.recording.kinds import DecisionKind
from trio_kubelet.recording.node_decisions import (
    Assess,
    ContainerGCPass,
    Evict,
    ImageGCPass,
    LogRotation,
    StorageEviction,
)
from trio_kubelet.recording.pod_decisions import Admission, PodStatusDecision, PodSync

KINDS: Mapping[type[BaseModel], type[DecisionKind[Any]]] = {
    kind.record: kind
    for kind in (
        PodSync, PodStatusDecision, Admission,
        Assess, Evict, StorageEviction, ContainerGCPass, ImageGCPass, LogRotation,
    )
}
