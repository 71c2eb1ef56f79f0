"""Manifests to throw at the sources: a hypothesis strategy, and the known hostile shapes.

``manifests`` starts from a valid pod and spoils it as a string of bytes drawn by hypothesis
decides, one choice per byte (the way libFuzzer-style harnesses read their input): a field
replaced by a value of the wrong type, out of range, too long, or junk; fields removed or
added; several documents, a PodList, anchors and aliases; YAML or JSON; the text cut,
doubled or with bytes replaced. Drawing one byte string and building from it is some fifty
times faster than nesting hypothesis strategies field by field, which is what lets 10,000
manifests run in the suite; hypothesis still shrinks a failure to a short byte string, and
so to a small manifest. An exhausted byte string chooses the first option everywhere: the
valid pod, unspoilt.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any, TypeVar

import yaml
from hypothesis import strategies as st

T = TypeVar("T")

JUNK: list[Any] = [
    None, True, False, 0, -1, 1, 65535, 65536, 2**31, 2**63, 2**64, 2**80, -(2**63) - 1, 0.5,
    -0.0, float("inf"), float("-inf"), float("nan"), 1e308, "", " ", "-1", "1e1000000", "100m",
    "-5Mi", "0x1F", "yes", "no", "on", "~", "null", "1:20", "!!binary", "&a", "*a", "<<", "{",
    "[", "'", '"', "\\u0000", "\x00", "é" * 40, "x" * 300, "a=b", "UPPER", "-dash-", "a/b/c",
    "/x", "Web_1", "a" * 64, [], {}, [1, "a", None], {"a": {"b": {"c": [1, 2]}}}, [[[[]]]],
    {"": ""}, {"k": [None, True]}, [{"name": 1}], {"containers": []}, {"1": 2}, ["x"] * 20,
]
NAMES = ["web", "app", "a", "x1", "my-name", "db-0", "c", "data", "logs", "http", "z" * 63]
QUANTITIES = ["100m", "1", "0.5", "64Mi", "1Gi", "2", "-1", "-5Mi", "1e3", "1E-3", 3, 0.25]
RESOURCES = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "example.com/gpu"]
INTS = [0, 1, 5, 30, 80, 65535, -1, 2**31, 2**63, 2**80]
LABEL_KEYS = ["app", "tier", "example.com/team", "a/b/c", "/x", "bad key", "k" * 64]
LABEL_VALUES = ["web", "", "v1.2", "-bad", "x" * 64, "a b"]


def _template() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"a": "b"}},
        "spec": {
            "containers": [{
                "name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"],
                "ports": [{"name": "http", "containerPort": 80}],
                "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}},
                "env": [{"name": "A", "value": "b"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "livenessProbe": {"httpGet": {"port": 80}, "periodSeconds": 10},
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 30,
        },
    }


class Choices:
    """Decisions read from a byte string; past its end every decision is the first option."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        value = self.data[self.at] if self.at < len(self.data) else 0
        self.at += 1
        return value

    def left(self) -> bool:
        return self.at < len(self.data)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]

    def below(self, limit: int) -> int:
        return (self.byte() * 256 + self.byte()) % limit if limit else 0


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``node`` that holds a value: mapping keys and list indexes."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _places(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _places(value, (*path, index))
    return found


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path[:-1]:
        doc = doc[step]
    return doc


def _spoil(doc: dict[str, Any], choices: Choices) -> None:
    """One change somewhere: a new value (of any kind), a removal, or an added field."""
    places = _places(doc)
    path = places[choices.below(len(places))]
    parent, last = _parent(doc, path), path[-1]
    action = choices.pick(["junk", "remove", "add", "name", "quantity", "int", "label", "dup"])
    if action == "remove":
        del parent[last]
    elif action == "add" and isinstance(parent[last], dict):
        parent[last][choices.pick(["extra", "name", "spec", "x" * 70])] = choices.pick(JUNK)
    elif action == "dup" and isinstance(parent[last], list) and parent[last]:
        parent[last].append(copy.deepcopy(parent[last][0]))
    elif action == "label":
        doc["metadata"] = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        labels = doc["metadata"].setdefault(choices.pick(["labels", "annotations"]), {})
        if isinstance(labels, dict):
            labels[choices.pick(LABEL_KEYS)] = choices.pick(LABEL_VALUES)
    else:
        pool = {"junk": JUNK, "name": NAMES, "quantity": QUANTITIES, "int": INTS}.get(action, JUNK)
        parent[last] = choices.pick(pool)


