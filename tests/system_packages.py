"""Debian packages some tests run (Chromium, Node, npm), installed with apt-get when missing.

``make test`` runs two workers, and two test runs can share a machine (two checkouts, or
``make check`` beside ``make test``): apt refuses a second apt-get while one runs, and two npm
installs into one folder can undo each other, so installs take ``installing()``, a lock that
every test process on the machine shares.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_LOCK = Path(tempfile.gettempdir()) / "attention-course-install.lock"


@contextlib.contextmanager
def installing():
    """Hold the lock that every test process takes to install something."""
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def apt_install(package: str, binary: str) -> str:
    """The path of BINARY, installing the Debian PACKAGE that provides it if it is not on PATH."""
    found = shutil.which(binary)
    if found:
        return found
    if not shutil.which("apt-get"):
        pytest.skip(f"{binary} is not installed and apt-get is unavailable to install it")
    if os.geteuid() != 0:
        pytest.skip(f"{binary} is not installed and installing it with apt-get needs root")
    with installing():
        if not shutil.which(binary):  # another worker may have installed it while this one waited
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", package]):
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = shutil.which(binary)
    assert found, f"apt-get installed {package} but {binary} is not on PATH"
    return found


def chromium() -> str:
    """Debian's Chromium, which the browser checks run headless."""
    return apt_install("chromium", "chromium")
