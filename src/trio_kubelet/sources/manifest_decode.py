"""Manifest text to documents (JSON or YAML), bounded in documents, size, nesting, values, time.

A manifest comes from whoever can write a file into the manifest directory or answer the
manifest URL, so decoding one must cost a bounded amount whatever it holds. While the text
is read, event by event (YAML) or token by token (JSON), its shape is checked against:

- documents: at most ``MAX_DOCUMENTS`` (``---`` separated, empty ones included);
- a document's size: at most ``MAX_DOCUMENT_CHARS`` characters (3 Mi, the API server's
  request limit: no bigger pod could be created there);
- nesting: at most ``MAX_DEPTH`` levels of mappings and lists (a Pod needs about a dozen);
- values: at most ``MAX_VALUES`` in the manifest, every mapping, list, key and scalar
  counted, and an alias counted as everything it repeats: an alias bomb ("billion laughs")
  is refused before a single copy is made, and the nesting an alias brings counts too; an
  alias inside the node it names (a recursive structure) is refused;
- time: reading gives up at ``deadline`` (``time.monotonic()``), if one is given.

YAML is composed in that same pass, iteratively (libyaml's own composer recurses in C and
overflows the stack some 20,000 levels down: a segfault), and the documents are then built
by PyYAML's safe constructor, as ``yaml.safe_load`` would (merge keys, tags). JSON is
decoded by ``json.loads`` only once its tokens have been checked, so it never recurses
deeper than ``MAX_DEPTH``. The pass yields to the interpreter between events, so a worker
thread running it never holds the GIL for long.

A refusal (``ManifestTooComplex``) names the field where the limit was crossed, e.g.
``spec.containers[4].args[0][0]...: nested deeper than 100 levels``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import yaml

from trio_kubelet.config import describe_yaml_error

MAX_MANIFEST_BYTES = 10 * 1024 * 1024  # Go's maxConfigLength, for a file and a URL's body alike
MAX_DOCUMENTS = 1000
MAX_DOCUMENT_CHARS = 3 * 1024 * 1024  # the API server's largest request body
MAX_DEPTH = 100
MAX_VALUES = 100_000
PARSE_BUDGET_SECONDS = 10.0
_DEADLINE_EVERY = 4096  # events or tokens between two looks at the clock
_TOO_BIG = f"more than {MAX_DOCUMENT_CHARS} characters in one document"
_PATH_STEPS = 12  # a refusal names at most this much of the path (a deep one is all alike)


class ManifestTooComplex(Exception):
    """A manifest beyond one of the limits; the message names the limit and where."""


class _ManifestLoader(yaml.CSafeLoader):  # libyaml (in PyYAML's wheels): ~8x the pure parser
    """Safe YAML without implicit timestamps: ``2024-01-01`` stays a string, as in a Pod."""


_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


# --- the shape of a manifest, event by event ------------------------------------------------


@dataclass
class _Frame:
    """One open mapping or list: where the scan is in it, and how deep it goes so far."""

    is_mapping: bool
    values_at_start: int
    anchor: str | None
    is_key: bool  # a mapping or list used as a mapping key (YAML's "? ")
    expect_key: bool = True  # mapping: the next node is a key
    key: str = ""  # mapping: the current key
    index: int = 0  # list: the current item
    deepest: int = 0  # levels below this one, so far

    def step(self) -> str:
        if self.is_mapping:
            return f".{self.key}" if self.key else ""
        return f"[{self.index}]"


@dataclass
class _Shape:
    """Counts documents, values and depth as the nodes of a manifest go by."""

    deadline: float | None
    documents: int = 0
    values: int = 0
    stack: list[_Frame] = field(default_factory=list)
    # Per anchor: the values it holds, and the levels it occupies (0 for a scalar).
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)
    seen: int = 0  # nodes, for the clock

    def refuse(self, reason: str) -> ManifestTooComplex:
        where = f"document {self.documents}" if self.documents > 1 else ""
        steps = [frame.step() for frame in self.stack[:_PATH_STEPS]]
        path = "".join(steps).lstrip(".") + ("..." if len(self.stack) > _PATH_STEPS else "")
        prefix = ", ".join(filter(None, (where, path)))
        return ManifestTooComplex(f"{prefix}: {reason}" if prefix else reason)

    def start_document(self) -> None:
        self.documents += 1
        if self.documents > MAX_DOCUMENTS:
            raise ManifestTooComplex(f"more than {MAX_DOCUMENTS} documents")
        self.anchors.clear()  # an alias never reaches into another document

    def expects_key(self) -> bool:
        return bool(self.stack) and self.stack[-1].is_mapping and self.stack[-1].expect_key

    def open(self, is_mapping: bool, anchor: str | None) -> None:
        self._count(1, 1)
        is_key = self._take_key("?")
        self.stack.append(_Frame(is_mapping, self.values, anchor, is_key))

    def close(self) -> None:
        frame = self.stack.pop()
        levels = frame.deepest + 1
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (self.values - frame.values_at_start + 1, levels)
        self._done(levels, frame.is_key)

    def scalar(self, value: str, anchor: str | None) -> None:
        self._count(1, 0)
        if anchor is not None:
            self.anchors[anchor] = (1, 0)
        key = value if len(value) <= 100 else value[:97] + "..."
        self._done(0, self._take_key(key))

    def alias(self, name: str) -> None:
        if any(frame.anchor == name for frame in self.stack):
            raise self.refuse(f"alias *{name} is inside the node it names (a recursive structure)")
        values, levels = self.anchors.get(name, (1, 0))
        self._count(values, levels)
        self._done(levels, self._take_key(f"*{name}"))

    def _take_key(self, key: str) -> bool:
        """Whether the node now starting is a mapping key (and then it is the current key)."""
        if not self.expects_key():
            return False
        frame = self.stack[-1]
        frame.key, frame.expect_key = key, False
        return True

    def _count(self, values: int, levels: int) -> None:
        self.values += values
        if self.values > MAX_VALUES:
            raise self.refuse(
                f"more than {MAX_VALUES} values in the manifest (an alias counts as all it repeats)"
            )
        if len(self.stack) + levels > MAX_DEPTH:
            raise self.refuse(f"nested deeper than {MAX_DEPTH} levels")
        self.seen += 1
        if (self.deadline is not None and self.seen % _DEADLINE_EVERY == 0
                and time.monotonic() > self.deadline):
            raise self.refuse(f"reading took longer than {PARSE_BUDGET_SECONDS:g} s")

    def _done(self, levels: int, was_key: bool) -> None:
        """A node has ended: it was a key (its value comes next) or an item of its parent."""
        if not self.stack:
            return
        frame = self.stack[-1]
        frame.deepest = max(frame.deepest, levels)
        if was_key:
            return
        if frame.is_mapping:
            frame.expect_key = True
        else:
            frame.index += 1


class _Chunks:
    """The manifest's bytes as a stream libyaml reads a chunk at a time, through Python.

    Given the bytes whole, libyaml scans a 10 MB scalar in one C call holding the GIL
    (130 ms measured): the event loop's thread could not run. Between two reads of this
    stream the interpreter can switch threads.
    """

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def read(self, size: int = -1, /) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        chunk = bytes(self._data[self._at:end])
        self._at += len(chunk)
        return chunk


def _load_yaml(source: bytes, deadline: float | None) -> list[Any]:
    """The documents, checked and built in one pass over libyaml's events. Raises
    yaml.YAMLError for bad syntax, or what PyYAML's safe loader would refuse."""
    loader = _ManifestLoader(_Chunks(source))
    try:
        return _build(loader, _Shape(deadline))
    finally:
        loader.dispose()


