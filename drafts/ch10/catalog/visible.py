"""Run the catalog's styles (and mistakes) through the chapter source's visible tests.

    nice .venv/bin/python drafts/ch10/catalog/visible.py [case ...]

Only the export cells, the exercises (the case's answer in place of the reference) and the test
cells run, in order; given code cells run too unless tagged (their experiments may need an exercise).
"""
import os
import re
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [HERE, ROOT]
import submissions  # noqa: E402
from coursekit.conventions import strip_solution_markers  # noqa: E402


def cells(path):
    text = open(path).read()
    parts = re.split(r"^(# %%.*)$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]


def run(answers, paths):
    ns = {"__name__": "__visible__"}
    verdicts = {}
    for path in paths:
        for header, body in cells(path):
            if "[markdown" in header or "[hidden" in header or "[written" in header:
                continue
            m = re.search(r"\[exercise (\w+)", header)
            t = re.search(r"\[test (\w+)", header)
            if m:
                body = answers.get(m.group(1), strip_solution_markers(body))
            try:
                exec(compile(body, header, "exec"), ns)
                if t:
                    verdicts[t.group(1)] = None
            except Exception as e:  # noqa: BLE001
                if t:
                    verdicts[t.group(1)] = f"{type(e).__name__}: {str(e)[:160]}"
                elif m:
                    print("   exercise cell failed", header, repr(e)[:200])
    return verdicts


if __name__ == "__main__":
    paths = [os.path.join(ROOT, "course/10_attention_kernels.py")]
    if not any("exercise paged_decoding" in open(p).read() for p in paths):
        paths.append(os.path.join(ROOT, "drafts/ch10/decoding.py"))
    cases = submissions.cases()
    for name in sys.argv[1:] or [k for k, v in cases.items() if v[0] == "correct"]:
        start = time.perf_counter()
        got = run(cases[name][1], paths)
        failed = {k: v for k, v in got.items() if v}
        print(f"{name}: {len(got) - len(failed)}/{len(got)} visible tests pass ({time.perf_counter() - start:.1f} s)")
        for k, v in failed.items():
            print(f"   {k}: {v}")
