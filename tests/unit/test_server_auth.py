"""server.auth: credentials, the path/verb mapping, caches, the chain, the review webhooks."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.server.auth import (
    ANONYMOUS,
    AlwaysAllowAuthorizer,
    Attributes,
    AuthenticationError,
    AuthorizationError,
    Credentials,
    DenyAllAuthorizer,
    RequestAuthenticator,
    ReviewClient,
    SubjectAccessReviewAuthorizer,
    TokenReviewAuthenticator,
    TTLCache,
    UserInfo,
    X509Authenticator,
    api_verb,
    authorization_error_message,
    authorize_any,
    build_auth,
    credentials_from_request,
    decision_ttl,
    forbidden_message,
    request_attributes,
)

ALICE = UserInfo("alice", groups=("dev",))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "verb"), [
    ("GET", "get"), ("HEAD", "get"), ("POST", "create"), ("PUT", "update"), ("PATCH", "patch"),
    ("DELETE", "delete"), ("OPTIONS", ""), ("get", "get"),
])
def test_api_verb(method: str, verb: str) -> None:
    assert api_verb(method) == verb


@pytest.mark.parametrize(("path", "subresources"), [
    ("/stats/summary", ["stats"]),
    ("/stats", ["stats"]),
    ("/statsfoo", ["proxy"]),
    ("/metrics", ["metrics"]),
    ("/metrics/cadvisor", ["metrics"]),
    ("/metrics/probes", ["metrics"]),
    ("/logs/", ["log"]),
    ("/logs/syslog", ["log"]),
    ("/spec/", ["spec"]),
    ("/spec", ["spec"]),
    ("/pods", ["pods", "proxy"]),
    ("/pods/", ["pods", "proxy"]),
    ("/healthz", ["healthz", "proxy"]),
    ("/healthz/pleg", ["healthz", "proxy"]),
    ("/configz", ["configz", "proxy"]),
    ("/runningpods/", ["pods", "proxy"]),
    ("/exec/default/web/main", ["proxy"]),
    ("/containerLogs/default/web/main", ["proxy"]),
    ("/portForward/default/web", ["proxy"]),
    ("/", ["proxy"]),
])
def test_request_attributes_map_paths_to_node_subresources(path: str,
                                                           subresources: list[str]) -> None:
    attributes = request_attributes(ALICE, "GET", path, "node-a")
    assert [a.subresource for a in attributes] == subresources
    assert {(a.resource, a.name, a.verb, a.api_version, a.path) for a in attributes} == {
        ("nodes", "node-a", "get", "v1", path)}


def test_messages_have_the_go_kubelet_shape() -> None:
    attributes = request_attributes(ANONYMOUS, "GET", "/pods", "node-a")
    assert forbidden_message(attributes) == (
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, "
        "subresource(s)=[pods proxy])\n")
    assert authorization_error_message(attributes[1]) == (
        "Authorization error (user=system:anonymous, verb=get, resource=nodes, "
        "subresource=proxy)")


def test_credentials_from_request() -> None:
    assert credentials_from_request({"authorization": "Bearer abc "}) == Credentials("abc")
    assert credentials_from_request({"authorization": "bearer abc"}).bearer_token == "abc"
    assert credentials_from_request({"authorization": "Basic abc"}).bearer_token is None
    assert credentials_from_request({"authorization": "Bearer "}).bearer_token is None
    encoded = base64.urlsafe_b64encode(b"ws-token").decode().rstrip("=")
    protocols = f"v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{encoded}"
    assert credentials_from_request({"sec-websocket-protocol": protocols}).bearer_token == \
        "ws-token"
    tls = {"client_cert_chain": ["PEM"]}
    assert credentials_from_request({}, tls) == Credentials(None, "PEM")
    assert credentials_from_request({}, {"client_cert_chain": []}) == Credentials()


def test_ttl_cache_expires_and_stays_bounded() -> None:
    cache: TTLCache[str, bool] = TTLCache(max_entries=2)
    cache.put("a", True, now=0.0, ttl=10.0)
    assert cache.get("a", 9.9) == (True, True)
    assert cache.get("a", 10.0) == (False, None)
    cache.put("zero", True, now=0.0, ttl=0.0)
    assert cache.get("zero", 0.0) == (False, None)
    for key in ("x", "y", "z"):
        cache.put(key, False, now=0.0, ttl=10.0)
    assert len(cache) == 2 and cache.get("x", 1.0) == (False, None)
    assert cache.get("z", 1.0) == (True, False)


def test_decision_ttl() -> None:
    assert decision_ttl(True, 300.0, 30.0) == 300.0
    assert decision_ttl(False, 300.0, 30.0) == 30.0


# --- the chain -------------------------------------------------------------------------------


class Fixed:
    def __init__(self, answer: UserInfo | Exception | None) -> None:
        self.answer = answer

    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_chain_first_identified_user_wins_and_joins_authenticated() -> None:
    chain = RequestAuthenticator([Fixed(None), Fixed(ALICE), Fixed(UserInfo("bob"))],
                                 anonymous=False)
    assert await chain.authenticate(Credentials()) == UserInfo(
        "alice", groups=("dev", "system:authenticated"))


async def test_chain_anonymous_only_when_enabled_and_errors_are_never_anonymous() -> None:
    assert await RequestAuthenticator([Fixed(None)], anonymous=False).authenticate(
        Credentials()) is None
    assert await RequestAuthenticator([Fixed(None)], anonymous=True).authenticate(
        Credentials()) == ANONYMOUS
    failing = RequestAuthenticator([Fixed(AuthenticationError("bad token"))], anonymous=True)
    with pytest.raises(AuthenticationError, match="bad token"):
        await failing.authenticate(Credentials("t"))


async def test_x509_user_is_common_name_and_groups_are_organizations() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert(common_name="system:node:node-a",
                         organization_name="system:nodes")
    pem = cert.cert_chain_pems[0].bytes().decode()
    user = await X509Authenticator().authenticate(Credentials(client_certificate_pem=pem))
    assert user == UserInfo("system:node:node-a", groups=("system:nodes",))
    assert await X509Authenticator().authenticate(Credentials()) is None
    with pytest.raises(AuthenticationError):
        await X509Authenticator().authenticate(Credentials(client_certificate_pem="garbage"))
    unverified = Credentials(client_certificate_pem=pem,
                             client_certificate_error="certificate signed by unknown authority")
    with pytest.raises(AuthenticationError, match="x509: certificate signed by unknown authority"):
        await RequestAuthenticator([X509Authenticator()], anonymous=True).authenticate(unverified)


async def test_authorize_any_stops_at_the_first_allowed_and_tags_errors() -> None:
    class Only:
        def __init__(self) -> None:
            self.asked: list[str] = []

        async def authorize(self, attributes: Attributes) -> bool:
            self.asked.append(attributes.subresource)
            if attributes.subresource == "broken":
                raise AuthorizationError("down")
            return bool(attributes.subresource == "pods")

    only = Only()
    assert await authorize_any(only, request_attributes(ALICE, "GET", "/pods", "n"))
    assert only.asked == ["pods"]
    assert not await authorize_any(only, request_attributes(ALICE, "GET", "/configz", "n"))
    broken = Attributes(ALICE, "get", "broken", "n", "/x")
    with pytest.raises(AuthorizationError) as caught:
        await authorize_any(only, [broken])
    assert caught.value.attributes == broken
    assert await AlwaysAllowAuthorizer().authorize(broken)
    assert not await DenyAllAuthorizer().authorize(broken)


# --- webhooks (through httpx's mock transport) -------------------------------------------------


class StandIn:
    """Answers TokenReviews and SubjectAccessReviews like an API server would."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if self.fail:
            return httpx.Response(503, text="etcd is sad")
        if body["kind"] == "TokenReview":
            token = body["spec"]["token"]
            if token == "alice-token":
                status = {"authenticated": True, "user": {"username": "alice", "uid": "42",
                                                          "groups": ["dev"]}}
            elif token == "revoked":
                status = {"authenticated": False, "error": "token revoked"}
            else:
                status = {"authenticated": False}
            return httpx.Response(201, json={**body, "status": status})
        spec = body["spec"]
        allowed = spec["user"] == "alice" and spec["resourceAttributes"]["subresource"] == "pods"
        return httpx.Response(201, json={**body, "status": {"allowed": allowed}})


