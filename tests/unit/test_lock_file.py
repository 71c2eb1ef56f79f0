"""--lock-file and --exit-on-lock-contention: the lock waited for, and the hand-over."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from tests.net import free_port
from trio_kubelet.cli import parse_run_options
from trio_kubelet.config import ConfigError
from trio_kubelet.node.lock_file import exit_on_contention, held_lock_file


async def test_the_lock_is_waited_for_then_held_until_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)  # another kubelet holds it
    entered = trio.Event()
    leave = trio.Event()

    async def agent() -> None:
        async with held_lock_file(path):
            entered.set()
            await leave.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent)
        with trio.move_on_after(0.5):
            await entered.wait()
        assert not entered.is_set(), "entered while the other process held the lock"
        fcntl.flock(other, fcntl.LOCK_UN)
        with trio.fail_after(10):
            await entered.wait()
        with pytest.raises(BlockingIOError):  # now ours
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        leave.set()
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go with the block
    os.close(other)


async def test_another_process_opening_the_file_stops_the_agent(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.lock"
    path.touch()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(exit_on_contention, path, scope)
            await trio.sleep(0.2)
            await trio.to_thread.run_sync(lambda: open(path).close())  # the next kubelet
            await trio.sleep_forever()
    assert scope.cancelled_caught


def test_exit_on_contention_needs_a_lock_file() -> None:
    with pytest.raises(ConfigError, match="--exit-on-lock-contention: no lock file specified"):
        parse_run_options(["--hostname-override=n", "--exit-on-lock-contention"])


def test_a_running_agent_hands_over_when_the_next_one_opens_its_lock(tmp_path: Path) -> None:
    """The agent process holds the lock (a second flock fails) and exits 0 once another
    process opens the file, as a kubelet waiting to take over does."""
    lock = tmp_path / "kubelet.lock"
    log = tmp_path / "agent.log"
    early = os.open(lock, os.O_RDWR | os.O_CREAT)  # opened before the agent watches it
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "trio_kubelet", "--hostname-override=n",
             f"--lock-file={lock}", "--exit-on-lock-contention", f"--root-dir={tmp_path}/root",
             "--address=127.0.0.1", f"--port={free_port()}", "--healthz-port=0",
             "--container-runtime-endpoint=unix:///nonexistent.sock"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "Watching the lock file" not in log.read_text():
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with pytest.raises(BlockingIOError):  # the agent holds it
            fcntl.flock(early, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.open("rb").close()  # opening it is the signal
        assert agent.wait(30) == 0, log.read_text()
        fcntl.flock(early, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and the lock went with it
    finally:
        os.close(early)
        if agent.poll() is None:
            agent.kill()
    assert "Another process opened the lock file" in log.read_text()
