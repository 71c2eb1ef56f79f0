"""Bounded manifest decoding: each limit refuses with the place named, within it all decodes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from trio_kubelet.sources import manifest_decode
from trio_kubelet.sources.manifest_decode import (
    MAX_DEPTH,
    MAX_DOCUMENT_CHARS,
    MAX_DOCUMENTS,
    MAX_VALUES,
    InvalidSyntax,
    ManifestTooComplex,
    decode_documents,
)


def decode(text: str, *, json_first: bool = False, deadline: float | None = None) -> list[Any]:
    return decode_documents(text.encode(), json_first=json_first, deadline=deadline)


def refusal(text: str, *, json_first: bool = False, deadline: float | None = None) -> str:
    with pytest.raises(ManifestTooComplex) as caught:
        decode(text, json_first=json_first, deadline=deadline)
    return str(caught.value)


def alias_bomb(levels: int, where: str = "metadata:\n  annotations:\n") -> str:
    """The "billion laughs": each level an anchor of nine aliases of the one before."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "apiVersion: v1\nkind: Pod\n" + where + "".join(f"    {line}\n" for line in lines)


# --- within the limits ----------------------------------------------------------------------


def test_yaml_documents_json_and_flow_yaml_decode() -> None:
    assert decode("a: 1\n---\n---\nb: [x, 2]\n", json_first=False) == [
        {"a": 1}, None, {"b": ["x", 2]}]
    assert decode('{"a": [1, {"b": null}], "c": "\\u00e9"}', json_first=True) == [
        {"a": [1, {"b": None}], "c": "é"}]
    assert decode("{name: x, list: [1, 2]}", json_first=True) == [
        {"name": "x", "list": [1, 2]}]


def test_a_modest_anchor_and_merge_key_are_fine() -> None:
    text = "base: &b {image: busybox, args: [a, b]}\none:\n  <<: *b\n  name: one\ntwo: *b\n"
    (document,) = decode(text, json_first=False)
    assert document["one"] == {"image": "busybox", "args": ["a", "b"], "name": "one"}
    assert document["two"] == {"image": "busybox", "args": ["a", "b"]}


def test_exactly_at_the_limits_is_accepted() -> None:
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert decode(nested, json_first=True)
    assert len(decode("---\n" * MAX_DOCUMENTS, json_first=False)) == MAX_DOCUMENTS
    flat = json.dumps(list(range(MAX_VALUES - 1)))  # the list itself is one value
    assert len(decode(flat, json_first=True)[0]) == MAX_VALUES - 1


# --- each limit -----------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [1000, 5000, 100_000])
def test_deep_json_is_refused_naming_where(levels: int) -> None:
    text = '{"kind":"Pod","spec":' + '{"a":' * levels + "1" + "}" * levels + "}"
    assert refusal(text, json_first=True) == (
        f"spec.a.a.a.a.a.a.a.a.a.a.a...: nested deeper than {MAX_DEPTH} levels")


def test_deep_json_array_and_unbalanced_json_are_refused() -> None:
    assert refusal("[" * 1_000_000, json_first=True).endswith(
        f"nested deeper than {MAX_DEPTH} levels")


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 1_000_000,  # libyaml's composer would overflow the C stack (segfault)
        "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)),
        "{a: " * 200 + "1" + "}" * 200,
    ],
    ids=["flow", "block", "flow-mapping"],
)
def test_deep_yaml_is_refused(text: str) -> None:
    assert refusal(text).endswith(f"nested deeper than {MAX_DEPTH} levels")


def test_the_refusal_names_the_field() -> None:
    text = "spec:\n  containers:\n  - name: a\n  - name: b\n    args: " + "[" * 200
    assert refusal(text) == (
        "spec.containers[1].args[0][0][0][0][0][0][0][0]...: "
        f"nested deeper than {MAX_DEPTH} levels")


def test_depth_brought_by_an_alias_counts() -> None:
    text = "a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 50 + "*a" + "]" * 50 + "\n"
    assert refusal(text).startswith("b[0][0]")


@pytest.mark.parametrize("levels", [9, 10, 11, 12])
def test_alias_bombs_are_refused_before_any_expansion(levels: int) -> None:
    began = time.monotonic()
    reason = refusal(alias_bomb(levels))
    assert time.monotonic() - began < 1.0
    assert reason == (
        f"metadata.annotations.a5[0]: more than {MAX_VALUES} values in the manifest "
        "(an alias counts as all it repeats)")


