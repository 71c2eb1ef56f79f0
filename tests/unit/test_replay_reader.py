"""replay.reader: each way a recording can be broken gets one precise message, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from trio_kubelet.recording.records import (
    ContainerStart,
    CRIRecord,
    DecisionRecord,
    EventRecord,
    Header,
    Record,
    SnapshotRecord,
    StatusRecord,
    TeardownRecord,
)
from trio_kubelet.replay import reader
from trio_kubelet.replay.reader import (
    RecordingError,
    RecordingReader,
    field_path,
    read_recording,
)

HEADER = Header(t=100.0, agent_version="0.1.0", node="n1", start_time=1.7e9, config={})
DECISION = DecisionRecord(
    t=101.5,
    uid="u1",
    pod="web-n1_default",
    spec_seq=0,
    now=1.7e9 + 1.5,
    observed={"uid": "u1", "name": "", "namespace": "", "sandboxes": [], "containers": []},
    actions={"kill_pod": True, "reasons": []},
    starts=[ContainerStart(container="main", key="k", allowed=True)],
)
RECORDS = [
    HEADER,
    EventRecord(t=100.1, seq=0, event={"kind": "resync"}),
    CRIRecord(t=100.2, method="Version", request={}, response={"version": "0.1.0"}),
    DECISION,
    StatusRecord(t=101.6, uid="u1", pod="web-n1_default", status={"phase": "Pending"}),
    SnapshotRecord(t=102.0, pod_sets={"file": []}, spec_seqs={"u1": 0}),
    TeardownRecord(t=103.0, uid="u1", pod="web-n1_default"),
]


def lines_of(*records: Any) -> list[str]:
    return [r.model_dump_json() if hasattr(r, "model_dump_json") else r for r in records]


def write(tmp_path: Path, lines: list[str], *, end: str = "\n") -> Path:
    path = tmp_path / "recording.jsonl"
    path.write_text("\n".join(lines) + end)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(RecordingError) as caught:
        read_recording(path)
    return str(caught.value)


def test_every_record_kind_reads_back_with_its_line(tmp_path: Path) -> None:
    recording = read_recording(write(tmp_path, lines_of(*RECORDS)))

    assert [r.record for r in recording.records] == RECORDS
    assert [r.line for r in recording.records] == list(range(1, len(RECORDS) + 1))
    assert recording.header == HEADER and recording.warnings == []


def test_records_written_in_another_key_order_read_the_same(tmp_path: Path) -> None:
    """The fast path expects the recorder's layout; anything else takes the slow path."""
    shuffled = json.dumps(dict(reversed(list(DECISION.model_dump().items()))))

    recording = read_recording(write(tmp_path, [HEADER.model_dump_json(), shuffled]))

    assert recording.records[1].record == DECISION


def test_a_corrupted_middle_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    lines = lines_of(*RECORDS)
    at = lines[3].index(',"spec_seq"')
    lines[3] = lines[3][:at] + " " + lines[3][at + 1 :]  # a comma lost
    path = write(tmp_path, lines)

    assert error_of(path) == f"{path}:4: not valid JSON (Expecting ',' delimiter: column {at + 2})"


def test_a_cut_off_last_line_is_a_warning_and_the_rest_reads(tmp_path: Path) -> None:
    lines = lines_of(*RECORDS)
    lines[-1] = lines[-1][:25]  # the agent died in the middle of writing it
    path = write(tmp_path, lines, end="")

    recording = read_recording(path)

    assert [r.record for r in recording.records] == RECORDS[:-1]
    assert recording.warnings == [
        f"{path}:7: the last line is cut off (the agent stopped while writing it); "
        "replaying the 6 complete lines before it"
    ]


def test_a_complete_last_line_without_newline_is_read(tmp_path: Path) -> None:
    recording = read_recording(write(tmp_path, lines_of(*RECORDS), end=""))

    assert len(recording.records) == len(RECORDS) and not recording.warnings


def test_a_cut_off_line_followed_by_more_lines_is_an_error(tmp_path: Path) -> None:
    lines = lines_of(*RECORDS)
    lines[2] = lines[2][:25]

    assert error_of(write(tmp_path, lines)).startswith(
        f"{tmp_path / 'recording.jsonl'}:3: not valid JSON (Unterminated string"
    )


