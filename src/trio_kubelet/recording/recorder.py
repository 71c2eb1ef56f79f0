"""Writing a recording: records are queued as cheap closures and serialised off the hot path.

The reconciler only appends to a list; a flusher task turns the queue into JSON
lines every ``flush_interval`` and writes them with one ``write`` call, so a
crash leaves every flushed line intact (at worst the last line is cut, which
the reader reports and stops at). Past ``max_bytes`` the file is rotated to
``FILE.1`` (older ones shift up, ``keep`` are kept) and the new file starts with
a header and a snapshot of the pods, so every file replays on its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import trio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtobufMessage
from pydantic import BaseModel

from trio_kubelet.recording.records import (
    CRIRecord,
    EventRecord,
    Header,
    SnapshotRecord,
    TeardownRecord,
)

log = logging.getLogger("trio_kubelet.recorder")

FLUSH_INTERVAL = 0.2
ROTATED_FILES_KEPT = 5
# Fields of CRI messages that carry credentials (PullImage's AuthConfig).
SECRET_FIELDS = frozenset({"password", "auth", "identityToken", "registryToken"})
REDACTED = "<redacted>"

Thunk = Callable[[], BaseModel]


def redact(value: Any) -> Any:
    """A copy of a JSON value with every credential field's value replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if k in SECRET_FIELDS and v else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _message_json(message: Any) -> dict[str, Any] | None:
    if message is None:
        return None
    if isinstance(message, ProtobufMessage):  # the upb-decoded list replies of runtime/client.py
        data = MessageToDict(message)
    else:
        to_dict = getattr(message, "to_dict", None)
        data = to_dict() if to_dict is not None else {"value": repr(message)}
    redacted: dict[str, Any] = redact(data)
    return redacted


class Recorder:
    """Appends records to a JSON Lines file; ``run`` must be running to write them."""

    def __init__(
        self,
        path: Path,
        header: Header,
        *,
        max_bytes: int | None = None,
        keep: int = ROTATED_FILES_KEPT,
    ) -> None:
        self.path = path
        self._header = header
        self._snapshot: Callable[[], SnapshotRecord] | None = None
        self._max_bytes = max_bytes
        self._keep = keep
        self._queue: list[Thunk] = []
        self._file: TextIO | None = None
        self._written = 0

    def add(self, make: Thunk) -> None:
        """Queue a record; ``make`` runs later, in the flusher, so it must capture final values."""
        self._queue.append(make)

    def event(self, seq: int, event: BaseModel) -> None:
        """An event as the sync loop consumed it, numbered ``seq`` (records name specs by it)."""
        t = trio.current_time()
        self.add(lambda: EventRecord(t=t, seq=seq, event=event.model_dump(mode="json",
                                                                       by_alias=True)))

    def teardown(self, uid: str, pod: str) -> None:
        """A pod's containers, sandboxes and logs are gone (the end of its timeline lanes)."""
        t = trio.current_time()
        self.add(lambda: TeardownRecord(t=t, uid=uid, pod=pod))

    def cri_observer(self, method: str, request: Any, outcome: Any, duration: float) -> None:
        """The CRI client's observer: every call except the PLEG's unfiltered relists.

        A relist's effect is recorded as the lifecycle events it produced; its raw
        answer (every container on the node, every second) would dwarf the rest.
        """
        if method in ("ListContainers", "ListPodSandbox") and not getattr(request, "filter", None):
            return
        t = trio.current_time()
        failed = isinstance(outcome, Exception)
        code = getattr(outcome, "code", None) if failed else None
        self.add(
            lambda: CRIRecord(
                t=t,
                method=method,
                request=_message_json(request) or {},
                response=None if failed else _message_json(outcome),
                error=str(outcome) if failed else None,
                error_code=getattr(code, "name", None),
                duration=duration,
            )
        )

    async def run(
        self,
        snapshot: Callable[[], SnapshotRecord],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the file, write the header, then flush the queue until cancelled (and once more).

        ``snapshot`` gives the pod sets a rotated file starts with (the sync loop's); records
        added before ``run`` wait in the queue.
        """
        self._snapshot = snapshot
        self._open(self._header)
        task_status.started()
        try:
            while True:
                await trio.sleep(FLUSH_INTERVAL)
                self.flush()
        finally:
            self.flush()
            if self._file is not None:
                self._file.close()
                self._file = None

    def flush(self) -> None:
        if not self._queue or self._file is None:
            return
        queue, self._queue = self._queue, []
        text = "".join(make().model_dump_json(exclude_defaults=False) + "\n" for make in queue)
        self._file.write(text)
        self._file.flush()
        self._written += len(text)
        if self._max_bytes is not None and self._written >= self._max_bytes:
            self._rotate()

    def _open(self, header: Header) -> None:
        self._file = self.path.open("w", encoding="utf-8")
        line = header.model_dump_json() + "\n"
        self._file.write(line)
        self._file.flush()
        self._written = len(line)

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.with_name(f"{self.path.name}.{self._keep}").unlink()
        for index in range(self._keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
        rotated = self.path.with_name(f"{self.path.name}.1")
        self.path.rename(rotated)
        t = trio.current_time()
        self._open(self._header.model_copy(update={"t": t, "rotated_from": rotated.name}))
        assert self._snapshot is not None
        snapshot = self._snapshot().model_copy(update={"t": t})
        line = snapshot.model_dump_json() + "\n"
        assert self._file is not None
        self._file.write(line)
        self._written += len(line)
        log.info("Rotated recording %s to %s", self.path, rotated)
