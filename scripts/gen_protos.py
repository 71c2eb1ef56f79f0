"""Regenerate (or with --check, verify) both generated CRI trees from protos/.

- ``runtime/cri``: betterproto2 messages, grpclib async client stubs and async
  server base classes (the fake runtime serves the latter). Everything except
  the PLEG relist uses these.
- ``runtime/cri_upb``: protobuf's own Python code (``--python_out`` and
  ``--pyi_out``), whose messages are backed by upb (C). The relist's two list
  calls decode with these: ~200x faster than betterproto2 on a 175 KB
  ListContainers reply (docs/runtime.md).

The betterproto2 compiler formats its output with the ``ruff`` on PATH using
this repository's ruff settings, so protoc runs from the repo root and the
result depends on the betterproto2-compiler and ruff versions installed. The
upb tree depends on the protoc bundled with grpcio-tools; its runtime-version
check needs ``protobuf`` at least the gencode version, which ``--check`` also
verifies against pyproject.toml.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
PROTOS = ("runtime/v1/api.proto",)
RUNTIME = REPO / "src" / "trio_kubelet" / "runtime"
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"
BETTERPROTO_DOC = (
    '"""Generated CRI runtime.v1 messages and grpclib stubs: '
    'run scripts/gen_protos.py, do not edit."""\n'
)
UPB_DOC = (
    '"""Generated CRI runtime.v1 protobuf (upb) messages, in a private descriptor pool: '
    'run scripts/gen_protos.py, do not edit."""\n'
)
# protoc registers the file in the process-wide default pool. Another copy of the CRI proto
# (upstream's ``cri_api`` package, say) then fails to import with "duplicate symbol
# 'runtime.v1.…'", whichever comes second. Our messages live in a pool of their own instead;
# upb builds classes from any pool, and nothing of ours looks messages up by name.
DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile("
GENCODE_VERSION = re.compile(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)$", re.MULTILINE)


def protoc(*options: str) -> None:
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", *options, *PROTOS]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"protoc failed ({done.returncode})")


def generate_betterproto(out: Path) -> None:
    """protoc with the betterproto2 plugin into ``out``."""
    protoc(f"--python_betterproto2_out={out}", f"--python_betterproto2_opt={PLUGIN_OPTIONS}")
    # The compiler leaves the top package empty; give it the house docstring.
    (out / "__init__.py").write_text(BETTERPROTO_DOC)


def generate_upb(out: Path) -> None:
    """protoc's own Python output (+ .pyi) into ``out``, made importable as a package."""
    protoc(f"--python_out={out}", f"--pyi_out={out}")
    for module in out.rglob("*_pb2.py"):
        text = module.read_text()
        if text.count(DEFAULT_POOL) != 1:
            raise SystemExit(f"{module.name}: protoc's output changed shape; "
                             f"expected one {DEFAULT_POOL!r}")
        module.write_text(text.replace(DEFAULT_POOL, PRIVATE_POOL))
        for package in module.relative_to(out).parents:
            (out / package / "__init__.py").touch()
    (out / "__init__.py").write_text(UPB_DOC)


TREES: dict[str, Callable[[Path], None]] = {
    "cri": generate_betterproto,
    "cri_upb": generate_upb,
}


def tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def ruff_format(path: Path) -> str:
    """The file in a canonical ruff layout (via stdin, so the trees' ruff exclusion is moot)."""
    cmd = ["ruff", "format", "--config", "format.skip-magic-trailing-comma = true", "-"]
    done = subprocess.run(cmd, input=path.read_text(), cwd=REPO, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else path.read_text()


def same(expected: Path, actual: Path) -> bool:
    """Byte-equal, or equal once both are formatted by the same ruff.

    The betterproto2 compiler formats with whatever ruff is installed, so a newer
    ruff alone must not make committed code look stale.
    """
    if filecmp.cmp(expected, actual, shallow=False):
        return True
    return expected.suffix == ".py" and ruff_format(expected) == ruff_format(actual)


def differences(expected: Path, actual: Path) -> list[str]:
    """Human-readable list of files that differ between two generated trees."""
    want, have = tree(expected), tree(actual)
    problems = [f"missing: {p}" for p in sorted(want - have)]
    problems += [f"unexpected: {p}" for p in sorted(have - want)]
    problems += [f"differs: {p}" for p in sorted(want & have)
                 if not same(expected / p, actual / p)]
    return problems


def gencode_version(upb_tree: Path) -> tuple[int, ...]:
    """The protobuf version the upb code was generated for (its runtime check's minimum)."""
    versions = {tuple(int(part) for part in match.groups())
                for module in upb_tree.rglob("*_pb2.py")
                for match in GENCODE_VERSION.finditer(module.read_text())}
    if len(versions) != 1:
        raise SystemExit(f"expected one gencode version under {upb_tree}, found {versions}")
    return versions.pop()


def required_protobuf_minimum() -> tuple[int, ...] | None:
    """The lower bound pyproject.toml puts on ``protobuf`` (``protobuf>=X.Y.Z``), if any."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project.get("dependencies", []):
        match = re.fullmatch(r"protobuf\s*(\S*)", requirement.split(";")[0].strip())
        if match is None:
            continue
        for clause in match.group(1).split(","):
            if clause.startswith(">="):
                return tuple(int(part) for part in clause[2:].split("."))
    return None


def check_runtime_requirement(upb_tree: Path) -> list[str]:
    """pip must not install a protobuf older than the gencode (its import would fail)."""
    needed = gencode_version(upb_tree)
    have = required_protobuf_minimum()
    wanted = ".".join(map(str, needed))
    if have is None:
        return [f"pyproject.toml: add protobuf>={wanted} to dependencies"]
    if have < needed:
        return [f"pyproject.toml: protobuf>={'.'.join(map(str, have))} is below the gencode "
                f"version; require protobuf>={wanted}"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temp dir and exit 1 if the committed code differs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gen-protos-") as tmp:
        fresh = {name: Path(tmp) / name for name in TREES}
        for name, generate in TREES.items():
            fresh[name].mkdir()
            generate(fresh[name])
        if args.check:
            stale = False
            for name in TREES:
                target = RUNTIME / name
                problems = differences(fresh[name], target)
                if problems:
                    stale = True
                    print(f"{target.relative_to(REPO)} is stale "
                          "(run python scripts/gen_protos.py):", file=sys.stderr)
                    for line in problems:
                        print(f"  {line}", file=sys.stderr)
            requirement = check_runtime_requirement(fresh["cri_upb"])
            for line in requirement:
                print(line, file=sys.stderr)
            if stale or requirement:
                return 1
            print("generated CRI code is up to date")
            return 0
        for name in TREES:
            target = RUNTIME / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(fresh[name], target)
            print(f"wrote {target.relative_to(REPO)}")
        for line in check_runtime_requirement(fresh["cri_upb"]):
            print(f"warning: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
