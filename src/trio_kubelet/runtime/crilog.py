"""CRI container log files: the line format, the `kubectl logs` options, and a streaming reader.

A runtime writes one line per chunk of container output,
``<RFC3339Nano> <stdout|stderr> <P|F> <text>``, where ``P`` marks a partial chunk (a long line
the runtime split, or output not yet terminated by a newline) that the next chunk of the same
stream continues. Everything up to `read_log` is pure (sans-IO, like h11's protocol
classes): options from a query, a `LogDecoder` that turns file bytes into what the client sees,
and `find_tail_start`, which walks a file backwards in blocks. `read_log` is the trio shell that
reads blocks (never a whole file) and follows a growing file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import BinaryIO

import trio

__all__ = [
    "STDERR",
    "STDOUT",
    "LogChunk",
    "LogDecoder",
    "LogOptions",
    "LogQueryError",
    "find_tail_start",
    "format_timestamp",
    "go_quote",
    "log_options_from_query",
    "open_log",
    "parse_chunk",
    "parse_rfc3339_nanos",
    "read_log",
    "timestamp_ns",
]

STDOUT = "stdout"
STDERR = "stderr"
BOTH_STREAMS = frozenset({STDOUT, STDERR})

BLOCK_SIZE = 64 * 1024
# A joined line is emitted (unterminated, continued by the next piece) once it reaches this
# size, so a container that never ends its line cannot make the reader buffer without bound.
MAX_JOINED_LINE = 1024 * 1024
# A file line longer than this is not a CRI chunk (containerd splits at 16 KiB): skipped.
MAX_FILE_LINE = 4 * 1024 * 1024

_INT64_MAX = 2**63 - 1
_TIMESTAMP = re.compile(
    rb"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)
_STREAMS = {b"stdout": STDOUT, b"stderr": STDERR}
_STREAM_PARAM = {"All": BOTH_STREAMS, "Stdout": frozenset({STDOUT}), "Stderr": frozenset({STDERR})}


def go_quote(value: str) -> str:
    """``value`` double-quoted, as Go's %q shows it in the messages this module mirrors."""
    return json.dumps(value, ensure_ascii=False)


# -- the line format ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogChunk:
    """One line of a CRI log file."""

    timestamp: bytes  # as written, e.g. b"2024-05-01T10:00:00.123456789Z"
    stream: str  # STDOUT or STDERR
    partial: bool  # tag P: the next chunk of this stream continues the line
    text: bytes  # without the line's newline


def parse_chunk(line: bytes) -> LogChunk | None:
    """Parse one file line (without its newline); None when it is not a CRI log line."""
    timestamp, _, rest = line.partition(b" ")
    if _TIMESTAMP.fullmatch(timestamp) is None:
        return None
    stream_name, _, rest = rest.partition(b" ")
    stream = _STREAMS.get(stream_name)
    if stream is None:
        return None
    tags, _, text = rest.partition(b" ")
    if not tags:
        return None
    # Tags are ':'-separated for forward compatibility; only the first one means anything today.
    return LogChunk(timestamp, stream, tags.split(b":", 1)[0] == b"P", text)


def timestamp_ns(raw: bytes) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 timestamp (any fraction length), or None."""
    match = _TIMESTAMP.fullmatch(raw)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                          tzinfo=_zone(zone))
    except ValueError:
        return None
    nanos = int((fraction or b"").ljust(9, b"0"))
    return int(moment.timestamp()) * 1_000_000_000 + nanos


def _zone(zone: bytes) -> timezone:
    if zone in (b"Z", b"z"):
        return UTC
    sign = -1 if zone[:1] == b"-" else 1
    return timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))


def format_timestamp(raw: bytes) -> bytes:
    """A chunk's timestamp with a fixed 9-digit fraction, as the Go kubelet prints it.

    RFC3339NanoFixed: runtimes trim trailing zeros, `kubectl logs --timestamps` shows all nine
    digits; the zone is kept as written (a zero offset becomes "Z").
    """
    match = _TIMESTAMP.fullmatch(raw)
    if match is None:
        return raw
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    if zone in (b"z", b"+00:00", b"-00:00"):
        zone = b"Z"
    return b"%s-%s-%sT%s:%s:%s.%s%s" % (year, month, day, hour, minute, second,
                                      (fraction or b"").ljust(9, b"0"), zone)


def parse_rfc3339_nanos(value: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 timestamp; ValueError when it is not one."""
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raw = b""
    nanos = timestamp_ns(raw)
    if nanos is None:
        raise ValueError(f"not an RFC 3339 timestamp: {go_quote(value)}")
    return nanos


