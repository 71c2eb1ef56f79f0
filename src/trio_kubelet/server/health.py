"""The agent's health checks and the answers of ``/healthz`` and ``/healthz/{check}``.

Framework-free, so the healthz port's own small server (``healthz_server.py``) and the
Quart apps of 10250 and 10255 (``routes_node.py``) give the same answers from one place.
The checks are the Go kubelet's: ``ping``, ``syncloop`` and ``pleg``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from urllib.parse import parse_qs

import trio

from trio_kubelet.model.duration import format_duration
from trio_kubelet.server.view import PLEG_RELIST_THRESHOLD, NodeView

log = logging.getLogger(__name__)

__all__ = [
    "HEALTHZ_PATH",
    "NodeHealth",
    "healthz_report",
    "pleg_error",
    "syncloop_error",
]

HEALTHZ_PATH = "/healthz"
# The Go kubelet's sync loop check allows max(2 * syncFrequency, 5 min) since the loop last ran.
SYNC_LOOP_MIN_THRESHOLD = 300.0

HealthCheck = Callable[[], "str | None"]


def syncloop_error(now: float, last_sync_loop: float | None, sync_frequency: float) -> str | None:
    """Why the sync loop is unhealthy, or None. Not run yet counts as healthy (as in Go)."""
    if last_sync_loop is None:
        return None
    threshold = max(2 * sync_frequency, SYNC_LOOP_MIN_THRESHOLD)
    if now - last_sync_loop > threshold:
        return (f"sync loop took longer than expected: last ran "
                f"{format_duration(round(now - last_sync_loop))} ago; threshold is "
                f"{format_duration(threshold)}")
    return None


def pleg_error(now: float, last_relist: float | None, started_at: float,
               threshold: float = PLEG_RELIST_THRESHOLD) -> str | None:
    """Why the PLEG is unhealthy, or None: no successful relist for ``threshold``.

    Before its first relist it is given ``threshold`` from ``started_at``.
    """
    if last_relist is None:
        if now - started_at > threshold:
            return "pleg has yet to be successful"
        return None
    elapsed = now - last_relist
    if elapsed > threshold:
        return (f"pleg was last seen active {format_duration(round(elapsed))} ago; threshold is "
                f"{format_duration(threshold)}")
    return None


def healthz_report(results: Sequence[tuple[str, str | None]], excluded: Sequence[str],
                   verbose: bool, name: str = "healthz") -> tuple[int, str]:
    """``(status, body)`` of /healthz as the apiserver's healthz handler writes them.

    Failures are always verbose and never show their reason (that is logged).
    """
    wanted_out = set(excluded)
    lines: list[str] = []
    failed = False
    for check, error in results:
        if check in wanted_out:
            wanted_out.discard(check)
            lines.append(f"[+]{check} excluded: ok")
        elif error is not None:
            failed = True
            lines.append(f"[-]{check} failed: reason withheld")
        else:
            lines.append(f"[+]{check} ok")
    if wanted_out:
        quoted = ",".join(f'"{c}"' for c in sorted(wanted_out))
        lines.append(f"warn: some health checks cannot be excluded: no matches for {quoted}")
    body = "".join(f"{line}\n" for line in lines)
    if failed:
        return 500, f"{body}{name} check failed\n"
    if not verbose:
        return 200, "ok"
    return 200, f"{body}{name} check passed\n"


class NodeHealth:
    """The named checks over the agent's view, and the answer to a health request.

    A check that starts failing is logged once (with its reason, which the answers
    withhold), and once more when it passes again.
    """

    def __init__(self, view: NodeView, *, started_at: float | None = None) -> None:
        self._view = view
        self._started_at = trio.current_time() if started_at is None else started_at
        self._checks: dict[str, HealthCheck] = {
            "ping": lambda: None, "syncloop": self._syncloop, "pleg": self._pleg}
        self._failing: dict[str, str] = {}

    def _syncloop(self) -> str | None:
        return syncloop_error(trio.current_time(), self._view.last_sync_loop(),
                              self._view.options.config.sync_frequency)

    def _pleg(self) -> str | None:
        return pleg_error(trio.current_time(), self._view.last_relist(), self._started_at)

    def answer(self, path: str, query: str = "") -> tuple[int, str] | None:
        """``(status, body)`` of ``GET path?query``, or None when ``path`` is not a health
        path (the caller's 404). ``/healthz`` takes ``?verbose`` and ``?exclude=CHECK``."""
        if path == HEALTHZ_PATH:
            results = [(name, check()) for name, check in self._checks.items()]
            self._note(results)
            args = parse_qs(query, keep_blank_values=True)
            return healthz_report(results, args.get("exclude", []), "verbose" in args)
        name = path.removeprefix(HEALTHZ_PATH + "/")
        check = self._checks.get(name) if name != path else None
        if check is None:
            return None
        error = check()
        if error is not None:
            return 500, f"internal server error: {error}\n"
        return 200, "ok"

    def _note(self, results: list[tuple[str, str | None]]) -> None:
        now_failing = {name: error for name, error in results if error is not None}
        for name, error in now_failing.items():
            if name not in self._failing:
                log.warning("healthz check %s failed: %s", name, error)
        for name in self._failing.keys() - now_failing.keys():
            log.info("healthz check %s passes again", name)
        self._failing = now_failing
