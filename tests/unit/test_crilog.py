"""crilog: the CRI log line format, `kubectl logs` options, decoding, tail and the reader."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path

import pytest
import trio

from trio_kubelet.runtime.crilog import (
    STDERR,
    STDOUT,
    LogChunk,
    LogDecoder,
    LogOptions,
    LogQueryError,
    find_tail_start,
    format_timestamp,
    log_options_from_query,
    open_log,
    parse_chunk,
    parse_rfc3339_nanos,
    read_log,
    timestamp_ns,
)

T0 = "2024-05-01T10:00:00"
NOW = parse_rfc3339_nanos("2024-05-01T10:01:00Z")


def line(second: int, stream: str, tag: str, text: str, fraction: str = "5") -> bytes:
    return f"{T0[:-2]}{second:02d}.{fraction}Z {stream} {tag} {text}\n".encode()


def decode(data: bytes, options: LogOptions | None = None, **kwargs: int) -> bytes:
    decoder = LogDecoder(options or LogOptions(), **kwargs)
    return decoder.feed(data) + decoder.end()


# -- the line format ----------------------------------------------------------------------------


def test_parse_chunk_reads_each_field() -> None:
    chunk = parse_chunk(b"2024-05-01T10:00:00.123Z stderr P some text  with spaces")
    assert chunk == LogChunk(b"2024-05-01T10:00:00.123Z", STDERR, True, b"some text  with spaces")
    assert parse_chunk(b"2024-05-01T10:00:00Z stdout F ") == LogChunk(
        b"2024-05-01T10:00:00Z", STDOUT, False, b"")
    # Tags are ':'-separated; only the first counts (forward compatibility).
    assert parse_chunk(b"2024-05-01T10:00:00Z stdout P:x y").partial  # type: ignore[union-attr]


@pytest.mark.parametrize("raw", [
    b"", b"garbage", b"2024-05-01T10:00:00Z", b"2024-05-01T10:00:00Z stdin F x",
    b"2024-05-01 10:00:00Z stdout F x", b"yesterday stdout F x", b"2024-05-01T10:00:00Z stdout",
    b'{"log":"docker json","stream":"stdout","time":"2024-05-01T10:00:00Z"}',
])
def test_parse_chunk_rejects_malformed_lines(raw: bytes) -> None:
    assert parse_chunk(raw) is None


def test_timestamps_keep_nanoseconds_and_zones() -> None:
    assert timestamp_ns(b"1970-01-01T00:00:01.000000001Z") == 1_000_000_001
    assert timestamp_ns(b"1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert timestamp_ns(b"1970-01-01T02:00:00+02:00") == 0
    assert timestamp_ns(b"1970-01-01T00:00:00-00:30") == 1800 * 10**9
    assert timestamp_ns(b"2024-02-30T00:00:00Z") is None  # no such day
    assert timestamp_ns(b"2024-05-01T10:00:00") is None  # no zone
    expected = int(datetime.fromisoformat("2024-05-01T10:00:00+00:00").timestamp()) * 10**9
    assert parse_rfc3339_nanos("2024-05-01T10:00:00Z") == expected
    with pytest.raises(ValueError):
        parse_rfc3339_nanos("2024-05-01")


def test_format_timestamp_pads_to_nine_digits_like_go() -> None:
    assert format_timestamp(b"2024-05-01T10:00:00.1234Z") == b"2024-05-01T10:00:00.123400000Z"
    assert format_timestamp(b"2024-05-01T10:00:00Z") == b"2024-05-01T10:00:00.000000000Z"
    assert format_timestamp(b"2024-05-01T10:00:00.5+00:00") == b"2024-05-01T10:00:00.500000000Z"
    assert format_timestamp(b"2024-05-01T10:00:00.5+02:00") == (
        b"2024-05-01T10:00:00.500000000+02:00")


# -- options ------------------------------------------------------------------------------------


def options(**query: str) -> LogOptions:
    return log_options_from_query({k: [v] for k, v in query.items()}, NOW)


def test_defaults_and_flags() -> None:
    assert options() == LogOptions()
    parsed = options(follow="true", previous="1", timestamps="", tailLines="5", limitBytes="10",
                     insecureSkipTLSVerifyBackend="true", unknown="x")
    assert (parsed.follow, parsed.previous, parsed.timestamps) == (True, True, True)
    assert (parsed.tail_lines, parsed.limit_bytes) == (5, 10)
    # Only absence, "false" and "0" are false (the API machinery's rule).
    assert not options(follow="false").follow and not options(follow="0").follow
    assert options(follow="yes").follow


def test_since_seconds_and_since_time() -> None:
    assert options(sinceSeconds="60").since_ns == NOW - 60 * 10**9
    assert options(sinceTime="2024-05-01T10:00:30Z").since_ns == NOW - 30 * 10**9


def test_legacy_tail_parameter() -> None:
    assert options(tail="3").tail_lines == 3
    assert options(tail="all", tailLines="3").tail_lines is None


def test_stream_selection() -> None:
    assert options(stream="Stdout").streams == {STDOUT}
    assert options(stream="Stderr").streams == {STDERR}
    assert options(stream="All").streams == {STDOUT, STDERR}


@pytest.mark.parametrize(("query", "message"), [
    ({"tailLines": "-1"}, "tailLines: Invalid value: -1: must be greater than or equal to 0"),
    ({"tailLines": "ten"}, 'tailLines: Invalid value: "ten": must be an integer'),
    ({"tailLines": "1.5"}, 'tailLines: Invalid value: "1.5": must be an integer'),
    ({"tailLines": "99999999999999999999"}, "must be an integer"),
    ({"limitBytes": "0"}, "limitBytes: Invalid value: 0: must be greater than 0"),
    ({"sinceSeconds": "0"}, "sinceSeconds: Invalid value: 0: must be greater than 0"),
    ({"sinceTime": "yesterday"}, 'sinceTime: Invalid value: "yesterday": must be an RFC 3339'),
    ({"sinceTime": "2024-05-01T10:00:00Z", "sinceSeconds": "5"},
     "at most one of `sinceTime` or `sinceSeconds` may be specified"),
    ({"stream": "stdout"}, 'stream: Unsupported value: "stdout"'),
])
def test_bad_values_are_named(query: dict[str, str], message: str) -> None:
    with pytest.raises(LogQueryError, match=None) as caught:
        options(**query)
    assert message in str(caught.value)


def test_every_bad_field_is_reported() -> None:
    with pytest.raises(LogQueryError) as caught:
        options(tailLines="-1", limitBytes="0")
    assert "tailLines" in str(caught.value) and "limitBytes" in str(caught.value)


# -- decoding -----------------------------------------------------------------------------------


def test_partial_chunks_are_joined_into_one_line() -> None:
    data = line(1, "stdout", "P", "hel") + line(2, "stdout", "P", "lo ") + line(3, "stdout", "F",
                                                                                  "world")
    assert decode(data) == b"hello world\n"


def test_partial_chunks_join_per_stream() -> None:
    data = (line(1, "stdout", "P", "out-") + line(2, "stderr", "F", "err")
            + line(3, "stdout", "F", "line"))
    assert decode(data) == b"err\nout-line\n"


def test_an_unterminated_last_line_has_no_newline() -> None:
    assert decode(line(1, "stdout", "F", "a") + line(2, "stdout", "P", "prompt> ")) == (
        b"a\nprompt> ")


def test_timestamps_prefix_each_line_with_its_first_chunk_time() -> None:
    data = line(1, "stdout", "P", "a", "25") + line(2, "stdout", "F", "b")
    assert decode(data, LogOptions(timestamps=True)) == b"2024-05-01T10:00:01.250000000Z ab\n"


def test_since_skips_older_lines() -> None:
    data = line(1, "stdout", "F", "old") + line(30, "stdout", "F", "new")
    since = parse_rfc3339_nanos("2024-05-01T10:00:10Z")
    assert decode(data, LogOptions(since_ns=since)) == b"new\n"


def test_limit_bytes_cuts_the_output() -> None:
    data = line(1, "stdout", "F", "abcdef") + line(2, "stdout", "F", "ghi")
    decoder = LogDecoder(LogOptions(limit_bytes=9))
    assert decoder.feed(data) == b"abcdef\ngh"
    assert decoder.done and decoder.feed(line(3, "stdout", "F", "more")) == b""
    # The timestamp prefix counts, as in Go.
    assert decode(line(1, "stdout", "F", "x"), LogOptions(limit_bytes=4, timestamps=True)) == (
        b"2024")


def test_stream_filter() -> None:
    data = line(1, "stdout", "F", "out") + line(2, "stderr", "F", "err")
    assert decode(data, LogOptions(streams=frozenset({STDERR}))) == b"err\n"


def test_malformed_lines_are_skipped() -> None:
    data = line(1, "stdout", "F", "a") + b"not a log line\n\n\xff\xfe\n" + line(2, "stdout", "F",
                                                                                  "b")
    assert decode(data) == b"a\nb\n"


def test_lines_split_across_blocks() -> None:
    data = b"".join(line(i, "stdout", "F", f"line {i}") for i in range(10))
    decoder = LogDecoder(LogOptions())
    out = b"".join(decoder.feed(data[i:i + 7]) for i in range(0, len(data), 7)) + decoder.end()
    assert out == b"".join(f"line {i}\n".encode() for i in range(10))


def test_max_lines_stops_decoding() -> None:
    data = b"".join(line(i, "stdout", "F", str(i)) for i in range(5))
    decoder = LogDecoder(LogOptions(), max_lines=2)
    assert decoder.feed(data) == b"0\n1\n" and decoder.done


def test_an_endless_partial_line_is_emitted_in_pieces() -> None:
    from trio_kubelet.runtime.crilog import MAX_JOINED_LINE

    piece = "x" * (MAX_JOINED_LINE // 2)
    data = b"".join(line(1, "stdout", "P", piece) for _ in range(3)) + line(2, "stdout", "F", "!")
    out = decode(data, LogOptions(timestamps=True))
    # One timestamp only: the continuation is not a new line.
    assert out.count(b"2024-05-01T") == 1
    assert out.endswith(b"x!\n") and len(out) == 31 + 3 * len(piece) + 2


# -- tail ---------------------------------------------------------------------------------------


def tail(data: bytes, lines: int, block_size: int = 16, **kwargs: frozenset[str]) -> bytes:
    file = io.BytesIO(data)
    start = find_tail_start(file, lines, block_size=block_size, **kwargs)
    return decode(data[start:])


LOG = b"".join(line(i, "stdout", "F", f"line number {i}") for i in range(20))


@pytest.mark.parametrize("block_size", [1, 7, 16, 64, 4096])
@pytest.mark.parametrize("lines", [0, 1, 2, 5, 19, 20, 50])
def test_tail_reads_backwards_across_blocks(lines: int, block_size: int) -> None:
    expected = b"".join(f"line number {i}\n".encode() for i in range(max(0, 20 - lines), 20))
    assert tail(LOG, lines, block_size) == expected


def test_tail_counts_joined_lines_and_the_unterminated_end() -> None:
    data = (line(1, "stdout", "F", "one") + line(2, "stdout", "P", "tw") + line(3, "stdout", "F",
                                                                                  "o")
            + line(4, "stdout", "P", "three"))
    assert tail(data, 1) == b"three"
    assert tail(data, 2) == b"two\nthree"
    assert tail(data, 3) == b"one\ntwo\nthree"


def test_tail_skips_malformed_lines_and_other_streams() -> None:
    data = (line(1, "stdout", "F", "a") + b"junk\n" + line(2, "stderr", "F", "e")
            + line(3, "stdout", "F", "b") + b"junk")
    assert tail(data, 2) == b"e\nb\n"
    file = io.BytesIO(data)
    start = find_tail_start(file, 2, frozenset({STDOUT}), block_size=5)
    assert decode(data[start:], LogOptions(streams=frozenset({STDOUT}))) == b"a\nb\n"


def test_tail_of_an_empty_file() -> None:
    assert find_tail_start(io.BytesIO(b""), 3) == 0


# -- the reader ---------------------------------------------------------------------------------


async def collect(path: Path, options: LogOptions, **kwargs: object) -> bytes:
    file = await open_log(path)
    return b"".join([chunk async for chunk in read_log(file, options, **kwargs)])  # type: ignore[arg-type]


async def test_read_log_reads_a_big_file_in_blocks(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"".join(line(i % 60, "stdout", "F", f"{i:06d}" + "y" * 100)
                              for i in range(5000)))
    out = await collect(path, LogOptions())
    assert out.count(b"\n") == 5000 and out.startswith(b"000000y")
    tail_out = await collect(path, LogOptions(tail_lines=3))
    assert tail_out.splitlines() == [f"{i:06d}".encode() + b"y" * 100 for i in (4997, 4998, 4999)]
    assert await collect(path, LogOptions(tail_lines=0)) == b""


async def test_follow_streams_new_lines_until_the_container_stops(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(line(1, "stdout", "F", "first"))
    running = True
    seen: list[bytes] = []

    async def is_running() -> bool:
        return running

    async def follow() -> None:
        file = await open_log(path)
        async for chunk in read_log(file, LogOptions(follow=True), is_running=is_running,
                                    poll_interval=0.01, running_check_interval=0.05):
            seen.append(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(0.2)
        assert seen == [b"first\n"]
        with path.open("ab") as log:
            log.write(line(2, "stdout", "P", "sec"))
            log.flush()
            await trio.sleep(0.2)
            assert seen == [b"first\n"]  # a partial chunk waits for the rest of its line
            log.write(line(3, "stdout", "F", "ond") + line(4, "stdout", "F", "third")[:20])
            log.flush()
            await trio.sleep(0.2)
            assert b"".join(seen) == b"first\nsecond\n"  # an incomplete file line waits too
            log.write(line(4, "stdout", "F", "third")[20:] + line(5, "stdout", "F", "last"))
        running = False
    assert b"".join(seen) == b"first\nsecond\nthird\nlast\n"


async def test_follow_stops_when_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(line(1, "stdout", "F", "only"))

    async def forever() -> bool:
        return True

    with trio.move_on_after(0.3) as scope:
        await collect(path, LogOptions(follow=True), is_running=forever, poll_interval=0.01)
    assert scope.cancelled_caught


async def test_follow_reopens_a_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(line(1, "stdout", "F", "old"))
    state = {"running": True}
    seen: list[bytes] = []

    async def is_running() -> bool:
        return state["running"]

    async def follow() -> None:
        file = await open_log(path)
        async for chunk in read_log(file, LogOptions(follow=True), is_running=is_running,
                                    poll_interval=0.01, running_check_interval=0.05):
            seen.append(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(0.1)
        path.rename(tmp_path / "0.log.20240501")
        path.write_bytes(line(2, "stdout", "F", "new"))
        await trio.sleep(0.2)
        state["running"] = False
    assert b"".join(seen) == b"old\nnew\n"
