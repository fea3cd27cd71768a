"""Escape suite: submitted code sees, changes and reaches nothing but its own scratch.

Each attack answers `scaled_dot_product_attention` with the reference solution only if
its escape worked, so an escape would show as points. Grading inside the sandbox must
give those tests 0, change no file, and leave other students' grades as they are alone.
The same native read, graded with --unsandboxed, does get the points: proof that the
attack is real and that the OS boundary, not the audit hook, is what stops it.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import textwrap
import time
import threading
from pathlib import Path

import nbformat
import pytest

from support import ROOT, grade_notebooks, reference_answers, submission

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

CHAPTER = "02_self_attention"
SDPA_TESTS = 4  # points of scaled_dot_product_attention's tests; the rest of the notebook is stubs
SECRET = "attention-is-all-you-need"


def attack(escape: str) -> nbformat.NotebookNode:
    """A stub notebook whose first answer is correct only when ``escape`` sets ok = True."""
    body = textwrap.dedent(escape).strip()
    answer = (f"ok = False\ntry:\n{textwrap.indent(body, '    ')}\nexcept BaseException as err:\n"
              f"    print('escape failed:', type(err).__name__, err)\n"
              f"if ok:\n{textwrap.indent(reference_answers(CHAPTER)['scaled_dot_product_attention'], '    ')}\n"
              "else:\n    def scaled_dot_product_attention(query, key, value, mask=None):\n"
              "        raise NotImplementedError()\n")
    return submission({"scaled_dot_product_attention": answer}, base="stub", chapter=CHAPTER)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """What an escape would reach: a private file, a loopback service, an environment secret."""
    private = tmp_path_factory.mktemp("private") / "secret.txt"
    private.write_text(SECRET)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(SECRET.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["ATTN_TEST_SECRET"] = SECRET  # the grading process has it; the kernel must not
    yield {"private": private, "port": server.server_address[1]}
    server.shutdown()
    os.environ.pop("ATTN_TEST_SECRET", None)


def attacks(host) -> dict[str, str]:
    reference = ROOT / "solutions" / "ch02_self_attention.py"
    return {
        # Native reads (torch and numpy open files in C++; no audit event).
        "native_read_reference": f"""
            import torch
            data = torch.from_file({str(reference)!r}, size=64, dtype=torch.uint8)
            ok = b"Reference" in bytes(data.tolist())
        """,
        "numpy_memmap_private_file": f"""
            import numpy as np
            ok = bytes(np.memmap({str(host['private'])!r}, dtype=np.uint8, mode='r')).decode() == {SECRET!r}
        """,
        "native_write_reference": f"""
            import torch
            target = torch.from_file({str(reference)!r}, shared=True, size=8, dtype=torch.uint8)
            target[:] = torch.tensor(list(b"# pwned!"), dtype=torch.uint8)
            ok = True
        """,
        "list_other_students": """
            import os
            ok = any(os.path.exists(p) for p in ("/work", "/root/.cache", "/home")) and \\
                 len([p for p in os.listdir("/tmp")]) > 8
        """,
        "loopback_network": f"""
            import socket
            with socket.create_connection(("127.0.0.1", {host['port']}), timeout=2) as s:
                s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
                ok = {SECRET!r}.encode() in s.recv(4096)
        """,
        "see_other_processes": """
            import os
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            ok = len(pids) > 10
        """,
        "environment_secret": f"""
            import os
            ok = os.environ.get("ATTN_TEST_SECRET") == {SECRET!r}
        """,
        "fill_the_disk": """
            import numpy as np
            block = np.ones(2**24)
            for i in range(200):  # 26 GiB if nothing stopped it
                block.tofile(f"/tmp/fill{i}")
            ok = False
        """,
        "write_the_python_environment": """
            import numpy, torch
            target = torch.from_file(numpy.__file__, shared=True, size=8, dtype=torch.uint8)
            target[:] = 0
            ok = True
        """,
        "signal_the_grader": """
            import os, signal
            for pid in range(1, 400):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except OSError:
                        pass
            ok = False
        """,
        # pid 1 inside is bwrap: its arguments and environment must name nothing of the host.
        "read_the_launcher": f"""
            import os
            seen = b""
            for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
                for part in ("cmdline", "environ"):
                    try:
                        seen += open(f"/proc/{{pid}}/{{part}}", "rb").read()
                    except OSError:
                        pass
            ok = any(word.encode() in seen for word in ({str(ROOT)!r}, "attn-grader", "ATTN_TEST_SECRET", "/root"))
        """,
    }


ATTACKS = list(attacks({"private": Path("/private"), "port": 0}))  # the names, for parametrize


def _tree_digest(*folders: Path) -> dict[str, str]:
    digest = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not any(p in path.parts for p in (".venv", ".git", ".cache", "_build",
                                                                   "__pycache__", ".pytest_cache")):
                digest[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


@pytest.fixture(scope="module")
def graded(host, grade_catalog):
    before = _tree_digest(ROOT)
    results = grade_catalog({f"escape:{name}": attack(code) for name, code in attacks(host).items()})
    return results, before


@pytest.mark.parametrize("name", ATTACKS)
def test_escape_gains_nothing(graded, name):
    result = graded[0][f"escape:{name}"]
    assert "error" not in result, result
    assert result["score"] == 0.0, result


def test_grading_changes_no_file_of_the_project(graded):
    assert _tree_digest(ROOT) == graded[1]
    assert b"# pwned!" not in (ROOT / "solutions" / "ch02_self_attention.py").read_bytes()


def test_the_native_read_is_a_real_attack_without_the_sandbox(host, tmp_path):
    """Unsandboxed (the instructor's explicit choice), the audit hook does not stop a native read."""
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(attack(attacks(host)["numpy_memmap_private_file"]), path)
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--unsandboxed"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{CHAPTER}: {SDPA_TESTS} / 10 points"), proc.stdout[:200]
    assert "WITHOUT the OS sandbox" in proc.stdout


