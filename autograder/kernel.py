"""Start the grading kernel: in the OS sandbox, with its guard, its probe library, an explicit environment.

The kernel talks to the grader over ZeroMQ ``ipc`` sockets (files in the exchange
folder): in its own network namespace it has no TCP route to the grader. It is
interrupted by message, because signals from outside do not reach into its session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Any, Bool, Instance, List, Unicode

from . import cgroups, peak_memory, sandbox
from .exchange import Exchange
from .messages import msg

HERE = Path(__file__).resolve().parent
SANDBOXED = HERE / "sandboxed"  # copied into the kernel: its guard, attn_probe, attn_wire and attn_standin
INSIDE_LIB = "/tmp/.grader/lib"  # read-only inside the sandbox
INSIDE_GUARD = "/tmp/ipython/profile_default/startup/00-attn-guard.py"
INSIDE_CONNECTION = "/tmp/.grader/kernel.json"  # the kernel's copy: socket paths as it sees them


def kernel_environment(exchange: Exchange, sandboxed: bool, scratch: Path, private=()) -> dict[str, str]:
    """Everything the kernel's environment holds: nothing of the grading user's."""
    tmp = "/tmp" if sandboxed else str(scratch)
    cases, results = ((exchange.inside(exchange.cases), exchange.inside(exchange.results)) if sandboxed
                      else (str(exchange.cases), str(exchange.results)))
    rules = [("write", tmp), ("write", results), ("read", cases)]
    if not sandboxed:  # the audit hook is all there is: keep it away from the project
        rules = [("deny", str(HERE.parent)), ("deny", str(exchange.folder.parent.parent)),
                 *(("deny", str(p)) for p in private),
                 ("read", sys.prefix), ("read", sys.base_prefix), ("read", str(scratch / "lib")),
                 ("read", str(scratch / "ipython")), *rules]
    return {
        "PATH": os.pathsep.join([str(Path(sandbox.python_inside() if sandboxed else sys.executable).parent),
                                 "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": f"{tmp}/home",
        "LANG": "C.UTF-8",
        "TMPDIR": tmp,
        "IPYTHONDIR": f"{tmp}/ipython",
        "PYTHONPATH": INSIDE_LIB if sandboxed else str(scratch / "lib"),
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": f"{tmp}/matplotlib",
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": str(peak_memory.MMAP_THRESHOLD),  # large tensors show in the memory rules
        "ATTN_GRADER_CASES": cases,
        "ATTN_GRADER_RESULTS": results,
        "ATTN_GRADER_RULES": json.dumps(rules),
    }


class GradingKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in the sandbox (or, if told so, plainly)."""

    exchange = Instance(Exchange)
    scratch = Instance(Path, allow_none=True)  # host folder: unsandboxed kernel's /tmp
    sandboxed = Bool(True)
    limits = Instance(sandbox.Limits)
    private = List(Unicode(), help="folders an unsandboxed kernel's audit hook must deny")
    watchdog = Any(None)
    cgroup = Any(None)

    def __init__(self, **kwargs):
        super().__init__(kernel_name="python3", transport="ipc", **kwargs)
        self.ip = str(self.exchange.sockets / "kernel")
        # Outside the shared folder: nothing in the sandbox can rewrite what the grader connects to.
        self.connection_file = str(self.exchange.folder.parent / "connection.json")
        self.kernel_spec.interrupt_mode = "message"

    @property
    def limit_reason(self) -> str | None:
        """The limit the sandbox was stopped at, if it was."""
        return self.watchdog.reason if self.watchdog else None

    @property
    def enforcement(self) -> str | None:
        """What enforced memory and tasks ('cgroup v1', 'cgroup v2', 'watchdog'); None unsandboxed."""
        return self.watchdog.enforcement if self.watchdog and self.sandboxed else None

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        env = kernel_environment(self.exchange, self.sandboxed, self.scratch, self.private)
        python = sandbox.python_inside() if self.sandboxed else sys.executable
        argv = [python, *kernel_cmd[1:]]  # the python3 kernelspec: python -m ipykernel_launcher ...
        self._log = open(self.exchange.folder.parent / "kernel.log", "wb")  # bwrap's and the kernel's own words
        kw["stdout"], kw["stderr"] = subprocess.DEVNULL, self._log
        launch = None
        if self.sandboxed:
            files = {INSIDE_GUARD: (SANDBOXED / "guard.py").read_bytes(),
                     f"{INSIDE_LIB}/attn_probe.py": (SANDBOXED / "probe.py").read_bytes(),
                     f"{INSIDE_LIB}/attn_wire.py": (SANDBOXED / "wire.py").read_bytes(),
                     f"{INSIDE_LIB}/attn_standin.py": (SANDBOXED / "standin.py").read_bytes(),
                     INSIDE_CONNECTION: self._inside_connection()}
            argv = [INSIDE_CONNECTION if a == self.connection_file else a for a in argv]
            self.cgroup = cgroups.create(self.limits.memory, self.limits.tasks)
            launch = sandbox.command(argv, self.exchange, files, env, self.limits, self.cgroup)
            argv = launch.argv
            kw["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            kw["pass_fds"] = launch.fds
        else:
            lib, startup = self.scratch / "lib", self.scratch / "ipython" / "profile_default" / "startup"
            for d in (lib, startup, self.scratch / "work", self.scratch / "home"):
                d.mkdir(parents=True, exist_ok=True)
            (startup / "00-attn-guard.py").write_bytes((SANDBOXED / "guard.py").read_bytes())
            (lib / "attn_probe.py").write_bytes((SANDBOXED / "probe.py").read_bytes())
            (lib / "attn_wire.py").write_bytes((SANDBOXED / "wire.py").read_bytes())
            (lib / "attn_standin.py").write_bytes((SANDBOXED / "standin.py").read_bytes())
            kw["env"] = env
            kw["cwd"] = str(self.scratch / "work")
        os.chmod(self.connection_file, 0o600)
        try:
            await super()._async_launch_kernel(argv, **kw)
        finally:
            if launch is not None:
                launch.close()
        self.watchdog = sandbox.Watchdog(self.provisioner.pid, self.exchange, self.limits,
                                         kill=self._kill_now, cgroup=self.cgroup)
        return None

    def _inside_connection(self) -> bytes:
        """The connection file as the kernel needs it: its sockets at their path inside."""
        info = json.loads(Path(self.connection_file).read_text())
        info["ip"] = self.exchange.inside(Path(self.ip))
        return json.dumps(info).encode()

    # ---------------------------------------------------------- memory, read from outside
    def _processes(self):
        import psutil
        try:
            root = psutil.Process(self.provisioner.pid)
            return [root, *root.children(recursive=True)]
        except (psutil.Error, AttributeError, TypeError):
            return []

    @property
    def memory_measure(self) -> str:
        """How ``peak_memory_rise`` measures: the sandbox's cgroup ('cgroup v1', 'cgroup v2'), or
        'VmHWM' (the peak resident memory of the kernel's processes that are still running, from
        /proc: no tmpfs pages, no ended children) where the machine gives the sandbox no cgroup."""
        return getattr(self, "_memory_measure", None) or (self.cgroup.enforcement if self.cgroup is not None
                                                          else "VmHWM")

    def reset_peak_memory(self) -> None:
        """Start measuring the sandbox's peak memory from now: its cgroup's peak (every process,
        children that end, tmpfs pages), reset from outside; else each process's VmHWM."""
        watch = getattr(self, "_peak_watch", None)
        if watch is not None:
            watch.close()
        self._peak_watch = self.cgroup.watch_peak() if self.cgroup is not None else None
        if self._peak_watch is not None and self._peak_watch.works:
            self._memory_measure = self.cgroup.enforcement
            return
        self._peak_watch, self._memory_measure = None, "VmHWM"
        self._memory_before = peak_memory.reset([proc.pid for proc in self._processes()])

    def peak_memory_rise(self) -> int | None:
        """How far the sandbox's peak memory rose above its memory at the reset (None: not measured)."""
        watch, self._peak_watch = getattr(self, "_peak_watch", None), None
        if watch is not None:
            return watch.rise()
        return peak_memory.rise([proc.pid for proc in self._processes()], getattr(self, "_memory_before", None))

    def stop_unresponsive(self, seconds: float) -> None:
        """Stop a kernel that ran a cell past its limit of SECONDS and ignored the interrupt."""
        reason = msg("a cell ran past its {seconds} s limit and did not stop when interrupted",
                     seconds=f"{seconds:g}")
        if self.watchdog:
            self.watchdog.halt(reason)
        else:
            self._kill_now()

    def _kill_now(self):
        try:
            os.killpg(self.provisioner.pgid or self.provisioner.pid, 9)
        except (ProcessLookupError, PermissionError, TypeError):
            pass
        if self.cgroup is not None:
            self.cgroup.kill()

    async def _async_shutdown_kernel(self, now=False, restart=False):
        if self.watchdog:
            self.watchdog.stop()
        try:
            await super()._async_shutdown_kernel(now=now, restart=restart)
        finally:
            if self.cgroup is not None:
                self.cgroup.remove()
            if getattr(self, "_log", None):
                self._log.close()

    # AsyncKernelManager binds shutdown_kernel to the base class's function: rebind it to ours.
    shutdown_kernel = _async_shutdown_kernel

    def start_failure(self) -> str:
        """The last line the sandbox or the kernel wrote, for a kernel that would not start."""
        try:
            lines = (self.exchange.folder.parent / "kernel.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

