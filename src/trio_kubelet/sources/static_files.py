"""The static pod source: pod manifests from a file or a directory (``staticPodPath``).

What a manifest directory means follows the Go kubelet (``pkg/kubelet/config/file.go``
and ``common.go``):

- files are read in name order; names starting with "." are ignored (editor swap
  files, ``..data`` links of projected volumes); subdirectories are not entered;
- every pod gets the static-pod defaults: namespace "default" when empty, the name
  suffixed with "-<node name>", ``spec.nodeName`` set to the node, the annotations
  ``kubernetes.io/config.source: file`` and ``kubernetes.io/config.hash``, and a
  toleration of every NoExecute taint so node problems never evict it;
- a missing path is not an error: the source reports an empty pod set (so the
  agent knows the source has been read) and waits for the path to appear.

Deliberate differences from the Go kubelet:

- **UID.** Go hashes the pod's *content* (plus host and file) into the UID, so every
  edit makes a new pod: the old one is killed and the new one started. Here the
  UID hashes only the identity — host, absolute file path, namespace and the name
  written in the manifest — so an edited manifest keeps its UID and the agent
  applies the edit in place, restarting only the containers whose spec changed.
  The content hash goes into ``kubernetes.io/config.hash`` instead. A
  ``metadata.uid`` written in the manifest is used as is.
- **Last good version.** A file that stops parsing (a half-saved edit, a typo) keeps
  contributing the pods of its last good version while its problem is reported,
  so a bad save never kills a running pod. A deleted file stops contributing.
  A file is taken as a whole: if any document in it is bad, none of its new
  documents apply (like a PodList, which Go also applies all or nothing).
- **Several documents.** A file may hold several YAML documents (``---``), each a
  v1 Pod or a v1 PodList; Go reads exactly one Pod per file.
- **Conflicts.** Two files defining the same namespace/name (or UID): the file that
  already runs the pod keeps it, otherwise the first in name order wins, and the
  other definition is reported naming both files.

Whoever can write a file into the manifest directory must not be able to stop, hang or
slow the agent: a file is read up to ``MAX_MANIFEST_BYTES``, decoded within the limits of
``manifest_decode`` (documents, size, nesting, values, aliases, time), and each pod is
validated as the API server would (``model/validation.py``). Every refusal is a problem
of that file, logged once; the file keeps its last good pods. Files bigger than
``INLINE_PARSE_BYTES`` are parsed in a worker thread (see ``run_static_files``).

The rules for one manifest (``parse_manifest``, ``static_pod``, ``static_pod_uid``) and
the bookkeeping of what a static source sent (``StaticPodReporter``) are shared with
the manifest URL source (``sources/manifest_url.py``), whose pods are static pods too.
"""

from __future__ import annotations

import codecs
import copy
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from trio_kubelet.config import describe_validation_error
from trio_kubelet.core.phase import CONFIG_SOURCE_ANNOTATION
from trio_kubelet.events import Event, ManifestProblem, PodSetUpdate
from trio_kubelet.inotify import Inotify
from trio_kubelet.model.pod import Pod
from trio_kubelet.model.validation import (
    FieldError,
    describe_field_errors,
    dns1123_label_errors,
    dns1123_subdomain_errors,
    validate_pod,
)
from trio_kubelet.sources.manifest_decode import (
    MAX_MANIFEST_BYTES,
    PARSE_BUDGET_SECONDS,
    InvalidSyntax,
    ManifestTooComplex,
    decode_documents,
)

logger = logging.getLogger(__name__)

SOURCE = "file"
CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"
CONFIG_SEEN_ANNOTATION = "kubernetes.io/config.seen"
NO_EXECUTE_TOLERATION: Mapping[str, str] = {"operator": "Exists", "effect": "NoExecute"}

# What wakes the source at once (Go's file source watches the same changes with inotify).
WATCH_MASK = (
    Inotify.CREATE | Inotify.DELETE | Inotify.MODIFY | Inotify.CLOSE_WRITE | Inotify.ATTRIB
    | Inotify.MOVED_FROM | Inotify.MOVED_TO | Inotify.DELETE_SELF | Inotify.MOVE_SELF
)
# After the first change, how long the source waits for the rest of a burst (a tool writing
# or removing many manifests at once) so that the burst makes one update, not one per file.
SETTLE_SECONDS = 0.02

