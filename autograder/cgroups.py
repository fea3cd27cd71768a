"""Limits the Linux kernel enforces on one sandbox: a control group of its own (v2, or v1's memory and pids).

A process joins the group before it starts the sandbox, so everything the sandbox runs
is charged to it: memory (the private ``/tmp``'s tmpfs pages included, no swap) and the
number of processes and threads. Crossing a limit is stopped by the kernel at once (an
OOM kill, a failed fork), not found later by polling; ``crossed()`` says which limit it
was, from the group's event counters. Where no writable cgroup hierarchy with those
controllers exists, ``create`` returns None and the grader's watchdog polls instead.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from . import settings

PARENT = "attn-grader"  # one folder per hierarchy holding every sandbox's group


def _own_groups() -> dict[str, str]:
    """controller ('' for v2) -> this process's group path, from /proc/self/cgroup."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _mounts() -> dict[str, Path]:
    """controller ('' for the v2 hierarchy) -> where its hierarchy is mounted."""
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = right.split(" ")[:3]
        point = Path(left.split(" ")[4])
        if fstype == "cgroup2":
            mounts.setdefault("", point)
        elif fstype == "cgroup":
            for option in options.split(","):
                if option in ("memory", "pids"):
                    mounts.setdefault(option, point)
    return mounts


class Cgroup:
    """One sandbox's control group (one folder in v2; one per controller in v1)."""

    def __init__(self, version: int, folders: dict[str, Path], memory: int, tasks: int):
        self.version, self.folders = version, folders
        self.memory, self.tasks = memory, tasks

    @property
    def enforcement(self) -> str:
        return f"cgroup v{self.version}"

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes its pid to, to join (every hierarchy)."""
        return [str(folder / "cgroup.procs") for folder in dict.fromkeys(self.folders.values())]

    def crossed(self) -> str | None:
        """'memory' or 'tasks' once the kernel has stopped the sandbox at that limit, else None."""
        if self._events("memory", "memory.events" if self.version == 2 else "memory.oom_control").get("oom_kill"):
            return "memory"
        if self._events("pids", "pids.events").get("max"):
            return "tasks"
        return None

    def reached_memory_limit(self) -> bool:
        """Whether the group has held all the memory its limit allows, at least once (its peak;
        v1's memory.failcnt stays 0 on recent kernels)."""
        peak = self.peak_memory()
        return (peak is not None and peak >= self.memory) or \
            (self.version == 2 and bool(self._events("memory", "memory.events").get("max")))

    def peak_memory(self) -> int | None:
        """The most memory the group has held, in bytes (None where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.folders["memory"] / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def watch_peak(self) -> "PeakWatch":
        """Start measuring how far the group's memory rises from now (``PeakWatch.rise``)."""
        return PeakWatch(self.folders["memory"], self.version)

    def _events(self, controller: str, name: str) -> dict[str, int]:
        try:
            text = (self.folders[controller] / name).read_text()
        except (OSError, KeyError):
            return {}
        return {k: int(v) for k, v in (line.split() for line in text.splitlines() if len(line.split()) == 2)
                if v.isdigit()}

    def kill(self) -> None:
        """Kill every process of the group (v2's cgroup.kill, else one by one)."""
        if self.version == 2 and (self.folders["memory"] / "cgroup.kill").exists():
            try:
                (self.folders["memory"] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for folder in dict.fromkeys(self.folders.values()):
            for pid in _pids(folder):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self, wait: float = 5.0) -> None:
        """Remove the group once its processes have gone (killing any that remain)."""
        deadline = time.monotonic() + wait
        for folder in dict.fromkeys(self.folders.values()):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.05)


