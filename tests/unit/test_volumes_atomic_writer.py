"""volumes.atomic_writer: the ..data swap, unchanged payloads, stale names, modes, fsGroup."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from trio_kubelet.volumes.atomic_writer import DATA_DIR, write_atomically


def hidden_dirs(target: Path) -> list[str]:
    return sorted(p.name for p in target.iterdir() if p.name.startswith("..") and p.is_dir()
                  and not p.is_symlink())


def test_first_write_makes_the_go_layout(tmp_path: Path) -> None:
    assert write_atomically(tmp_path, {"key": (b"v1", 0o644), "conf/app.conf": (b"x", 0o600)})
    data = os.readlink(tmp_path / DATA_DIR)
    assert data.startswith("..") and data != DATA_DIR
    assert hidden_dirs(tmp_path) == [data]
    assert os.readlink(tmp_path / "key") == "..data/key"
    assert os.readlink(tmp_path / "conf") == "..data/conf"
    assert (tmp_path / "key").read_bytes() == b"v1"
    assert (tmp_path / "conf" / "app.conf").read_bytes() == b"x"
    assert stat.S_IMODE((tmp_path / data).stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "conf" / "app.conf").stat().st_mode) == 0o600


def test_modes_ignore_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomically(tmp_path, {"open": (b"", 0o666), "a/b/c": (b"", 0o644)})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "open").stat().st_mode) == 0o666
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):  # others may traverse them
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def test_an_unchanged_payload_writes_nothing(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"key": (b"v1", 0o644)})
    data = os.readlink(tmp_path / DATA_DIR)
    (tmp_path / "key").unlink()  # a lost link is made again even so
    assert not write_atomically(tmp_path, {"key": (b"v1", 0o644)})
    assert os.readlink(tmp_path / DATA_DIR) == data
    assert (tmp_path / "key").read_bytes() == b"v1"


def test_a_new_mode_is_a_change(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"key": (b"v1", 0o644)})
    assert write_atomically(tmp_path, {"key": (b"v1", 0o400)})
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o400


def test_an_update_swaps_data_and_drops_stale_names(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"keep": (b"1", 0o644), "drop": (b"1", 0o644), "d/x": (b"", 0o644)})
    old = os.readlink(tmp_path / DATA_DIR)
    (tmp_path / "mine").write_text("not the writer's")
    assert write_atomically(tmp_path, {"keep": (b"2", 0o644), "new": (b"2", 0o644)})
    new = os.readlink(tmp_path / DATA_DIR)
    assert new != old
    assert hidden_dirs(tmp_path) == [new]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("..")) == [
        "keep", "mine", "new",
    ]
    assert (tmp_path / "keep").read_bytes() == b"2"


def test_an_empty_payload_still_has_a_data_dir(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"key": (b"v1", 0o644)})
    assert write_atomically(tmp_path, {})
    assert list((tmp_path / DATA_DIR).iterdir()) == []
    assert not os.path.lexists(tmp_path / "key")


def test_leftovers_of_an_interrupted_write_are_cleaned(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"key": (b"v1", 0o644)})
    (tmp_path / "..2001_01_01_00_00_00.abc").mkdir()
    os.symlink("..2001_01_01_00_00_00.abc", tmp_path / "..data_tmp")
    write_atomically(tmp_path, {"key": (b"v2", 0o644)})
    assert hidden_dirs(tmp_path) == [os.readlink(tmp_path / DATA_DIR)]
    assert not os.path.lexists(tmp_path / "..data_tmp")


def test_fs_group_owns_files_and_adds_group_read(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"secret": (b"s", 0o600), "d/f": (b"", 0o400)}, fs_group=4321)
    data = tmp_path / DATA_DIR
    for path, mode in ((data / "secret", 0o640), (data / "d" / "f", 0o440)):
        info = path.stat()
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, mode)
    assert stat.S_IMODE((data / "d").stat().st_mode) & stat.S_ISGID
    assert tmp_path.stat().st_gid == 4321
    assert not write_atomically(tmp_path, {"secret": (b"s", 0o600), "d/f": (b"", 0o400)},
                                fs_group=4321)


def test_readers_never_see_a_half_update(tmp_path: Path) -> None:
    """Whatever a reader resolves ..data to, it finds one whole version of every file."""
    versions = [{f"f{i}": (str(n).encode() * 1000, 0o644) for i in range(5)} for n in range(40)]
    write_atomically(tmp_path, versions[0])
    seen: list[set[bytes]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                data = os.path.realpath(tmp_path / DATA_DIR)
                contents = {Path(data, f"f{i}").read_bytes() for i in range(5)}
            except FileNotFoundError:
                continue  # the old directory went away between resolving and reading
            seen.append(contents)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in versions[1:]:
            write_atomically(tmp_path, version)
    finally:
        done.set()
        reader.join()
    assert seen
    assert all(len(contents) == 1 and len(next(iter(contents))) in (1000, 2000)
               for contents in seen)