# ------------------------------------------------------------------ limits
# name -> (code run before the SelfAttention answer, limits for the run, words of the message)
LIMITS = {
    "memory": ("import numpy as np\nblocks = []\nwhile True:\n    blocks.append(np.ones(2**27))\n",
               {"MEMORY": 2**30}, "more than 1 GiB of memory"),
    "threads": ("import threading, time\nfor _ in range(10000):\n"
                "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
                {}, "processes and threads"),
    "exchange_flood": ("import os\nd = os.environ['ATTN_GRADER_RESULTS']\n"
                       "for i in range(10000):\n    open(os.path.join(d, f'junk{i}'), 'wb').write(b'x' * 2**20)\n",
                       {"EXCHANGE": 2**27}, "exchange folder"),
    "exchange_entries": ("import os\nd = os.environ['ATTN_GRADER_RESULTS']\n"
                         "for i in range(10**6):\n    os.mkdir(os.path.join(d, f'e{i}'))\n",
                         {"EXCHANGE_ENTRIES": 2000}, "files to the grader's exchange folder"),
    # Bursts that land far past a limit between two polls: the kernel (cgroup) stops them at it. The
    # limit is 1 GiB so that the burst reaches it well inside the cell's time limit on a busy machine
    # (filling 4 GiB took over 19 s there once; test_a_burst_is_stopped_at_the_limit_not_past_it
    # bursts past the default 4 GiB without a cell's limit).
    "memory_burst_3_GiB_at_once": ("import torch\nburst = torch.ones(3 * 2**30 // 4)\n", {"MEMORY": 2**30},
                                   "more than 1 GiB of memory"),
    "thread_burst_600": ("import threading, time\nfor _ in range(600):\n"
                         "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
                         {}, "more than 256 processes and threads"),
    "tmpfs_pages_count_as_memory": ("import numpy as np\nhalf = np.ones(450 * 2**17)\n"  # 900 MiB in /tmp
                                    "half.tofile('/tmp/a')\nhalf.tofile('/tmp/b')\ndel half\n"
                                    "rest = np.ones(2**27)\n",  # then 1 GiB of RSS
                                    {"MEMORY": int(1.5 * 2**30)}, "more than 1.5 GiB of memory"),
    # A cell past its time limit that ignores the interrupt (as native code that never checks for
    # signals does): the grader stops the kernel instead of losing the whole notebook.
    "interrupt_ignored": ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)\n",
                          {}, "did not stop when interrupted"),
}