# -- the options -------------------------------------------------------------------------------


class LogQueryError(ValueError):
    """A query parameter of a log request has a bad value; the message names the field."""


@dataclass(frozen=True)
class LogOptions:
    """What `kubectl logs` asks for (v1.PodLogOptions, as the kubelet receives it)."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None  # None: the whole file
    limit_bytes: int | None = None  # None: no limit
    since_ns: int | None = None  # skip lines older than this (epoch nanoseconds)
    streams: frozenset[str] = field(default=BOTH_STREAMS)


def log_options_from_query(query: Mapping[str, Sequence[str]], now_ns: int) -> LogOptions:
    """Decode and validate the query of a ``/containerLogs`` request.

    Follows the API machinery's query conversion (the first value counts; a boolean is false only
    when absent, "false" or "0"; an empty number is absent) and ValidatePodLogOptions, plus the
    kubelet's legacy ``tail`` (``all`` = no limit). Unknown parameters, such as
    ``insecureSkipTLSVerifyBackend`` (meant for the API server), are ignored. Raises
    `LogQueryError` listing every bad field.
    """
    errors: list[str] = []

    def first(name: str) -> str | None:
        values = query.get(name)
        return values[0] if values else None

    def flag(name: str) -> bool:
        value = first(name)
        return value is not None and value.lower() not in ("false", "0")

    def integer(name: str, value: str | None, minimum: int, rule: str) -> int | None:
        if value is None or value == "":
            return None
        try:
            number = int(value, 10)
        except ValueError:
            number = None
        if number is None or not value.lstrip("+-").isdigit() or abs(number) > _INT64_MAX:
            errors.append(f"{name}: Invalid value: {go_quote(value)}: must be an integer")
            return None
        if number < minimum:
            errors.append(f"{name}: Invalid value: {number}: {rule}")
            return None
        return number

    tail_value = first("tailLines")
    legacy_tail = first("tail")
    if legacy_tail:
        tail_value = None if legacy_tail == "all" else legacy_tail
    tail = integer("tailLines", tail_value, 0, "must be greater than or equal to 0")
    limit = integer("limitBytes", first("limitBytes"), 1, "must be greater than 0")
    since_seconds = integer("sinceSeconds", first("sinceSeconds"), 1, "must be greater than 0")
    since_time: int | None = None
    raw_since_time = first("sinceTime")
    if raw_since_time:
        try:
            since_time = parse_rfc3339_nanos(raw_since_time)
        except ValueError:
            errors.append(f"sinceTime: Invalid value: {go_quote(raw_since_time)}: must be an "
                          "RFC 3339 timestamp such as 2006-01-02T15:04:05Z")
    if first("sinceSeconds") and raw_since_time:
        errors.append("Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified")
    stream = first("stream") or "All"
    if stream not in _STREAM_PARAM:
        errors.append(f'stream: Unsupported value: {go_quote(stream)}: supported values: '
                      '"All", "Stderr", "Stdout"')
    if errors:
        raise LogQueryError(errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    since = since_time
    if since_seconds is not None:
        since = now_ns - since_seconds * 1_000_000_000
    return LogOptions(
        follow=flag("follow"), previous=flag("previous"), timestamps=flag("timestamps"),
        tail_lines=tail, limit_bytes=limit, since_ns=since, streams=_STREAM_PARAM[stream],
    )


# -- decoding ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _PartialLine:
    timestamp: bytes
    parts: list[bytes]
    size: int
    continued: bool  # an earlier piece of this line was already emitted (too long to hold)


class LogDecoder:
    """File bytes in, the bytes the client sees out: joins partial chunks, filters, limits.

    Feed it consecutive blocks of a log file from a line start; it keeps incomplete file lines
    and unfinished partial lines between calls. `end` flushes what is left when the log is over
    (the file ended and no more output is coming). Lines that are not CRI chunks are skipped.
    """

    def __init__(self, options: LogOptions, max_lines: int | None = None) -> None:
        self._options = options
        self._remaining = options.limit_bytes
        self._max_lines = max_lines  # stop after this many lines (tailLines without follow)
        self._carry = b""
        self._pending: dict[str, _PartialLine] = {}
        self.done = False  # the byte or line limit has been reached: read no more

    def feed(self, data: bytes) -> bytes:
        """Decode a block; returns the output for every line completed by it."""
        if self.done or not data:
            return b""
        lines = (self._carry + data).split(b"\n")
        self._carry = lines.pop()
        if len(self._carry) > MAX_FILE_LINE:
            self._carry = b""
        out: list[bytes] = []
        for line in lines:
            self._chunk(line, out)
            if self.done:
                break
        return b"".join(out)

    def new_file(self) -> None:
        """The log continues in a new file (rotation): drop the old one's unfinished file line."""
        self._carry = b""

    def end(self) -> bytes:
        """Flush the last, unterminated file line and every partial line (without newline)."""
        out: list[bytes] = []
        if self._carry and not self.done:
            self._chunk(self._carry, out)
        self._carry = b""
        for stream in list(self._pending):
            if self.done:
                break
            pending = self._pending.pop(stream)
            self._emit(pending, stream, terminated=False, out=out)
        self._pending.clear()
        return b"".join(out)

    def _chunk(self, line: bytes, out: list[bytes]) -> None:
        chunk = parse_chunk(line)
        if chunk is None or chunk.stream not in self._options.streams:
            return
        pending = self._pending.get(chunk.stream)
        if pending is None:
            pending = _PartialLine(chunk.timestamp, [], 0, continued=False)
            self._pending[chunk.stream] = pending
        pending.parts.append(chunk.text)
        pending.size += len(chunk.text)
        if not chunk.partial:
            del self._pending[chunk.stream]
            self._emit(pending, chunk.stream, terminated=True, out=out)
        elif pending.size >= MAX_JOINED_LINE:
            self._pending[chunk.stream] = _PartialLine(chunk.timestamp, [], 0, continued=True)
            self._emit(pending, chunk.stream, terminated=False, out=out)

    def _emit(self, line: _PartialLine, stream: str, *, terminated: bool,
              out: list[bytes]) -> None:
        options = self._options
        if options.since_ns is not None:
            moment = timestamp_ns(line.timestamp)
            if moment is not None and moment < options.since_ns:
                return
        prefix = b""
        if options.timestamps and not line.continued:
            prefix = format_timestamp(line.timestamp) + b" "
        rendered = b"".join([prefix, *line.parts, b"\n" if terminated else b""])
        if self._remaining is not None:
            rendered = rendered[: self._remaining]
            self._remaining -= len(rendered)
            if self._remaining <= 0:
                self.done = True
        out.append(rendered)
        if terminated and self._max_lines is not None:
            self._max_lines -= 1
            if self._max_lines <= 0:
                self.done = True


