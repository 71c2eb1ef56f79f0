"""The kubelet's server sockets, bound when the agent starts: a port in use stops the start
before any pod is touched, and a client that connects while the servers are still being
built (their imports, the serving certificate) waits in the listen backlog instead of being
refused. Only trio and the configuration here, so binding costs the start nothing more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager

import trio

from trio_kubelet.config import KubeletConfiguration

__all__ = ["KUBELET", "Listeners", "ServerStartError", "bind_servers", "bound_servers",
           "close_listeners", "listen", "server_ports"]

KUBELET, READ_ONLY, HEALTHZ = "kubelet", "read-only", "healthz"
Listeners = list[trio.SocketListener]


class ServerStartError(Exception):
    """A server could not start (port in use, bad certificate); ``str()`` says which."""


def server_ports(config: KubeletConfiguration) -> list[tuple[str, str, int]]:
    """(name, host, port) of each server the configuration turns on."""
    ports = [(KUBELET, config.address, config.port)]
    if config.read_only_port > 0:
        ports.append((READ_ONLY, config.address, config.read_only_port))
    if config.healthz_port > 0:
        ports.append((HEALTHZ, config.healthz_bind_address, config.healthz_port))
    return ports


async def listen(host: str, port: int, name: str) -> Listeners:
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ServerStartError(f"{name} server: cannot listen on {host}:{port}: "
                               f"{exc.strerror or exc}") from None


async def bind_servers(config: KubeletConfiguration) -> dict[str, Listeners]:
    """Every server's sockets, by name; all or none (what was bound is closed on an error)."""
    bound: dict[str, Listeners] = {}
    try:
        for name, host, port in server_ports(config):
            bound[name] = await listen(host, port, name)
    except BaseException:
        await close_listeners(bound.values())
        raise
    return bound


@asynccontextmanager
async def bound_servers(
    config: KubeletConfiguration, enabled: bool = True
) -> AsyncIterator[dict[str, Listeners] | None]:
    """``bind_servers`` for the agent's lifetime (None when it serves nothing); the servers
    close their own sockets, this closes those never handed over."""
    listeners = await bind_servers(config) if enabled else None
    try:
        yield listeners
    finally:
        if listeners:
            await close_listeners(listeners)


async def close_listeners(groups: Iterable[Listeners] | Mapping[str, Listeners]) -> None:
    with trio.CancelScope(shield=True):
        for listeners in (groups.values() if isinstance(groups, Mapping) else groups):
            for listener in listeners:
                await trio.aclose_forcefully(listener)
