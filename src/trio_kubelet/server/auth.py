"""Authentication and authorisation of the 10250 API, as KubeletConfiguration configures them.

Authentication (``authentication``): x509 client certificates verified against
``clientCAFile`` (user = CN, groups = O), bearer tokens checked by a TokenReview
webhook (results cached ``webhook.cacheTTL``), anonymous requests as
``system:anonymous`` only when ``anonymous.enabled``. Authorisation
(``authorization.mode``): ``AlwaysAllow``, or ``Webhook`` — a SubjectAccessReview
per request with the Go kubelet's mapping of path to ``nodes`` subresource and
method to verb, allowed answers cached ``cacheAuthorizedTTL``, denied ones
``cacheUnauthorizedTTL``.

The decisions (credentials from headers, request attributes, messages, cache
lifetimes) are pure functions; the webhooks are called through httpx with
timeouts, and a failing webhook fails that request only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import ssl
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import httpx
import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trio_kubelet.config import AgentOptions

log = logging.getLogger(__name__)

__all__ = [
    "ANONYMOUS",
    "AUTHENTICATED_GROUP",
    "AlwaysAllowAuthorizer",
    "Attributes",
    "AuthenticationError",
    "Authenticator",
    "AuthorizationError",
    "Authorizer",
    "Credentials",
    "DenyAllAuthorizer",
    "RequestAuthenticator",
    "ReviewClient",
    "ReviewError",
    "SubjectAccessReviewAuthorizer",
    "TTLCache",
    "TokenReviewAuthenticator",
    "UserInfo",
    "X509Authenticator",
    "api_verb",
    "authorization_error_message",
    "authorize_any",
    "build_auth",
    "credentials_from_request",
    "decision_ttl",
    "forbidden_message",
    "request_attributes",
]

AUTHENTICATED_GROUP = "system:authenticated"
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
WEBSOCKET_TOKEN_PREFIX = "base64url.bearer.authorization.k8s.io."
DEFAULT_WEBHOOK_TIMEOUT = 10.0
CACHE_MAX_ENTRIES = 4096


# --- identities and credentials -------------------------------------------------------------


@dataclass(frozen=True)
class UserInfo:
    """An authenticated (or anonymous) user, as Kubernetes' user.Info."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo("system:anonymous", groups=("system:unauthenticated",))


@dataclass(frozen=True)
class Credentials:
    """What a request presents: a bearer token and/or a client certificate, with why it
    did not verify against ``clientCAFile`` (None: it did)."""

    bearer_token: str | None = None
    client_certificate_pem: str | None = None
    client_certificate_error: str | None = None


class AuthenticationError(Exception):
    """Credentials were presented and are invalid, or could not be checked (→ 401)."""


def _websocket_token(protocols: str) -> str | None:
    for protocol in protocols.split(","):
        protocol = protocol.strip()
        if protocol.startswith(WEBSOCKET_TOKEN_PREFIX):
            encoded = protocol[len(WEBSOCKET_TOKEN_PREFIX):]
            try:
                token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
            return token or None
    return None


def credentials_from_request(headers: Mapping[str, str],
                             tls: Mapping[str, Any] | None = None) -> Credentials:
    """The credentials of a request: ``Authorization: Bearer …`` (or the websocket
    ``base64url.bearer.authorization.k8s.io.…`` subprotocol) and the ASGI TLS
    extension's client certificate and its ``client_cert_error``. ``headers`` is
    case-insensitive."""
    token: str | None = None
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        token = value.strip()
    elif not authorization:
        token = _websocket_token(headers.get("sec-websocket-protocol", ""))
    chain = (tls or {}).get("client_cert_chain") or []
    return Credentials(bearer_token=token, client_certificate_pem=chain[0] if chain else None,
                       client_certificate_error=(tls or {}).get("client_cert_error"))


class Authenticator(Protocol):
    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        """The user these credentials identify, or None if they identify nobody.

        Raises AuthenticationError when credentials were presented but are invalid
        or could not be checked; the request then fails even if anonymous is allowed.
        """
        ...


