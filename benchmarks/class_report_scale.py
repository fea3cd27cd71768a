"""Time the class report and the similarity report for a large class of one chapter.

    .venv/bin/python benchmarks/class_report_scale.py [--submissions 500] [--no-gradebook] [--json] [--keep DIR]

Makes N synthetic Chapter 2 submissions without grading them: notebooks whose answer
cells are the reference, disguised copies of it (renamed, reordered, recommented), the
independent solutions of coursekit.similarity_variants, known mistakes and untouched
stubs, mixed per exercise; a ledger entry for each with the outcomes and feedback lines grading
would have written (a few submissions "could not be graded"); and, unless
--no-gradebook, a real nbgrader gradebook holding their scores (built first, not timed).
Prints the seconds for the report's tables, the similarity ranking and the pages, and
the whole `report` as the command line runs it.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHAPTER = "02_self_attention"
MISTAKES = {
    "scaled_dot_product_attention": (
        "def scaled_dot_product_attention(query, key, value, mask=None):\n"
        "    scores = query @ key.transpose(-2, -1)\n"
        "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
        "    weights = scores.softmax(-1)\n    return weights @ value, weights\n",
        "scores not scaled by 1/sqrt(d_k)"),
    "causal_mask": ("def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).triu()\n",
                    "True is above the diagonal: that lets a token see the future"),
    "padding_mask": ("def padding_mask(lengths, max_len):\n    return torch.arange(max_len)[None] <= lengths[:, None]\n",
                     "the mask is True one position past the end of each sequence"),
    "SelfAttention": ("class SelfAttention(nn.Module):\n    def __init__(self, d_model, d_k, d_v):\n"
                      "        super().__init__()\n        self.W_q = nn.Linear(d_model, d_k)\n"
                      "        self.W_k = nn.Linear(d_model, d_k)\n        self.W_v = nn.Linear(d_model, d_v)\n\n"
                      "    def forward(self, x, mask=None):\n"
                      "        return scaled_dot_product_attention(self.W_q(x), self.W_q(x), self.W_v(x), mask)\n",
                      "the keys are computed with W_q"),
}


def synthesize(folder: Path, count: int, seed: int = 0) -> dict:
    """COURSE/submitted/<student>/<chapter>/<chapter>.ipynb and COURSE/.grading/ledger.jsonl; returns scores."""
    from autograder.classroom.ledger import Ledger
    from autograder.classroom.similarity import answer_cells
    from coursekit import conventions as C
    from coursekit import similarity_variants as V
    from coursekit.sample_submissions import reference_answers
    rng = random.Random(seed)
    learner = json.loads(C.learner_notebook(CHAPTER).read_text())
    stubs = answer_cells(C.learner_notebook(CHAPTER))
    reference = reference_answers(CHAPTER)
    disguised = V.disguised(reference)
    tests = {}
    for cell in learner["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            tests[meta["grade_id"]] = float(meta.get("points", 0))
    exercise_tests = {ex: [t for t in tests if C.exercise_of(t, list(stubs)) == ex] for ex in stubs}
    ledger = Ledger(folder)
    scores = {}
    lines = []
    for n in range(count):
        student = f"s{n:04d}"
        answers, results = {}, {}
        for ex in stubs:
            kind = rng.choices(["reference", "disguised", "independent", "mistake", "stub"], [4, 2, 3, 2, 1])[0]
            if kind == "reference":
                answers[ex], ok = reference[ex], True
            elif kind == "disguised":
                answers[ex], ok = disguised[rng.choice(list(disguised))][ex], True
            elif kind == "independent":
                answers[ex], ok = rng.choice(V.INDEPENDENT[ex]), True
            elif kind == "mistake":
                answers[ex], ok = MISTAKES[ex][0], False
            else:
                answers[ex], ok = stubs[ex], None
            results[ex] = (kind, ok)
        nb = copy.deepcopy(learner)
        for cell in nb["cells"]:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in answers and cell["metadata"]["nbgrader"].get("solution"):
                cell["source"] = answers[gid]
        path = folder / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(nb))
        entry = {"student": student, "chapter": CHAPTER, "sha256": "synthetic", "time": "2026-11-25T00:00:00",
                 "max_score": sum(tests.values()), "repairs": []}
        if n % 97 == 13:
            entry.update(status="failed", score=0.0, reason=f"{CHAPTER}.ipynb: the file is empty", exercises={},
                         tests={t: 0.0 for t in tests}, outcomes=[])
            path.write_text("")
        else:
            exercises, test_scores, outcomes = {}, {}, []
            for ex, (kind, ok) in results.items():
                feedback = []
                for t in exercise_tests[ex]:
                    got = tests[t] if ok else 0.0
                    test_scores[t] = got
                    case = f"case {rng.randint(1, 9)}"
                    # as judge.outcome.Verdict: the named mistake on one case, or the grader's own
                    verdicts = [] if ok else [
                        {"message": f"`{ex}` is not implemented yet (it raises NotImplementedError)", "mistake": None,
                         "label": "", "what": f"`{ex}` is not implemented yet"} if ok is None else
                        {"message": f"{MISTAKES[ex][1]} ({case})", "mistake": MISTAKES[ex][1], "label": case,
                         "what": MISTAKES[ex][1]}]
                    outcomes.append({"test_id": t, "exercise": ex, "points": tests[t], "score": got,
                                     "verdicts": verdicts})
                    feedback += [f"{t} ({got:g}/{tests[t]:g}): {v['message']}" for v in verdicts] or \
                        [f"{t} ({got:g}/{tests[t]:g}): passed"]
                exercises[ex] = {"score": sum(test_scores[t] for t in exercise_tests[ex]),
                                 "max_score": sum(tests[t] for t in exercise_tests[ex]), "feedback": feedback}
            entry.update(status="ok", score=sum(test_scores.values()), reason="", exercises=exercises,
                         tests=test_scores, outcomes=outcomes)
        scores[student] = entry["tests"]
        lines.append(json.dumps(entry))
    ledger.path.write_text("\n".join(lines) + "\n")
    return scores


def build_gradebook(folder: Path, scores: dict) -> None:
    """A real nbgrader gradebook with every synthetic submission's test scores (one session)."""
    from autograder.chapters import known
    from autograder.classroom.record import ensure_gradebook
    from coursekit.nbgrader_course import gradebook
    ensure_gradebook(folder, [known()[CHAPTER]])
    with gradebook(folder) as gb:
        for student, tests in scores.items():
            gb.update_or_create_student(student)
            gb.add_submission(CHAPTER, student)
            for test_id, score in tests.items():
                grade = gb.find_grade(test_id, CHAPTER, CHAPTER, student)
                grade.auto_score = score
            gb.db.commit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=500)
    parser.add_argument("--no-gradebook", action="store_true",
                        help="skip the nbgrader gradebook (scores then read as 0; tables and similarity still timed)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--keep", type=Path, help="copy the synthetic class with its reports to this folder")
    args = parser.parse_args()
    import os
    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter while the gradebook is built
    from coursekit.conventions import with_python_bin_on_path
    os.environ["PATH"] = with_python_bin_on_path()["PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp) / "class"
        scores = synthesize(course, args.submissions)
        if not args.no_gradebook:
            built = time.perf_counter()
            build_gradebook(course, scores)
            built = time.perf_counter() - built
        else:
            built = 0.0
        from autograder.classroom import class_report
        started = time.perf_counter()
        result = class_report.write(course)
        in_process = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autograder", "report", "--course", str(course)], cwd=ROOT,
                       check=True, capture_output=True)
        command = time.perf_counter() - started
        if not args.no_gradebook:  # the report's scores are the gradebook's, which are the ledger's
            shown = result["report"].scores[CHAPTER]
            assert shown == {s: sum(t.values()) for s, t in scores.items()}, "report and gradebook differ"
        if args.keep:
            import shutil
            shutil.copytree(course, args.keep, dirs_exist_ok=True)
        pairs = [p for ps in result["pairs"].values() for p in ps]
        copies = sum(p.a == "(reference solution)" for p in pairs)
        t = result["timings"]
        figures = {"submissions": args.submissions, "tables_seconds": round(t["tables"], 2),
                   "similarity_seconds": round(t["similarity"], 2), "pages_seconds": round(t["pages"], 2),
                   "report_seconds": round(in_process, 2), "command_seconds": round(command, 2),
                   "gradebook_build_seconds": round(built, 1), "pairs_listed": len(pairs),
                   "copies_found": copies,
                   "page_kib": round((course / "class-report.html").stat().st_size / 1024),
                   "similarity_page_kib": round((course / "class-similarity.html").stat().st_size / 1024)}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{args.submissions} submissions of {CHAPTER}:")
        print(f"  report tables        {figures['tables_seconds']:7.2f} s")
        print(f"  similarity           {figures['similarity_seconds']:7.2f} s  ({len(pairs)} pairs listed, "
              f"{copies} with the reference)")
        print(f"  pages and CSVs       {figures['pages_seconds']:7.2f} s")
        print(f"  all of it            {figures['report_seconds']:7.2f} s  (in one process)")
        print(f"  `autograder report`  {figures['command_seconds']:7.2f} s  (a fresh process, imports included)")


if __name__ == "__main__":
    main()
