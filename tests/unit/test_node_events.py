"""Node condition transitions become the Go kubelet's node events."""

from __future__ import annotations

from trio_kubelet.node.manager import condition_event_reasons


def conditions(**statuses: str) -> dict[str, object]:
    return {"conditions": [{"type": k, "status": v} for k, v in statuses.items()]}


def test_new_and_changed_conditions_give_events_unchanged_ones_do_not() -> None:
    first = conditions(MemoryPressure="False", DiskPressure="False", PIDPressure="False",
                       Ready="True")
    assert condition_event_reasons({}, first) == [
        "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]
    assert condition_event_reasons(first, first) == []
    worse = conditions(MemoryPressure="True", DiskPressure="False", PIDPressure="False",
                       Ready="False")
    assert condition_event_reasons(first, worse) == ["NodeHasInsufficientMemory", "NodeNotReady"]
    assert condition_event_reasons(first, conditions(Ready="Unknown")) == []