class X509Authenticator:
    """User = the certificate's CN, groups = its O values.

    The TLS layer (``tls.server_tls_context``) checks the certificate against
    ``clientCAFile`` and lets the handshake go on either way; a certificate that
    did not verify is an error here, so the request gets 401 even where anonymous
    requests are allowed (Go's x509 authenticator).
    """

    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        if credentials.client_certificate_pem is None:
            return None
        if credentials.client_certificate_error is not None:
            raise AuthenticationError(f"verifying certificate failed: x509: "
                                      f"{credentials.client_certificate_error}")
        # Only built with clientCAFile, whose TLS (pyOpenSSL) has loaded cryptography already;
        # without it the agent never loads cryptography (``tls.py``).
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        try:
            cert = x509.load_pem_x509_certificate(credentials.client_certificate_pem.encode())
        except ValueError as exc:
            raise AuthenticationError(f"unreadable client certificate: {exc}") from None
        common_names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        name = str(common_names[0].value) if common_names else ""
        if not name:
            return None
        groups = tuple(str(a.value) for a in
                       cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
        return UserInfo(name, groups=groups)


class RequestAuthenticator:
    """The Go kubelet's chain: the first authenticator that identifies the user wins;
    any error fails the request; otherwise anonymous if enabled, else unauthenticated."""

    def __init__(self, authenticators: Sequence[Authenticator], *, anonymous: bool) -> None:
        self.authenticators = list(authenticators)
        self.anonymous = anonymous

    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        errors: list[str] = []
        for authenticator in self.authenticators:
            try:
                user = await authenticator.authenticate(credentials)
            except AuthenticationError as exc:
                errors.append(str(exc))
                continue
            if user is not None:
                return with_authenticated_group(user)
        if errors:
            raise AuthenticationError("; ".join(errors))
        return ANONYMOUS if self.anonymous else None


def with_authenticated_group(user: UserInfo) -> UserInfo:
    """Every authenticated user is also in ``system:authenticated`` (Go's group adder)."""
    if AUTHENTICATED_GROUP in user.groups or user.name == ANONYMOUS.name:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


# --- attributes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attributes:
    """One authorisation question: may ``user`` ``verb`` ``nodes/<subresource>`` ``name``?"""

    user: UserInfo
    verb: str
    subresource: str
    name: str
    path: str
    resource: str = "nodes"
    api_version: str = "v1"


_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}


def api_verb(method: str) -> str:
    """The API verb of an HTTP method; empty (never allowed by RBAC) for other methods."""
    return _VERBS.get(method.upper(), "")


def _is_subpath(subpath: str, path: str) -> bool:
    path = path.rstrip("/")
    return subpath == path or (subpath.startswith(path) and subpath[len(path):][:1] == "/")


# Checked first, and additionally to "proxy" (KubeletFineGrainedAuthz, on since Kubernetes 1.33).
_FINE_GRAINED = (("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"),
                 ("/statusz", "statusz"), ("/runningpods/", "pods"))
# Instead of "proxy". /spec is not served by current Go kubelets; older ones used "spec".
_SUBRESOURCES = (("/stats/", "stats"), ("/metrics", "metrics"), ("/logs/", "log"),
                 ("/checkpoint/", "checkpoint"), ("/spec/", "spec"))


def request_attributes(user: UserInfo, method: str, path: str, node_name: str
                       ) -> tuple[Attributes, ...]:
    """What to ask the authorizer for a request; it is allowed if any one is allowed.

    ``/stats*`` → stats, ``/metrics*`` → metrics, ``/logs*`` → log, ``/spec*`` → spec,
    anything else → proxy; ``/pods``, ``/healthz``, ``/configz`` ask for their own
    subresource first, then proxy.
    """
    subresources = [sub for prefix, sub in _FINE_GRAINED if _is_subpath(path, prefix)][:1]
    subresources.append(next((sub for prefix, sub in _SUBRESOURCES if _is_subpath(path, prefix)),
                             "proxy"))
    verb = api_verb(method)
    return tuple(Attributes(user, verb, sub, node_name, path) for sub in subresources)


def forbidden_message(attributes: Sequence[Attributes]) -> str:
    """The Go kubelet's 403 body."""
    first = attributes[0]
    subresources = " ".join(a.subresource for a in attributes)
    return (f"Forbidden (user={first.user.name}, verb={first.verb}, resource={first.resource}, "
            f"subresource(s)=[{subresources}])\n")


def authorization_error_message(attributes: Attributes) -> str:
    """The Go kubelet's 500 body when the authorizer could not decide."""
    return (f"Authorization error (user={attributes.user.name}, verb={attributes.verb}, "
            f"resource={attributes.resource}, subresource={attributes.subresource})")


class AuthorizationError(Exception):
    """The authorizer could not decide (webhook down, bad answer) (→ 500)."""

    def __init__(self, message: str, attributes: Attributes | None = None) -> None:
        super().__init__(message)
        self.attributes = attributes


