"""Container image references: parsing by the docker reference grammar, and docker.io defaults.

A container's ``image`` reaches the runtime with ``:latest`` added when it names
neither a tag nor a digest, as the Go kubelet does before pulling; a string the
grammar rejects is the pod's ``InvalidImageName``. Credentials are matched against
the normalised form (``busybox`` is ``docker.io/library/busybox``), the one the
registry sees.

The grammar (github.com/distribution/reference)::

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [domain "/"] path-component ["/" path-component]*
    domain     := host [":" port]            host: DNS name, IPv4, or [IPv6]
    path-component := [a-z0-9]+ ( ("." | "_" | "__" | "-"+) [a-z0-9]+ )*
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex          e.g. sha256 with 64 lowercase hex digits
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPO_PREFIX = "library/"
DEFAULT_TAG = "latest"
NAME_TOTAL_LENGTH_MAX = 255

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[[a-fA-F0-9:]+\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_REFERENCE = re.compile(
    rf"(?P<name>(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH}))"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
_ANCHORED_IDENTIFIER = re.compile(r"[a-f0-9]{64}")
# Digest algorithms a registry may use, with the length of their hex encoding.
_DIGEST_HEX_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
_LOWER_HEX = re.compile(r"[a-f0-9]+")


class InvalidImageReference(ValueError):
    """The string is not an image reference; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class ImageReference:
    """A parsed, normalised reference: ``domain/path[:tag][@digest]``."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        """``docker.io/library/busybox``: what credentials are looked up by."""
        return f"{self.domain}/{self.path}"

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag is not None else ""
        digest = f"@{self.digest}" if self.digest is not None else ""
        return f"{self.repository}{tag}{digest}"


def split_domain(name: str) -> tuple[str, str]:
    """The registry part of a name and the rest, with docker.io's defaults applied.

    The first component is a registry only when it looks like a host: it has a dot or
    a port, is ``localhost``, or has capitals (which a repository path cannot have).
    """
    first, slash, rest = name.partition("/")
    if not slash or (
        "." not in first and ":" not in first and first != "localhost" and first.lower() == first
    ):
        domain, remainder = DEFAULT_DOMAIN, name
    else:
        domain, remainder = first, rest
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in remainder:
        remainder = OFFICIAL_REPO_PREFIX + remainder
    return domain, remainder


def parse_image_reference(image: str) -> ImageReference:
    """Parse and normalise ``image`` as docker's ParseNormalizedNamed does."""
    if _ANCHORED_IDENTIFIER.fullmatch(image):
        raise InvalidImageReference(
            f"invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
        )
    domain, remainder = split_domain(image)
    repository = remainder.split(":", 1)[0]  # the tag may have capitals, the path not
    if repository.lower() != repository:
        raise InvalidImageReference("invalid reference format: repository name must be lowercase")
    return _parse(f"{domain}/{remainder}")


def _parse(text: str) -> ImageReference:
    if not text:
        raise InvalidImageReference("repository name must have at least one component")
    match = _REFERENCE.fullmatch(text)
    if match is None:
        if _REFERENCE.fullmatch(text.lower()) is not None:
            raise InvalidImageReference("repository name must be lowercase")
        raise InvalidImageReference("invalid reference format")
    if len(match["name"]) > NAME_TOTAL_LENGTH_MAX:
        raise InvalidImageReference(
            f"repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters"
        )
    digest = match["digest"]
    if digest is not None:
        _check_digest(digest)
    return ImageReference(
        domain=match["domain"] or "", path=match["path"], tag=match["tag"], digest=digest
    )


def _check_digest(digest: str) -> None:
    algorithm, _, encoded = digest.partition(":")
    length = _DIGEST_HEX_LENGTHS.get(algorithm)
    if length is None:
        raise InvalidImageReference("unsupported digest algorithm")
    if len(encoded) != length:
        raise InvalidImageReference("invalid checksum digest length")
    if not _LOWER_HEX.fullmatch(encoded):
        raise InvalidImageReference("invalid checksum digest format")


def with_default_tag(image: str) -> str:
    """``image`` as the runtime is asked for it: ``:latest`` added when it has no tag or digest.

    The name is otherwise left as written (``busybox`` becomes ``busybox:latest``, not
    ``docker.io/library/busybox:latest``) so the runtime applies its own defaults.
    """
    reference = parse_image_reference(image)
    if reference.tag is None and reference.digest is None:
        return f"{image}:{DEFAULT_TAG}"
    return image


def invalid_image_message(image: str, error: InvalidImageReference) -> str:
    """The ``InvalidImageName`` message, worded as the Go kubelet's."""
    return (
        f'Failed to apply default image tag "{image}": '
        f'couldn\'t parse image reference "{image}": {error}'
    )
