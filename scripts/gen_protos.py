"""Regenerate (or with --check, verify) the betterproto2 CRI code under runtime/cri from protos/.

Output is grpclib async client stubs plus async server base classes (the fake
runtime serves the latter). The compiler formats its output with the ``ruff``
on PATH using this repository's ruff settings, so protoc runs from the repo root
and the result depends on the betterproto2-compiler and ruff versions installed.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
PROTOS = ("runtime/v1/api.proto",)
TARGET = REPO / "src" / "trio_kubelet" / "runtime" / "cri"
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"
PACKAGE_DOC = (
    '"""Generated CRI runtime.v1 messages and grpclib stubs: '
    'run scripts/gen_protos.py, do not edit."""\n'
)


def generate(out: Path) -> None:
    """Run protoc with the betterproto2 plugin into ``out``."""
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
        f"--python_betterproto2_out={out}", f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
        *PROTOS,
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"protoc failed ({done.returncode})")
    # The compiler leaves the top package empty; give it the house docstring.
    (out / "__init__.py").write_text(PACKAGE_DOC)


def tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def ruff_format(path: Path) -> str:
    """The file in a canonical ruff layout (via stdin, so runtime/cri's exclusion is moot)."""
    cmd = ["ruff", "format", "--config", "format.skip-magic-trailing-comma = true", "-"]
    done = subprocess.run(cmd, input=path.read_text(), cwd=REPO, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else path.read_text()


def same(expected: Path, actual: Path) -> bool:
    """Byte-equal, or equal once both are formatted by the same ruff.

    The compiler formats with whatever ruff is installed, so a newer ruff alone
    must not make committed code look stale.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temp dir and exit 1 if the committed code differs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gen-protos-") as tmp:
        fresh = Path(tmp) / "cri"
        fresh.mkdir()
        generate(fresh)
        if args.check:
            problems = differences(fresh, TARGET)
            if problems:
                print(f"{TARGET.relative_to(REPO)} is stale (run python scripts/gen_protos.py):",
                      file=sys.stderr)
                for line in problems:
                    print(f"  {line}", file=sys.stderr)
                return 1
            print("generated CRI code is up to date")
            return 0
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(fresh, TARGET)
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
