"""Where a burst is stopped: the same bursts with the kernel's cgroup limits and with the watchdog alone.

    .venv/bin/python benchmarks/sandbox_limits.py

Each burst runs in a fresh sandboxed grading kernel, once with a cgroup of its own (where
this machine offers one) and once with ``ATTN_GRADER_NO_CGROUPS=1`` (the watchdog polls
every 0.2 s). Prints, per burst and mode: the limit named, how far memory got (the
cgroup's own peak, which counts the private /tmp; or, watchdog alone, the rise of the
processes' peak RSS, which is all a poller can see),
the threads that started, and the time until the kernel was stopped.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GiB = 2**30
BURSTS = {
    "6 GiB in one allocation (limit 4 GiB)": ({}, "import torch\nburst = torch.ones(6 * 2**30 // 4)"),
    "600 threads (limit 256)": ({}, "import threading, time\nstarted = 0\nfor _ in range(600):\n"
                                    "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
                                    "    started += 1\nprint('threads started:', started)"),
    "900 MiB in /tmp + 1 GiB (limit 1.5 GiB)": ({"MEMORY": int(1.5 * GiB)},
                                                "import numpy as np\nhalf = np.ones(450 * 2**17)\n"
                                                "half.tofile('/tmp/a')\nhalf.tofile('/tmp/b')\ndel half\n"
                                                "rest = np.ones(2**27)\nimport time\ntime.sleep(2)"),
}


def run(code: str, limits: dict, cgroups: bool) -> dict:
    import threading

    import psutil
    from jupyter_core.utils import run_sync

    from autograder.grading import KernelSlot
    saved = dict(os.environ)
    os.environ.update({f"ATTN_GRADER_LIMIT_{k}": str(v) for k, v in limits.items()})
    if not cgroups:
        os.environ["ATTN_GRADER_NO_CGROUPS"] = "1"
    try:
        slot = KernelSlot()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = {"mode": slot.kernel.enforcement, "rss": 0}
    done = threading.Event()

    def sample_rss():  # what any poller could see, sampled 50 times as often as the watchdog
        root = psutil.Process(slot.kernel.provisioner.pid)
        while not done.wait(0.004):
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                out["rss"] = max(out["rss"], rss)
            except psutil.Error:
                pass
    try:
        client = slot.kernel.client()
        client.start_channels()
        run_sync(client.wait_for_ready)(timeout=60)
        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        started = time.monotonic()
        msg_id = client.execute(code)
        printed, replied = [], False
        while time.monotonic() - started < 60 and slot.kernel.limit_reason is None and not replied:
            try:
                msg = run_sync(client.get_iopub_msg)(timeout=0.02)
                printed.append(msg["content"].get("text") or msg["content"].get("evalue") or "")
            except Exception:  # noqa: BLE001 - nothing yet
                pass
            try:
                replied = run_sync(client.get_shell_msg)(timeout=0.02)["parent_header"].get("msg_id") == msg_id
            except Exception:  # noqa: BLE001
                pass
        out["seconds"] = time.monotonic() - started
        out["reason"] = slot.kernel.limit_reason or "not stopped"
        done.set()
        group = slot.kernel.cgroup
        out["peak"] = group.peak_memory() if group else None
        out["printed"] = "".join(printed).strip()[-120:]
        client.stop_channels()
    finally:
        done.set()
        slot.close()
    return out


def main() -> None:
    import warnings
    warnings.filterwarnings("ignore")
    print("burst | enforcement | stopped at | cgroup peak (all memory, /tmp included) | "
          "highest RSS seen every 4 ms | seconds to the stop | last output")
    for name, (limits, code) in BURSTS.items():
        for cgroups in (True, False):
            r = run(code, limits, cgroups)
            peak = f"{r['peak'] / GiB:.2f} GiB" if r["peak"] else "-"
            print(f"{name} | {r['mode']} | {r['reason']} | {peak} | {r['rss'] / GiB:.2f} GiB | "
                  f"{r['seconds']:.2f} s | {r['printed'] or '-'}")


if __name__ == "__main__":
    main()
