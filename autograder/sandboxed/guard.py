"""Kernel-side guard, installed as an IPython startup file before any submitted code runs.

It adds a Python audit hook (PEP 578: once added, a hook cannot be removed) that keeps
submitted code away from the course's private files (reference, instructor notebook,
gradebook, hidden tests), confines writes to the kernel's scratch folders, and refuses
to start processes, signal other processes or use ctypes. The grader never trusts the
kernel anyway; this guard only keeps the private material out of reach.
"""
import os
import sys


def _install():
    import json

    import numpy  # noqa: F401  (import before ctypes is refused: both load shared libraries)
    import torch  # noqa: F401

    rules = json.loads(os.environ.pop("ATTN_GRADER_RULES", "[]"))
    # Longest matching prefix wins: ("deny" | "read" | "write", path).
    rules = sorted(((os.path.realpath(p), kind) for kind, p in rules), key=lambda r: -len(r[0]))
    realpath, fsdecode, sep, me = os.path.realpath, os.fsdecode, os.sep, os.getpid()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def access(path):
        try:
            p = realpath(fsdecode(path))
        except (TypeError, ValueError):
            return "read"
        for root, kind in rules:
            if p == root or p.startswith(root + sep):
                return kind
        return "read"

    def refuse(what):
        raise PermissionError(f"{what} is not allowed while grading")

    path_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod",
                   "os.chown", "os.link", "os.symlink", "os.utime", "shutil.rmtree", "shutil.move",
                   "shutil.copyfile", "shutil.copytree", "os.chdir", "os.listdir", "os.scandir",
                   "sqlite3.connect", "glob.glob"}
    process_events = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                      "os.fork", "os.forkpty", "pty.spawn", "os.startfile"}

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            kind = access(path)
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & write_flags)
            if kind == "deny" or (writing and kind != "write"):
                refuse(f"opening {fsdecode(path)!r}")
        elif event in path_events:
            reading = event in ("os.listdir", "os.scandir", "os.chdir", "glob.glob", "sqlite3.connect")
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)):
                    kind = access(path)
                    if kind == "deny" or (not reading and kind != "write"):
                        refuse(f"{event} on {fsdecode(path)!r}")
        elif event in process_events:
            refuse("starting a process")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] != me:
            refuse("signalling another process")
        elif event.startswith("ctypes."):
            refuse("ctypes")
        elif event == "import" and str(args[0]).split(".")[0] in ("solutions", "autograder"):
            raise ImportError(f"{args[0]} is not available to submissions")

    sys.addaudithook(hook)


_install()
del _install
