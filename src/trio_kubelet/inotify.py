"""Linux inotify through ctypes (the standard library has none): what changed in watched paths.

The OOM watcher follows cgroup v2 ``memory.events`` files with it; the static pod source
its manifest directory.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
_EVENT = struct.Struct("iIII")  # struct inotify_event, before its name


class Inotify:
    """An inotify instance, non-blocking.

    A v2 cgroup file such as memory.events raises ``IN_MODIFY`` whenever one of its
    counters moves. One instance serves every watch: the per-user limit on instances
    is 128, far fewer than the containers of a node.
    """

    MODIFY = 0x2
    ATTRIB = 0x4
    CLOSE_WRITE = 0x8
    MOVED_FROM = 0x40
    MOVED_TO = 0x80
    CREATE = 0x100
    DELETE = 0x200
    DELETE_SELF = 0x400
    MOVE_SELF = 0x800
    IGNORED = 0x8000  # the watch is gone
    OVERFLOW = 0x4000  # events were lost (wd -1)

    def __init__(self) -> None:
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise _errno_error("inotify_init1")
        self.fd: int = fd

    def add_watch(self, path: bytes, mask: int = MODIFY) -> int:
        """A watch descriptor; raises OSError (ENOENT when ``path`` does not exist)."""
        wd = _libc.inotify_add_watch(self.fd, path, mask)
        if wd < 0:
            raise _errno_error(os.fsdecode(path))
        return int(wd)

    def rm_watch(self, wd: int) -> None:
        """Remove a watch; one the kernel already dropped is not an error."""
        if _libc.inotify_rm_watch(self.fd, wd) < 0 and ctypes.get_errno() != errno.EINVAL:
            raise _errno_error("inotify_rm_watch")

    def read(self) -> list[tuple[int, int]]:
        """The (watch descriptor, mask) of every queued event; [] when there are none."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _, name_len = _EVENT.unpack_from(data, offset)
            events.append((wd, mask))
            offset += _EVENT.size + name_len
        return events

    def close(self) -> None:
        os.close(self.fd)


def _errno_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), what)
