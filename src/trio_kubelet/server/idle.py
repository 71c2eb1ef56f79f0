"""Ending streaming sessions that carry no data (streamingConnectionIdleTimeout).

An exec, attach or port-forward session left open by a client that went away
silently holds a connection and a runtime session forever; after ``timeout``
seconds in which no byte moved either way the session is cancelled.
"""

from __future__ import annotations

import math

import trio


class IdleTimer:
    """Cancels ``scope`` once ``touch`` has not been called for ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout if timeout > 0 else math.inf  # 0: never
        self.last = trio.current_time()
        self.expired = False

    def touch(self) -> None:
        self.last = trio.current_time()

    async def watch(self, scope: trio.CancelScope) -> None:
        """Run beside the session; a session that ends first cancels this."""
        while True:
            deadline = self.last + self.timeout
            if trio.current_time() >= deadline:
                self.expired = True
                scope.cancel()
                return
            await trio.sleep_until(deadline)