def find_tail_start(file: BinaryIO, lines: int, streams: frozenset[str] = BOTH_STREAMS,
                    block_size: int = BLOCK_SIZE) -> int:
    """The offset from which ``file`` holds its last ``lines`` log lines, read backwards in blocks.

    A line is what `LogDecoder` prints: the chunks of one stream up to and including an ``F``
    chunk, or the unterminated group of ``P`` chunks at the very end. Chunks of unselected
    streams and malformed lines do not count. Blocking; call it in a thread for big files.
    """
    end = file.seek(0, os.SEEK_END)
    if lines <= 0:
        return end
    counted = 0
    in_line = False  # reading the earlier P chunks of a line already counted
    position = end  # file[position:] has been read
    limit = end + 1  # lines from here on are counted; a virtual newline ends the last line
    buffer = b"\n"  # file[position:limit], always ending with the newline before `limit`
    while True:
        pieces = buffer[:-1].split(b"\n")
        head = pieces.pop(0) if position > 0 else b""  # may be cut by the block boundary
        for piece in reversed(pieces):
            limit -= len(piece) + 1
            chunk = parse_chunk(piece)
            if chunk is None or chunk.stream not in streams:
                continue
            if not chunk.partial:
                if counted == lines:
                    return min(limit + len(piece) + 1, end)
                counted += 1
                in_line = True
            elif not in_line:  # the unterminated group at the very end
                counted += 1
                in_line = True
        if position == 0:
            return 0
        if len(head) > MAX_FILE_LINE:  # not a CRI chunk: start after it rather than hold it
            return limit
        read_from = max(0, position - block_size)
        file.seek(read_from)
        buffer = file.read(position - read_from) + head + b"\n"
        position = read_from


