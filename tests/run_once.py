"""Work done once per test run, whichever worker process asks first (``make test`` runs two).

pytest-xdist gives each worker its own session, so a session fixture would run once per worker:
a class graded twice, the book built twice into the same folder at once. ``once`` makes the
first worker that asks do the work while the others wait for it, and hands all of them the
same (pickled) result. Without workers it simply does the work.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import tempfile
from pathlib import Path


def run_folder(tmp_path_factory) -> Path:
    """The folder every worker of this run shares: pytest's base temporary folder (a worker's own
    is one level below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def locked(path: Path):
    """Hold an exclusive lock on ``path`` (created if missing) while the block runs."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def once(shared: Path, name: str, work):
    """``work(folder)``'s result, computed by the first worker that asks, in a new folder under
    ``shared``; the others wait for it. A failure is not kept: the next worker that asks tries
    again (in a folder of its own) and reports its own error."""
    done = shared / f"{name}.result"
    with locked(shared / f"{name}.lock"):
        if done.exists():
            return pickle.loads(done.read_bytes())
        result = work(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
        done.write_bytes(pickle.dumps(result))
        return result
