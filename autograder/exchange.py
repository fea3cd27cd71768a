"""The one folder the kernel and the grader share, as the grader touches it: without races.

The kernel's sockets live in ``sockets/``, a test's inputs in ``cases/`` (read-only inside
the sandbox, where it is a mount point that cannot be renamed) and its results in
``results/`` (with ``sockets/``, the only places the kernel writes, also mount points; the
folder's top is read-only inside). Code in the sandbox
can put anything where a result is expected, and swap it at any moment: a symlink to a
host file, a FIFO whose writer is gone, a folder, a huge file. So the grader never
follows a path there: it opens the folder once, reaches entries relative to that
descriptor with ``O_NOFOLLOW | O_NONBLOCK``, checks what it opened with ``fstat``
(a regular file of bounded size, nothing else) and reads from the descriptor; it
deletes with ``unlinkat`` and descriptor-based ``rmtree``, which never follow a link.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

INSIDE = "/exchange"  # where the sandboxed kernel sees the folder: nothing of the host's path
_OPEN_ENTRY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_REMOVED = 100_000  # entries one clear() deletes at most (the rest goes with the scratch folder)
MAX_DEPTH = 32


class Exchange:
    def __init__(self, folder: Path):
        self.folder = folder
        self.cases, self.results = folder / "cases", folder / "results"
        self.sockets = folder / "sockets"  # the kernel's ZeroMQ ipc sockets (it makes them)
        for d in (self.cases, self.results, self.sockets):
            d.mkdir(parents=True, exist_ok=True)

    def inside(self, path: Path) -> str:
        """The path the sandboxed kernel uses for this host path in the folder."""
        return f"{INSIDE}/{path.relative_to(self.folder)}".rstrip("/.")

    @contextlib.contextmanager
    def _open_folder(self, folder: Path):
        fd = os.open(folder, _OPEN_FOLDER)
        try:
            yield fd
        finally:
            os.close(fd)

    def read_result(self, name: str, max_bytes: int) -> bytes | None:
        """The bytes of ``results/name`` if it is a regular file of at most ``max_bytes``, else None."""
        try:
            with self._open_folder(self.results) as folder:
                fd = os.open(name, _OPEN_ENTRY, dir_fd=folder)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
                return None
            chunks, total = [], 0
            while total <= max_bytes:  # the file may still grow: read no more than allowed
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return None if total > max_bytes else b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Empty ``cases/`` and ``results/`` without following anything the kernel put there."""
        budget = [MAX_REMOVED]
        for folder in (self.cases, self.results):
            try:
                with self._open_folder(folder) as fd:
                    _empty(fd, budget, 0)
            except OSError:
                pass

    def remove(self) -> None:
        """Delete the whole folder (once its kernel is gone), following nothing."""
        try:
            with self._open_folder(self.folder) as fd:
                _empty(fd, [MAX_REMOVED * 10], 0)
            os.rmdir(self.folder)
        except OSError:
            pass

    def usage(self, max_entries: int) -> tuple[int, int]:
        """(bytes, entries) under the folder, counting no further than ``max_entries`` entries."""
        used = entries = 0
        for folder, dirs, names in os.walk(self.folder):  # os.walk follows no symlink
            for name in names + dirs:
                entries += 1
                if entries > max_entries:
                    return used, entries
                try:
                    used += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        return used, entries


def _empty(folder_fd: int, budget: list[int], depth: int) -> None:
    """Delete what the folder holds: links and files by unlinkat, folders depth first."""
    for name in os.listdir(folder_fd):
        if budget[0] <= 0:
            return
        budget[0] -= 1
        try:
            os.unlink(name, dir_fd=folder_fd)  # never follows: removes a link, not its target
            continue
        except IsADirectoryError:
            pass
        except OSError:
            continue
        if depth >= MAX_DEPTH:
            continue
        try:
            sub = os.open(name, _OPEN_FOLDER, dir_fd=folder_fd)  # swapped for a link or a FIFO: fails
        except OSError:
            continue
        try:
            _empty(sub, budget, depth + 1)
        finally:
            os.close(sub)
        try:
            os.rmdir(name, dir_fd=folder_fd)
        except OSError:
            pass