# A manifest up to this size is read and parsed in the trio thread (a few milliseconds at
# most); a bigger one in a worker thread. See ``run_static_files`` for why not always there.
INLINE_PARSE_BYTES = 8 * 1024


class _Rejected(Exception):
    """A document, or part of one, that cannot become a pod; the message names the field."""


# --- one manifest ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedManifest:
    """What one manifest (a file, or a URL's response body) yields: its pods, or its problems."""

    pods: tuple[Pod, ...] = ()
    problems: tuple[ManifestProblem, ...] = ()


def static_pod_uid(
    node_name: str, location: str, namespace: str, name: str, source: str = SOURCE
) -> str:
    """The UID of a static pod without ``metadata.uid``: stable across edits of its manifest.

    ``location`` is the file path or the URL; ``source`` keeps a file and a URL apart.
    """
    digest = hashlib.sha256()
    for part in (f"host:{node_name}", f"{source}:{location}", namespace, name):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def content_hash(document: Mapping[str, Any]) -> str:
    """The hash of a manifest document as written, for ``kubernetes.io/config.hash``."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _quote(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _shape(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {_quote(value)}"


def _with_no_execute_toleration(tolerations: Any) -> list[Any]:
    if tolerations is None:
        tolerations = []
    if not isinstance(tolerations, list):
        raise _Rejected(f"spec.tolerations: expected a list, got {_shape(tolerations)}")
    for toleration in tolerations:
        if (
            isinstance(toleration, dict)
            and not toleration.get("key")
            and not toleration.get("value")
            and toleration.get("operator") == "Exists"
            and toleration.get("effect") == "NoExecute"
        ):
            return tolerations
    return [*tolerations, dict(NO_EXECUTE_TOLERATION)]


def _check_name(field: str, value: str, errors: Callable[[str], list[str]]) -> None:
    """The name as the API server checks it (before the node name is appended)."""
    found = [FieldError(field, "Invalid value", value, message) for message in errors(value)]
    if found:
        raise _Rejected(describe_field_errors(found))


def static_pod(
    document: Mapping[str, Any], location: str, node_name: str, *, source: str = SOURCE
) -> Pod:
    """A v1 Pod document with the static-pod defaults applied and validated.

    ``location`` (file path or URL) and ``source`` ("file" or "http") go into the UID
    and the ``kubernetes.io/config.source`` annotation.
    """
    meta = document.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise _Rejected(f"metadata: expected a mapping, got {_shape(meta)}")
    name = meta.get("name")
    if name is None or name == "":
        raise _Rejected("metadata.name: required value")
    if not isinstance(name, str):
        raise _Rejected(f"metadata.name: expected a string, got {_shape(name)}")
    _check_name("metadata.name", name, dns1123_subdomain_errors)
    full_name = f"{name}-{node_name}"
    if len(full_name) > 253:
        raise _Rejected(
            f"metadata.name: {_quote(full_name)} (with the node name) is longer than 253 characters"
        )
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise _Rejected(f"metadata.namespace: expected a string, got {_shape(namespace)}")
    _check_name("metadata.namespace", namespace, dns1123_label_errors)
    uid = meta.get("uid") or static_pod_uid(node_name, location, namespace, name, source)
    if not isinstance(uid, str):
        raise _Rejected(f"metadata.uid: expected a string, got {_shape(uid)}")
    annotations = meta.get("annotations")
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict):
        raise _Rejected(f"metadata.annotations: expected a mapping, got {_shape(annotations)}")

    pod: dict[str, Any] = copy.deepcopy(dict(document))
    pod["metadata"] = {
        **copy.deepcopy(meta),
        "name": full_name,
        "namespace": namespace,
        "uid": uid,
        "annotations": {
            **annotations,
            CONFIG_SOURCE_ANNOTATION: source,
            CONFIG_HASH_ANNOTATION: content_hash(document),
        },
    }
    spec = pod.get("spec")
    if spec is not None:
        if not isinstance(spec, dict):
            raise _Rejected(f"spec: expected a mapping, got {_shape(spec)}")
        spec["nodeName"] = node_name
        spec["tolerations"] = _with_no_execute_toleration(spec.get("tolerations"))
    pod["status"] = {}  # a manifest cannot claim a status; the pod starts Pending
    try:
        valid = Pod.model_validate(pod)
    except ValidationError as exc:
        raise _Rejected(describe_validation_error(exc)) from None
    errors = validate_pod(valid)  # as the API server would (Go's file source does the same)
    if errors:
        raise _Rejected(describe_field_errors(errors))
    return valid


def _check_type(document: Mapping[str, Any], kinds: Sequence[str], where: str = "") -> str:
    """The document's kind, after checking kind and apiVersion; ``where`` locates a list item."""
    expected = " or ".join(kinds)
    field = f"{where}." if where else ""
    prefix = f"{where}: " if where else ""
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if kind is None:
        raise _Rejected(f"{field}kind: required value (expected {expected})")
    if kind not in kinds:
        raise _Rejected(f"{prefix}unsupported kind {_quote(kind)} (expected {expected})")
    if api_version is None:
        raise _Rejected(f"{field}apiVersion: required value (expected v1)")
    if api_version != "v1":
        raise _Rejected(
            f"{prefix}unsupported apiVersion {_quote(api_version)} for kind {kind} (expected v1)"
        )
    return str(kind)