_NO_KEY = object()  # an open mapping waiting for its next key
_MERGE = object()  # the merge key ``<<``


@dataclass
class _Open:
    """A mapping or list being built: its items so far, and for a mapping the pending key
    and the mappings merged into it (``<<``), later ones overriding earlier ones."""

    value: dict[Any, Any] | list[Any]
    anchor: str | None
    mark: Any
    key: Any = _NO_KEY
    merged: list[dict[Any, Any]] = field(default_factory=list)

    def add(self, value: Any, mark: Any) -> None:
        if isinstance(self.value, list):
            self.value.append(value)
        elif self.key is _NO_KEY:
            self.key = _string_key(value, mark)
        elif self.key is _MERGE:
            self.merged.extend(_merge_sources(value, mark))
            self.key = _NO_KEY
        else:
            self.value[self.key] = value
            self.key = _NO_KEY

    def finish(self) -> dict[Any, Any] | list[Any]:
        if not self.merged:
            return self.value
        result: dict[Any, Any] = {}
        for source in self.merged:
            result.update(source)
        result.update(self.value)
        return result


def _build(loader: _ManifestLoader, shape: _Shape) -> list[Any]:
    """Every document, built without recursion and without PyYAML's node tree (a node,
    with its marks, costs several times the value it becomes)."""
    documents: list[Any] = []
    anchored: dict[str, Any] = {}
    building: list[_Open] = []
    root: Any = None
    start = 0
    events: Iterator[Any] = iter(loader.get_event, None)
    for event in events:
        kind = type(event)  # libyaml's events are exactly these classes: no isinstance chain
        if kind is yaml.DocumentStartEvent:
            shape.start_document()
            anchored.clear()
            start = _index(event.start_mark)
            continue
        if kind is yaml.DocumentEndEvent:
            documents.append(root)
            root = None
            continue
        if _index(event.end_mark) - start > MAX_DOCUMENT_CHARS:
            raise shape.refuse(_TOO_BIG)
        if kind is yaml.ScalarEvent:
            shape.scalar(event.value, event.anchor)
            value, anchor, mark = _scalar(loader, event), event.anchor, event.start_mark
        elif kind is yaml.AliasEvent:
            shape.alias(event.anchor)  # first: an alias inside its own anchor is refused there
            if event.anchor not in anchored:
                raise yaml.composer.ComposerError(
                    None, None, f"found undefined alias {event.anchor!r}", event.start_mark)
            value, anchor, mark = anchored[event.anchor], None, event.start_mark
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            is_mapping = kind is yaml.MappingStartEvent
            shape.open(is_mapping, event.anchor)
            _check_collection_tag(event, is_mapping)
            building.append(_Open({} if is_mapping else [], event.anchor, event.start_mark))
            continue
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            shape.close()
            done = building.pop()
            value, anchor, mark = done.finish(), done.anchor, done.mark
        else:  # stream start and end
            continue
        if anchor is not None:
            anchored[anchor] = value
        if building:
            building[-1].add(value, mark)
        else:
            root = value
    return documents