def _hog(name: str) -> nbformat.NotebookNode:
    """The hog runs in the SelfAttention answer: earlier exercises keep their points."""
    return submission({"SelfAttention": LIMITS[name][0] + "\n" + reference_answers(CHAPTER)["SelfAttention"]},
                      chapter=CHAPTER)


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """Every case of ``LIMITS`` graded: the first by the command line, its limits set as an instructor
    sets them (``ATTN_GRADER_LIMIT_<NAME>``), beside the others in the run's grading processes, each
    in a kernel started under its own limits."""
    folder = tmp_path_factory.mktemp("limits")
    first, *rest = LIMITS
    path = folder / first / f"{CHAPTER}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(_hog(first), path)
    env = {**os.environ, **{f"ATTN_GRADER_LIMIT_{k}": str(v) for k, v in LIMITS[first][1].items()}}
    cli = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(path), "--json"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    reports = grade_notebooks({name: _hog(name) for name in rest}, folder,
                              limits={name: {k.lower(): v for k, v in LIMITS[name][1].items()} for name in rest})
    out, err = cli.communicate(timeout=600)
    reports[first] = json.loads(out) if cli.returncode == 0 else {"error": err}
    return reports


@pytest.mark.parametrize("name", list(LIMITS))
def test_a_limit_costs_only_the_tests_that_did_not_run_and_names_it(limited, name):
    data = limited[name]
    assert "error" not in data, data["error"]
    assert data["score"] == 6.0, data  # everything before SelfAttention's 4 points
    lost = " ".join(data["exercises"]["SelfAttention"]["feedback"])
    assert LIMITS[name][2] in lost, lost


def test_the_kernel_enforces_memory_and_tasks_where_cgroups_exist():
    """On this machine (root, writable cgroups) the grader's log says the kernel enforced the limits;
    the report, which the learner reads, does not."""
    from autograder import cgroups
    group = cgroups.create(2**30, 64)
    if group is None:
        pytest.skip("no writable cgroup hierarchy with memory and pids here: the watchdog polls instead")
    group.remove()
    path = ROOT / "chapters" / f"{CHAPTER}.ipynb"
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert f"enforced the sandbox's memory and task limits ({group.enforcement})" in run.stderr, run.stderr
    assert "enforced" not in run.stdout and "cgroup" not in run.stdout, run.stdout


def test_a_burst_is_stopped_at_the_limit_not_past_it():
    """6 GiB touched in one allocation stops at the 4 GiB the cgroup allows (the poller saw it too late)."""
    from jupyter_core.utils import run_sync

    from autograder.grading import KernelSlot

    slot = KernelSlot()
    if slot.kernel.cgroup is None:
        slot.close()
        pytest.skip("no writable cgroup hierarchy here")
    try:
        client = slot.kernel.client()
        client.start_channels()
        run_sync(client.wait_for_ready)(timeout=60)
        client.execute("import torch\nburst = torch.ones(6 * 2**30 // 4)")
        deadline = time.monotonic() + 120  # the killed kernel never replies: watch the sandbox instead
        while slot.kernel.limit_reason is None and time.monotonic() < deadline:
            time.sleep(0.2)
        client.stop_channels()
        peak = slot.kernel.cgroup.peak_memory()
        assert slot.kernel.limit_reason == "the notebook used more than 4 GiB of memory"
        assert peak is not None and peak <= 4 * 2**30, peak
    finally:
        slot.close()


