#!/usr/bin/env python3
"""Build the images Kubernetes' NodeConformance specs run, under their exact upstream names.

Usage: conformance_images.py --bin-dir DIR [--cache-dir DIR]

No registry is reachable here, so each image the specs name (test/utils/image/manifest.go of
the e2e suite's version) is made locally as an OCI image layout tarball, loadable with
`ctr -n k8s.io images import`; the paths are printed one per line. BIN_DIR is
scripts/build-conformance's output (agnhost, nnp, agnhost-localhost.crt/.key, and busybox 1.37.0
built from upstream's tarball with its default configuration, as the docker library's
busybox:1.37.0 that upstream's image is FROM). What each holds, beside a rootfs of that busybox
(scripts/images.py's layout) standing in for the upstream busybox/alpine/Debian base:

- e2e-test-images/busybox:1.37.0-1: busybox alone.
- e2e-test-images/agnhost:2.63.0 and :2.55: the agnhost built from the suite's module (2.63.0
  under both names; 2.55 differs only in a label, so the two have different image IDs as
  upstream), curl and bash with their shared libraries (specs curl from inside agnhost, probes
  run /bin/bash), the host's netcat-openbsd as /usr/bin/nc (upstream's nc, ahead of busybox's
  on PATH: busybox's has no -u), the user and group upstream's Dockerfile adds, /uploads, the
  porter's localhost.crt/.key, entrypoint /agnhost, command `pause`.
- e2e-test-images/nonroot:1.5: busybox with USER 1234.
- e2e-test-images/nonewprivs:1.4: nnp (prints its effective uid) installed set-uid root.
- e2e-test-images/glibc-dns-testing:2.0.0: the host's (Debian's, glibc) hostname at
  /usr/bin/hostname, ahead of busybox's on PATH, and an nsswitch.conf: `hostname -f` resolves
  through glibc as in upstream's Debian image (which also has dig; this one does not).
- e2e-test-images/nginx:1.15-4 and :1.27-0: Debian's nginx (`apt-get download`, kept in the
  cache) with its shared libraries, serving "Welcome to nginx!" on port 80 in the foreground.

Host binaries (curl, nginx) are copied with the libraries `ldd` names, at the same paths. The
output is deterministic (scripts/images.py), so a rebuild from the same inputs gives the same
digests and containerd keeps what it has; a build takes a few seconds.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from images import (  # the scripts directory is not a package
    DEFAULT_PATH,
    Layer,
    busybox_layer,
    default_cache_dir,
    image_layout,
    write_atomic,
)

E2E = "registry.k8s.io/e2e-test-images"
CURL = Path("/usr/bin/curl")
BASH = Path("/bin/bash")
HOSTNAME = Path("/bin/hostname")
BUSYBOX = "busybox-1.37.0"  # scripts/build-conformance's build of upstream's release
NGINX_PACKAGE = "nginx"  # bookworm's nginx-light is a transitional package depending on it
NETCAT = Path("/bin/nc.openbsd")  # Debian's netcat-openbsd (scripts/bootstrap installs it)
ENV = [f"PATH={DEFAULT_PATH}"]
Tarballs = dict[str, bytes]  # file stem -> OCI image layout tarball

AGNHOST_PASSWD = b"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
AGNHOST_GROUP = (
    b"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
)
NGINX_PASSWD = b"nginx:x:101:101:nginx:/nonexistent:/bin/false\n"
NGINX_GROUP = b"nginx:x:101:\n"
NGINX_CONF = b"""\
user nginx;
worker_processes 1;
error_log /dev/stderr notice;
pid /run/nginx.pid;
events { worker_connections 1024; }
http {
    types { text/html html; text/plain txt; application/json json; }
    default_type application/octet-stream;
    access_log /dev/stdout;
    server {
        listen 80;
        listen [::]:80;
        root /usr/share/nginx/html;
        index index.html;
    }
}
"""
NGINX_INDEX = b"<!DOCTYPE html>\n<html><body><h1>Welcome to nginx!</h1></body></html>\n"


class Inputs:
    """Where the images' files come from: scripts/build-conformance's output and the cache."""

    def __init__(self, bin_dir: Path, cache_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.cache_dir = cache_dir

    def built_path(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.exists():
            sys.exit(f"conformance_images.py: {path} missing (run scripts/build-conformance)")
        return path

    def built(self, name: str) -> bytes:
        return self.built_path(name).read_bytes()

    def deb(self, package: str) -> Path:
        """Debian's PACKAGE file, downloaded into the cache once."""
        debs = self.cache_dir / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        found = sorted(debs.glob(f"{package}_*.deb"))
        if not found:
            # apt's progress goes to stderr: this script's stdout is its list of tarballs.
            download = ["apt-get", "download", "-q", package]
            if subprocess.run(download, cwd=debs, stdout=sys.stderr).returncode != 0:
                # A machine whose package lists were never fetched knows no package yet.
                subprocess.run(["apt-get", "update", "-q"], stdout=sys.stderr, check=True)
                subprocess.run(download, cwd=debs, stdout=sys.stderr, check=True)
            found = sorted(debs.glob(f"{package}_*.deb"))
        return found[-1]

    def deb_binary(self, package: str, member: str, scratch: Path) -> Path:
        """The executable MEMBER (``./usr/sbin/nginx``) of Debian's PACKAGE, written into
        SCRATCH so that `ldd` can read it."""
        contents = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", str(self.deb(package))], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(contents)) as tar:
            source = tar.extractfile(tar.getmember(member))
            assert source is not None
            extracted = scratch / member.rsplit("/", 1)[-1]
            extracted.write_bytes(source.read())
        extracted.chmod(0o755)
        return extracted