_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG}{name}" for name in ("null", "bool", "int", "float", "str", "binary",
                                              "timestamp")}


def _scalar(loader: _ManifestLoader, event: Any) -> Any:
    """A scalar's value, as PyYAML's safe loader makes it (the merge key ``<<`` as _MERGE)."""
    tag = event.tag
    if tag is None or tag == "!":
        tag = cast(Any, loader).resolve(yaml.ScalarNode, event.value, event.implicit)
    if tag == f"{_TAG}merge":
        return _MERGE
    if tag == f"{_TAG}value":
        return event.value
    if tag not in _SCALAR_TAGS:
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {tag!r} is not supported in a manifest", event.start_mark)
    node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
    return loader.yaml_constructors[tag](loader, node)


def _check_collection_tag(event: Any, is_mapping: bool) -> None:
    expected = f"{_TAG}{'map' if is_mapping else 'seq'}"
    if event.tag not in (None, "!", expected):
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {event.tag!r} is not supported in a manifest",
            event.start_mark)


def _string_key(key: Any, mark: Any) -> Any:
    """A mapping key as JSON has it, a string: an integer or boolean key becomes its text,
    as the API server's YAML decoder makes it (``8080: http`` → ``"8080"``); any other key
    that is not a string (null, a float, a list) is refused."""
    if isinstance(key, str) or key is _MERGE:
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise yaml.constructor.ConstructorError(
        None, None, f"a mapping key must be a string, not {key!r}", mark)


