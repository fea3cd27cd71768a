"""Escape suite, system calls: what no namespace separates is refused inside the sandbox.

Keyrings are not namespaced: a key in the grading user's session keyring was listed, read and
updated from inside the sandbox, and every kernel of a class run shares that keyring. The sandbox's
seccomp filter (``sandbox.seccomp_program``) refuses the keyring calls and the other calls no
notebook needs, with EPERM. Submitted code reaches them natively through cffi (installed with
the grader's dependencies; the audit hook refuses ctypes, not cffi), as an attacker would.

One kernel answers every question here (``inside``): it is started by a process of its own, which
first puts a key in a session keyring of its own (so this test process keeps no key and no
keyring), then asks the kernel for each call's errno, which of its folders take a new file, what
its ``/proc/self/mountinfo`` names, and how ``/dev/shm`` is charged. One attack notebook is
graded through ``grade`` the same way.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys
import textwrap

import nbformat
import pytest

from support import ROOT, submission

pytestmark = [pytest.mark.pipeline,
              pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86-64")]

CHAPTER = "02_self_attention"
SECRET = b"the grader's own secret"
MiB = 2**20
SHM_WRITTEN = 192 * MiB

# name -> (x86-64 number, arguments): arguments the sandbox without its filter answers with something
# other than EPERM (in brackets), so that EPERM is the filter's own answer; init_module and kexec_load
# would fail with EPERM without their capability anyway (ENOSYS on a kernel built without modules or
# kexec, as on this course's machines). Each is called in a child of the kernel.
CLONE_NEWNS, CLONE_NEWUSER, CLONE_FS = 0x00020000, 0x10000000, 0x00000200
DENIED = {
    "keyctl": (250, (0xDEAD,)),  # an unknown operation [EOPNOTSUPP]
    "add_key": (248, (0, 0, 0, 0, -3)),  # no type [EFAULT]
    "request_key": (249, (0, 0, 0, 0)),  # [EFAULT]
    "io_uring_setup": (425, (1, 0)),  # no parameters [EFAULT]
    "ptrace": (101, (0, 0, 0, 0)),  # PTRACE_TRACEME [0: traced by bwrap]
    "perf_event_open": (298, (0, 0, -1, -1, 0)),  # no attributes [EFAULT]
    "bpf": (321, (0xDEAD, 0, 0)),  # an unknown command [EINVAL]
    "userfaultfd": (323, (1 | 0x40000000,)),  # UFFD_USER_MODE_ONLY and an unknown flag [EINVAL]
    "unshare": (272, (0,)),  # nothing to unshare [0]
    "setns": (308, (-1, 0)),  # [EBADF]
    "mount": (165, (0, 0, 0, 0, 0)),  # no target [EFAULT]
    "init_module": (175, (0, 0, 0)),
    "kexec_load": (246, (0, 0, 0, 0)),
    # clone() with a namespace flag; CLONE_FS beside it makes an unfiltered clone fail [EINVAL], not fork
    "clone(CLONE_NEWUSER)": (56, (CLONE_NEWUSER | CLONE_FS, 0, 0, 0, 0)),
    "clone(CLONE_NEWNS)": (56, (CLONE_NEWNS | CLONE_FS, 0, 0, 0, 0)),
}
ENOSYS_CALLS = {"clone3": (435, (0, 0))}  # [EINVAL]: the C library falls back to clone() on ENOSYS

WRITABLE = ["/tmp", "/dev/shm", "/exchange/sockets", "/exchange/results"]
READ_ONLY = ["/", "/etc", "/opt", "/dev", "/exchange", "/exchange/cases", "/opt/venv", "/usr"]


def _probe(key: str) -> str:
    """Kernel-side code: one JSON line of what it could do (cffi, past the audit hook) with the
    grader's key KEY (its id)."""
    return textwrap.dedent(f"""
        import cffi, errno, json, os, threading, torch
        ffi = cffi.FFI()
        ffi.cdef("long syscall(long number, ...); int *__errno_location(void); int fork(void);"
                 "void _exit(int); int open(const char *path, int flags, ...); long write(int, const void *, long);"
                 "int close(int); int unlink(const char *);")
        libc = ffi.dlopen(None)

        def arg(value):
            return ffi.cast("long", value) if isinstance(value, int) else value

        def call(number, *args):
            return 0 if libc.syscall(ffi.cast("long", number), *map(arg, args)) >= 0 else libc.__errno_location()[0]

        def in_child(number, *args):  # whatever an allowed call would do (PTRACE_TRACEME), it does in a child
            pid = libc.fork()
            if pid == 0:
                libc._exit(call(number, *args))
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        found = {{}}
        found["errno"] = {{name: in_child(number, *args) for name, (number, args) in {{**{DENIED!r}, **{ENOSYS_CALLS!r}}}.items()}}
        buf = ffi.new("char[64]")
        found["key"] = {{
            "search": call(250, 10, -3, ffi.new("char[]", b"user"), ffi.new("char[]", b"attn-grader-test"), 0),
            "read": call(250, 11, {key}, buf, 64),
            "update": call(250, 2, {key}, ffi.new("char[]", b"changed"), 7),
            "add": call(248, ffi.new("char[]", b"user"), ffi.new("char[]", b"for-the-next"), ffi.new("char[]", b"x"), 1, -3),
        }}
        found["read_bytes"] = ffi.buffer(buf, 64)[:].rstrip(b"\\0").decode("latin-1")

        def creates(folder):
            path = os.path.join(folder, "probe-new-file").encode()
            fd = libc.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ffi.cast("int", 0o600))
            if fd < 0:
                return errno.errorcode[libc.__errno_location()[0]]
            libc.close(fd)
            libc.unlink(path)
            return "created"
        found["writes"] = {{folder: creates(folder) for folder in {WRITABLE + READ_ONLY!r}}}

        # what must still work: threads (clone3 refused, so clone), a fork, torch's own threads
        box = []
        thread = threading.Thread(target=box.append, args=(1,))
        thread.start()
        thread.join()
        pid = libc.fork()
        if pid == 0:
            libc._exit(7)
        status = os.waitpid(pid, 0)[1] if pid > 0 else -1
        torch.set_num_threads(2)
        product = float((torch.ones(256, 256) @ torch.ones(256, 256)).sum())
        found["works"] = {{"thread": box == [1], "fork": os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7,
                          "torch": product == 256.0 ** 3}}
        found["seccomp"] = [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")]
        found["mounts"] = [line.split()[3:5] for line in open("/proc/self/mountinfo")]
        print(json.dumps(found))
    """)


