"""An OS lock (fcntl.flock, exclusive, non-blocking) on an output a command writes, so that two commands writing the
same file (or Parquet folder) cannot interleave their rows: the second stops at once with one line naming the holder
(its pid and command line, found in /proc/locks where Linux has it). The lock lives as long as the open descriptor:
a killed holder releases it with its process, so no stale lock file is ever left behind."""

from __future__ import annotations

import fcntl
import os

from engine.errors import UserError


def lock_holder(fd: int) -> str:
    """'pid N (command line)' of the process holding a flock on the file open at `fd`, or 'another process'."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if "FLOCK" in parts and parts[-3] == dev:
                    pid = int(parts[-4])
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as c:
                            cmd = c.read(300).replace(b"\0", b" ").decode("utf-8", "replace").strip()
                    except OSError:
                        cmd = ""
                    return f"pid {pid}" + (f" ({' '.join(cmd.split())})" if cmd else "")
    except (OSError, ValueError, IndexError):
        pass
    return "another process"


def lock_fd(fd: int, path: str) -> None:
    """Take the exclusive lock on the open file (or folder) `fd`; a UserError naming the holder when it is taken."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        raise UserError(
            f"another command is writing this output ({holder}); wait for it to end or choose another output", path
        ) from None


class FolderLock:
    """The lock on an output folder (a Parquet output), held from __init__ to close()."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            lock_fd(self._fd, path)
        except BaseException:
            os.close(self._fd)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
