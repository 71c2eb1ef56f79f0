"""A token bucket (client-go's flowcontrol): ``qps`` tokens a second, at most ``burst`` saved.

The API server client waits for its tokens (``reserve``); image pulls past registryPullQPS
fail instead (``try_accept``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """Reserve a token at a time; the answer is how long to wait before using it.

    Time is an argument, so the arithmetic is testable without sleeping. ``qps`` 0
    means unlimited, as in client-go.
    """

    qps: float
    burst: int
    _tokens: float | None = None  # None until first use: then a full bucket
    _last: float = 0.0

    def reserve(self, now: float) -> float:
        if self.qps <= 0:
            return 0.0
        tokens = self._refilled(now) - 1.0
        self._tokens, self._last = tokens, now
        return 0.0 if tokens >= 0 else -tokens / self.qps

    def try_accept(self, now: float) -> bool:
        """Take a token if one is there now (client-go's TryAccept); never waits or owes one."""
        if self.qps <= 0:
            return True
        tokens = self._refilled(now)
        accepted = tokens >= 1.0
        self._tokens, self._last = tokens - 1.0 if accepted else tokens, now
        return accepted

    def _refilled(self, now: float) -> float:
        burst = float(max(1, self.burst))
        tokens = burst if self._tokens is None else self._tokens
        return min(burst, tokens + (now - self._last) * self.qps)
