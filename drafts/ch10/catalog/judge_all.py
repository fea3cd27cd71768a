"""Judge every case of tests/test_grading_ch10.py in process and print, per case, what it got wrong
against what the catalog expects (the grader's bugs, as data for H2 and the lead).

    cd REPO && nice .venv/bin/python drafts/ch10/catalog/judge_all.py [substring ...]
"""
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = ["tests", "."]
import support  # noqa: E402
import test_grading_ch10 as T  # noqa: E402
from catalog import outcomes_by_test, told  # noqa: E402

if __name__ == "__main__":
    cat = T.CATALOG
    kernel = {f"mistake:{k}" for k in cat.kernel_only}
    notebooks = {k: v for k, v in cat.notebooks().items()
                 if not k.startswith(("tamper:", "disguised:")) and k not in kernel
                 and (len(sys.argv) < 2 or any(s in k for s in sys.argv[1:]))}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = support.judge_notebooks(notebooks, Path(tmp))
    print(f"{len(notebooks)} notebooks judged in {time.perf_counter() - start:.0f} s")
    points = T.INFO.tests
    for key, result in results.items():
        kind, _, name = key.partition(":")
        expected = {} if kind == "correct" else cat.expected_losses(name)
        if "error" in result:
            print(f"BAD {key}: grading error {result['error']}")
            continue
        bad = []
        for test_id, o in outcomes_by_test(result).items():
            lost = o["score"] < o["points"]
            want = test_id in expected
            if lost and not want:
                bad.append(f"  extra loss {test_id}: {told(o).strip()}")
            elif want and not lost:
                bad.append(f"  not lost   {test_id} (expected '{expected[test_id]}')")
            elif want and expected[test_id] not in told(o):
                bad.append(f"  words      {test_id}: expected '{expected[test_id]}' in: {told(o).strip()}")
        print(f"{'ok ' if not bad else 'BAD'} {key}: {result['score']:g}/{sum(points.values()):g}")
        print("\n".join(bad)) if bad else None