def test_an_unsupported_format_is_refused(tmp_path: Path) -> None:
    header = json.loads(HEADER.model_dump_json()) | {"format": 2, "new_field": True}

    message = error_of(write(tmp_path, [json.dumps(header), *lines_of(*RECORDS[1:])]))

    assert message.endswith(
        ":1: recording format 2 is not supported (this trio-kubelet reads format 1)"
    )


def test_an_unknown_record_kind_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, [*lines_of(*RECORDS[:3]), '{"t": 1.0, "kind": "foo"}'])

    assert error_of(path) == f'{path}:4: unknown record kind "foo"'


def test_a_line_without_a_kind(tmp_path: Path) -> None:
    path = write(tmp_path, [*lines_of(*RECORDS[:2]), '{"t": 1.0}', "[1, 2]"])

    assert error_of(path) == f'{path}:3: no record kind (the "kind" field is missing)'


def test_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = write(tmp_path, [*lines_of(*RECORDS[:2]), "[1, 2]"])

    assert error_of(path) == f"{path}:3: expected a JSON object, got an array"


def test_a_missing_header_is_an_error_on_line_1(tmp_path: Path) -> None:
    path = write(tmp_path, lines_of(*RECORDS[1:]))

    assert error_of(path) == (
        f'{path}:1: a recording starts with a header, but this line is a "event" record'
    )


def test_an_empty_file_has_no_header(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")

    assert error_of(path) == f"{path}:1: the recording is empty (expected a header)"


def test_a_cut_off_header_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, [HEADER.model_dump_json()[:30]], end="")

    assert error_of(path) == f"{path}:1: the header line is cut off"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"spec_seq": "zero"},
            "spec_seq: Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"starts": [{"container": "main", "key": "k", "allowed": "perhaps"}]},
            "starts[0].allowed: Input should be a valid boolean, unable to interpret input",
        ),
        ({"actions": None}, "actions: Input should be a valid dictionary"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_an_invalid_field_is_named_with_its_path(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    decision = json.loads(DECISION.model_dump_json()) | change
    path = write(tmp_path, [*lines_of(*RECORDS[:3]), json.dumps(decision)])

    assert error_of(path) == f"{path}:4: {message}"


def test_a_missing_field_is_named(tmp_path: Path) -> None:
    decision = json.loads(DECISION.model_dump_json())
    del decision["observed"], decision["uid"]
    path = write(tmp_path, [HEADER.model_dump_json(), json.dumps(decision)])

    assert error_of(path) == f"{path}:2: uid: Field required (and 1 more)"


def test_invalid_utf8_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "recording.jsonl"
    path.write_bytes(HEADER.model_dump_json().encode() + b'\n{"t": 1, "kind": "\xff"}\n')

    assert error_of(path) == f"{path}:2: not valid UTF-8 (byte 19)"


def test_an_empty_line_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, [*lines_of(*RECORDS[:2]), "", *lines_of(*RECORDS[2:])])

    assert error_of(path) == f"{path}:3: empty line"


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"

    assert error_of(path) == f"{path}: No such file or directory"


def test_the_reader_streams_and_stops_at_the_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path, [*lines_of(*RECORDS[:3]), "{oops", *lines_of(*RECORDS[3:])])
    reader = RecordingReader(path, source="rec")
    seen = []

    with pytest.raises(RecordingError) as caught:
        for item in reader:
            seen.append(item.line)

    assert seen == [1, 2, 3]
    assert (caught.value.line, str(caught.value)) == (
        4,
        "rec:4: not valid JSON (Expecting property name enclosed in double quotes: column 2)",
    )


def test_error_without_a_file_name() -> None:
    assert str(RecordingError(3, "bad")) == "line 3: bad"
    assert field_path(("starts", 0, "allowed")) == "starts[0].allowed"


def test_the_fast_path_knows_every_record_kind() -> None:
    """Each kind of the ``Record`` union parses on the fast path, by its own model."""
    kinds = {
        model.model_fields["kind"].default: model for model in get_args(get_args(Record)[0])
    }
    assert kinds == reader._MODELS
