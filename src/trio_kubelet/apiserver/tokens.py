"""Service-account tokens for projected volumes, through the TokenRequest API (Go's token manager).

A token is bound to its pod, asked for with the projection's audience and lifetime,
and kept until 80 % of its lifetime has passed (or a day, whichever is sooner), so a
pod's resync rewrites the volume with a fresh token before the old one expires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.errors import APIError
from trio_kubelet.core.objects import ObjectUnavailable
from trio_kubelet.core.timestamps import parse_time
from trio_kubelet.model.pod import Pod

DEFAULT_EXPIRATION = 3600  # the API's default for a projected token's expirationSeconds
REFRESH_AT = 0.8
MAX_KEEP = 24 * 3600


@dataclass(frozen=True, slots=True)
class _Token:
    token: str
    refresh_after: float  # wall-clock seconds
    expires: float


class TokenSource:
    """``VolumeManager``'s token source: one cached token per (pod, account, audience, ttl)."""

    def __init__(self, client: APIClient, wall_clock: Callable[[], float]) -> None:
        self._client = client
        self._now = wall_clock
        self._tokens: dict[tuple[str, str, str, int], _Token] = {}

    async def __call__(self, pod: Pod, source: Mapping[str, Any]) -> str:
        meta = pod.metadata
        account = pod.spec.service_account_name or "default"
        audience = str(source.get("audience") or "")
        ttl = int(source.get("expirationSeconds") or DEFAULT_EXPIRATION)
        key = (meta.uid, account, audience, ttl)
        now = self._now()
        cached = self._tokens.get(key)
        if cached is not None and now < cached.refresh_after:
            return cached.token
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else None,
                "expirationSeconds": ttl,
                "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid,
                },
            },
        }
        path = f"/api/v1/namespaces/{meta.namespace}/serviceaccounts/{account}/token"
        try:
            reply = await self._client.create(path, body)
        except APIError as err:
            if cached is not None and now < cached.expires:  # still valid: keep serving it
                return cached.token
            raise ObjectUnavailable(
                f"failed to fetch token for service account {meta.namespace}/{account}: {err}"
            ) from None
        status = reply.get("status") or {}
        expires = parse_time(status.get("expirationTimestamp")) or now + ttl
        lifetime = max(0.0, expires - now)
        self._tokens[key] = _Token(
            str(status.get("token", "")), now + min(lifetime * REFRESH_AT, MAX_KEEP), expires
        )
        return self._tokens[key].token

    def forget_pod(self, uid: str) -> None:
        for key in [k for k in self._tokens if k[0] == uid]:
            del self._tokens[key]
