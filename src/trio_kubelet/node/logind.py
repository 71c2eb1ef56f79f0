"""The system bus calls of graceful node shutdown (Go's nodeshutdown/systemd DBusCon): logind's
InhibitDelayMaxUSec, a delay inhibitor lock, the reload of logind's configuration through
systemd, and the PrepareForShutdown signals, over jeepney on trio.

The bus is DBUS_SYSTEM_BUS_ADDRESS or /var/run/dbus/system_bus_socket, as for Go's godbus.
Everything that goes wrong on the bus is a ``LogindError`` naming the call.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import trio
from jeepney import DBusAddress, MatchRule, Message, Properties, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.fds import FileDescriptor
from jeepney.io.common import RouterClosed
from jeepney.io.trio import DBusRouter, open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

from trio_kubelet.core.logind import (
    INHIBIT_MODE,
    INHIBIT_WHAT,
    INHIBIT_WHO,
    INHIBIT_WHY,
    LOGIND_CONF_DIR,
    LOGIND_DROPIN,
    LOGIND_UNIT,
    SIGHUP,
    override_dropin,
)

LOGIND = DBusAddress(
    "/org/freedesktop/login1",
    bus_name="org.freedesktop.login1",
    interface="org.freedesktop.login1.Manager",
)
SYSTEMD = DBusAddress(
    "/org/freedesktop/systemd1",
    bus_name="org.freedesktop.systemd1",
    interface="org.freedesktop.systemd1.Manager",
)
# Any sender: Kubernetes' node e2e test sends the signal with dbus-send, as Go accepts it.
PREPARE_FOR_SHUTDOWN = MatchRule(
    type="signal", interface=LOGIND.interface, member="PrepareForShutdown", path=LOGIND.object_path
)
# Signals queued while a shutdown is being handled (more are dropped).
SIGNAL_QUEUE = 16
# libdbus's default method call timeout.
CALL_TIMEOUT = 25.0


class LogindError(Exception):
    """The system bus, logind or systemd did not answer as graceful shutdown needs."""


class LogindBus:
    """One connection to the system bus, for logind's shutdown inhibitor."""

    def __init__(self, router: DBusRouter, conf_dir: Path) -> None:
        self.router = router
        self.conf_dir = conf_dir

    async def _call(self, what: str, message: Message) -> tuple[object, ...]:
        try:
            with trio.fail_after(CALL_TIMEOUT):
                reply = await self.router.send_and_get_reply(message)
            return tuple(unwrap_msg(reply))
        except DBusErrorResponse as err:
            raise LogindError(f"{what}: {err.name}: {' '.join(map(str, err.data))}") from err
        except trio.TooSlowError as err:
            raise LogindError(f"{what}: no answer in {CALL_TIMEOUT:g}s") from err
        except (RouterClosed, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            raise LogindError(f"{what}: the system bus connection broke: {err}") from err

    async def inhibit_delay_usec(self) -> int:
        """logind's InhibitDelayMaxUSec: how long a delay inhibitor may hold a shutdown back."""
        what = "failed reading InhibitDelayMaxUSec property from logind"
        (variant,) = await self._call(what, Properties(LOGIND).get("InhibitDelayMaxUSec"))
        if not (isinstance(variant, tuple) and len(variant) == 2 and variant[0] == "t"):
            raise LogindError(f"{what}: InhibitDelayMaxUSec from logind is not a uint64")
        return int(variant[1])

    async def inhibit_shutdown(self) -> int:
        """Take a delay inhibitor lock on shutdown; the lock lasts while the fd is open."""
        message = new_method_call(
            LOGIND, "Inhibit", "ssss", (INHIBIT_WHAT, INHIBIT_WHO, INHIBIT_WHY, INHIBIT_MODE)
        )
        (fd,) = await self._call("failed creating systemd inhibitor", message)
        if not isinstance(fd, FileDescriptor):
            raise LogindError(f"failed creating systemd inhibitor: got {fd!r}, not a file")
        raw: int = fd.to_raw_fd()
        os.set_inheritable(raw, False)  # a child outliving the release would hold it
        return raw

    async def reload_logind_conf(self) -> None:
        """SIGHUP to logind through systemd (KillUnit), as Go does: logind rereads its config."""
        message = new_method_call(SYSTEMD, "KillUnit", "ssi", (LOGIND_UNIT, "all", SIGHUP))
        await self._call("unable to reload logind conf", message)

    async def override_inhibit_delay(self, seconds: int) -> Path:
        """Write Go's drop-in that raises InhibitDelayMaxSec to ``seconds``."""
        path = self.conf_dir / LOGIND_DROPIN

        def write() -> None:
            self.conf_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.write_text(override_dropin(seconds))
            path.chmod(0o644)

        try:
            await trio.to_thread.run_sync(write)
        except OSError as err:
            raise LogindError(
                f"unable to override inhibit delay by shutdown manager: failed writing {path}: "
                f"{err.strerror}"
            ) from err
        return path

    async def prepare_for_shutdown(self) -> trio.MemoryReceiveChannel[Message]:
        """PrepareForShutdown signals from now on, as they come; the channel ends with the
        connection. (The filter is never removed: jeepney's router closes its filters' channels
        as the connection ends, and one removed meanwhile breaks that loop.)"""
        signals_in, signals = trio.open_memory_channel[Message](SIGNAL_QUEUE)
        self.router.filter(PREPARE_FOR_SHUTDOWN, channel=signals_in)
        await self._call("failed to monitor shutdown", message_bus.AddMatch(PREPARE_FOR_SHUTDOWN))
        return signals


def release_inhibit_lock(fd: int) -> None:
    """Close the inhibitor's fd: logind lets the shutdown go on once no lock holds it."""
    os.close(fd)


# How a bus connection fails or ends: the socket, the authentication, the address.
_CONNECT_FAILURES = (OSError, ValueError, RuntimeError, KeyError, trio.BrokenResourceError,
                     trio.EndOfChannel)
_CONNECTION_ENDED = (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError,
                     OSError)


@contextmanager
def _as_logind_error(what: str, failures: tuple[type[Exception], ...]) -> Iterator[None]:
    """``failures`` (alone or grouped by jeepney's router nursery) as one LogindError; any
    other exception, cancellation included, as it was."""
    try:
        yield
    except LogindError:
        raise
    except failures as err:
        raise LogindError(f"{what}: {err or type(err).__name__}") from err
    except BaseExceptionGroup as group:
        kinds: tuple[type[Exception], ...] = (LogindError, *failures)
        matched, rest = group.split(kinds)
        if matched is None or rest is not None:
            raise
        leaf: BaseException = matched
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        if isinstance(leaf, LogindError):
            raise LogindError(str(leaf)) from group
        raise LogindError(f"{what}: {leaf or type(leaf).__name__}") from group


@asynccontextmanager
async def open_logind(
    address: str = "SYSTEM", conf_dir: Path = Path(LOGIND_CONF_DIR)
) -> AsyncIterator[LogindBus]:
    """A connection to the system bus (``address`` a D-Bus address for tests), with file
    descriptor passing (the inhibitor lock is one). Its end is a LogindError."""
    with _as_logind_error("cannot connect to the system bus", _CONNECT_FAILURES):
        conn = await open_dbus_connection(address, enable_fds=True)
    with _as_logind_error("the system bus connection ended", _CONNECTION_ENDED):
        async with conn, conn.router() as router:
            yield LogindBus(router, conf_dir)
