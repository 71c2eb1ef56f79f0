"""``trio-kubelet replay``: print a recording's decision trace, re-check it, render its timeline."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TextIO

import trio
import trio.testing

from trio_kubelet.recording.records import Record
from trio_kubelet.replay.reader import NumberedRecord, RecordingError, RecordingReader
from trio_kubelet.replay.replayer import (
    DecisionTrace,
    Divergence,
    ReplayResult,
    replay_in_virtual_time,
)

PROG = "trio-kubelet"
EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_ERROR = 2
TO_STDOUT = "-"

Renderer = Callable[[Sequence[Record], Path], None]


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _timeline_renderer() -> Renderer:
    """The timeline renderer, imported only when a timeline is asked for (it is large)."""
    from trio_kubelet.replay.timeline import render_timeline

    return render_timeline


def format_trace_line(entry: DecisionTrace) -> str:
    """``   12.345s  web-node1_default  start main  [main: back-off 10s, 3.0s left]``."""
    line = f"{entry.t:10.3f}s  {entry.pod}  {entry.summary}"
    if entry.gates:
        line += f"  [{'; '.join(entry.gates)}]"
    if entry.diverged:
        line += "  << differs from the recording"
    return line


def print_trace(result: ReplayResult, out: TextIO, *, explain: bool) -> None:
    for entry in result.trace:
        print(format_trace_line(entry), file=out)
        if explain:
            for text in entry.inputs:
                print(f"              {text}", file=out)
            for text in entry.reasons:
                print(f"              why: {text}", file=out)


def format_divergence(divergence: Divergence) -> str:
    return "\n".join(
        [
            f"replay DIVERGED at line {divergence.line} (after {divergence.event_index} events), "
            f"pod {divergence.pod}: {divergence.reason}",
            divergence.diff,
        ]
    )


def _collecting(reader: RecordingReader, into: list[Record] | None) -> Iterator[NumberedRecord]:
    for item in reader:
        if into is not None:
            into.append(item.record)
        yield item


def _until(records: list[Record], until: float | None) -> list[Record]:
    if until is None or not records:
        return records
    start = records[0].t
    return [record for record in records if record.t - start <= until]


def _write_timeline(render: Renderer, records: list[Record], target: str, out: TextIO) -> None:
    """Render to ``target`` (``-``: stdout) and say where; raises OSError."""
    if target != TO_STDOUT:
        render(records, Path(target))
        print(f"timeline written to {target}", file=out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.html"
        render(records, path)
        with path.open(encoding="utf-8") as html:
            shutil.copyfileobj(html, sys.stdout)


def replay_main(args: argparse.Namespace) -> int:
    """Run ``replay`` for parsed arguments; returns the exit status (0, 1 diverged, 2 error)."""
    render: Renderer | None = None
    if args.timeline is not None:
        render = _timeline_renderer()
    reader = RecordingReader(Path(args.file))
    kept: list[Record] | None = [] if render is not None else None
    run = partial(
        replay_in_virtual_time,
        _collecting(reader, kept),
        until=args.until,
        pod=args.pod,
        explain=args.explain,
    )
    try:
        result = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    except RecordingError as err:
        if err.source is None:  # found by the replayer rather than the reader
            err.source = reader.source
        return _error(str(err))
    for warning in reader.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    # HTML on stdout must not be mixed with the trace.
    out = sys.stderr if args.timeline == TO_STDOUT else sys.stdout
    if args.pod is not None and result.decisions == 0:
        print(f"{PROG}: warning: no decision for a pod named {args.pod!r}", file=sys.stderr)
    print_trace(result, out, explain=args.explain)
    if render is not None and kept is not None:
        try:
            _write_timeline(render, _until(kept, args.until), args.timeline, out)
        except OSError as err:
            return _error(f"cannot write the timeline to {args.timeline}: {err.strerror or err}")
    if result.divergence is not None:
        print(format_divergence(result.divergence), file=out)
        if result.divergences > 1:
            print(f"({result.divergences} decisions or gates differ in all)", file=out)
        return EXIT_DIVERGED if args.check else EXIT_OK
    if args.check:
        print(
            f"replay OK: {result.decisions} decisions, {result.admissions} admissions, "
            f"{result.evictions} evictions, {result.gc_passes} GC passes, "
            f"{result.log_rotations} log rotations, "
            f"{result.gates} gates, {result.statuses} pod statuses re-checked, no divergence",
            file=out,
        )
    return EXIT_OK