def review_client(stand_in: StandIn) -> ReviewClient:
    return ReviewClient(httpx.AsyncClient(base_url="https://apiserver",
                                          transport=httpx.MockTransport(stand_in.handle)))


async def test_token_review_identifies_caches_and_expires() -> None:
    stand_in, clock = StandIn(), Clock()
    authn = TokenReviewAuthenticator(review_client(stand_in), cache_ttl=120.0, clock=clock)
    user = await authn.authenticate(Credentials("alice-token"))
    assert user == UserInfo("alice", "42", ("dev",))
    assert stand_in.requests[0] == {"apiVersion": "authentication.k8s.io/v1",
                                    "kind": "TokenReview", "spec": {"token": "alice-token"}}
    assert await authn.authenticate(Credentials("alice-token")) == user
    assert await authn.authenticate(Credentials("nobody")) is None
    assert await authn.authenticate(Credentials("nobody")) is None
    assert authn.webhook_calls == 2, "answers, yes and no, are cached"
    clock.now += 121
    await authn.authenticate(Credentials("alice-token"))
    assert authn.webhook_calls == 3
    assert await authn.authenticate(Credentials()) is None
    assert authn.webhook_calls == 3, "no token, no question"


async def test_token_review_errors() -> None:
    stand_in = StandIn()
    authn = TokenReviewAuthenticator(review_client(stand_in), clock=Clock())
    with pytest.raises(AuthenticationError, match="token revoked"):
        await authn.authenticate(Credentials("revoked"))
    stand_in.fail = True
    with pytest.raises(AuthenticationError, match="HTTP 503"):
        await authn.authenticate(Credentials("alice-token"))
    stand_in.fail = False
    assert await authn.authenticate(Credentials("alice-token")) is not None, \
        "a failed call is not cached"


