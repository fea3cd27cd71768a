"""The operating system's boundary around a grading kernel (bubblewrap, rlimits, a watchdog).

Inside the sandbox the kernel sees the Python environment and system libraries
read-only, a private ``/tmp`` of limited size, and one exchange folder it shares with
the grader (the kernel's sockets, the current test's inputs, its results). Nothing else
of the machine exists there: not the project, the course folder, other submissions, the
gradebook, the reference, the grader's caches, the home folder or the host's ``/tmp``.
It has its own network namespace (no network), its own PID namespace (it sees and
signals only itself), no capabilities, no new privileges, and an explicit environment.

Limits (defaults below; environment variables of the same name change them):

* rlimits set before the sandbox starts, which no process inside can raise:
  CPU seconds, size of one written file, open files;
* ``/proc`` is read-only inside, so the kernel cannot reset the peak-memory counters the
  grader reads from outside (a test's memory rule, ``HiddenTests.test(max_memory=...)``);
* a watchdog in the grader's process: memory of all the sandbox's processes together,
  their number of threads, the exchange folder's size, and the wall clock. Crossing one
  kills the whole sandbox and names the limit.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import threading
import time
from pathlib import Path

GiB, MiB = 2**30, 2**20


@dataclasses.dataclass(frozen=True)
class Limits:
    memory: int = 4 * GiB  # resident memory of the whole sandbox
    tasks: int = 256  # processes and threads of the whole sandbox
    cpu_seconds: int = 1800
    file_size: int = 512 * MiB  # one written file
    open_files: int = 1024
    scratch: int = 1 * GiB  # the private /tmp
    exchange: int = 512 * MiB  # the folder shared with the grader
    wall_seconds: float = 1800.0

    @classmethod
    def from_environment(cls) -> "Limits":
        """Defaults, changed by ATTN_GRADER_LIMIT_<NAME> (bytes, seconds or a count)."""
        values = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"ATTN_GRADER_LIMIT_{field.name.upper()}")
            if raw:
                values[field.name] = float(raw) if field.type == "float" else int(float(raw))
        return cls(**values)


class SandboxUnavailable(RuntimeError):
    """No OS sandbox can run here (message: one line saying how to proceed)."""


def bubblewrap() -> str:
    """Path of ``bwrap``, or a one-line reason why grading cannot be sandboxed."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "the OS sandbox needs bubblewrap: install it (Debian/Ubuntu: `apt-get install bubblewrap`), "
            "or grade without a sandbox with --unsandboxed (only for code you trust)")
    return path


def _system_paths() -> list[tuple[str, str]]:
    """What the kernel may read: the system's libraries and this Python (bind mounts)."""
    binds = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            binds.append(("--symlink", os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append(("--ro-bind", top, top))
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/fonts",
                "/etc/alternatives", "/etc/nsswitch.conf", "/etc/mime.types"):
        if os.path.exists(etc):
            binds.append(("--ro-bind", etc, etc))
    # The interpreter at its own path (a venv's python links to it), the venv at VENV_INSIDE,
    # so that no folder of the project appears inside.
    base = os.path.realpath(sys.base_prefix)
    if not base.startswith(("/usr/", "/bin", "/lib")):
        binds.append(("--ro-bind", base, base))
    if in_venv():
        binds.append(("--ro-bind", sys.prefix, VENV_INSIDE))
    return binds


VENV_INSIDE = "/opt/venv"


def in_venv() -> bool:
    return os.path.realpath(sys.prefix) != os.path.realpath(sys.base_prefix)


def python_inside() -> str:
    """The interpreter's path inside the sandbox."""
    return f"{VENV_INSIDE}/bin/python" if in_venv() else sys.executable


def command(kernel_argv: list[str], exchange: Path, files: dict[str, Path], env: dict[str, str],
            limits: Limits) -> list[str]:
    """The command that runs ``kernel_argv`` in the sandbox.

    exchange: a host folder shared read-write, mounted at the same path inside (the
    kernel's connection file names its sockets by host path). files: read-only files
    to place inside, by their path inside.
    """
    argv = ["prlimit", f"--cpu={limits.cpu_seconds}", f"--fsize={limits.file_size}",
            f"--nofile={limits.open_files}", "--core=0",
            bubblewrap(), "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--disable-userns", "--hostname", "grader", "--clearenv",
            "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
            "--size", str(limits.scratch), "--tmpfs", "/tmp"]
    for kind, source, target in _system_paths():
        argv += [kind, source, target]
    argv += ["--bind", str(exchange), str(exchange)]
    for inside, source in files.items():
        argv += ["--ro-bind", str(source), inside]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--dir", "/tmp/work", "--dir", "/tmp/home", "--chdir", "/tmp/work", "--"]
    return argv + kernel_argv


class Watchdog:
    """Polls the sandbox's process tree; kills it and names the limit it crossed."""

    def __init__(self, pid: int, exchange: Path, limits: Limits, kill, interval: float = 0.2):
        self.pid, self.exchange, self.limits, self.kill = pid, exchange, limits, kill
        self.interval, self.reason = interval, None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-watchdog", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self):
        import psutil
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.wait(self.interval):
            try:
                reason = self._check(root, psutil)
            except psutil.Error:
                continue
            if reason:
                self.reason = reason
                self.kill()
                return

    def _check(self, root, psutil) -> str | None:
        limits = self.limits
        if time.monotonic() - self.started > limits.wall_seconds:
            return f"the notebook ran longer than {limits.wall_seconds:g} s in all"
        rss, tasks = 0, 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                rss += proc.memory_info().rss
                tasks += proc.num_threads()
            except psutil.Error:
                pass
        if rss > limits.memory:
            return f"the notebook used more than {_size(limits.memory)} of memory"
        if tasks > limits.tasks:
            return f"the notebook started more than {limits.tasks} processes and threads"
        used = 0
        for folder, _, names in os.walk(self.exchange):
            for name in names:
                try:
                    used += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        if used > limits.exchange:
            return f"the notebook wrote more than {_size(limits.exchange)} to the grader's exchange folder"
        return None


def _size(n: int) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB else f"{n / MiB:g} MiB"
