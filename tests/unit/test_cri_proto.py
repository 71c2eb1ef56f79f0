"""Our protos/runtime/v1/api.proto must agree with upstream CRI field for field.

So must the descriptors compiled into the upb-generated tree (runtime/cri_upb),
and that tree and the betterproto2 one must read each other's bytes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

pytest.importorskip("cri_api.v1.api_pb2")
pytest.importorskip("grpc_tools.protoc")

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "protos"
API_PROTO = "runtime/v1/api.proto"

REQUIRED_METHODS = {
    "RuntimeService": {
        "Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus",
        "ListPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer",
        "ListContainers", "ContainerStatus", "UpdateContainerResources", "ExecSync", "Exec",
        "Attach", "PortForward", "ContainerStats", "ListContainerStats", "PodSandboxStats",
        "ListPodSandboxStats", "Status",
    },
    "ImageService": {"ListImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo"},
}

Messages = dict[str, descriptor_pb2.DescriptorProto]
Enums = dict[str, descriptor_pb2.EnumDescriptorProto]


def compile_proto(root: Path, out: Path) -> descriptor_pb2.FileDescriptorProto:
    """Compile one proto with grpc_tools.protoc and load it back as a descriptor."""
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}",
         f"--descriptor_set_out={out}", API_PROTO],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (proto,) = files.file
    return proto


def upstream() -> descriptor_pb2.FileDescriptorProto:
    from cri_api.v1 import api_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def index(proto: descriptor_pb2.FileDescriptorProto) -> tuple[Messages, Enums]:
    """Every message and enum by fully qualified name, nested ones included."""
    messages: Messages = {}
    enums: Enums = {}

    def walk(prefix: str, items: Iterator[descriptor_pb2.DescriptorProto]) -> None:
        for message in items:
            name = f"{prefix}.{message.name}"
            messages[name] = message
            for enum in message.enum_type:
                enums[f"{name}.{enum.name}"] = enum
            walk(name, iter(message.nested_type))

    package = f".{proto.package}"
    for enum in proto.enum_type:
        enums[f"{package}.{enum.name}"] = enum
    walk(package, iter(proto.message_type))
    return messages, enums


def differences(ours: descriptor_pb2.FileDescriptorProto,
                theirs: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Every way ``ours`` departs from ``theirs`` (empty when it is a faithful subset)."""
    problems: list[str] = []
    if ours.package != theirs.package:
        problems.append(f"package {ours.package!r} != {theirs.package!r}")
    our_msgs, our_enums = index(ours)
    up_msgs, up_enums = index(theirs)
    for name, message in our_msgs.items():
        if name not in up_msgs:
            problems.append(f"message {name} not upstream")
            continue
        problems += _message_differences(name, message, up_msgs[name], up_msgs)
    for name, enum in our_enums.items():
        if name not in up_enums:
            problems.append(f"enum {name} not upstream")
            continue
        mine = {(v.name, v.number) for v in enum.value}
        want = {(v.name, v.number) for v in up_enums[name].value}
        if mine != want:
            problems.append(f"enum {name}: values {sorted(mine ^ want)} differ")
    problems += _service_differences(ours, theirs)
    return problems


def _message_differences(name: str, ours: descriptor_pb2.DescriptorProto,
                         theirs: descriptor_pb2.DescriptorProto, up_msgs: Messages) -> list[str]:
    problems: list[str] = []
    if ours.options.map_entry != theirs.options.map_entry:
        problems.append(f"{name}: map-entry-ness differs")
    mine = {f.name: f for f in ours.field}
    want = {f.name: f for f in theirs.field}
    problems += [f"{name}.{f}: missing" for f in sorted(want.keys() - mine.keys())]
    problems += [f"{name}.{f}: not upstream" for f in sorted(mine.keys() - want.keys())]
    for fname in sorted(mine.keys() & want.keys()):
        a, b = mine[fname], want[fname]
        for attr in ("number", "type", "label", "type_name", "proto3_optional", "oneof_index"):
            if getattr(a, attr) != getattr(b, attr):
                problems.append(f"{name}.{fname}: {attr} {getattr(a, attr)!r} != "
                                f"{getattr(b, attr)!r}")
        if _is_map(b, up_msgs) and a.type_name != b.type_name:
            problems.append(f"{name}.{fname}: map-ness differs")
    return problems


def _is_map(field: descriptor_pb2.FieldDescriptorProto, messages: Messages) -> bool:
    entry = messages.get(field.type_name)
    return entry is not None and entry.options.map_entry


def _service_differences(ours: descriptor_pb2.FileDescriptorProto,
                         theirs: descriptor_pb2.FileDescriptorProto) -> list[str]:
    problems: list[str] = []
    upstream_services = {s.name: {m.name: m for m in s.method} for s in theirs.service}
    for service in ours.service:
        methods = upstream_services.get(service.name)
        if methods is None:
            problems.append(f"service {service.name} not upstream")
            continue
        for method in service.method:
            up = methods.get(method.name)
            if up is None:
                problems.append(f"{service.name}.{method.name} not upstream")
                continue
            for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
                if getattr(method, attr) != getattr(up, attr):
                    problems.append(f"{service.name}.{method.name}: {attr} differs")
    return problems


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorProto:
    return compile_proto(PROTO_ROOT, tmp_path_factory.mktemp("proto") / "api.pb")