def _pods_in_document(
    document: Any, location: str, node_name: str, source: str
) -> list[tuple[str, Pod]]:
    """``(place within the document, pod)`` for a Pod or each item of a PodList."""
    if not isinstance(document, dict):
        raise _Rejected(f"expected a mapping (a Pod or PodList), got {_shape(document)}")
    if _check_type(document, ("Pod", "PodList")) == "Pod":
        return [("", static_pod(document, location, node_name, source=source))]
    items = document.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise _Rejected(f"items: expected a list, got {_shape(items)}")
    pods = []
    for index, item in enumerate(items):
        where = f"items[{index}]"
        if not isinstance(item, dict):
            raise _Rejected(f"{where}: expected a mapping (a Pod), got {_shape(item)}")
        item = {"apiVersion": "v1", "kind": "Pod", **item}
        _check_type(item, ("Pod",), where)
        try:
            pods.append((where, static_pod(item, location, node_name, source=source)))
        except _Rejected as exc:
            raise _Rejected(f"{where}.{exc}") from None
    return pods


def _documents(text: bytes, suffix: str, deadline: float) -> list[Any]:
    """The documents of a manifest (UTF-8): JSON (one object) or YAML (any number, ``---``)."""
    json_first = suffix == ".json" or text.lstrip().startswith(b"{")
    try:
        return decode_documents(text, json_first=json_first, deadline=deadline)
    except (InvalidSyntax, ManifestTooComplex) as exc:
        raise _Rejected(str(exc)) from None
    except (ValueError, TypeError) as exc:  # e.g. an integer of more than 4300 digits
        raise _Rejected(f"cannot decode: {exc}") from None


def _rejected(location: str, reason: str) -> ParsedManifest:
    return ParsedManifest(problems=(ManifestProblem(file=location, reason=reason),))