def test_an_alias_bomb_in_args_names_args() -> None:
    text = "spec:\n  containers:\n  - name: c\n    args:\n" + "".join(
        f"    - &x{i} [" + ", ".join([f"*x{i - 1}"] * 10 if i else ["lol"] * 10) + "]\n"
        for i in range(8))
    assert refusal(text).startswith("spec.containers[0].args[4][")


def test_too_many_values_without_aliases() -> None:
    assert "more than 100000 values" in refusal(json.dumps(list(range(MAX_VALUES))),
                                                 json_first=True)


def test_too_many_documents_even_empty_ones() -> None:
    assert refusal("---\n" * 20_000) == f"more than {MAX_DOCUMENTS} documents"


def test_a_document_too_big_names_the_field_that_makes_it_so() -> None:
    big = "x" * (MAX_DOCUMENT_CHARS + 1)
    too_big = f"more than {MAX_DOCUMENT_CHARS} characters in one document"
    assert refusal(f"metadata:\n  annotations:\n    a: {big}\n") == (
        f"metadata.annotations.a: {too_big}")
    assert refusal(f"a: 1\n---\nb: {big}\n") == f"document 2, b: {too_big}"
    assert refusal(json.dumps({"metadata": {"annotations": {"a": big}}}), json_first=True) == (
        f"metadata.annotations.a: {too_big}")


def test_the_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_decode, "_DEADLINE_EVERY", 10)
    text = json.dumps({"items": list(range(100))})
    assert decode(text, json_first=True, deadline=time.monotonic() + 60)
    assert refusal(text, json_first=True, deadline=time.monotonic() - 1).endswith(
        "reading took longer than 10 s")


def test_anchors_do_not_reach_into_the_next_document() -> None:
    with pytest.raises(InvalidSyntax, match="undefined alias"):
        decode("a: &x 1\n---\nb: *x\n", json_first=False)


def test_syntax_errors_say_where() -> None:
    with pytest.raises(InvalidSyntax) as caught:
        decode('{"kind": "Pod" "x": 1}', json_first=True)
    assert str(caught.value) == "invalid JSON at line 1, column 16: Expecting ',' delimiter"
    with pytest.raises(InvalidSyntax, match="invalid YAML at line 2, column 3: mapping values"):
        decode("a: 1\n b: 2\n", json_first=False)


def test_a_recursive_structure_is_refused() -> None:
    assert refusal("a: &x [1, *x]\n") == (
        "a[1]: alias *x is inside the node it names (a recursive structure)")


def test_decoding_is_pyyaml_safe_load_within_the_limits() -> None:
    """The one-pass builder makes exactly what yaml.safe_load_all does (timestamps aside)."""
    text = (
        "a: !!str 123\nb: [yes, no, ~, 0x1F, 1_000, .inf, 1:20, '2024-01-01', !!binary aGk=]\n"
        "c: &c {x: 1, z: 0}\nd: &d {x: 2, w: 3}\nm1:\n  <<: *c\n  y: 2\n"
        "m2:\n  <<: [*c, *d]\n  z: 9\ne: [*c, *c]\nf: {'=': v}\n---\n---\n- [a, {b: c}]\n"
    )
    ours = decode(text)
    assert ours == list(yaml.safe_load_all(text))
    assert ours[0]["m1"] == {"x": 1, "z": 0, "y": 2}
    assert ours[0]["m2"] == {"x": 1, "z": 9, "w": 3}


@pytest.mark.parametrize(("text", "message"), [
    ("a: !!set {p, q}\n", "the tag 'tag:yaml.org,2002:set' is not supported in a manifest"),
    ("a: !!python/name:os.system x\n", "the tag 'tag:yaml.org,2002:python/name:os.system' is "
     "not supported in a manifest"),
    ("a: !custom x\n", "the tag '!custom' is not supported in a manifest"),
    ("? [k]\n: v\n", "a mapping key must be a string, not ['k']"),
    ("a: {<<: 1}\n", "expected a mapping or list of mappings for merging"),
])
def test_what_safe_load_would_build_but_a_pod_cannot_hold_is_refused(
        text: str, message: str) -> None:
    with pytest.raises(InvalidSyntax, match="invalid YAML at line 1") as caught:
        decode(text)
    assert str(caught.value).endswith(message)


def test_mapping_keys_are_strings_as_in_json() -> None:
    assert decode("8080: http\ntrue: x\n0x1F: y\nok: z\n", json_first=False) == [
        {"8080": "http", "true": "x", "31": "y", "ok": "z"}]
    for key in ("~", "1.5"):
        with pytest.raises(InvalidSyntax, match="invalid YAML at line 2, column 3: a mapping key"):
            decode(f"a:\n  {key}: x\n", json_first=False)