def shared_libraries(binary: Path) -> list[Path]:
    """The shared libraries (and the dynamic loader) BINARY loads, as `ldd` resolves them."""
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    libraries = []
    for line in out.splitlines():
        words = line.split()
        if "not" in words and "found" in words:
            sys.exit(f"conformance_images.py: {binary}: {line.strip()}")
        path = words[2] if len(words) > 2 and words[1] == "=>" else words[0]
        if path.startswith("/"):
            libraries.append(Path(path))
    return libraries


def add_dynamic(layer: Layer, binary: Path, at: str) -> None:
    """BINARY at path AT in the image, with its libraries at their host paths (those another
    binary brought already are kept)."""
    present = {info.name for info, _ in layer.members}
    layer.dir(at.rsplit("/", 1)[0])
    layer.file(at, binary.read_bytes(), 0o755)
    for library in shared_libraries(binary):
        name = str(library).lstrip("/")
        if name not in present:
            layer.dir(name.rsplit("/", 1)[0])
            layer.file(name, library.resolve().read_bytes(), 0o755)


def base(inputs: Inputs, passwd: bytes = b"", group: bytes = b"") -> Layer:
    """Upstream's busybox, as in the docker library's image: not Debian's, whose ash drops
    environment names that are not identifiers (envFrom's `data-1`) and, in busybox-static,
    runs its own applets ahead of PATH (scripts/build-conformance says more)."""
    return busybox_layer(inputs.built_path(BUSYBOX), passwd, group)


def busybox_image(inputs: Inputs) -> Tarballs:
    config = {"Env": ENV, "Cmd": ["sh"]}
    return {"busybox": image_layout(base(inputs).tar(), config, (f"{E2E}/busybox:1.37.0-1",))}


def agnhost_layer(inputs: Inputs) -> bytes:
    layer = base(inputs, AGNHOST_PASSWD, AGNHOST_GROUP)
    layer.file("agnhost", inputs.built("agnhost"), 0o755)
    layer.symlink("agnhost-2", "agnhost")
    layer.dir("uploads")
    layer.dir("home/user-defined-in-image")
    for name in ("localhost.crt", "localhost.key"):
        layer.file(name, inputs.built(f"agnhost-{name}"))
    add_dynamic(layer, CURL, "usr/bin/curl")
    add_dynamic(layer, BASH, "bin/bash")  # probe specs run /bin/bash
    # Upstream's netcat-openbsd: the node-pod UDP spec runs `nc -w 1 -u`, which busybox's nc
    # lacks; ahead of busybox's nc on PATH.
    if not NETCAT.exists():
        sys.exit(f"conformance_images.py: {NETCAT} missing (apt-get install netcat-openbsd)")
    add_dynamic(layer, NETCAT, "usr/bin/nc")
    return layer.tar()


