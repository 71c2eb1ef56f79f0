"""The ASGI types the kubelet's server and apps share (plain aliases: the messages are dicts)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# Loose on purpose: Quart types its app with TypedDict messages, which a dict does not match.
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