def _render(documents: list[Any], choices: Choices) -> tuple[str, bytes]:
    if choices.pick([False, True]):
        return ".json", json.dumps(documents[0]).encode()
    text = "---\n".join(
        yaml.dump(d, Dumper=yaml.CSafeDumper, default_flow_style=None) for d in documents)
    if choices.pick([False, False, False, True]):  # an anchor, and aliases to it
        anchor = choices.pick(["[1, 2]", "{k: v}", "lol", "[[a, b], [c, d]]"])
        text = f"x-anchor: &a {anchor}\n" + text.replace(": ", ": *a\n#", choices.below(3))
    return ".yaml", text.encode()


def build_manifest(data: bytes) -> tuple[str, bytes]:
    """``(file suffix, content)`` of the manifest the choices in ``data`` make."""
    choices = Choices(data)
    documents: list[Any] = []
    for _ in range(1 + choices.below(3)):
        doc = _template()
        doc["metadata"]["name"] = choices.pick(NAMES[:6])
        for _ in range(choices.byte() % 4):
            _spoil(doc, choices)
        documents.append(doc)
    shape = choices.pick(["pods", "pods", "list", "junk"])
    if shape == "list":
        documents = [{"apiVersion": "v1", "kind": "PodList", "items": documents}]
    elif shape == "junk":
        documents.append(choices.pick(JUNK))
    suffix, raw = _render(documents, choices)
    while choices.left() and raw:  # cut, double, replace bytes
        at = choices.below(len(raw))
        action = choices.pick(["cut", "double", "byte", "none"])
        if action == "cut":
            raw = raw[:at]
        elif action == "double":
            raw = raw[:at] + raw[at:] + raw[at:]
        elif action == "byte":
            raw = raw[:at] + bytes([choices.byte()]) + raw[at + 1:]
    return suffix, raw[: 1 << 20]


manifests = st.binary(max_size=48).map(build_manifest)


# --- the known hostile shapes ---------------------------------------------------------------

POD_HEAD = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hostile\n"
CONTAINER = "spec:\n  containers:\n    - {name: app, image: busybox:1.36}\n"


def deep_json(levels: int) -> bytes:
    return ('{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep"},"spec":'
            + '{"a":' * levels + "1" + "}" * levels + "}").encode()


def alias_bomb(levels: int, where: str) -> bytes:
    """The "billion laughs", ``levels`` deep, in ``where``: annotations, args or unknown."""
    chain = ['[lol, lol, lol, lol, lol, lol, lol, lol, lol]']
    chain += ["[" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    if where == "args":
        items = "".join(f"        - &a{i} {value}\n" for i, value in enumerate(chain))
        return (POD_HEAD + "spec:\n  containers:\n    - name: app\n      image: busybox:1.36\n"
                "      args:\n" + items).encode()
    parent = "  annotations:\n" if where == "annotations" else "  x-unknown:\n"
    entries = "".join(f"    a{i}: &a{i} {value}\n" for i, value in enumerate(chain))
    return (POD_HEAD + parent + entries + CONTAINER).encode()


def empty_documents(count: int) -> bytes:
    return b"---\n" * count


def big_annotation(size: int) -> bytes:
    return (POD_HEAD + f"  annotations:\n    big: {'x' * size}\n" + CONTAINER).encode()


def many_containers(count: int) -> bytes:
    items = "".join(f"    - {{name: c{i}, image: busybox:1.36}}\n" for i in range(count))
    return (POD_HEAD + "spec:\n  containers:\n" + items).encode()


HOSTILE: dict[str, tuple[str, bytes]] = {
    **{f"deep-json-{n}": (".json", deep_json(n)) for n in (1000, 5000, 100_000)},
    **{f"alias-bomb-{n}-{where}": (".yaml", alias_bomb(n, where))
       for n in (9, 10, 11, 12) for where in ("annotations", "args", "unknown")},
    "empty-documents-20000": (".yaml", empty_documents(20_000)),
    "annotation-1MB": (".yaml", big_annotation(1_000_000)),
    "annotation-10MB": (".yaml", big_annotation(10_000_000)),
    "containers-20000": (".yaml", many_containers(20_000)),
}