# -- the reader --------------------------------------------------------------------------------


async def open_log(path: Path) -> BinaryIO:
    """Open a log file for `read_log` (in a thread: a slow disk must not stall the server)."""
    return await trio.to_thread.run_sync(lambda: path.open("rb"))


async def read_log(
    file: BinaryIO,
    options: LogOptions,
    *,
    is_running: Callable[[], Awaitable[bool]] | None = None,
    poll_interval: float = 0.25,
    running_check_interval: float = 1.0,
) -> AsyncIterator[bytes]:
    """Stream an open log file (from `open_log`) as `kubectl logs` shows it, block by block.

    With ``options.follow`` it keeps polling the file (a cheap fstat every ``poll_interval``)
    for as long as ``is_running()`` says the container runs -- asked at most every
    ``running_check_interval`` while no new output arrives, like the Go kubelet's
    ContainerStatus check -- then drains the rest and stops. A file replaced under the same
    path (log rotation) is reopened from its start. Cancellation (the client went away) stops
    it; the file is closed in every case.
    """
    path = Path(file.name) if isinstance(file.name, str) else None
    try:
        max_lines = None
        if options.tail_lines is not None:
            start = await trio.to_thread.run_sync(
                find_tail_start, file, options.tail_lines, options.streams)
            file.seek(start)
            if not options.follow:
                if options.tail_lines == 0:
                    return
                max_lines = options.tail_lines
        decoder = LogDecoder(options, max_lines=max_lines)
        last_check = trio.current_time()
        stopping = False
        while True:
            data = await trio.to_thread.run_sync(file.read, BLOCK_SIZE)
            if data:
                output = decoder.feed(data)
                if output:
                    yield output
                if decoder.done:
                    return
                continue
            if not options.follow or stopping:
                output = decoder.end()
                if output:
                    yield output
                return
            while not _grown(file):
                replacement = _replaced(file, path) if path is not None else None
                if replacement is not None:
                    file.close()
                    file = replacement
                    decoder.new_file()
                    break
                now = trio.current_time()
                if is_running is not None and now - last_check >= running_check_interval:
                    last_check = now
                    if not await is_running():
                        stopping = True  # one more pass reads what was written before it stopped
                        break
                await trio.sleep(poll_interval)
    finally:
        file.close()


def _grown(file: BinaryIO) -> bool:
    return os.fstat(file.fileno()).st_size > file.tell()


def _replaced(file: BinaryIO, path: Path) -> BinaryIO | None:
    """A new file at ``path`` if the one we read was renamed or removed (rotation), else None."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return None
    opened = os.fstat(file.fileno())
    if (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
        return None
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None
