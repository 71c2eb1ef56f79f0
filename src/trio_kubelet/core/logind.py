"""systemd-logind's part in graceful node shutdown (Go's nodeshutdown/systemd): the delay
inhibitor the agent asks for, whether logind's InhibitDelayMaxSec must be raised and the drop-in
that raises it, how long to wait for logind to take it, and what a PrepareForShutdown says.

logind lets a "delay" inhibitor hold a shutdown back for at most InhibitDelayMaxSec (5 s by
default), so a grace period longer than that would be cut short: the agent writes the drop-in
Go writes, asks logind to reload, and reads the value again a few times (the reload is
asynchronous).
"""

from __future__ import annotations

from collections.abc import Sequence

from trio_kubelet.model.duration import format_duration

# The inhibitor Go's kubelet takes (org.freedesktop.login1.Manager.Inhibit's what, who, why, mode).
INHIBIT_WHAT = "shutdown"
INHIBIT_WHO = "kubelet"
INHIBIT_WHY = "Kubelet needs time to handle node shutdown"
INHIBIT_MODE = "delay"

# Where Go writes its override, and how it makes logind read it: SIGHUP through systemd.
LOGIND_CONF_DIR = "/etc/systemd/logind.conf.d"
LOGIND_DROPIN = "99-kubelet.conf"
LOGIND_UNIT = "systemd-logind.service"
SIGHUP = 1

# After the reload, InhibitDelayMaxUSec is read up to len + 1 times, with these pauses between
# (Go's exponential backoff: 100 ms doubling, 5 steps).
RELOAD_CHECK_PAUSES: tuple[float, ...] = (0.1, 0.2, 0.4, 0.8)

# Go waits this long before watching again once the bus connection has ended.
DBUS_RECONNECT_PERIOD = 1.0

USEC = 1_000_000


def needs_override(requested_seconds: int, inhibit_delay_usec: int) -> bool:
    """Whether logind would cut the shutdown short: its delay below the whole grace period."""
    return requested_seconds * USEC > inhibit_delay_usec


def override_dropin(requested_seconds: int) -> str:
    """The drop-in that raises logind's InhibitDelayMaxSec to the whole grace period."""
    return f"# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={requested_seconds}\n"


def override_failed(attempts: int, requested_seconds: int, inhibit_delay_usec: int) -> str:
    """Why the watch does not start: logind still has a shorter delay after the reload."""
    return (
        f"node shutdown manager was timed out after {attempts} attempts waiting for logind "
        f"InhibitDelayMaxSec to update to {format_duration(requested_seconds)} "
        f"(ShutdownGracePeriod), current value is {format_duration(inhibit_delay_usec / USEC)}"
    )


def prepare_for_shutdown(body: Sequence[object]) -> bool | None:
    """PrepareForShutdown's argument: True the node is going down, False a shutdown was
    cancelled; None when the signal does not carry one boolean (Go logs and ignores it)."""
    if len(body) != 1 or not isinstance(body[0], bool):
        return None
    return body[0]