def test_a_cell_whose_output_comes_late_keeps_its_kernel(tmp_path):
    """nbclient raises the same error when an interrupted cell does not end as when an ended cell's
    last output is later than it waits (a busy machine): only the first stops the kernel. Here every
    output is late (nbclient waits 0 s), and a correct notebook keeps full marks."""
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(submission({}, chapter=CHAPTER), path)
    code = ("import sys\nfrom pathlib import Path\nfrom autograder import execute\n"
            "execute.GuardedExecute.class_traits()['iopub_timeout'].default_value = 0\n"
            "from autograder.grading import grade\n"
            "r = grade(Path(sys.argv[1])).as_json()\nprint(r.get('score'), r.get('max_score'), r.get('error'))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split()[-3:] == ["10.0", "10.0", "None"], proc.stdout + proc.stderr[-2000:]


def test_a_sandbox_stopped_at_its_memory_limit_is_named_for_it_whatever_stopped_it():
    """A burst held at the memory limit (the kernel reclaiming, not yet killing) does not answer
    its interrupt either: when the grader stops it for that, the report names the memory limit."""
    from autograder import cgroups
    from autograder.sandbox import Limits, Watchdog
    group = cgroups.create(64 * 2**20, 64)
    if group is None:
        pytest.skip("no writable cgroup hierarchy here")
    try:
        assert not group.reached_memory_limit()
        join = "".join(f"open({f!r}, 'w').write(str(os.getpid()))\n" for f in group.procs_files)
        hog = subprocess.run([sys.executable, "-c", f"import os\n{join}x = b'x' * (256 * 2**20)\n"], timeout=60)
        assert hog.returncode != 0  # stopped at 64 MiB
        assert group.reached_memory_limit()
        killed = []
        dog = Watchdog(os.getpid(), None, Limits.from_environment(), kill=lambda: killed.append(True),
                       cgroup=group, interval=3600)
        dog.halt("a cell ran past its limit and did not stop when interrupted")
        dog.stop()
        assert killed and "of memory" in dog.reason, dog.reason
    finally:
        group.remove()


# ------------------------------------------------------------------ the exchange folder, raced
CANARY = "a host file no grader may read or delete"


def race_attack(canary: Path) -> nbformat.NotebookNode:
    """A background thread swaps every result the grader is about to read for a symlink to a host
    file or folder, a FIFO with no writer, or a folder holding a link, about a thousand times a
    second (a swapper that never sleeps only burns a core: the reads see the same four kinds)."""
    return attack(f"""
        import os, threading, time
        results, cases = os.environ["ATTN_GRADER_RESULTS"], os.environ["ATTN_GRADER_CASES"]

        def swap():
            i = 0
            while True:
                i += 1
                for name in os.listdir(cases) or ["x.json"]:
                    spare = os.path.join(results, f".spare{{i % 4}}")
                    try:
                        if i % 4 == 0:
                            os.symlink({str(canary)!r}, spare)
                        elif i % 4 == 1:
                            os.mkfifo(spare)
                        elif i % 4 == 2:
                            os.mkdir(spare)
                            os.symlink({str(canary.parent)!r}, os.path.join(spare, "host"))
                        else:
                            os.symlink({str(canary.parent)!r}, spare)
                        os.replace(spare, os.path.join(results, name))
                    except OSError:
                        pass
                    try:  # the inputs are read-only inside: a link planted there would redirect the grader's writes
                        os.symlink({str(canary)!r}, os.path.join(cases, "planted.json"))
                    except OSError:
                        pass
                time.sleep(0.001)

        threading.Thread(target=swap, daemon=True).start()
        ok = False
    """)


def test_results_swapped_in_a_loop_read_nothing_of_the_host_and_block_nothing(tmp_path):
    """The grader meets the swapper's entries where results should be; none is followed or blocks.

    The kernel's own probe may open a FIFO the swapper left and hang until the cell's limit: the
    attacker's loss, so the limit here is short (5 s) to keep the test's cost small."""
    canary = tmp_path / "host" / "canary.json"
    canary.parent.mkdir()
    canary.write_text(CANARY)
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(race_attack(canary), path)
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATTN_GRADER_CELL_TIMEOUT": "5"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["score"] == 0.0
    feedback = [line for exercise in report["exercises"].values() for line in exercise["feedback"]]  # the spec's JSON
    assert any("did not run" in line for line in feedback), feedback  # the swapper did run
    assert canary.read_text() == CANARY and sorted(p.name for p in canary.parent.iterdir()) == ["canary.json"]


def test_read_result_under_a_racing_swapper_never_follows_or_blocks(tmp_path):
    """The grader's read of one result, against a thread swapping the file as fast as it can."""
    import threading
    import time

    from autograder.exchange import Exchange

    canary = tmp_path / "canary.json"
    canary.write_text(CANARY)
    exchange = Exchange(tmp_path / "exchange")
    target, stop = exchange.results / "t.json", threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            i += 1
            spare = exchange.results / f".spare{i % 4}"
            try:
                [lambda: spare.write_text('{"probes": []}'), lambda: spare.symlink_to(canary),
                 lambda: os.mkfifo(spare), lambda: spare.mkdir()][i % 4]()
                os.replace(spare, target)
            except OSError:
                pass

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    kinds, slowest = set(), 0.0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            started = time.monotonic()
            data = exchange.read_result("t.json", 2**20)
            slowest = max(slowest, time.monotonic() - started)
            kinds.add(data)
            exchange.clear()
    finally:
        stop.set()
        thread.join()
    assert CANARY.encode() not in kinds
    assert kinds <= {None, b'{"probes": []}'} and b'{"probes": []}' in kinds, kinds
    assert slowest < 1.0, slowest
    assert canary.read_text() == CANARY


# ------------------------------------------------------------------ scratch folders
def test_abandoned_scratch_folders_are_swept_following_nothing(tmp_path, monkeypatch):
    """A dead process's folder, unchanged for a while, is removed; a live or recent one is not,
    and a link its kernel left in the exchange folder is removed, not followed."""
    from autograder import scratch
    monkeypatch.setattr(scratch.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid, canary = int(dead.stdout), tmp_path / "host" / "canary.json"
    canary.parent.mkdir()
    canary.write_text(CANARY)
    folders = {"abandoned": scratch.parent() / f"grade-{dead_pid}-a",
               "recent": scratch.parent() / f"grade-{dead_pid}-b",
               "alive": scratch.parent() / f"grade-{os.getpid()}-c"}
    for folder in folders.values():
        (folder / "exchange" / "results").mkdir(parents=True)
        (folder / "exchange" / "results" / "t.json").symlink_to(canary)
        (folder / "exchange" / "results" / "host").symlink_to(canary.parent)
    hour_ago = time.time() - 3600
    for name in ("abandoned", "alive"):
        os.utime(folders[name], (hour_ago, hour_ago))
    assert scratch.sweep_abandoned() == [folders["abandoned"]]
    assert not folders["abandoned"].exists() and folders["recent"].exists() and folders["alive"].exists()
    assert canary.read_text() == CANARY and sorted(p.name for p in canary.parent.iterdir()) == ["canary.json"]


def test_a_process_killed_with_its_session_has_its_folders_removed_after_it(tmp_path):
    """A worker past its grace kills its whole session (kill -9, nothing of it runs on): the
    process it started just before (``remove_after_exit``) removes its folders once it has ended."""
    code = textwrap.dedent("""
        import os, signal, time
        from autograder import scratch
        os.setsid()
        for _ in range(2):
            (scratch.new_folder() / "exchange" / "results").mkdir(parents=True)
        print(os.getpid(), flush=True)
        scratch.remove_after_exit(os.getpid())
        os.killpg(0, signal.SIGKILL)
        time.sleep(60)
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    made = list((tmp_path / "attn-grader").glob(f"grade-{int(proc.stdout)}-*"))
    deadline = time.monotonic() + 30
    while any(p.exists() for p in made) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p.name for p in (tmp_path / "attn-grader").iterdir()]


def test_a_spare_kernel_boot_interrupted_leaves_no_kernel_and_no_folder(monkeypatch):
    """Ctrl-C (or a class run's end) while the next submission's kernel boots: neither that kernel
    nor the one taken for the current submission is left running or leaves its folder."""
    from autograder import grading, scratch
    # a kernel's socket path is short: its real parent, shared with other test workers (their folders
    # come and go meanwhile); this process's folders are named by its pid
    mine = f"{scratch.PREFIX}{os.getpid()}-*"
    before = set(scratch.parent().glob(mine))
    boots, pids, started = [], [], grading.GradingKernelManager.start_kernel

    async def start_kernel(self, **kw):
        boots.append(self)
        if len(boots) == 2:
            raise KeyboardInterrupt
        await started(self, **kw)
        pids.append(self.provisioner.pid)

    monkeypatch.setattr(grading.GradingKernelManager, "start_kernel", start_kernel)
    relay = grading.KernelRelay(sandboxed=False)
    with pytest.raises(KeyboardInterrupt):
        relay.take(ROOT / "chapters" / f"{CHAPTER}.ipynb", CHAPTER, boot_next=True)
    assert len(pids) == 1 and not scratch.owner_alive(pids[0])
    assert relay.spare is None and set(scratch.parent().glob(mine)) == before


# ------------------------------------------------------------------ class mode
def test_class_run_attackers_gain_nothing_and_change_nobody_else(tmp_path):
    """In a class run, attackers aim at other students' work and the class gradebook."""
    from autograder.grading import grade
    course = (tmp_path / "my-class").resolve()
    victim = course / "submitted" / "ada" / CHAPTER / f"{CHAPTER}.ipynb"
    notebooks = {
        "ada": submission(chapter=CHAPTER),
        "ben": submission({"causal_mask": "def causal_mask(n):\n    return torch.ones(n, n).bool().triu()\n"},
                          chapter=CHAPTER),
        "mallory": attack(f"""
            import torch
            data = torch.from_file({str(victim)!r}, size=256, dtype=torch.uint8)
            ok = b"cells" in bytes(data.tolist())
        """),
        "trudy": attack(f"""
            import torch
            for target in ({str(victim)!r}, {str(course / 'gradebook.db')!r}):
                t = torch.from_file(target, shared=True, size=16, dtype=torch.uint8)
                t[:] = 0
            ok = True
        """),
    }
    for student, nb in notebooks.items():
        path = course / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    submitted_before = _tree_digest(course / "submitted")
    alone = {}
    for student in ("ada", "ben"):
        copy = tmp_path / "alone" / student / f"{CHAPTER}.ipynb"
        copy.parent.mkdir(parents=True)
        copy.write_bytes((course / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb").read_bytes())
        alone[student] = grade(copy).as_json()["score"]
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade-class", "--course", "my-class",
                           "--workers", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = [json.loads(line) for line in (course / ".grading" / "ledger.jsonl").read_text().splitlines()]
    scores = {e["student"]: e["score"] for e in ledger}
    assert scores == {"ada": alone["ada"], "ben": alone["ben"], "mallory": 0.0, "trudy": 0.0}, scores
    assert _tree_digest(course / "submitted") == submitted_before


# ------------------------------------------------------------------ memory rules, read from outside
def test_peak_memory_is_read_from_outside_and_cannot_be_reset_inside():
    """What a test's memory rule (HiddenTests.test(max_memory=...)) relies on."""
    from jupyter_core.utils import run_sync

    from autograder.grading import KernelSlot

    slot = KernelSlot()
    try:
        client = slot.kernel.client()
        client.start_channels()
        run_sync(client.wait_for_ready)(timeout=60)

        def run(code):
            reply = run_sync(client.execute_interactive)(code, timeout=60, output_hook=lambda msg: None)
            return reply["content"]["status"]

        slot.kernel.reset_peak_memory()
        assert run("import numpy as np\nbig = np.ones(2**25)\ndel big") == "ok"  # 256 MiB, then freed
        assert slot.kernel.peak_memory_rise() > 200 * 2**20
        slot.kernel.reset_peak_memory()
        assert run("small = list(range(1000))") == "ok"
        assert slot.kernel.peak_memory_rise() < 50 * 2**20
        slot.kernel.reset_peak_memory()
        run("import numpy as np\nbig = np.ones(2**25)\ndel big\n"
            "open('/proc/self/clear_refs', 'w').write('5')")  # read-only inside: the peak stays
        assert slot.kernel.peak_memory_rise() > 200 * 2**20
        client.stop_channels()
    finally:
        slot.close()


def test_without_bubblewrap_grading_refuses_with_one_line(tmp_path):
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(submission(chapter=CHAPTER), path)
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": str(tmp_path)})  # no bwrap on this PATH
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bubblewrap" in lines[0] and "--unsandboxed" in lines[0], proc.stderr
