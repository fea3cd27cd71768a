"""The operating system's boundary around a grading kernel (bubblewrap, rlimits, cgroups, a watchdog).

Inside the sandbox the kernel sees the Python environment and system libraries
read-only, a private ``/tmp`` of limited size, and one exchange folder it shares with
the grader (the kernel's sockets, the current test's inputs, its results). Nothing else
of the machine exists there: not the project, the course folder, other submissions, the
gradebook, the reference, the grader's caches, the home folder or the host's ``/tmp``.
It has its own network namespace (no network), its own PID namespace (it sees and
signals only itself), no capabilities, no new privileges, and an explicit environment;
what it can read of its own launcher (``/proc/1/cmdline``) names no host path. Its
root, ``/dev`` and the top of the exchange folder are read-only; it writes only in its
``/tmp``, its ``/dev/shm`` (both sized tmpfs) and the exchange folder's ``sockets/`` and
``results/``. A seccomp filter (``seccomp_program``, given to bubblewrap) refuses the
system calls no notebook needs and that namespaces do not separate (``DENIED_CALLS``).

Limits (defaults in ``settings.Limits``, read there with the other settings; environment variables
of the same name change them):

* rlimits set before the sandbox starts, which no process inside can raise:
  CPU seconds, size of one written file, open files;
* ``/proc`` is read-only inside, so the kernel cannot reset the peak-memory counters the
  grader reads from outside (a test's memory rule, ``HiddenTests.test(max_memory=...)``);
* a control group of its own where the machine offers one (``cgroups``): the kernel
  enforces the memory of all its processes together (tmpfs pages included, no swap)
  and their number of processes and threads;
* a watchdog in the grader's process: the wall clock and the exchange folder's size,
  always; memory and tasks by polling where no control group could be made. Crossing a
  limit kills the whole sandbox and names the limit.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from .messages import msg
from .settings import GiB, Limits, MiB  # noqa: F401 - the sandbox's limits, read with the other settings


class SandboxUnavailable(RuntimeError):
    """No OS sandbox can run here (message: one line saying how to proceed)."""


def bubblewrap() -> str:
    """Path of ``bwrap``, or a one-line reason why grading cannot be sandboxed (no bubblewrap, or
    no libseccomp to build the sandbox's system-call filter)."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "the OS sandbox needs bubblewrap: install it (Debian/Ubuntu: `apt-get install bubblewrap`), "
            "or grade without a sandbox with --unsandboxed (only for code you trust)")
    seccomp_program()
    return path


