"""Reading a recording back: one record per line, with errors that name the line and the field.

A recording is JSON Lines written by ``recording.recorder``. The first line is a
header whose ``format`` this reader must understand. A last line that is cut off
(no newline and not JSON: the agent died mid-write) ends the recording with a
warning; any other bad line is an error naming its line number, and for a record
that fails validation, the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from trio_kubelet.recording.records import (
    FORMAT_VERSION,
    Header,
    Record,
)

# Dispatching on ``kind`` by hand is faster than the discriminated union, and the
# field paths in errors do not start with the tag.
_MODELS: dict[str, type[BaseModel]] = {
    model.model_fields["kind"].default: model for model in get_args(get_args(Record)[0])
}


# The recorder writes ``{"t":<float>,"kind":"<kind>",...}``: sniffing the kind lets pydantic
# parse the line straight from bytes (about twice as fast as json.loads + model_validate).
# Any other shape, and any line that fails, takes the slow path, which words the error.
_RECORDER_PREFIX = re.compile(rb'\{"t":[-+0-9.eE]+,"kind":"([a-z_]+)"')


class RecordingError(Exception):
    """A recording that cannot be read; ``str()`` is ``FILE:LINE: message``."""

    def __init__(self, line: int, message: str, *, source: str | None = None) -> None:
        super().__init__(line, message)
        self.line = line
        self.message = message
        self.source = source

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else ""
        if self.source:
            where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.message}" if where else self.message


@dataclass(frozen=True, slots=True)
class NumberedRecord:
    """A record and the line of the file it came from (1-based)."""

    line: int
    record: Record


@dataclass
class Recording:
    """A whole recording in memory."""

    source: str
    records: list[NumberedRecord]
    warnings: list[str] = field(default_factory=list)

    @property
    def header(self) -> Header:
        first = self.records[0].record
        assert isinstance(first, Header)
        return first


def field_path(loc: Iterable[int | str]) -> str:
    """A pydantic error location as ``starts[0].allowed``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _validation_message(err: ValidationError) -> str:
    errors = err.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    where = field_path(first["loc"])
    text = f"{where}: {first['msg']}" if where else first["msg"]
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def parse_record(data: Any, line: int, *, first: bool) -> Record:
    """Validate one decoded line; raises RecordingError (without a source name)."""
    if not isinstance(data, dict):
        raise RecordingError(line, f"expected a JSON object, got {_json_type(data)}")
    kind = data.get("kind")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if kind is None:
        raise RecordingError(line, 'no record kind (the "kind" field is missing)')
    if model is None:
        raise RecordingError(line, f"unknown record kind {json.dumps(kind)}")
    if first and model is not Header:
        raise RecordingError(
            line, f'a recording starts with a header, but this line is a "{kind}" record'
        )
    if model is Header and data.get("format") != FORMAT_VERSION:
        raise RecordingError(
            line,
            f"recording format {json.dumps(data.get('format'))} is not supported "
            f"(this trio-kubelet reads format {FORMAT_VERSION})",
        )
    try:
        record: Record = model.model_validate(data)  # type: ignore[assignment]
    except ValidationError as err:
        raise RecordingError(line, _validation_message(err)) from None
    return record


def _parse_line(raw: bytes, line: int) -> Record:
    sniffed = _RECORDER_PREFIX.match(raw)
    if sniffed is not None and line != 1:
        model = _MODELS.get(sniffed.group(1).decode())
        if model is not None and model is not Header:
            try:
                record: Record = model.model_validate_json(raw)  # type: ignore[assignment]
            except ValidationError:
                pass
            else:
                return record
    if not raw.strip():
        raise RecordingError(line, "empty line")
    return parse_record(_decode(raw.rstrip(b"\r\n"), line), line, first=line == 1)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _decode(raw: bytes, line: int) -> Any:
    try:
        return json.loads(raw)
    except UnicodeDecodeError as err:
        raise RecordingError(line, f"not valid UTF-8 (byte {err.start + 1})") from None
    except json.JSONDecodeError as err:
        raise RecordingError(line, f"not valid JSON ({err.msg}: column {err.colno})") from None


class RecordingReader:
    """Iterates a recording's records one line at a time.

    Iteration raises ``RecordingError`` (with the file name) at the first bad line;
    a cut-off last line stops it cleanly and adds a message to ``warnings``.
    """

    def __init__(self, path: Path, *, source: str | None = None) -> None:
        self.path = path
        self.source = source if source is not None else str(path)
        self.warnings: list[str] = []

    def __iter__(self) -> Iterator[NumberedRecord]:
        try:
            with self.path.open("rb") as file:
                yield from self._records(file)
        except RecordingError as err:
            err.source = self.source
            raise
        except OSError as err:
            raise RecordingError(0, err.strerror or str(err), source=self.source) from None

    def _records(self, lines: Iterable[bytes]) -> Iterator[NumberedRecord]:
        number = 0
        for number, raw in enumerate(lines, start=1):
            if not raw.endswith(b"\n"):
                record = self._last_line(raw, number)
                if record is not None:
                    yield NumberedRecord(number, record)
                return
            yield NumberedRecord(number, _parse_line(raw, number))
        if number == 0:
            raise RecordingError(1, "the recording is empty (expected a header)")

    def _last_line(self, raw: bytes, number: int) -> Record | None:
        """A line without a newline: the recording ends here, complete or cut off mid-write."""
        try:
            data = json.loads(raw)
        except ValueError:
            if number == 1:
                raise RecordingError(1, "the header line is cut off") from None
            self.warnings.append(
                f"{self.source}:{number}: the last line is cut off (the agent stopped while "
                f"writing it); replaying the {number - 1} complete lines before it"
            )
            return None
        return parse_record(data, number, first=number == 1)


def read_recording(path: Path, *, source: str | None = None) -> Recording:
    """Read a whole recording into memory; raises RecordingError."""
    reader = RecordingReader(path, source=source)
    records = list(reader)
    return Recording(reader.source, records, reader.warnings)
