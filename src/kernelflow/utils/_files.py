"""Atomic file writes shared by model files and checkpoints.

A file is written to ``.<name>.kf-tmp-<host>-<pid>-<random>`` in the destination directory,
flushed and ``fsync``-ed, renamed over the destination with ``os.replace`` (atomic on POSIX and
Windows), and the directory is ``fsync``-ed. An exception or ``KeyboardInterrupt`` removes the
temporary file and leaves the destination as it was; the temporary file of a killed writer is
removed by the next write to the same directory once its process has ended on this host.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

import numpy as np

__all__ = ["write_npz_atomically"]


def write_npz_atomically(path: Path, members: dict[str, np.ndarray]) -> None:
    """Write ``members`` as an uncompressed ``.npz`` at ``path``, all or nothing."""
    directory = path.parent if str(path.parent) else Path(".")
    _remove_stale_temporaries(directory)
    fd, tmp = _temporary(directory, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **members)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # an exception or KeyboardInterrupt: nothing is left behind and ``path`` is untouched
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


_TMP_MARK = ".kf-tmp-"
_TMP_RE = re.compile(r"^\..+\.kf-tmp-([A-Za-z0-9]*)-(\d+)-[A-Za-z0-9_]+$")


_NAME_MAX = 255  # bytes of one file name on common file systems


def _temporary(directory: Path, name: str) -> tuple[int, str]:
    """Create ``.<name>.kf-tmp-<host>-<pid>-<random>`` in ``directory``, its ``<name>`` part
    shortened so that the whole stays a legal file name, with mode ``0o666`` less the umask
    (the mode of any file the process creates; ``mkstemp`` would give ``0o600``)."""
    tail = f"{_TMP_MARK}{_host()}-{os.getpid()}-"
    room = _NAME_MAX - len(tail.encode()) - 1 - 16
    stem = os.fsencode(name)[:room].decode(errors="ignore") or "model"
    for _ in range(100):
        tmp = str(directory / f".{stem}{tail}{secrets.token_hex(8)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file in {directory}")


_O_BINARY = getattr(os, "O_BINARY", 0)


def _host() -> str:
    """This machine's name reduced to letters and digits (temporary files on a shared file
    system are only ever removed by a save on the machine that wrote them)."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:40]


def _remove_stale_temporaries(directory: Path) -> None:
    """Remove temporary files of earlier saves to ``directory`` whose writer no longer runs.

    A save killed by a signal (SIGKILL, power loss) cannot clean up after itself; its temporary
    file is named ``.<name>.kf-tmp-<host>-<pid>-<random>`` and is removed here once process
    ``pid`` of this host has ended, so a save running in another process (or on another machine
    sharing the directory) is never disturbed.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _TMP_RE.match(name)
        if match is None or match.group(1) != _host() or _process_alive(int(match.group(2))):
            continue
        try:
            os.unlink(directory / name)
        except OSError:
            pass


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
