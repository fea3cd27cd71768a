"""Kernels' scratch folders: one per grading kernel, named after the process that made it.

A grading removes its folder when it ends. A process killed outright cannot: a class run's
worker killed for overrunning (or on Ctrl-C) has its folders removed by the run that killed
it (``remove_of_process``), one that kills itself has a process of its own delete them once it has
ended (``remove_after_exit``), and folders whose process is gone for some other reason (kill -9,
a crash) are swept by the next grading process on the machine (``sweep_abandoned``).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exchange import Exchange

PREFIX = "grade-"
ABANDONED_AFTER = 600.0  # seconds unchanged before a dead process's folder is swept (a live one's
# process may sit in another PID namespace sharing this /tmp, where it looks dead from here)
_OWNER = re.compile(rf"{PREFIX}(\d+)-")
_swept = False


def parent() -> Path:
    return Path(tempfile.gettempdir()) / "attn-grader"


def new_folder() -> Path:
    """A new scratch folder for a kernel of this process (the first also sweeps abandoned ones)."""
    global _swept
    folder = parent()
    folder.mkdir(parents=True, exist_ok=True)
    if not _swept:
        _swept = True
        sweep_abandoned()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=folder))


def remove(work: Path) -> None:
    """Delete a scratch folder, following nothing its kernel left in the exchange folder."""
    exchange = work / "exchange"
    if exchange.is_dir() and not exchange.is_symlink():
        Exchange(exchange).remove()
    shutil.rmtree(work, ignore_errors=True)


def remove_of_process(pid: int) -> None:
    """Delete every scratch folder process PID made (once it and its kernels are gone)."""
    for work in parent().glob(f"{PREFIX}{pid}-*"):
        remove(work)


def remove_after_exit(pid: int) -> None:
    """Have a process of its own delete PID's scratch folders once PID has ended: for a process
    about to be killed outright with its session, which cannot delete them itself."""
    subprocess.Popen([sys.executable, "-c", "import sys; from autograder import scratch; "
                      "scratch.remove_once_ended(int(sys.argv[1]))", str(pid)],
                     cwd=Path(__file__).resolve().parent.parent, start_new_session=True,  # the kill spares it
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def remove_once_ended(pid: int, poll: float = 0.2) -> None:
    while owner_alive(pid):
        time.sleep(poll)
    remove_of_process(pid)


def sweep_abandoned() -> list[Path]:
    """Delete this user's scratch folders whose process is gone and that have not changed for
    ``ABANDONED_AFTER`` seconds; returns them."""
    now, swept = time.time(), []
    try:
        entries = list(os.scandir(parent()))
    except OSError:
        return swept
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid() \
                or now - info.st_mtime < ABANDONED_AFTER or owner_running(Path(entry.path)):
            continue
        remove(Path(entry.path))
        swept.append(Path(entry.path))
    return swept


def owner_running(work: Path) -> bool:
    """Whether the process that made scratch folder WORK still runs (a name not ours counts as yes)."""
    match = _OWNER.match(work.name)
    if not match:
        return True
    return owner_alive(int(match[1]))


def owner_alive(pid: int) -> bool:
    """Whether process PID runs (a zombie, dead but not yet reaped, does not; one not ours does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