def agnhost_images(inputs: Inputs) -> Tarballs:
    layer = agnhost_layer(inputs)
    return {
        f"agnhost-{version}": image_layout(
            layer,
            {
                "Env": ENV,
                "Entrypoint": ["/agnhost"],
                "Cmd": ["pause"],
                "ExposedPorts": {f"{port}/tcp": {} for port in (80, 8080, 8081, 9376, 5000)},
                "Labels": {"org.opencontainers.image.version": version},
            },
            (f"{E2E}/agnhost:{version}",),
        )
        for version in ("2.63.0", "2.55")
    }


def nonroot_image(inputs: Inputs) -> Tarballs:
    config = {"Env": ENV, "Cmd": ["sh"], "User": "1234"}
    return {"nonroot": image_layout(base(inputs).tar(), config, (f"{E2E}/nonroot:1.5",))}


def nonewprivs_image(inputs: Inputs) -> Tarballs:
    layer = base(inputs)
    layer.dir("usr/local/bin")
    layer.file("usr/local/bin/nnp", inputs.built("nnp"), 0o6755)  # Dockerfile: chmod +s
    config = {"Env": ENV, "Cmd": ["nnp"]}
    return {"nonewprivs": image_layout(layer.tar(), config, (f"{E2E}/nonewprivs:1.4",))}


def glibc_dns_testing_image(inputs: Inputs) -> Tarballs:
    layer = base(inputs)
    add_dynamic(layer, HOSTNAME, "usr/bin/hostname")
    layer.file("etc/nsswitch.conf", b"hosts: files dns\n")
    config = {"Env": ENV, "Cmd": ["sh"]}
    ref = f"{E2E}/glibc-dns-testing:2.0.0"
    return {"glibc-dns-testing": image_layout(layer.tar(), config, (ref,))}


def nginx_layer(inputs: Inputs, scratch: Path) -> bytes:
    """nginx from the package (ldd reads it from SCRATCH) with its libraries from the host."""
    layer = base(inputs, NGINX_PASSWD, NGINX_GROUP)
    add_dynamic(
        layer, inputs.deb_binary(NGINX_PACKAGE, "./usr/sbin/nginx", scratch), "usr/sbin/nginx"
    )
    layer.dir("etc/nginx")
    layer.file("etc/nginx/nginx.conf", NGINX_CONF)
    layer.dir("usr/share/nginx/html")
    layer.file("usr/share/nginx/html/index.html", NGINX_INDEX)
    layer.dir("run")
    layer.dir("var/lib/nginx")  # Debian's build keeps its temp paths (client bodies…) here
    layer.dir("var/log/nginx")
    layer.dir("var/lock")
    return layer.tar()


def nginx_images(inputs: Inputs) -> Tarballs:
    with tempfile.TemporaryDirectory(prefix="trio-kubelet-nginx-") as scratch:
        layer = nginx_layer(inputs, Path(scratch))
    return {
        f"nginx-{version}": image_layout(
            layer,
            {
                "Env": ENV,
                "Cmd": ["nginx", "-g", "daemon off;"],
                "ExposedPorts": {"80/tcp": {}},
                "StopSignal": "SIGQUIT",
                "Labels": {"org.opencontainers.image.version": version},
            },
            (f"{E2E}/nginx:{version}",),
        )
        for version in ("1.15-4", "1.27-0")
    }


BUILDERS: list[Callable[[Inputs], Tarballs]] = [
    busybox_image,
    agnhost_images,
    nonroot_image,
    nonewprivs_image,
    glibc_dns_testing_image,
    nginx_images,
]


def build(bin_dir: Path, cache_dir: Path) -> list[Path]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    inputs = Inputs(bin_dir, cache_dir)
    outputs = []
    for builder in BUILDERS:
        for name, tarball in builder(inputs).items():
            path = cache_dir / f"{name}.tar"
            write_atomic(path, tarball)
            outputs.append(path)
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument(
        "--cache-dir", type=Path, default=default_cache_dir().with_name("conformance-images")
    )
    args = parser.parse_args(argv)
    for path in build(args.bin_dir, args.cache_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