# The shared memory's part: written natively, then the limit of /dev/shm's size.
SHM_FILL = textwrap.dedent(f"""
    import cffi, errno, os
    ffi = cffi.FFI()
    ffi.cdef("int open(const char *path, int flags, ...); long write(int, const void *, long); int *__errno_location(void);")
    libc = ffi.dlopen(None)
    chunk = ffi.new("char[]", b"x" * {MiB})
    fd = libc.open(b"/dev/shm/fill", os.O_WRONLY | os.O_CREAT, ffi.cast("int", 0o600))
    written, error = 0, None
    while written < {{limit}}:
        n = libc.write(fd, chunk, {MiB})
        if n <= 0:
            error = errno.errorcode[libc.__errno_location()[0]]
            break
        written += n
    print(written, error)
""")

# Runs in a process of its own (its session keyring, its kernel); prints one JSON line.
RUN = textwrap.dedent("""
    import ctypes, json, sys, time
    sys.path.insert(0, sys.argv[1])
    import dataclasses
    from jupyter_core.utils import run_sync
    from autograder.grading import KernelSlot
    from autograder.sandbox import Limits
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert libc.syscall(250, 1, None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: a new one, for this process alone
    secret = sys.argv[2].encode()
    key = libc.syscall(248, b"user", b"attn-grader-test", secret, len(secret), ctypes.c_long(-3))
    assert key > 0, ctypes.get_errno()
    probe, fill, shm_written = sys.argv[3], sys.argv[4], int(sys.argv[5])

    def keyring():
        buf = ctypes.create_string_buffer(256)
        ids = ctypes.c_long(libc.syscall(250, 11, ctypes.c_long(-3), buf, 256))  # KEYCTL_READ of the keyring
        payload = ctypes.create_string_buffer(64)
        n = libc.syscall(250, 11, ctypes.c_long(key), payload, 64)
        return {"keys": ids.value // 4, "payload": payload.raw[:max(n, 0)].decode("latin-1")}

    def memory(cgroup):
        if cgroup is None:
            return None
        folder = cgroup.folders["memory"]
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        usage = (folder / ("memory.current" if cgroup.version == 2 else "memory.usage_in_bytes")).read_text()
        return {"shmem": int(stat["shmem"]), "usage": int(usage),
                "pinned": int(stat["anon" if cgroup.version == 2 else "rss"]) + int(stat["shmem"])}

    report = {}
    slot = KernelSlot(limits=dataclasses.replace(Limits.from_environment(), memory=2**30))
    try:
        client = slot.kernel.client()
        client.start_channels()
        run_sync(client.wait_for_ready)(timeout=120)

        def run(code):
            out = []
            def hook(msg):
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    out.append("\\n".join(msg["content"]["traceback"]))
            run_sync(client.execute_interactive)(code, timeout=120, output_hook=hook)
            return "".join(out).strip()

        report["probe"] = run(probe.replace("GRADER_KEY_ID", str(key)))
        report["keyring"] = keyring()
        cgroup = slot.kernel.cgroup
        report["before"] = memory(cgroup)
        report["fill"] = run(fill.format(limit=shm_written))
        report["after"] = memory(cgroup)
        report["overfill"] = run(fill.format(limit=shm_written * 4))
        if cgroup is not None:
            # Anonymous memory that fits beside what the sandbox holds but its /dev/shm, not beside it all:
            # the limit is crossed only because the shared memory counts.
            held = memory(cgroup)
            report["held"] = held
            extra = 2**30 - held["pinned"] + 64 * 2**20
            client.execute(f"import numpy as np\\nextra = np.ones({extra // 8})")
            deadline = time.monotonic() + 60
            while slot.kernel.limit_reason is None and time.monotonic() < deadline:
                time.sleep(0.2)
            report["limit_reason"] = slot.kernel.limit_reason
        client.stop_channels()
    finally:
        slot.close()
    report["enforcement"] = cgroup.enforcement if cgroup is not None else None
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def inside():
    proc = subprocess.run([sys.executable, "-c", RUN, str(ROOT), SECRET.decode(), _probe("GRADER_KEY_ID"),
                           SHM_FILL, str(SHM_WRITTEN)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    try:
        report["probe"] = json.loads(report["probe"].splitlines()[-1])
    except (ValueError, IndexError):
        pytest.fail(f"the kernel's probe failed: {report['probe'][-3000:]}")
    return report


def test_the_graders_keyring_is_out_of_reach(inside):
    """The key the grading process holds is neither found, read nor changed, and no key is left
    there for the next submission."""
    assert inside["probe"]["key"] == {"search": 1, "read": 1, "update": 1, "add": 1}  # EPERM each
    assert SECRET.decode() not in inside["probe"]["read_bytes"]
    assert inside["keyring"] == {"keys": 1, "payload": SECRET.decode()}


@pytest.mark.parametrize("name", [*DENIED, *ENOSYS_CALLS])
def test_a_denied_call_fails_inside_and_the_kernel_goes_on(inside, name):
    found = inside["probe"]["errno"][name]
    assert found == (errno.ENOSYS if name in ENOSYS_CALLS else errno.EPERM), errno.errorcode.get(found, found)


def test_threads_processes_and_torch_still_work_under_the_filter(inside):
    assert inside["probe"]["works"] == {"thread": True, "fork": True, "torch": True}
    assert inside["probe"]["seccomp"] == ["2"]  # a filter is on


def test_only_tmp_shm_sockets_and_results_take_a_new_file(inside):
    writes = inside["probe"]["writes"]
    assert {folder: writes[folder] for folder in WRITABLE} == dict.fromkeys(WRITABLE, "created"), writes
    assert {folder: writes[folder] for folder in READ_ONLY} == dict.fromkeys(READ_ONLY, "EROFS"), writes


def test_mountinfo_names_only_the_bound_folders_of_the_host(inside):
    """Bubblewrap's bind mounts show their host path in mountinfo's root field, and no option of it
    hides that: the kernel learns the names of the folders bound into it (the system's, the venv,
    the Python installation, the exchange folder under the grader's scratch folder), none of which
    it can reach any further. Nothing else of the host is named there."""
    import re

    from autograder import sandbox
    roots = [root for root, _ in inside["probe"]["mounts"]]
    bound = {os.path.realpath(source) for kind, source, _ in sandbox._system_paths() if kind == "--ro-bind"}
    bwrap_own = {"/newroot", "/", "/irq", "/bus", *(f"/{device}" for device in
                                                     ("null", "zero", "full", "random", "urandom", "tty"))}
    exchange = [root for root in roots if re.fullmatch(r".*/grade-\d+-\w+/exchange(/sockets|/cases|/results)?", root)]
    placed = [root for root in roots if re.fullmatch(r"/bindfile\w+//deleted", root)]  # files given as data
    assert set(roots) - bound - bwrap_own - set(exchange) - set(placed) == set(), roots
    assert len(exchange) == 4 and len(placed) >= 4, roots
    assert {root for root in roots if root.startswith(str(ROOT))} <= {os.path.realpath(sys.prefix)}, roots


def test_dev_shm_is_sized_and_charged_to_the_sandboxs_memory(inside):
    """What /dev/shm holds is a tmpfs of the sandbox's own: its pages count in the sandbox's memory
    (its control group, no swap), and it is full at its size (the limit that holds where no control
    group can be made)."""
    from autograder.sandbox import Limits
    assert inside["fill"] == f"{SHM_WRITTEN} None"
    assert inside["overfill"] == f"{Limits().shm} ENOSPC"  # the same file, grown to the tmpfs's size
    if inside["enforcement"] is None:
        pytest.skip("no writable cgroup hierarchy here: the watchdog polls, and /dev/shm's size bounds it")
    rise = inside["after"]["shmem"] - inside["before"]["shmem"]
    assert rise >= SHM_WRITTEN, inside
    assert inside["after"]["usage"] - inside["before"]["usage"] >= SHM_WRITTEN * 0.9, inside
    # memory that would fit beside everything but the shared memory crosses the limit
    assert inside["limit_reason"] == "the notebook used more than 1 GiB of memory", inside


# ------------------------------------------------------------------ graded
KEY_ATTACK = """
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("long syscall(long number, ...);")
    libc = ffi.dlopen(None)
    L = lambda v: ffi.cast("long", v)
    key = libc.syscall(L(250), L(10), L(-3), ffi.new("char[]", b"user"), ffi.new("char[]", b"attn-grader-test"), L(0))
    buf = ffi.new("char[64]")
    read = libc.syscall(L(250), L(11), L(key), buf, L(64)) > 0 and b"secret" in ffi.buffer(buf, 64)[:]
    changed = libc.syscall(L(250), L(2), L(key), ffi.new("char[]", b"changed"), L(7)) == 0
    planted = libc.syscall(L(248), ffi.new("char[]", b"user"), ffi.new("char[]", b"for-the-next"),
                           ffi.new("char[]", b"x"), L(1), L(-3)) > 0
    ok = read or changed or planted
"""

GRADE = textwrap.dedent("""
    import ctypes, json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import warnings
    warnings.filterwarnings("ignore")
    from autograder.grading import grade
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert libc.syscall(250, 1, None) > 0  # a session keyring of this process's own
    secret = sys.argv[3].encode()
    key = libc.syscall(248, b"user", b"attn-grader-test", secret, len(secret), ctypes.c_long(-3))
    result = grade(Path(sys.argv[2])).as_json()
    buf, payload = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
    keys = libc.syscall(250, 11, ctypes.c_long(-3), buf, 256) // 4
    n = libc.syscall(250, 11, ctypes.c_long(key), payload, 64)
    print(json.dumps({"score": result.get("score"), "error": result.get("error"), "keys": keys,
                      "payload": payload.raw[:max(n, 0)].decode()}))
""")


def test_a_notebook_that_reaches_for_the_keyring_gains_nothing(tmp_path):
    """Graded through ``grade``: the answer is the reference only if the kernel read, changed or
    added a key of the grading process's session keyring."""
    from test_sandbox import attack
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(attack(KEY_ATTACK), path)
    proc = subprocess.run([sys.executable, "-c", GRADE, str(ROOT), str(path), SECRET.decode()], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"score": 0.0, "error": None, "keys": 1,
                                                                 "payload": SECRET.decode()}


def test_without_libseccomp_grading_refuses_with_one_line(tmp_path):
    """No seccomp filter can be built (no pyseccomp, or no libseccomp under it): sandboxed grading
    refuses before a kernel starts, as without bubblewrap."""
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(submission(chapter=CHAPTER), path)
    code = ("import runpy, sys\nsys.modules['pyseccomp'] = None\n"
            "sys.argv = ['autograder', 'grade', sys.argv[1], '--json']\n"
            "runpy.run_module('autograder', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "libseccomp" in lines[0] and "--unsandboxed" in lines[0], proc.stderr