def _merge_sources(value: Any, mark: Any) -> list[dict[Any, Any]]:
    """What ``<<`` merges, later entries overriding earlier ones (in ``<<: [*a, *b]`` the
    first wins, as in PyYAML)."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return list(reversed(value))
    raise yaml.constructor.ConstructorError(
        None, None, "expected a mapping or list of mappings for merging", mark)


def _index(mark: Any) -> int:
    """A mark's character offset (libyaml always gives the marks)."""
    return int(mark.index) if mark is not None else 0


# Strings, brackets, and runs of anything else that is not a separator (numbers, literals,
# and what a YAML flow mapping holds unquoted). "," and ":" are skipped.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|[^\s\[\]{},:"]+')


def _check_json(source: bytes, deadline: float | None) -> None:
    """Raises ManifestTooComplex before ``json.loads`` could recurse or build too much."""
    shape = _Shape(deadline)
    shape.start_document()
    for match in _JSON_TOKEN.finditer(source):
        if match.end() > MAX_DOCUMENT_CHARS:
            raise shape.refuse(_TOO_BIG)
        token = match.group()
        if token in (b"{", b"["):
            shape.open(token == b"{", None)
        elif token in (b"}", b"]"):
            if not shape.stack:
                return  # unbalanced: json.loads says where
            shape.close()
        elif token.startswith(b'"') and shape.expects_key():
            shape.scalar(_json_string(token), None)
        else:
            shape.scalar("", None)


def _json_string(token: bytes) -> str:
    try:
        return str(json.loads(token))
    except ValueError:
        return token.decode(errors="replace")


_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


class InvalidSyntax(Exception):
    """Text that is neither valid JSON nor valid YAML; the message says where."""


def decode_documents(source: bytes, *, json_first: bool,
                     deadline: float | None = None) -> list[Any]:
    """The documents of a manifest, UTF-8 text: JSON (one object) or YAML (any number, ``---``).

    ``json_first``: try JSON before YAML (a ``.json`` file, or text starting with "{"; a
    YAML flow mapping starts with "{" too, so YAML is tried next). The bytes are handed to
    the parsers as they are: a str copy (or two, libyaml encodes a str back to UTF-8) of a
    10 MiB manifest would cost more memory than the manifest. Raises ManifestTooComplex
    beyond a limit, InvalidSyntax for text that does not parse.
    """
    json_error: json.JSONDecodeError | None = None
    if json_first:
        _check_json(source, deadline)
        try:
            return [json.loads(source)]
        except json.JSONDecodeError as exc:
            json_error = exc
    try:
        return _load_yaml(source, deadline)
    except yaml.YAMLError as exc:
        if _LIBYAML_TOO_DEEP in str(getattr(exc, "problem", "")):
            # Newer libyaml (PyYAML 6.0.4's wheels) stops at 1,000 levels while scanning,
            # ahead of the events the depth check above counts: the same refusal.
            mark = getattr(exc, "problem_mark", None)
            where = f"at line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise ManifestTooComplex(f"{where}nested deeper than {MAX_DEPTH} levels") from None
        if json_error is not None:
            raise InvalidSyntax(
                f"invalid JSON at line {json_error.lineno}, column {json_error.colno}: "
                f"{json_error.msg}"
            ) from None
        raise InvalidSyntax(describe_yaml_error(exc)) from None
