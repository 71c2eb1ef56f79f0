"""A private system bus with the real systemd-logind on it, for the graceful node shutdown tests.

dbus-daemon runs with a system-bus configuration of its own (its socket under the test's
directory, every root call allowed); systemd-logind (Debian's systemd package) runs against it
through DBUS_SYSTEM_BUS_ADDRESS, in a mount namespace of its own where /etc/systemd and
/run/systemd are the test's directories: it reads its drop-ins from ``conf_dir`` and keeps its
state away from the host's. logind runs without systemd as PID 1 (it only needs systemd's
manager to power the machine off, which the signal the tests send never asks for); what it
asks of systemd's manager, the KillUnit that reloads it, a stand-in answers (``systemd1``).
The shutdown signal is sent as Kubernetes' node e2e test sends it: ``dbus-send --system``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
from jeepney import HeaderFields, MessageType, new_error, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.trio import open_dbus_connection

LOGIND_BIN = "/lib/systemd/systemd-logind"
START_TIMEOUT = 15.0

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow send_type="signal"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
</busconfig>
"""


@dataclass
class Logind:
    """The bus (``address``, served by ``bus_pid``), logind on it (``pid``) and the directory
    logind reads drop-ins from."""

    address: str
    bus_pid: int
    pid: int
    conf_dir: Path
    env: dict[str, str] = field(repr=False)

    def busctl(self, *args: str) -> object:
        out = subprocess.run(["busctl", "--system", "--json=short", *args], env=self.env,
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return json.loads(out)

    def inhibit_delay_usec(self) -> int:
        answer = self.busctl("get-property", "org.freedesktop.login1", "/org/freedesktop/login1",
                             "org.freedesktop.login1.Manager", "InhibitDelayMaxUSec")
        return int(answer["data"])  # type: ignore[index]

    def inhibitors(self) -> list[tuple[str, str, str, str, int]]:
        """logind's inhibitor locks: (what, who, why, mode, pid)."""
        answer = self.busctl("call", "org.freedesktop.login1", "/org/freedesktop/login1",
                             "org.freedesktop.login1.Manager", "ListInhibitors")
        return [(w, who, why, mode, pid)
                for w, who, why, mode, _uid, pid in answer["data"][0]]  # type: ignore[index]

    def prepare_for_shutdown(self, value: bool) -> None:
        """The signal as Kubernetes' node e2e test emits it (dbus-send's default type is a
        signal; its sender is dbus-send, not logind)."""
        subprocess.run(["dbus-send", "--system", "/org/freedesktop/login1",
                        "org.freedesktop.login1.Manager.PrepareForShutdown",
                        f"boolean:{str(value).lower()}"], env=self.env, timeout=10, check=True)


def _wait_for(predicate: object, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if predicate():  # type: ignore[operator]
                return
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up in {START_TIMEOUT}s: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextmanager
def running_logind(root: Path, logind_conf: str = "") -> Iterator[Logind]:
    """dbus-daemon and systemd-logind under ``root``; ``logind_conf`` is the [Login] section
    of logind's own logind.conf (empty: its defaults, InhibitDelayMaxSec 5 s)."""
    for tool in ("dbus-daemon", "dbus-send", "busctl", "unshare", LOGIND_BIN):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing (scripts/bootstrap installs dbus and systemd)")
    socket = root / "system_bus_socket"
    (root / "bus.conf").write_text(BUS_CONFIG.format(socket=socket))
    etc, run = root / "etc-systemd", root / "run-systemd"
    (etc / "logind.conf.d").mkdir(parents=True)
    run.mkdir()
    if logind_conf:
        (etc / "logind.conf").write_text(f"[Login]\n{logind_conf}\n")
    address = f"unix:path={socket}"
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": address}
    bus_log, logind_log = root / "dbus-daemon.log", root / "logind.log"
    bus = subprocess.Popen(["dbus-daemon", "--config-file", str(root / "bus.conf"), "--nofork"],
                           stdout=bus_log.open("wb"), stderr=subprocess.STDOUT)
    logind = None
    try:
        _wait_for(socket.exists, "dbus-daemon", bus, bus_log)
        # unshare's default propagation is private: the binds stay in logind's namespace.
        script = (f"mount --bind {etc} /etc/systemd && mount --bind {run} /run/systemd "
                  f"&& exec {LOGIND_BIN}")
        logind = subprocess.Popen(["unshare", "--mount", "sh", "-c", script], env=env,
                                  stdout=logind_log.open("wb"), stderr=subprocess.STDOUT)
        running = Logind(address, bus.pid, logind.pid, etc / "logind.conf.d", env)
        _wait_for(running.inhibit_delay_usec, "systemd-logind", logind, logind_log)
        yield running
    finally:
        if logind is not None:
            _stop(logind)
        _stop(bus)


@dataclass
class SystemdStandIn:
    """What logind's reload asks of systemd's manager: KillUnit, done by signalling logind."""

    logind: Logind
    calls: list[tuple[str, str, int]] = field(default_factory=list)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        conn = await open_dbus_connection(self.logind.address)
        async with conn:
            async with conn.router() as router:
                await router.send_and_get_reply(
                    message_bus.RequestName("org.freedesktop.systemd1"))
            task_status.started()
            while True:
                message = await conn.receive()
                header = message.header
                if header.message_type is not MessageType.method_call:
                    continue
                if header.fields.get(HeaderFields.member) != "KillUnit":
                    await conn.send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod"))
                    continue
                unit, who, signum = message.body
                self.calls.append((unit, who, signum))
                if unit == "systemd-logind.service":
                    os.kill(self.logind.pid, signum)
                await conn.send(new_method_return(message))
