#!/usr/bin/env python3
"""Build the busybox and pause OCI image tarballs locally, with no registry.

Usage: images.py [--cache-dir DIR] [--force] [--pause-image REF]

Writes DIR/busybox.tar and DIR/pause.tar (OCI image layouts, loadable with
`ctr -n k8s.io images import`) and prints their paths, one per line. Output is
deterministic: fixed mtimes, owners and ordering, gzip without timestamp, so a
rebuild from the same inputs gives the same digests. A stamp file holding the
hash of the inputs lets a second run skip the work.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BUSYBOX_REFS = ("docker.io/library/busybox:latest", "docker.io/library/busybox:1.36")
PAUSE_REF = "registry.k8s.io/pause:3.9"
BUSYBOX_BIN = Path("/bin/busybox")
# A fixed, recognisable timestamp for every file and for the image config.
EPOCH = 946684800  # 2000-01-01T00:00:00Z
CREATED = "2000-01-01T00:00:00Z"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

PAUSE_C = r"""
/* trio-kubelet pause: hold a pod's namespaces until told to stop; reap orphans. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo) {
    (void)signo;
    _exit(0);
}

static void on_child(int signo) {
    int saved = errno;
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static void handle(int signo, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART | (signo == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigemptyset(&sa.sa_mask);
    sigaction(signo, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        static const char version[] = "trio-kubelet-pause 3.9\n";
        return write(1, version, sizeof version - 1) < 0;
    }
    handle(SIGINT, on_stop);
    handle(SIGTERM, on_stop);
    handle(SIGCHLD, on_child);
    for (;;) {
        pause();
    }
}
"""


@dataclass
class Layer:
    """A rootfs layer under construction: tar members in insertion order."""

    members: list[tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=list)

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.mtime = EPOCH
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        """Add directory NAME and its missing parents; one already added is left as it is."""
        present = {info.name for info, _ in self.members}
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            if path not in present:
                own_mode = mode if depth == len(parts) else 0o755
                self.members.append((self._info(path, tarfile.DIRTYPE, own_mode), None))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.members.append((info, data))

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.members.append((info, None))

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in self.members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def image_layout(layer_tar: bytes, config: dict[str, object], refs: tuple[str, ...]) -> bytes:
    """Return an OCI image layout (as a tar) holding one image under every name in refs."""
    layer = gzip.compress(layer_tar, compresslevel=6, mtime=0)
    image_config = {
        "architecture": oci_arch(),
        "os": "linux",
        "created": CREATED,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer_tar)]},
        "history": [{"created": CREATED, "created_by": "trio-kubelet scripts/images.py"}],
    }
    config_blob = canonical_json(image_config)
    manifest_blob = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": sha256(config_blob),
                "size": len(config_blob),
            },
            "layers": [
                {"mediaType": MEDIA_LAYER_GZIP, "digest": sha256(layer), "size": len(layer)}
            ],
        }
    )
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": sha256(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": oci_arch(), "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                },
            }
            for ref in refs
        ],
    }
    outer = Layer()
    outer.file("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
    outer.file("index.json", canonical_json(index))
    outer.dir("blobs")
    outer.dir("blobs/sha256")
    for blob in sorted({config_blob, manifest_blob, layer}, key=sha256):
        outer.file("blobs/sha256/" + sha256(blob).removeprefix("sha256:"), blob)
    return outer.tar()


def busybox_applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    return sorted({name for name in out.stdout.split() if name and "/" not in name} - {"busybox"})


def busybox_layer(busybox: Path, passwd: bytes = b"", group: bytes = b"") -> Layer:
    """A busybox rootfs; PASSWD and GROUP lines are added to its root and nobody entries."""
    layer = Layer()
    for name in ("bin", "dev", "etc", "home", "proc", "root", "sys", "usr", "usr/bin", "var"):
        layer.dir(name, 0o700 if name == "root" else 0o755)
    layer.dir("tmp", 0o1777)
    layer.dir("var/tmp", 0o1777)
    layer.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in busybox_applets(busybox):
        layer.symlink(f"bin/{applet}", "busybox")
    layer.file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n" + passwd,
    )
    layer.file("etc/group", b"root:x:0:\nnobody:x:65534:\n" + group)
    return layer


def compile_pause(workdir: Path) -> bytes:
    source = workdir / "pause.c"
    binary = workdir / "pause"
    source.write_text(PAUSE_C)
    subprocess.run(
        ["gcc", "-static", "-O2", "-s", "-o", str(binary), str(source)],
        check=True,
    )
    return binary.read_bytes()


def pause_layer(binary: bytes) -> Layer:
    layer = Layer()
    layer.file("pause", binary, 0o755)
    return layer


def inputs_digest(busybox: Path, pause_ref: str) -> str:
    """Hash of everything the output depends on, so an unchanged rebuild can be skipped."""
    gcc = subprocess.run(["gcc", "--version"], check=True, capture_output=True).stdout
    h = hashlib.sha256()
    for part in (Path(__file__).read_bytes(), busybox.read_bytes(), gcc, pause_ref.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def build(cache_dir: Path, pause_ref: str, force: bool) -> list[Path]:
    for tool in ("gcc",):
        if shutil.which(tool) is None:
            sys.exit(f"images.py: {tool} not found (scripts/containerd-env install)")
    if not BUSYBOX_BIN.exists():
        sys.exit(f"images.py: {BUSYBOX_BIN} not found (apt-get install busybox-static)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    outputs = [cache_dir / "busybox.tar", cache_dir / "pause.tar"]
    stamp = cache_dir / "inputs.sha256"
    digest = inputs_digest(BUSYBOX_BIN, pause_ref)
    fresh = stamp.exists() and stamp.read_text().strip() == digest
    if fresh and not force and all(p.exists() for p in outputs):
        return outputs
    write_atomic(
        outputs[0],
        image_layout(
            busybox_layer(BUSYBOX_BIN).tar(),
            {"Env": [f"PATH={DEFAULT_PATH}"], "Cmd": ["sh"], "WorkingDir": "/"},
            BUSYBOX_REFS,
        ),
    )
    with tempfile.TemporaryDirectory(prefix="trio-kubelet-pause-") as workdir:
        binary = compile_pause(Path(workdir))
    write_atomic(
        outputs[1],
        image_layout(
            pause_layer(binary).tar(),
            {"Env": [f"PATH={DEFAULT_PATH}"], "Entrypoint": ["/pause"], "User": "65535:65535"},
            (pause_ref,),
        ),
    )
    write_atomic(stamp, (digest + "\n").encode())
    return outputs


def default_cache_dir() -> Path:
    base = os.environ.get("TRIO_KUBELET_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trio-kubelet"
    )
    return Path(base) / "images"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--pause-image", default=PAUSE_REF)
    parser.add_argument("--force", action="store_true", help="rebuild even if inputs are unchanged")
    args = parser.parse_args(argv)
    for path in build(args.cache_dir, args.pause_image, args.force):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