# System calls refused inside the sandbox with EPERM, as Docker's default profile refuses them:
# what namespaces do not separate, or what would widen the kernel surface a notebook can reach.
# Names libseccomp does not know (an older library than the kernel) are left out.
DENIED_CALLS = {
    # Keyrings are not namespaced: the grading user's session keyring is the sandbox's too, and
    # every kernel of a class run would share it (a channel between submissions).
    "keyrings": ("add_key", "keyctl", "request_key"),
    # Another process's memory, even inside the sandbox (the kernel needs none of it).
    "tracing": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    # Large kernel interfaces, the usual way in for a kernel exploit.
    "kernel interfaces": ("io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open", "bpf",
                          "userfaultfd", "fanotify_init", "lookup_dcookie", "open_by_handle_at"),
    # Mounts and namespaces: the sandbox's view of the files stays what bubblewrap made.
    "mounts and namespaces": ("mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
                              "fspick", "move_mount", "open_tree", "mount_setattr", "unshare", "setns"),
    # Kernel modules, kexec and the machine's own settings.
    "the machine": ("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
                    "swapon", "swapoff", "acct", "syslog", "settimeofday", "clock_settime", "quotactl",
                    "iopl", "ioperm", "uselib", "vhangup"),
}
# clone() with any of these flags makes a namespace: refused (EPERM); threads and processes are not.
CLONE_NAMESPACES = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                    "CLONE_NEWNET": 0x40000000}


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The sandbox's seccomp filter, a BPF program for ``bwrap --seccomp FD`` built by libseccomp.

    Every call of ``DENIED_CALLS`` fails with EPERM, and so does clone() with a namespace flag.
    clone3() fails with ENOSYS: its flags are in memory a filter cannot read, and ENOSYS makes
    the C library fall back to clone() for threads and processes (Docker does the same). A call
    of another architecture (32-bit int 0x80, x32) fails with ENOSYS: the filter's rules name
    this architecture's calls only. Everything else is allowed."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError):  # pyseccomp raises RuntimeError without libseccomp
        raise SandboxUnavailable(
            "the OS sandbox needs libseccomp and its Python binding pyseccomp: install them (Debian/Ubuntu: "
            "`apt-get install libseccomp2`, then `make install`), or grade without a sandbox with --unsandboxed "
            "(only for code you trust)") from None
    denied = seccomp.ERRNO(errno.EPERM)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    program.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ERRNO(errno.ENOSYS))

    def known(name: str) -> bool:
        return seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0

    for name in (name for names in DENIED_CALLS.values() for name in names if known(name)):
        program.add_rule(denied, name)
    if known("clone3"):
        program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NAMESPACES.values():
        program.add_rule(denied, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    fd = os.memfd_create("seccomp", 0)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            program.export_bpf(out)
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


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


@dataclasses.dataclass
class Launch:
    """How to start a sandbox: the command line, and descriptors it must inherit (``pass_fds``).

    Every host path and environment value goes to bwrap through ``--args FD`` (a memory
    file), never on its command line, so that ``/proc/1/cmdline`` inside (bwrap is pid 1
    there) says nothing of the host; files placed inside come as data (``--ro-bind-data``).
    The caller closes ``fds`` once the process has started.
    """
    argv: list[str]
    fds: list[int]

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass


# Joins the control group (each cgroup.procs file named before the command), then runs the
# command with an empty environment: a process joins before it forks, so all of it is charged.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 111; shift; n=$((n - 1)); done; exec "$@"'


def _memory_file(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def command(kernel_argv: list[str], exchange, files: dict[str, bytes], env: dict[str, str],
            limits: Limits, cgroup=None) -> Launch:
    """How to run ``kernel_argv`` (paths as seen inside) in the sandbox.

    exchange: the shared ``Exchange``, mounted read-only at ``exchange.INSIDE``: its
    ``sockets/`` (the kernel's own) and ``results/`` writable, its ``cases/`` read-only, all
    mount points the kernel cannot rename. files: read-only files to place inside, by their
    path inside. cgroup: a ``cgroups.Cgroup`` the sandbox runs in, if the machine offers one.
    """
    from .exchange import INSIDE
    fds: list[int] = [_memory_file("bwrap-seccomp", seccomp_program())]
    options = ["--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000", "--die-with-parent",
               "--new-session", "--cap-drop", "ALL", "--disable-userns", "--hostname", "grader", "--clearenv",
               "--seccomp", str(fds[0]),
               "--proc", "/proc", "--remount-ro", "/proc",
               # /dev's own tmpfs has no size: only /dev/shm, sized, is writable
               "--dev", "/dev", "--size", str(limits.shm), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
               "--size", str(limits.scratch), "--tmpfs", "/tmp"]
    for kind, source, target in _system_paths():
        options += [kind, source, target]
    options += ["--ro-bind", str(exchange.folder), INSIDE,
                "--bind", str(exchange.sockets), exchange.inside(exchange.sockets),
                "--ro-bind", str(exchange.cases), exchange.inside(exchange.cases),
                "--bind", str(exchange.results), exchange.inside(exchange.results)]
    for inside, data in files.items():
        fds.append(_memory_file(Path(inside).name, data))
        options += ["--ro-bind-data", str(fds[-1]), inside]
    for key, value in env.items():
        options += ["--setenv", key, value]
    # bubblewrap's root is a tmpfs with no size: read-only once everything is in place
    options += ["--dir", "/tmp/work", "--dir", "/tmp/home", "--remount-ro", "/", "--chdir", "/tmp/work"]
    fds.insert(0, _memory_file("bwrap-args", "\0".join(options).encode() + b"\0"))
    argv = [shutil.which("prlimit") or "prlimit", f"--cpu={limits.cpu_seconds}", f"--fsize={limits.file_size}",
            f"--nofile={limits.open_files}", "--core=0", bubblewrap(), "--args", str(fds[0]), *kernel_argv]
    procs = cgroup.procs_files if cgroup else []
    return Launch(["/bin/sh", "-c", _JOIN, "sh", str(len(procs)), *procs, "/usr/bin/env", "-i", *argv], fds)


class Watchdog:
    """Watches the sandbox; kills it and names the limit it crossed.

    With a control group (``cgroups``) the kernel itself stops memory and tasks at their
    limits, and the watchdog only reads which limit it was; without one it polls the
    process tree's memory and threads. Either way it polls the wall clock and the exchange
    folder (bytes and entries), which no kernel limit covers.
    """

    def __init__(self, pid: int, exchange, limits: Limits, kill, cgroup=None, interval: float = 0.2):
        self.pid, self.exchange, self.limits, self.kill, self.cgroup = pid, exchange, limits, kill, cgroup
        self.interval, self._reason = interval, None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-watchdog", daemon=True)
        self._thread.start()

    @property
    def reason(self) -> str | None:
        """The limit the sandbox was stopped at, if any (read from the kernel's counters too)."""
        if self._reason is None and self.cgroup is not None:
            self._reason = _CROSSED.get(self.cgroup.crossed(), lambda limits: None)(self.limits)
        return self._reason

    @property
    def enforcement(self) -> str:
        """Which part enforces memory and tasks, for the report."""
        return self.cgroup.enforcement if self.cgroup else "watchdog"

    def halt(self, reason: str) -> None:
        """Kill the sandbox for a reason found outside (a cell that ignored its interrupt), named
        for the memory limit instead if the sandbox reached it: a burst held there by the kernel's
        reclaim does not answer either."""
        if self._reason is None:
            held = self.cgroup is not None and self.cgroup.reached_memory_limit()
            self._reason = _CROSSED["memory"](self.limits) if held else reason
        self.kill()

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
                self._reason = reason
                self.kill()
                return

    def _check(self, root, psutil) -> str | None:
        limits = self.limits
        if time.monotonic() - self.started > limits.wall_seconds:
            return msg("the notebook ran longer than {seconds} s in all", seconds=f"{limits.wall_seconds:g}")
        if self.cgroup is not None:
            crossed = self.cgroup.crossed()
            if crossed:
                return _CROSSED[crossed](limits)
        else:
            rss, tasks = 0, 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    rss += proc.memory_info().rss
                    tasks += proc.num_threads()
                except psutil.Error:
                    pass
            if rss > limits.memory:
                return _CROSSED["memory"](limits)
            if tasks > limits.tasks:
                return _CROSSED["tasks"](limits)
        used, entries = self.exchange.usage(limits.exchange_entries)
        if used > limits.exchange or entries > limits.exchange_entries:
            return msg("the notebook wrote more than {size} or {count} files to the grader's exchange folder",
                       size=_size(limits.exchange), count=limits.exchange_entries)
        return None


_CROSSED = {
    "memory": lambda limits: msg("the notebook used more than {size} of memory", size=_size(limits.memory)),
    "tasks": lambda limits: msg("the notebook started more than {count} processes and threads", count=limits.tasks),
}


def _size(n: int) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB else f"{n / MiB:g} MiB"
