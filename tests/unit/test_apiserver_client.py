"""The API-server client against httpx's MockTransport: requests, typed errors, watches."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme

from trio_kubelet.apiserver import errors
from trio_kubelet.apiserver.client import APIClient, WatchEvent
from trio_kubelet.apiserver.kubeconfig import Connection, KubeconfigError, load_kubeconfig
from trio_kubelet.apiserver.reflector import Reflector
from trio_kubelet.core.token_bucket import TokenBucket

PLAIN = Connection(server="http://api.test", ssl_context=None, token="sekrit")


def client_for(handler: Any, **kwargs: Any) -> APIClient:
    return APIClient(PLAIN, transport=httpx.MockTransport(handler), **kwargs)


def status(code: int, reason: str, message: str = "no") -> httpx.Response:
    return httpx.Response(
        code, json={"kind": "Status", "reason": reason, "message": message, "code": code}
    )


async def test_requests_carry_json_token_and_patch_content_type() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"kind": "Pod"})

    observed: list[tuple[str, str, int | None]] = []
    client = client_for(handler, observer=lambda *seen: observed.append(seen))
    await client.patch("/api/v1/namespaces/a/pods/b/status", {"status": {}}, kind="merge")
    request = seen[0]
    assert request.method == "PATCH"
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.headers["Authorization"] == "Bearer sekrit"
    assert json.loads(request.content) == {"status": {}}
    assert observed == [("api.test", "PATCH", 200)]


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (404, "NotFound", errors.NotFound),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (403, "Forbidden", errors.Forbidden),
        (410, "Expired", errors.Gone),
        (503, "ServiceUnavailable", errors.ServerError),
    ],
)
async def test_errors_are_typed(code: int, reason: str, kind: type[errors.APIError]) -> None:
    client = client_for(lambda request: status(code, reason, "because"))
    with pytest.raises(kind) as caught:
        await client.get("/api/v1/nodes/x")
    assert type(caught.value) is kind
    assert caught.value.status == code and caught.value.message == "because"


async def test_retry_after_is_read_and_unreachable_is_typed() -> None:
    client = client_for(
        lambda request: httpx.Response(
            429, headers={"Retry-After": "3"}, json={"reason": "TooManyRequests"}
        )
    )
    with pytest.raises(errors.TooManyRequests) as caught:
        await client.get("/x")
    assert caught.value.retry_after == 3.0

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(errors.Unreachable, match="connection refused"):
        await client_for(refuse).get("/x")


def test_token_bucket_allows_a_burst_then_paces_at_qps() -> None:
    bucket = TokenBucket(qps=5, burst=3)
    waits = [bucket.reserve(10.0) for _ in range(5)]
    assert waits == [0.0, 0.0, 0.0, pytest.approx(0.2), pytest.approx(0.4)]
    assert bucket.reserve(11.0) == pytest.approx(0.0, abs=1e-9)  # refilled by a second
    assert TokenBucket(qps=0, burst=0).reserve(0.0) == 0.0


def test_token_bucket_try_accept_takes_only_what_is_there() -> None:
    bucket = TokenBucket(qps=2, burst=2)
    assert [bucket.try_accept(5.0) for _ in range(3)] == [True, True, False]
    assert not bucket.try_accept(5.4)  # 0.8 of a token: a refusal owes nothing
    assert bucket.try_accept(5.5) and not bucket.try_accept(5.5)
    assert TokenBucket(qps=0, burst=0).try_accept(0.0)


class Recording:
    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    async def replace(self, items: list[dict[str, Any]]) -> None:
        self.lists.append([i["metadata"]["name"] for i in items])

    async def apply(self, event: WatchEvent) -> None:
        self.events.append((event.type, event.object["metadata"]["name"]))


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def watch_body(*frames: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(f).encode() + b"\n" for f in frames)


async def test_reflector_lists_watches_skips_bookmarks_and_relists_on_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        calls.append(params)
        if "watch" not in params:
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": "10"}, "items": [pod("a", "9")]}
            )
        if params["resourceVersion"] == "10":
            return httpx.Response(
                200,
                content=watch_body(
                    {"type": "ADDED", "object": pod("b", "11")},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                ),
            )
        if params["resourceVersion"] == "15":
            return httpx.Response(
                200,
                content=watch_body(
                    {
                        "type": "ERROR",
                        "object": {"kind": "Status", "code": 410, "reason": "Expired"},
                    }
                ),
            )
        return httpx.Response(200, content=b"")

    seen = Recording()
    reflector = Reflector(
        client_for(handler), "/api/v1/pods", seen, params={"fieldSelector": "spec.nodeName=n"}
    )
    with trio.move_on_after(1):
        await reflector.run()
    assert seen.lists[:2] == [["a"], ["a"]]  # listed, then listed again after the 410
    assert seen.events[0] == ("ADDED", "b")
    watches = [c for c in calls if "watch" in c]
    assert [w["resourceVersion"] for w in watches[:2]] == ["10", "15"]
    assert all(
        w["fieldSelector"] == "spec.nodeName=n" and w["allowWatchBookmarks"] == "true"
        for w in watches
    )


async def test_reflector_backs_off_while_the_server_is_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        times.append(trio.current_time())
        raise httpx.ConnectError("refused")

    with trio.move_on_after(60):
        await Reflector(client_for(handler), "/api/v1/pods", Recording()).run()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) < 15, "retries must back off, not spin"
    assert gaps[0] < 1.5 and max(gaps) > 15


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "node",
                "contexts": [{"name": "node", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_kubeconfig_with_embedded_certificates(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert(common_name="system:node:n")
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    path = kubeconfig(
        tmp_path,
        {
            "client-certificate-data": b64(cert.cert_chain_pems[0].bytes()),
            "client-key-data": b64(cert.private_key_pem.bytes()),
        },
        {
            "server": "https://127.0.0.1:6443",
            "certificate-authority-data": b64(ca.cert_pem.bytes()),
        },
    )
    connection = load_kubeconfig(path)
    assert connection.server == "https://127.0.0.1:6443"
    assert connection.ssl_context is not None and connection.token is None


def test_kubeconfig_token_file_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    path = kubeconfig(
        tmp_path,
        {"tokenFile": "token"},
        {"server": "https://h:6443", "insecure-skip-tls-verify": True},
    )
    assert load_kubeconfig(path).token == "abc"


@pytest.mark.parametrize(
    ("user", "cluster", "message"),
    [
        ({}, {"server": "h:6443"}, "server: 'h:6443' is not a URL"),
        (
            {"client-certificate": "missing.crt"},
            {"server": "https://h"},
            "users.user.client-certificate: .*missing.crt: No such file",
        ),
        ({"client-key-data": "%%%"}, {"server": "https://h"}, "client-key-data: not base64"),
    ],
)
def test_bad_kubeconfigs_name_the_field(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message):
        load_kubeconfig(kubeconfig(tmp_path, user, cluster))