def read_manifest_file(file: Path, node_name: str) -> ParsedManifest:
    """The static pods of one manifest file, or every problem found in it.

    At most ``MAX_MANIFEST_BYTES`` are read; the file is opened without blocking, so a
    FIFO swapped in since it was listed cannot hang the reader.
    """
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return _rejected(str(file), f"cannot read file: {exc.strerror or exc}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _rejected(str(file), "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        return _rejected(str(file), f"cannot read file: {exc.strerror or exc}")
    finally:
        os.close(fd)
    return parse_manifest(raw, str(file), node_name, suffix=file.suffix)


def parse_manifest(
    raw: bytes,
    location: str,
    node_name: str,
    *,
    source: str = SOURCE,
    suffix: str = "",
    container: str = "file",
) -> ParsedManifest:
    """The static pods in one manifest's bytes, or every problem found in them.

    ``location`` (file path or URL) names the problems and goes into the UIDs with
    ``source``; ``suffix`` (".json") says to try JSON first; ``container`` is what the
    bytes came in, for the message about an empty one. Whatever the bytes hold, this
    returns (a bug it trips over becomes a problem of this manifest, logged once with
    its traceback), within about ``PARSE_BUDGET_SECONDS``.
    """
    try:
        return _parse_manifest(raw, location, node_name, source, suffix, container)
    except Exception as exc:  # contained here: one manifest must never stop the source
        logger.exception("reading static pod manifest %s failed", location)
        return _rejected(location, f"cannot be read: {type(exc).__name__}: {exc}")


def _parse_manifest(
    raw: bytes, location: str, node_name: str, source: str, suffix: str, container: str
) -> ParsedManifest:
    deadline = time.monotonic() + PARSE_BUDGET_SECONDS
    if len(raw) > MAX_MANIFEST_BYTES:
        return _rejected(location, f"{container} is larger than {MAX_MANIFEST_BYTES} bytes")
    text = raw.removeprefix(codecs.BOM_UTF8)
    try:
        text.decode()  # only checked: the parsers read the bytes
    except UnicodeDecodeError as exc:
        offset = exc.start + len(raw) - len(text)
        return _rejected(location, f"not UTF-8 text (invalid byte at offset {offset})")
    try:
        documents = _documents(text, suffix, deadline)
    except _Rejected as exc:
        return _rejected(location, str(exc))
    if all(document is None for document in documents):
        return _rejected(location, f"no pod manifest in {container} (it is empty)")

    several = len(documents) > 1
    found: list[tuple[str, Pod]] = []
    problems: list[ManifestProblem] = []
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        prefix = f"document {number}" if several else ""
        if time.monotonic() > deadline:
            reason = f"reading took longer than {PARSE_BUDGET_SECONDS:g} s"
            return _rejected(location, f"{prefix}: {reason}" if prefix else reason)
        try:
            pods = _pods_in_document(document, location, node_name, source)
        except _Rejected as exc:
            reason = f"{prefix}: {exc}" if prefix else str(exc)
            problems.append(ManifestProblem(file=location, reason=reason))
            continue
        found.extend((", ".join(filter(None, (prefix, where))), pod) for where, pod in pods)
    problems.extend(_duplicates_within(location, found))
    if problems:
        return ParsedManifest(problems=tuple(problems))
    return ParsedManifest(pods=tuple(pod for _, pod in found))


def _pod_key(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _duplicates_within(location: str, found: Sequence[tuple[str, Pod]]) -> list[ManifestProblem]:
    first_at: dict[str, str] = {}
    problems = []
    for where, pod in found:
        key = _pod_key(pod)
        if key in first_at:
            reason = f"{where}: duplicate pod {_quote(key)} (also defined by {first_at[key]})"
            problems.append(ManifestProblem(file=location, reason=reason))
        else:
            first_at[key] = where
    return problems


# --- the whole path -------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestScan:
    """The static pods of a manifest path at one moment, and everything wrong with it.

    ``good`` (per file, the pods of its newest good version) and ``owners`` (which file
    runs each namespace/name) carry what the next scan needs to keep last good
    versions and settle name conflicts the same way.
    """

    pods: tuple[Pod, ...] = ()
    problems: tuple[ManifestProblem, ...] = ()
    good: Mapping[str, tuple[Pod, ...]] = field(default_factory=dict)
    owners: Mapping[str, str] = field(default_factory=dict)
    stale: frozenset[str] = frozenset()  # files running their last good version
    path_exists: bool = True
    # Per file: (inode, mtime, size) when read, and what reading it gave; an unchanged
    # file is not read or parsed again.
    read: Mapping[str, tuple[tuple[int, int, int], ParsedManifest]] = field(default_factory=dict)


def _manifest_files(path: Path) -> tuple[list[Path] | None, list[ManifestProblem], bool]:
    """(files to read, or None when the listing failed; problems; whether the path exists)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return [], [], False
    except OSError as exc:
        return None, [ManifestProblem(file=str(path), reason=f"cannot stat: {exc.strerror}")], True
    if stat.S_ISREG(mode):
        return [path], [], True
    if not stat.S_ISDIR(mode):
        reason = "not a directory or a regular file"
        return [], [ManifestProblem(file=str(path), reason=reason)], True
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        reason = f"cannot list directory: {exc.strerror}"
        return None, [ManifestProblem(file=str(path), reason=reason)], True
    files = []
    for name in names:
        if name.startswith("."):
            continue
        entry = path / name
        try:
            mode = entry.stat().st_mode
        except OSError:
            files.append(entry)  # a dangling link: reading it reports why
            continue
        if stat.S_ISDIR(mode):
            logger.debug("not recursing into manifest subdirectory %s", entry)
        elif stat.S_ISREG(mode):
            files.append(entry)
        else:
            logger.debug("ignoring %s: not a regular file", entry)
    return files, [], True


def _settle_conflicts(
    good: Mapping[str, tuple[Pod, ...]], previous_owners: Mapping[str, str]
) -> tuple[tuple[Pod, ...], dict[str, str], list[ManifestProblem]]:
    """Keep one definition per namespace/name and per UID; report the others."""
    entries = [(file, pod) for file, pods in good.items() for pod in pods]

    def precedence(index: int) -> tuple[bool, int]:
        file, pod = entries[index]
        return previous_owners.get(_pod_key(pod)) != file, index

    owners: dict[str, str] = {}
    uid_owners: dict[str, tuple[str, str]] = {}
    accepted: list[int] = []
    rejected: list[tuple[int, ManifestProblem]] = []
    for index in sorted(range(len(entries)), key=precedence):
        file, pod = entries[index]
        key, uid = _pod_key(pod), pod.metadata.uid
        if key in owners:
            reason = f"pod {_quote(key)} is already defined in {owners[key]}; ignoring this one"
        elif uid in uid_owners:
            other_key, other_file = uid_owners[uid]
            reason = (
                f"pod {_quote(key)}: metadata.uid {_quote(uid)} is already used by pod "
                f"{_quote(other_key)} in {other_file}; ignoring this one"
            )
        else:
            owners[key], uid_owners[uid] = file, (key, file)
            accepted.append(index)
            continue
        rejected.append((index, ManifestProblem(file=file, reason=reason)))
    pods = tuple(entries[index][1] for index in sorted(accepted))
    return pods, owners, [problem for _, problem in sorted(rejected, key=lambda r: r[0])]


StatKey = tuple[int, int, int]  # inode, mtime, size: a file with the same key is not read again


@dataclass(frozen=True)
class _Listing:
    """One look at a manifest path: which files there are, and which of them to read.

    ``cached`` holds, for files unchanged since the previous scan, what reading them gave
    then; ``to_read`` the others, with their stat key (None when even stat failed).
    """

    files: tuple[Path, ...] | None  # None: the listing failed, nothing is known
    problems: tuple[ManifestProblem, ...]
    exists: bool
    cached: Mapping[str, tuple[StatKey, ParsedManifest]]
    to_read: tuple[tuple[Path, StatKey | None], ...]


def _list_manifests(path: Path, previous: ManifestScan) -> _Listing:
    files, problems, exists = _manifest_files(path)
    cached: dict[str, tuple[StatKey, ParsedManifest]] = {}
    to_read: list[tuple[Path, StatKey | None]] = []
    for file in files or ():
        try:
            st = file.stat()
        except OSError:
            to_read.append((file, None))  # reading it reports the problem precisely
            continue
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        before = previous.read.get(str(file))
        if before is not None and before[0] == key:
            cached[str(file)] = before
        else:
            to_read.append((file, key))
    return _Listing(
        None if files is None else tuple(files), tuple(problems), exists, cached, tuple(to_read)
    )


def _assemble(
    listing: _Listing, results: Mapping[str, ParsedManifest], previous: ManifestScan
) -> ManifestScan:
    """The scan from a listing and what reading its changed files gave (``results``)."""
    problems = list(listing.problems)
    if listing.files is None:  # the listing failed: keep everything as it was
        return ManifestScan(
            pods=previous.pods,
            problems=tuple(problems),
            good=previous.good,
            owners=previous.owners,
            stale=frozenset(previous.good),
        )
    keys = {str(file): key for file, key in listing.to_read}
    good: dict[str, tuple[Pod, ...]] = {}
    stale: set[str] = set()
    read: dict[str, tuple[StatKey, ParsedManifest]] = dict(listing.cached)
    for file in map(str, listing.files):
        result = listing.cached[file][1] if file in listing.cached else results[file]
        key = keys.get(file)
        if key is not None:
            read[file] = (key, result)
        problems.extend(result.problems)
        if not result.problems:
            good[file] = result.pods
        elif file in previous.good:
            good[file] = previous.good[file]
            stale.add(file)
    pods, owners, conflicts = _settle_conflicts(good, previous.owners)
    return ManifestScan(
        pods=pods,
        problems=(*problems, *conflicts),
        good=good,
        owners=owners,
        stale=frozenset(stale),
        path_exists=listing.exists,
        read=read,
    )


def load_manifests(
    path: Path, node_name: str, *, previous: ManifestScan | None = None
) -> ManifestScan:
    """Read every static pod manifest under ``path`` (a directory or one file).

    Pass the previous scan to keep the last good pods of files that have become
    malformed, to keep each pod with the file that already runs it, and to skip
    reading files that have not changed. Everything is read in the calling thread.
    """
    previous = previous or ManifestScan()
    listing = _list_manifests(path.absolute(), previous)
    node = node_name.lower()
    results = {str(file): read_manifest_file(file, node) for file, _ in listing.to_read}
    return _assemble(listing, results, previous)


# --- the source task ------------------------------------------------------------------------


def _fingerprint(path: Path) -> object:
    """A cheap summary of the path that changes when a manifest may have changed (no reads)."""

    def summary(st: os.stat_result) -> tuple[int, ...]:
        return (st.st_mode, st.st_ino, st.st_mtime_ns, st.st_size)

    try:
        top = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return summary(top)
    entries: list[tuple[object, ...]] = []
    try:
        with os.scandir(path) as listing:
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                try:
                    entries.append((entry.name, *summary(entry.stat())))
                except OSError:
                    entries.append((entry.name,))
    except OSError:
        return (summary(top), None)
    return (summary(top), tuple(sorted(entries, key=lambda e: str(e[0]))))


def _rfc3339(epoch_seconds: float) -> str:
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


class StaticPodReporter:
    """What a static pod source sent last, so that it sends and logs only what changed.

    It stamps ``kubernetes.io/config.seen`` (when this agent first saw each pod UID),
    logs each problem once when it appears and once when it is resolved, and drops
    an update equal to the previous one. ``subject`` names a problem's location in
    the log ("static pod manifest", "static pod URL").
    """

    def __init__(
        self, source: str, subject: str, log: Log, wall_clock: Callable[[], float]
    ) -> None:
        self.source = source
        self.subject = subject
        self.log = log
        self.wall_clock = wall_clock
        self.first_seen: dict[str, str] = {}
        self.logged: set[ManifestProblem] = set()
        # The pods as sent (the sync loop holds the same objects: no copy is kept here).
        self.last_sent: tuple[list[Pod], tuple[ManifestProblem, ...]] | None = None

    def update(
        self,
        pods: Sequence[Pod],
        problems: Sequence[ManifestProblem],
        stale: Collection[str] = (),
    ) -> PodSetUpdate | None:
        """The update to send for the source's current pods and problems, or None if unchanged.

        ``stale`` holds the locations whose last good pods are kept despite a problem.
        """
        self._log_problems(problems, stale)
        stamped = self._stamp_first_seen(pods)
        sent = (stamped, tuple(problems))
        if sent == self.last_sent:
            return None
        self.last_sent = sent
        return PodSetUpdate(source=self.source, pods=stamped, problems=list(problems))

    def _log_problems(self, problems: Sequence[ManifestProblem], stale: Collection[str]) -> None:
        current = set(problems)
        for problem in problems:
            if problem not in self.logged:
                kept = " (keeping its last good pods)" if problem.file in stale else ""
                self.log.warning("%s %s: %s%s", self.subject, problem.file, problem.reason, kept)
        for problem in self.logged - current:
            self.log.info("%s %s: resolved: %s", self.subject, problem.file, problem.reason)
        self.logged = current

    def _stamp_first_seen(self, pods: Sequence[Pod]) -> list[Pod]:
        stamped = []
        now: str | None = None
        for pod in pods:
            seen = self.first_seen.get(pod.metadata.uid)
            if seen is None:
                now = now or _rfc3339(self.wall_clock())
                seen = self.first_seen[pod.metadata.uid] = now
            annotations = {**pod.metadata.annotations, CONFIG_SEEN_ANNOTATION: seen}
            metadata = pod.metadata.model_copy(update={"annotations": annotations})
            stamped.append(pod.model_copy(update={"metadata": metadata}))
        live = {pod.metadata.uid for pod in pods}
        self.first_seen = {uid: seen for uid, seen in self.first_seen.items() if uid in live}
        return stamped


class _StaticPodFiles:
    """The state between scans: last good versions and whether the path was missing."""

    def __init__(
        self, path: Path, node_name: str, log: Log, wall_clock: Callable[[], float]
    ) -> None:
        self.path = path.absolute()
        self.node_name = node_name
        self.log = log
        self.scan = ManifestScan()
        self.missing_reported = False
        self.reporter = StaticPodReporter(SOURCE, "static pod manifest", log, wall_clock)
        self.parser = trio.CapacityLimiter(1)  # one worker thread at a time for big files

    async def rescan(self) -> PodSetUpdate | None:
        """Scan the path; the update to send, or None when nothing changed since the last one."""
        listing = _list_manifests(self.path, self.scan)
        results = {str(file): await self._read(file, key) for file, key in listing.to_read}
        self.scan = _assemble(listing, results, self.scan)
        if not self.scan.path_exists and not self.missing_reported:
            self.log.info("static pod path %s does not exist yet; waiting for it", self.path)
        elif self.scan.path_exists and self.missing_reported:
            self.log.info("static pod path %s appeared", self.path)
        self.missing_reported = not self.scan.path_exists
        return self.reporter.update(self.scan.pods, self.scan.problems, self.scan.stale)

    async def _read(self, file: Path, key: StatKey | None) -> ParsedManifest:
        if key is not None and key[2] > INLINE_PARSE_BYTES:
            return await parse_off_loop(
                partial(read_manifest_file, file, self.node_name), self.parser
            )
        result = read_manifest_file(file, self.node_name)
        await trio.lowlevel.checkpoint()  # many small files: let others in between
        return result


async def parse_off_loop(
    read: Callable[[], ParsedManifest], limiter: trio.CapacityLimiter
) -> ParsedManifest:
    """``read()`` in a worker thread; cancelling the wait abandons the thread, which ends
    on its own within the parse budget."""
    return await trio.to_thread.run_sync(read, abandon_on_cancel=True, limiter=limiter)


class _DirectoryWatch:
    """inotify on the manifest directory, or on the directory that holds the path when it
    is a file or does not exist (so that its coming is seen at once too).

    Without inotify (no instance left: the per-user limit is 128) `wait` just waits out
    its timeout: the source then polls as before.
    """

    def __init__(self, path: Path, log: Log) -> None:
        self._path = path
        self._inotify: Inotify | None = None
        try:
            self._inotify = Inotify()
        except OSError as err:
            log.info("cannot watch %s with inotify (%s): polling it every second", path, err)
        self._wd: int | None = None
        self._watched: tuple[int, int] | None = None  # (device, inode) of the watched directory

    def refresh(self) -> None:
        """Watch the directory the path is now (after a scan: it may have appeared or been
        replaced); a directory already watched keeps its watch."""
        if self._inotify is None:
            return
        directory = self._path if self._path.is_dir() else self._path.parent
        try:
            st = os.stat(directory)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == self._watched:
            return
        if self._wd is not None:
            self._inotify.rm_watch(self._wd)
            self._wd = self._watched = None
        try:
            self._wd = self._inotify.add_watch(os.fsencode(directory), WATCH_MASK)
        except OSError:
            return
        self._watched = (st.st_dev, st.st_ino)

    async def wait(self, timeout: float) -> None:
        """Until something changes in the watched directory (and its burst settles), or
        ``timeout`` seconds."""
        with trio.move_on_after(timeout):
            if self._inotify is None or self._wd is None:
                await trio.sleep_forever()
            await trio.lowlevel.wait_readable(self._inotify.fd)
            self._drain()
            await trio.sleep(SETTLE_SECONDS)
            self._drain()

    def _drain(self) -> None:
        assert self._inotify is not None
        for wd, mask in self._inotify.read():
            if wd == self._wd and mask & Inotify.IGNORED:  # the directory went
                self._wd = self._watched = None

    def close(self) -> None:
        if self._inotify is not None:
            trio.lowlevel.notify_closing(self._inotify.fd)
            self._inotify.close()
            self._inotify = None


async def run_static_files(
    send: trio.MemorySendChannel[Event],
    path: Path,
    node_name: str,
    *,
    check_frequency: float = 20.0,
    poll_interval: float = 1.0,
    log: Log = logger,
    wall_clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send the static pods under ``path`` as ``PodSetUpdate(source="file")`` whenever they change.

    The first update is sent at once (empty if the path does not exist yet), then
    ``task_status.started()`` is called. Whenever inotify reports a change in the
    directory (as Go's file source, which reacts to inotify at once), and at the latest
    every ``poll_interval``, the directory is stat'ed (names, inodes, mtimes, sizes — no
    reads) and rescanned if that changed; every ``check_frequency`` it is rescanned
    regardless (``fileCheckFrequency``). A burst of changes (``SETTLE_SECONDS``) makes
    one update.
    ``wall_clock`` (epoch seconds, e.g. ``TrioWallClock().now``) only stamps
    ``kubernetes.io/config.seen``; all waiting uses trio's clock.

    Where parsing happens: a file of at most ``INLINE_PARSE_BYTES`` (8 KiB, a typical
    static pod is 1-4 KiB) is parsed right here, in the trio thread, at a few milliseconds
    at most, with a checkpoint after each file; a bigger one in a worker thread
    (``trio.to_thread``), one at a time, so the event loop keeps answering (healthz) while
    it is decoded and validated. Not every file goes to a thread because a thread is
    invisible to ``trio.testing.MockClock``: while the source waits for one, an autojump
    clock sees every task blocked and jumps ahead, firing the tests' timeouts early, and a
    replay would no longer be deterministic. Small files inline keep the virtual-clock
    tests exact; the time budget of a big file is enforced inside the parse
    (``PARSE_BUDGET_SECONDS``, ``time.monotonic``), not with a trio deadline, for the same
    reason.
    """
    files = _StaticPodFiles(path, node_name.lower(), log, wall_clock)
    log.info("watching static pod path %s", path)
    watch = _DirectoryWatch(files.path, log)
    try:
        watch.refresh()
        fingerprint = _fingerprint(path)
        update = await files.rescan()
        assert update is not None  # the first scan is always sent: it marks the source as seen
        await send.send(update)
        task_status.started()
        last_scan = trio.current_time()
        while True:
            await watch.wait(min(poll_interval, check_frequency))
            watch.refresh()
            current = _fingerprint(path)
            if current == fingerprint and trio.current_time() - last_scan < check_frequency:
                continue
            fingerprint, last_scan = current, trio.current_time()
            update = await files.rescan()
            if update is not None:
                await send.send(update)
    finally:
        watch.close()