def test_proto_matches_upstream(ours: descriptor_pb2.FileDescriptorProto) -> None:
    assert differences(ours, upstream()) == []


def test_proto_has_the_services_the_agent_needs(ours: descriptor_pb2.FileDescriptorProto) -> None:
    services = {s.name: {m.name for m in s.method} for s in ours.service}
    for service, methods in REQUIRED_METHODS.items():
        assert methods <= services.get(service, set()), service


def test_every_referenced_type_is_defined(ours: descriptor_pb2.FileDescriptorProto) -> None:
    messages, enums = index(ours)
    assert len(messages) > 50
    for message in messages.values():
        for field in message.field:
            if field.type_name:
                assert field.type_name in messages or field.type_name in enums


def test_comparison_catches_a_renumbered_field(ours: descriptor_pb2.FileDescriptorProto) -> None:
    broken = descriptor_pb2.FileDescriptorProto()
    broken.CopyFrom(ours)
    container = next(m for m in broken.message_type if m.name == "Container")
    next(f for f in container.field if f.name == "state").number = 60
    problems = differences(broken, upstream())
    assert problems == [".runtime.v1.Container.state: number 60 != 6"]


def test_comparison_catches_edits_to_the_proto_text(tmp_path: Path) -> None:
    text = (PROTO_ROOT / API_PROTO).read_text()
    edits = [
        ("    string runtime_handler = 7;", "    string runtime_handler = 17;"),
        ("    SANDBOX_NOTREADY = 1;", "    SANDBOX_NOTREADY = 2;"),
        ("    map<string, string> labels = 8;", "    repeated string labels = 8;"),
        ("returns (ListContainersResponse)", "returns (ContainerStatusResponse)"),
    ]
    for number, (old, new) in enumerate(edits):
        assert old in text, old
        root = tmp_path / str(number)
        (root / "runtime" / "v1").mkdir(parents=True)
        (root / API_PROTO).write_text(text.replace(old, new, 1))
        assert differences(compile_proto(root, root / "api.pb"), upstream()), new


# -- the upb-generated tree (runtime/cri_upb) ---------------------------------------------------


def upb_generated() -> descriptor_pb2.FileDescriptorProto:
    from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def test_upb_generated_code_matches_upstream() -> None:
    assert differences(upb_generated(), upstream()) == []


def without_json_names(proto: descriptor_pb2.FileDescriptorProto
                       ) -> descriptor_pb2.FileDescriptorProto:
    """A copy without json_name, which protoc's Python output leaves out of its descriptors."""
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(proto)
    pending = list(copy.message_type)
    while pending:
        message = pending.pop()
        for field in message.field:
            field.ClearField("json_name")
        pending.extend(message.nested_type)
    return copy


def test_upb_generated_code_is_compiled_from_our_proto(
        ours: descriptor_pb2.FileDescriptorProto) -> None:
    # Catches a proto edit without regenerating, even where upstream would not notice.
    assert without_json_names(upb_generated()) == without_json_names(ours)


def test_upb_messages_do_not_claim_the_default_pool() -> None:
    # Upstream's compiled descriptors (imported above) register runtime.v1 in the default
    # pool; ours must coexist with them and with any other copy of the CRI proto.
    from cri_api.v1 import api_pb2 as theirs

    from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2

    assert api_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    assert theirs.DESCRIPTOR.pool is descriptor_pool.Default()
    assert api_pb2.Container.DESCRIPTOR.full_name == "runtime.v1.Container"


def test_betterproto2_and_upb_read_each_others_bytes() -> None:
    from trio_kubelet.runtime.cri.runtime import v1
    from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2

    container = v1.Container(
        id="c1", pod_sandbox_id="s1", metadata=v1.ContainerMetadata(name="app", attempt=2),
        image=v1.ImageSpec(image="busybox"), image_ref="sha256:ab",
        state=v1.ContainerState.CONTAINER_EXITED, created_at=1_700_000_000_123_456_789,
        labels={"io.kubernetes.pod.uid": "u"}, annotations={"io.kubernetes.container.hash": "h"})
    wire = bytes(v1.ListContainersResponse(containers=[container]))
    (decoded,) = api_pb2.ListContainersResponse.FromString(wire).containers
    assert (decoded.id, decoded.pod_sandbox_id, decoded.metadata.name, decoded.metadata.attempt,
            decoded.image.image, decoded.image_ref, decoded.created_at) == (
        "c1", "s1", "app", 2, "busybox", "sha256:ab", 1_700_000_000_123_456_789)
    assert decoded.state == api_pb2.CONTAINER_EXITED == v1.ContainerState.CONTAINER_EXITED
    assert dict(decoded.labels) == container.labels
    assert dict(decoded.annotations) == container.annotations

    request = api_pb2.ListContainersRequest()
    request.filter.label_selector["io.kubernetes.pod.uid"] = "u"
    parsed = v1.ListContainersRequest.parse(request.SerializeToString())
    assert parsed.filter is not None
    assert parsed.filter.label_selector == {"io.kubernetes.pod.uid": "u"}
