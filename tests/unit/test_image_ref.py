"""core.image_ref: the docker reference grammar, docker.io defaults and the default tag."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.image_ref import (
    ImageReference,
    InvalidImageReference,
    invalid_image_message,
    parse_image_reference,
    split_domain,
    with_default_tag,
)

SHA = "a" * 64


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("busybox", ImageReference("docker.io", "library/busybox")),
        ("busybox:1.36", ImageReference("docker.io", "library/busybox", tag="1.36")),
        ("user/app:v1", ImageReference("docker.io", "user/app", tag="v1")),
        ("index.docker.io/user/app", ImageReference("docker.io", "user/app")),
        ("docker.io/busybox", ImageReference("docker.io", "library/busybox")),
        ("localhost/app", ImageReference("localhost", "app")),
        ("localhost:5000/a/b/c:t", ImageReference("localhost:5000", "a/b/c", tag="t")),
        ("r.local/app:Tag_1.0-rc", ImageReference("r.local", "app", tag="Tag_1.0-rc")),
        ("127.0.0.1:5055/tk/busybox:a", ImageReference("127.0.0.1:5055", "tk/busybox", tag="a")),
        ("[::1]:5000/app", ImageReference("[::1]:5000", "app")),
        ("Registry.Local/app", ImageReference("Registry.Local", "app")),
        ("a__b/c-d.e_f:x", ImageReference("docker.io", "a__b/c-d.e_f", tag="x")),
        (f"app@sha256:{SHA}", ImageReference("docker.io", "library/app", digest=f"sha256:{SHA}")),
        (
            f"r.io/app:v1@sha256:{SHA}",
            ImageReference("r.io", "app", tag="v1", digest=f"sha256:{SHA}"),
        ),
    ],
)
def test_valid_references_normalise(image: str, expected: ImageReference) -> None:
    assert parse_image_reference(image) == expected


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("", "invalid reference format"),
        ("Busybox", "invalid reference format: repository name must be lowercase"),
        ("user/App", "invalid reference format: repository name must be lowercase"),
        ("registry.local/App", "repository name must be lowercase"),
        ("busybox:", "invalid reference format"),
        ("busybox::1", "invalid reference format"),
        ("-busybox", "invalid reference format"),
        ("a//b", "invalid reference format"),
        ("a b", "invalid reference format"),
        ("app:" + "t" * 129, "invalid reference format"),
        (SHA, "cannot specify 64-byte hexadecimal strings"),
        ("app@sha256:abc", "invalid reference format"),
        (f"app@sha256:{'a' * 63}b1", "invalid checksum digest length"),
        (f"app@sha256:{'A' * 64}", "invalid checksum digest format"),
        (f"app@md5:{'a' * 32}", "unsupported digest algorithm"),
        ("r.io/" + "a" * 251, "repository name must not be more than 255 characters"),
    ],
)
def test_invalid_references_say_why(image: str, why: str) -> None:
    with pytest.raises(InvalidImageReference) as caught:
        parse_image_reference(image)
    assert why in str(caught.value)


def test_default_tag_is_added_only_without_tag_or_digest() -> None:
    assert with_default_tag("busybox") == "busybox:latest"  # not fully qualified: the runtime's job
    assert with_default_tag("localhost:5000/app") == "localhost:5000/app:latest"
    assert with_default_tag("busybox:1.36") == "busybox:1.36"
    assert with_default_tag(f"busybox@sha256:{SHA}") == f"busybox@sha256:{SHA}"


def test_invalid_image_message_is_the_go_wording() -> None:
    with pytest.raises(InvalidImageReference) as caught:
        with_default_tag("Busybox")
    assert invalid_image_message("Busybox", caught.value) == (
        'Failed to apply default image tag "Busybox": couldn\'t parse image reference '
        '"Busybox": invalid reference format: repository name must be lowercase'
    )


def test_split_domain_needs_a_host_looking_first_component() -> None:
    assert split_domain("team/app") == ("docker.io", "team/app")
    assert split_domain("team.io/app") == ("team.io", "app")
    assert split_domain("team:1/app") == ("team:1", "app")
    assert split_domain("Team/app") == ("Team", "app")  # capitals cannot be a path


# -- properties -------------------------------------------------------------------------------

_alnum = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
_separator = st.sampled_from([".", "_", "__", "-", "--"])
_component = st.builds(
    lambda first, rest: first + "".join(sep + part for sep, part in rest),
    _alnum,
    st.lists(st.tuples(_separator, _alnum), max_size=2),
)
_path = st.lists(_component, min_size=1, max_size=3).map("/".join)
_domain = st.one_of(
    st.just(""),
    st.builds(lambda h, p: h + p, st.sampled_from(["r.io", "localhost", "10.0.0.1", "a.b.c"]),
              st.sampled_from(["", ":5000"])),
)
_tag = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z")
_digest = st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: f"sha256:{h}")


@st.composite
def references(draw: st.DrawFn) -> str:
    domain, path = draw(_domain), draw(_path)
    if not domain and "/" in path:  # a first component with a dot would be read as a host
        path = f"{draw(_alnum)}/{path}"
    tag, digest = draw(st.none() | _tag), draw(st.none() | _digest)
    text = f"{domain}/{path}" if domain else path
    return text + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


@settings(max_examples=300)
@given(references())
def test_grammar_references_parse_and_round_trip(image: str) -> None:
    parsed = parse_image_reference(image)
    assert parse_image_reference(str(parsed)) == parsed  # normalising is idempotent
    assert str(parsed).endswith(image.split("/")[-1])  # name, tag and digest survive
    defaulted = parse_image_reference(with_default_tag(image))
    assert defaulted.tag is not None or defaulted.digest is not None


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_any_string_parses_or_raises_invalid_reference(text: str) -> None:
    try:
        parsed = parse_image_reference(text)
    except InvalidImageReference:
        return
    assert parsed.path and parsed.domain