class PeakWatch:
    """How far one group's memory rose above what it held when the watch began, read by the grader
    from the group's own files (every process of the sandbox, the children that have already
    ended and the tmpfs pages of ``/tmp`` and ``/dev/shm`` included; no process inside can reach
    these files: the sandbox mounts no cgroupfs).

    * v1: the group's ``memory.max_usage_in_bytes`` is reset to its current usage (a write of 0);
    * v2 on Linux >= 6.12: ``memory.peak`` reset for the watch's own descriptor (a write to it);
    * older v2: ``memory.peak`` is the group's lifetime peak. A new lifetime peak is exact; below
      the old one, a thread samples ``memory.current`` every ``SAMPLE_SECONDS`` meanwhile.
    """

    SAMPLE_SECONDS = 0.002

    def __init__(self, folder: Path, version: int):
        self.folder, self.version = folder, version
        self._fd: int | None = None
        self._sampler = None
        if version == 1:
            try:
                (folder / "memory.max_usage_in_bytes").write_text("0")
                self._peak_file = "memory.max_usage_in_bytes"
            except OSError:
                self._peak_file = None
            self.before = self._read("memory.usage_in_bytes")
            return
        self._peak_file = "memory.peak"
        try:
            self._fd = os.open(folder / "memory.peak", os.O_RDWR)
            os.write(self._fd, b"reset\n")
        except OSError:  # before 6.12 the file is read-only: sample beside the lifetime peak
            if self._fd is not None:
                os.close(self._fd)
            self._fd = None
            self._lifetime = self._read("memory.peak")
            try:
                self._sampler = _Sampler(folder / "memory.current", self.SAMPLE_SECONDS)
            except OSError:
                self._peak_file = None
        self.before = self._read("memory.current")

    @property
    def works(self) -> bool:
        """Whether this group's files give a measurement (else the caller measures another way)."""
        return self.before is not None and (self._fd is not None or self._sampler is not None or
                                            self._peak_file is not None)

    def rise(self) -> int | None:
        """Bytes the group's peak rose above its memory at the start (None where it cannot say);
        the watch ends."""
        try:
            if self.before is None:
                return None
            if self._fd is not None:
                peak = _number(os.pread(self._fd, 64, 0))
            elif self._sampler is not None:
                sampled, lifetime = self._sampler.stop(), self._read("memory.peak")
                # A new lifetime peak was reached during the watch: it is the watch's peak.
                peak = lifetime if lifetime is not None and self._lifetime is not None and \
                    lifetime > self._lifetime else sampled
            else:
                peak = self._read(self._peak_file) if self._peak_file else None
            return None if peak is None else max(peak - self.before, 0)
        except OSError:
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._sampler is not None:
            self._sampler.stop()

    def _read(self, name: str) -> int | None:
        try:
            return _number((self.folder / name).read_bytes())
        except OSError:
            return None


class _Sampler:
    """The highest value of one cgroup file, read every INTERVAL seconds in a thread of its own."""

    def __init__(self, path: Path, interval: float):
        import threading
        self.highest: int | None = None
        self._done = threading.Event()
        self._fd = os.open(path, os.O_RDONLY)
        self._read()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def _read(self):
        value = _number(os.pread(self._fd, 64, 0))
        if value is not None and (self.highest is None or value > self.highest):
            self.highest = value

    def _loop(self, interval):
        while not self._done.wait(interval):
            self._read()

    def stop(self) -> int | None:
        if not self._done.is_set():
            self._done.set()
            self._thread.join()
            self._read()
            os.close(self._fd)
        return self.highest


def _number(data: bytes) -> int | None:
    try:
        return int(data.split()[0])
    except (ValueError, IndexError):
        return None


def _pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def create(memory: int, tasks: int) -> Cgroup | None:
    """A new group with these limits, or None where this machine offers none we may write."""
    if settings.current().no_cgroups:  # to measure or test the watchdog alone
        return None
    try:
        own, mounts = _own_groups(), _mounts()
    except OSError:
        return None
    name = f"sandbox-{uuid.uuid4().hex[:12]}"
    if "" in mounts and "" in own:
        group = _create_v2(mounts[""] / own[""].lstrip("/"), name, memory, tasks)
        if group:
            return group
    if "memory" in mounts and "pids" in mounts:
        return _create_v1({c: mounts[c] / own.get(c, "/").lstrip("/") for c in ("memory", "pids")},
                          name, memory, tasks)
    return None


def _create_v2(base: Path, name: str, memory: int, tasks: int) -> Cgroup | None:
    # A group with processes in it cannot hand controllers to children (v2's "no internal
    # processes" rule); the root of a cgroup namespace, as in most containers, can.
    try:
        if not {"memory", "pids"} <= set((base / "cgroup.controllers").read_text().split()):
            return None
        parent = base / PARENT
        parent.mkdir(exist_ok=True)
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            (base / "cgroup.subtree_control").write_text("+memory +pids")
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
        folder = parent / name
        folder.mkdir()
    except OSError:
        return None
    try:
        (folder / "memory.max").write_text(str(memory))
        if (folder / "memory.swap.max").exists():
            (folder / "memory.swap.max").write_text("0")
        (folder / "pids.max").write_text(str(tasks))
    except OSError:
        folder.rmdir()
        return None
    return Cgroup(2, {"memory": folder, "pids": folder}, memory, tasks)


def _create_v1(bases: dict[str, Path], name: str, memory: int, tasks: int) -> Cgroup | None:
    folders: dict[str, Path] = {}
    try:
        for controller, base in bases.items():
            folder = base / PARENT / name
            folder.mkdir(parents=True)
            folders[controller] = folder
        (folders["memory"] / "memory.limit_in_bytes").write_text(str(memory))
        if (folders["memory"] / "memory.memsw.limit_in_bytes").exists():  # no swap either
            (folders["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory))
        (folders["pids"] / "pids.max").write_text(str(tasks))
    except OSError:
        for folder in folders.values():
            try:
                folder.rmdir()
            except OSError:
                pass
        return None
    return Cgroup(1, folders, memory, tasks)