async def test_subject_access_review_asks_caches_by_answer_and_fails_loudly() -> None:
    stand_in, clock = StandIn(), Clock()
    authz = SubjectAccessReviewAuthorizer(review_client(stand_in), 300.0, 30.0, clock=clock)
    pods, configz = request_attributes(ALICE, "GET", "/pods", "node-a")[0], \
        request_attributes(ALICE, "GET", "/configz", "node-a")[0]
    assert await authz.authorize(pods)
    assert stand_in.requests[0] == {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": "", "verb": "get", "group": "",
                                        "version": "v1", "resource": "nodes",
                                        "subresource": "pods", "name": "node-a"},
                 "user": "alice", "groups": ["dev"]}}
    assert not await authz.authorize(configz)
    clock.now += 31
    assert await authz.authorize(pods)
    assert not await authz.authorize(configz)
    assert authz.webhook_calls == 3, "the denial expired after 30 s, the allowance did not"
    stand_in.fail = True
    clock.now += 301
    with pytest.raises(AuthorizationError, match="503"):
        await authz.authorize(pods)


async def test_review_client_rejects_nonsense() -> None:
    def nonsense(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>")

    client = ReviewClient(httpx.AsyncClient(base_url="https://x",
                                            transport=httpx.MockTransport(nonsense)))
    authz = SubjectAccessReviewAuthorizer(client, clock=Clock())
    with pytest.raises(AuthorizationError, match="not JSON"):
        await authz.authorize(Attributes(ALICE, "get", "proxy", "n", "/"))


# --- from the configuration ------------------------------------------------------------------


def options(**wire: Any) -> AgentOptions:
    return AgentOptions(config=KubeletConfiguration.model_validate(wire), node_name="node-a",
                        root_dir=Path("/nonexistent"))


async def test_build_auth_without_an_api_server_is_safe() -> None:
    authenticator, authorizer = build_auth(options())
    assert authenticator.authenticators == [] and not authenticator.anonymous
    assert isinstance(authorizer, DenyAllAuthorizer)


async def test_build_auth_from_configuration() -> None:
    client = review_client(StandIn())
    authenticator, authorizer = build_auth(options(
        authentication={"x509": {"clientCAFile": "/ca.crt"}, "anonymous": {"enabled": True},
                        "webhook": {"cacheTTL": "1m"}},
        authorization={"webhook": {"cacheAuthorizedTTL": "10s"}}), client)
    kinds = [type(a) for a in authenticator.authenticators]
    assert kinds == [X509Authenticator, TokenReviewAuthenticator]
    assert authenticator.anonymous
    token = authenticator.authenticators[1]
    assert isinstance(token, TokenReviewAuthenticator) and token.cache_ttl == 60.0
    assert isinstance(authorizer, SubjectAccessReviewAuthorizer)
    assert (authorizer.authorized_ttl, authorizer.unauthorized_ttl) == (10.0, 30.0)
    _, always = build_auth(options(authorization={"mode": "AlwaysAllow"},
                                   authentication={"webhook": {"enabled": False}}))
    assert isinstance(always, AlwaysAllowAuthorizer)