class Authorizer(Protocol):
    async def authorize(self, attributes: Attributes) -> bool:
        """Whether the request is allowed; raises AuthorizationError if undecidable."""
        ...


class AlwaysAllowAuthorizer:
    async def authorize(self, attributes: Attributes) -> bool:
        return True


class DenyAllAuthorizer:
    """Webhook mode without an API server to ask: nothing is allowed."""

    async def authorize(self, attributes: Attributes) -> bool:
        return False


async def authorize_any(authorizer: Authorizer, attributes: Sequence[Attributes]) -> bool:
    """Allowed if the authorizer allows any of ``attributes``; errors carry the attribute."""
    for attr in attributes:
        try:
            if await authorizer.authorize(attr):
                return True
        except AuthorizationError as exc:
            raise AuthorizationError(str(exc), attr) from exc
    return False


# --- caching ---------------------------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """A bounded map whose entries expire; time is always an argument (no clock reads)."""

    def __init__(self, max_entries: int = CACHE_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> tuple[bool, V | None]:
        """``(True, value)`` for a live entry, ``(False, None)`` otherwise."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        expires, value = entry
        if now >= expires:
            del self._entries[key]
            return False, None
        return True, value

    def put(self, key: K, value: V, now: float, ttl: float) -> None:
        if ttl <= 0:
            return
        self._entries.pop(key, None)
        self._entries[key] = (now + ttl, value)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def decision_ttl(allowed: bool, authorized_ttl: float, unauthorized_ttl: float) -> float:
    """How long an authorisation answer may be reused."""
    return authorized_ttl if allowed else unauthorized_ttl


# --- webhooks --------------------------------------------------------------------------------


class ReviewError(Exception):
    """A TokenReview or SubjectAccessReview call failed or was answered nonsensically."""


class ReviewClient:
    """POSTs review objects to the API server (or a stand-in speaking the same JSON)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @classmethod
    def connect(cls, server: str, *, ca_file: Path | str | None = None,
                cert_file: Path | str | None = None, key_file: Path | str | None = None,
                token: str | None = None,
                timeout: float = DEFAULT_WEBHOOK_TIMEOUT) -> ReviewClient:
        """A client for ``server`` (``https://host:6443``) with the given TLS settings.

        Until the cluster issue supplies a kubeconfig-based client, this is how the
        webhook target is configured.
        """
        verify = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if cert_file is not None:
            verify.load_cert_chain(str(cert_file), str(key_file or cert_file))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.AsyncClient(base_url=server, verify=verify, headers=headers,
                                   timeout=httpx.Timeout(timeout))
        return cls(client)

    async def create(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        kind = review.get("kind", "review")
        try:
            response = await self.client.post(path, json=review)
        except httpx.HTTPError as exc:
            raise ReviewError(f"{kind} webhook: {type(exc).__name__}: {exc}") from None
        if response.status_code // 100 != 2:
            raise ReviewError(f"{kind} webhook: HTTP {response.status_code}: "
                              f"{response.text[:200]}")
        try:
            body = response.json()
        except ValueError:
            raise ReviewError(f"{kind} webhook: the answer is not JSON") from None
        if not isinstance(body, dict):
            raise ReviewError(f"{kind} webhook: the answer is not an object")
        return body

    async def aclose(self) -> None:
        await self.client.aclose()


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _ReviewUser(_Lenient):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class _TokenReviewStatus(_Lenient):
    authenticated: bool = False
    user: _ReviewUser = Field(default_factory=_ReviewUser)
    error: str = ""


class _SubjectAccessReviewStatus(_Lenient):
    allowed: bool = False
    denied: bool = False
    reason: str = ""
    evaluation_error: str = Field(default="", alias="evaluationError")


def _status(body: Mapping[str, Any], model: type[_Lenient], kind: str) -> Any:
    try:
        return model.model_validate(body.get("status") or {})
    except ValidationError as exc:
        raise ReviewError(f"{kind} webhook: invalid status: "
                          f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None


def token_review(token: str, audiences: Sequence[str] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def subject_access_review(attributes: Attributes) -> dict[str, Any]:
    user = attributes.user
    spec: dict[str, Any] = {
        "resourceAttributes": {
            "namespace": "", "verb": attributes.verb, "group": "",
            "version": attributes.api_version, "resource": attributes.resource,
            "subresource": attributes.subresource, "name": attributes.name,
        },
        "user": user.name,
        "groups": list(user.groups),
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class TokenReviewAuthenticator:
    """Bearer tokens checked by the API server; answers (yes or no) cached ``cache_ttl``."""

    def __init__(self, review: ReviewClient, cache_ttl: float = 120.0, *,
                 audiences: Sequence[str] = (), clock: Callable[[], float] = trio.current_time
                 ) -> None:
        self.review = review
        self.cache_ttl = cache_ttl
        self.audiences = tuple(audiences)
        self.clock = clock
        # Keys are token digests: the cache never holds a token itself.
        self.cache: TTLCache[str, UserInfo | None] = TTLCache()
        self.webhook_calls = 0

    async def authenticate(self, credentials: Credentials) -> UserInfo | None:
        token = credentials.bearer_token
        if token is None:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        found, user = self.cache.get(key, self.clock())
        if found:
            return user
        self.webhook_calls += 1
        try:
            body = await self.review.create(TOKEN_REVIEW_PATH, token_review(token, self.audiences))
        except ReviewError as exc:
            raise AuthenticationError(str(exc)) from None
        status: _TokenReviewStatus = _status(body, _TokenReviewStatus, "TokenReview")
        if not status.authenticated:
            if status.error:
                raise AuthenticationError(f"token rejected: {status.error}")
            user = None
        else:
            user = UserInfo(status.user.username, status.user.uid, tuple(status.user.groups),
                            {k: tuple(v) for k, v in status.user.extra.items()})
        self.cache.put(key, user, self.clock(), self.cache_ttl)
        return user


class SubjectAccessReviewAuthorizer:
    """Each question asked to the API server once per cache lifetime."""

    def __init__(self, review: ReviewClient, authorized_ttl: float = 300.0,
                 unauthorized_ttl: float = 30.0, *,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.review = review
        self.authorized_ttl = authorized_ttl
        self.unauthorized_ttl = unauthorized_ttl
        self.clock = clock
        self.cache: TTLCache[str, bool] = TTLCache()
        self.webhook_calls = 0

    async def authorize(self, attributes: Attributes) -> bool:
        review = subject_access_review(attributes)
        key = json.dumps(review["spec"], sort_keys=True)
        found, allowed = self.cache.get(key, self.clock())
        if found:
            return bool(allowed)
        self.webhook_calls += 1
        try:
            body = await self.review.create(SUBJECT_ACCESS_REVIEW_PATH, review)
        except ReviewError as exc:
            raise AuthorizationError(str(exc), attributes) from None
        status: _SubjectAccessReviewStatus = _status(body, _SubjectAccessReviewStatus,
                                                     "SubjectAccessReview")
        if status.evaluation_error and not status.allowed and not status.denied:
            log.info("SubjectAccessReview evaluation error for %s: %s", attributes.user.name,
                     status.evaluation_error)
        allowed = status.allowed and not status.denied
        ttl = decision_ttl(allowed, self.authorized_ttl, self.unauthorized_ttl)
        self.cache.put(key, allowed, self.clock(), ttl)
        return allowed


def build_auth(options: AgentOptions, review: ReviewClient | None = None
               ) -> tuple[RequestAuthenticator, Authorizer]:
    """The authenticator and authorizer ``options`` ask for.

    Without an API server (``review`` is None) a webhook cannot be asked: bearer
    tokens are then not accepted, and ``authorization.mode: Webhook`` denies every
    request (the Go kubelet refuses to start instead); both are logged once.
    """
    authn = options.config.authentication
    authz = options.config.authorization
    authenticators: list[Authenticator] = []
    if authn.x509.client_ca_file:
        authenticators.append(X509Authenticator())
    if authn.webhook.enabled:
        if review is not None:
            authenticators.append(TokenReviewAuthenticator(review, authn.webhook.cache_ttl))
        else:
            log.warning("authentication.webhook.enabled but no API server to send TokenReviews "
                        "to: bearer tokens are not accepted on port %d", options.config.port)
    authenticator = RequestAuthenticator(authenticators, anonymous=authn.anonymous.enabled)

    authorizer: Authorizer
    if authz.mode == "AlwaysAllow":
        authorizer = AlwaysAllowAuthorizer()
    elif review is not None:
        authorizer = SubjectAccessReviewAuthorizer(review, authz.webhook.cache_authorized_ttl,
                                                   authz.webhook.cache_unauthorized_ttl)
    else:
        log.warning("authorization.mode is Webhook but there is no API server to ask: every "
                    "request on port %d is denied (set authorization.mode: AlwaysAllow on a "
                    "standalone node)", options.config.port)
        authorizer = DenyAllAuthorizer()
    return authenticator, authorizer
