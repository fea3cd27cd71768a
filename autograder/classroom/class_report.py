"""The class report: what a class run found, as tables, one self-contained HTML page and a CSV.

Read from what the class run stores: scores from the gradebook (``gradebook.db``, the
record), each test's outcome (points, verdicts: ``judge.outcome.TestOutcome.as_dict``) and the
reasons from the ledger (``.grading/ledger.jsonl``), run times from ``.grading/runs.jsonl``, and answer cells from
the submitted notebooks (for the similarity page, ``similarity``).

    class-report.html      score distribution per chapter, pass rate per exercise and per
                           hidden test, the most common named mistakes and who made them,
                           submissions that could not be graded and why, the runs' times
    class-report.csv       the same tables, long form (table, chapter, item, value, of, detail)
    class-similarity.html  per exercise, the most similar pairs of answer cells side by side
    class-similarity.csv   every pair at or above the threshold, or with the same rare wrong result

The pages are for the instructor (English), offline: figures are SVG data URIs (drawn
here), the CSS is inline and there is no script. Every value on them (student ids, exercise and
test names, messages, reasons, answer cells) is escaped by ``html_safety.text``, and each page's
Content-Security-Policy allows nothing but its own styles and data: images.
"""
from __future__ import annotations

import base64
import csv
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..html_safety import csp_meta, policy
from ..html_safety import text as _e
from .ledger import Ledger

REPORT_HTML, REPORT_CSV = "class-report.html", "class-report.csv"
SIMILARITY_HTML, SIMILARITY_CSV = "class-similarity.html", "class-similarity.csv"
RUNS = Path(".grading") / "runs.jsonl"
SHOWN_PAIRS = 25  # per exercise on the page; the CSV has them all

def lost_tests(entry: dict, grades: dict | None = None) -> list:
    """The tests a graded ledger entry lost points on, each with the named mistake of its verdict
    (``similarity.Lost``; for the similarity report's shared failures).

    Read from the entry's outcomes: the gradebook's grades (a grader's manual score over the auto
    score) when given, else the ledger's scores, and the chapter's points; a verdict's ``mistake``,
    the chapter's own name for what is wrong (a ``Mistake`` it reproduces, a check, a memory rule).
    The grader's own verdicts ("`f` raised ...", "`f`: output 0 differs from the reference") name
    none: two of them need not be the same wrong values, so they are no shared failure.
    """
    from ..chapters import known
    from .similarity import Lost
    if entry.get("status") != "ok":
        return []
    grades = grades or {}
    info = known().get(entry["chapter"])
    points = dict(info.tests) if info else {}
    scores = {t: g["score"] for t, g in grades.items()} or dict(entry.get("tests", {}))
    lost: dict[tuple[str, str], Lost] = {}
    for outcome in sorted(entry.get("outcomes", []), key=lambda o: o["exercise"]):
        test = outcome["test_id"]
        top = grades[test]["max_score"] if test in grades else points.get(test, outcome["points"])
        score = float(scores.get(test, outcome["score"]))
        for verdict in outcome["verdicts"]:
            if verdict["mistake"] is not None and score < top:
                lost.setdefault((test, verdict["mistake"]),
                                Lost(test, outcome["exercise"], score, top, verdict["mistake"]))
    return list(lost.values())


def record_run(folder: Path, started: float, summary: dict, workers: int, shard=None) -> None:
    """One line per grade-class run: when, how long, how many (for the report's throughput)."""
    path = Path(folder) / RUNS
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "seconds": round(time.time() - started, 2), "graded": summary["graded"],
            "failed": summary["failed"], "skipped": summary["skipped"], "workers": workers,
            "shard": f"{shard[0]}/{shard[1]}" if shard else "", "interrupted": bool(summary.get("interrupted"))}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def runs(folder: Path) -> list[dict]:
    """The runs recorded in FOLDER (a shard merged twice is counted once)."""
    path = Path(folder) / RUNS
    out, seen = [], set()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                run = json.loads(line)
            except ValueError:
                continue
            key = json.dumps(run, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(run)
    return out


@dataclass
class Report:
    chapters: list[str] = field(default_factory=list)
    scores: dict = field(default_factory=dict)        # chapter -> {student: score} (gradebook)
    max_score: dict = field(default_factory=dict)     # chapter -> points
    exercises: dict = field(default_factory=dict)     # chapter -> {exercise: [full, graded, points, max]}
    tests: dict = field(default_factory=dict)         # chapter -> {test: [passed, graded, points]}
    mistakes: list = field(default_factory=list)      # (chapter, exercise, mistake, [students])
    ungraded: list = field(default_factory=list)      # (student, chapter, reason)
    notes: list = field(default_factory=list)         # (student, chapter, note): cells stopped at their limit
    late: dict = field(default_factory=dict)          # (chapter, student) -> gradebook.lateness
    hand_max: dict = field(default_factory=dict)      # chapter -> points of its written answers
    pending: dict = field(default_factory=dict)       # (chapter, student) -> written points not yet graded
    runs: list = field(default_factory=list)


_SCORES = """
SELECT a.name, sa.student_id,
       SUM(COALESCE(g.manual_score, g.auto_score, 0) + COALESCE(g.extra_credit, 0)),
       COUNT(DISTINCT sn.id), COALESCE(SUM(DISTINCT sn.late_submission_penalty), 0)
FROM submitted_assignment sa
JOIN assignment a ON a.id = sa.assignment_id
LEFT JOIN submitted_notebook sn ON sn.assignment_id = sa.id
LEFT JOIN grade g ON g.notebook_id = sn.id
GROUP BY sa.id
"""


def gradebook_scores(folder: Path, chapters) -> dict:
    """chapter -> {student: total score} as nbgrader's gradebook computes it (manual over auto score,
    plus extra credit, less a late penalty), read with one SQL query (nbgrader's ORM takes seconds)."""
    import sqlite3
    out = {c: {} for c in chapters}
    path = Path(folder) / "gradebook.db"
    if not path.exists():
        return out
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for chapter, student, score, _, penalty in con.execute(_SCORES):
            if chapter in out:
                out[chapter][student] = max(0.0, float(score or 0) - float(penalty or 0))
    except sqlite3.DatabaseError as err:
        raise RuntimeError(f"the gradebook cannot be opened ({err}); is gradebook.db an nbgrader gradebook?") \
            from None
    finally:
        con.close()
    return out


def tables(folder: Path, scores: dict | None = None) -> Report:
    """Every table of the report, from the ledger, the gradebook (or given scores) and the runs.

    Only the ledger and the gradebook are read (no notebook): the chapter's points and
    hidden tests are those the ledger recorded, so a results folder is enough.
    """
    folder = Path(folder)
    entries = Ledger(folder).entries()
    report = Report()
    report.chapters = sorted({e["chapter"] for e in entries.values()})
    book = scores if scores is not None else gradebook_scores(folder, report.chapters)
    who: dict[tuple, set] = defaultdict(set)
    for chapter in report.chapters:
        mine = [e for e in entries.values() if e["chapter"] == chapter]
        report.scores[chapter] = {e["student"]: book.get(chapter, {}).get(e["student"], 0.0)
                                  for e in sorted(mine, key=lambda e: e["student"])}
        report.max_score[chapter] = max((e["max_score"] for e in mine), default=0)
        report.exercises[chapter] = {}
        # every entry names every test (0 points when it could not be graded); points from the outcomes
        points = {t: None for e in mine for t in e["tests"]}
        for e in mine:
            for outcome in e.get("outcomes", []):
                if outcome["test_id"] in points:
                    points[outcome["test_id"]] = float(outcome["points"])
        report.tests[chapter] = {t: [0, 0, 1.0 if p is None else p] for t, p in points.items()}
    from .gradebook import exercise_of, grade_scores, lateness, pending_by_hand, written_of
    grades = grade_scores(folder) if scores is None else {}
    late = lateness(folder) if scores is None else {}
    names = {c: {} for c in report.chapters}  # chapter -> {exercise: points}, from every graded entry
    for e in entries.values():
        for name, ex in e.get("exercises", {}).items():
            names[e["chapter"]].setdefault(name, ex["max_score"])
    for key in sorted(entries):
        e = entries[key]
        chapter = e["chapter"]
        if (chapter, e["student"]) in late:
            report.late[(chapter, e["student"])] = late[(chapter, e["student"])]
        waiting = pending_by_hand(grades.get((chapter, e["student"]), {}), written_of(chapter))
        if waiting:
            report.pending[(chapter, e["student"])] = waiting
        report.notes += [(e["student"], chapter, n) for n in e.get("notes", [])]
        if e["status"] != "ok":
            report.ungraded.append((e["student"], chapter, e.get("reason") or "no reason recorded"))
        # every submission counts in every table (one that could not be graded scores 0 in each
        # test), each grade as the gradebook has it (a grader's manual score over the auto score)
        tests = {t: g["score"] for t, g in grades.get((chapter, e["student"]), {}).items()
                 if t in report.tests[chapter]} or e["tests"]
        earned: dict[str, float] = {}
        for outcome in e.get("outcomes", []):
            if outcome["score"] < outcome["points"] and tests.get(outcome["test_id"], 0) < outcome["points"]:
                for verdict in outcome["verdicts"]:
                    who[(chapter, outcome["exercise"], verdict["what"])].add(e["student"])
        for test, score in tests.items():
            row = report.tests[chapter].setdefault(test, [0, 0, score])
            row[0] += score >= row[2]
            row[1] += 1
            earned[exercise_of(chapter, test)] = earned.get(exercise_of(chapter, test), 0.0) + score
        for name, top in names[chapter].items():
            row = report.exercises[chapter].setdefault(name, [0, 0, 0.0, top])
            got = earned.get(name, e.get("exercises", {}).get(name, {}).get("score", 0.0))
            row[0] += got >= top
            row[1] += 1
            row[2] += got
    report.hand_max = {c: sum(written_of(c).values()) for c in report.chapters}
    report.mistakes = sorted(((c, x, m, sorted(s)) for (c, x, m), s in who.items()),
                             key=lambda r: (-len(r[3]), r[0], r[1], r[2]))
    report.runs = runs(folder)
    return report


# --------------------------------------------------------------------------- figures

# Drawn as SVG here (rectangles and labels), not with matplotlib: its import and one figure cost a
# class run about two seconds of processor time, and an SVG's labels stay text.

def _text(x: float, y: float, words, anchor: str = "middle", size: int = 11, rotate: bool = False) -> str:
    place = f"transform='translate({x:.1f} {y:.1f}) rotate(-90)'" if rotate else f"x='{x:.1f}' y='{y:.1f}'"
    return (f"<text {place} text-anchor='{anchor}' font-family='system-ui,sans-serif' font-size='{size}' "
            f"fill='#222'>{_e(words)}</text>")


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    svg = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}'>"
           f"<rect width='100%' height='100%' fill='white'/>{_text(width / 2, 16, title, size=12)}"
           + "".join(body) + "</svg>")
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _bar(x: float, y: float, width: float, height: float, colour: str, tip: str) -> str:
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{width:.1f}' height='{height:.1f}' fill='{colour}'>"
            f"<title>{_e(tip)}</title></rect>")


def _histogram(chapter: str, scores: list[float], top: float) -> str:
    """Submissions per score: one bar per whole point up to 10 points, else ten bins."""
    top = top or max(scores, default=1) or 1
    edges = [i * top / 10 for i in range(11)] if top > 10 else [i - 0.5 for i in range(int(top) + 2)]
    counts = [0] * (len(edges) - 1)
    for score in scores:  # a bin holds [left, right), the last one its right edge too
        if edges[0] <= score <= edges[-1]:
            counts[next((i for i in range(len(counts) - 1) if score < edges[i + 1]), len(counts) - 1)] += 1
    step = -(-max(counts, default=0) // 5) or 1  # at most six whole-number ticks
    ticks = list(range(0, max(counts, default=0) + step, step)) if any(counts) else [0, 1]
    left, right, bottom, height = 48, 456, 190, 150  # the plot: x from left to right, y up from bottom
    x = lambda v: left + (v - edges[0]) / (edges[-1] - edges[0]) * (right - left)  # noqa: E731
    y = lambda n: bottom - n / ticks[-1] * height  # noqa: E731
    body = [_bar(x(a) + 0.5, y(n), x(b) - x(a) - 1, bottom - y(n), "#3b6ea5",
                 f"{f'score {a + 0.5:g}' if top <= 10 else f'scores {a:g} to {b:g}'}: {n}")
            for a, b, n in zip(edges, edges[1:], counts) if n]
    body.append(f"<path d='M{left} {bottom - height - 4}V{bottom}H{right}' stroke='#444' fill='none'/>")
    body += [_text(left - 6, y(t) + 4, t, anchor="end") for t in ticks]
    body += [_text(x(v), bottom + 15, f"{v:g}") for v in (edges if top > 10 else range(int(top) + 1))]
    body += [_text((left + right) / 2, bottom + 32, f"score (of {top:g})"),
             _text(14, bottom - height / 2, "submissions", rotate=True)]
    return _svg(470, 232, chapter, body)


def _bars(title: str, names: list[str], rates: list[float]) -> str:
    """One bar per name: the share of graded submissions with its full marks."""
    left = 12 + 6.5 * max((len(n) for n in names), default=0)  # room for the longest name
    right, top, row = left + 300, 28, 22
    bottom = top + row * len(names)
    body = []
    for i, (name, rate) in enumerate(zip(names, rates)):
        body += [_bar(left, top + i * row + 3, rate * (right - left), row - 6, "#5b9a68", f"{name}: {100 * rate:.0f} %"),
                 _text(left - 6, top + i * row + row / 2 + 4, name, anchor="end")]
    body.append(f"<path d='M{left} {top}V{bottom}H{right}' stroke='#444' fill='none'/>")
    body += [_text(left + p / 100 * (right - left), bottom + 15, p) for p in range(0, 101, 20)]
    body.append(_text((left + right) / 2, bottom + 32, "full marks (% of graded submissions)"))
    return _svg(right + 20, bottom + 42, title, body)


# --------------------------------------------------------------------------- page and CSV

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:72rem;
  padding:0 1rem;color:#222;line-height:1.4}
h1{font-size:1.6rem}h2{font-size:1.3rem;border-bottom:1px solid #ccc;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums}
.figs{display:flex;flex-wrap:wrap;gap:1rem}.figs img{border:1px solid #ddd}
.note{color:#555;font-size:.9rem}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:.5rem;margin:.3rem 0 1.2rem}
.pair pre{background:#f7f7f7;border:1px solid #ddd;padding:.5rem;margin:0;overflow-x:auto;font-size:.8rem}
.pair h4{margin:.2rem 0;font-size:.9rem}
.pair .shared{grid-column:1/-1;margin:0;background:#eef3fa;border-left:4px solid #3b6ea5;padding:.2rem .5rem;
  font-size:.85rem}
.group{background:#fff4e0;border-left:4px solid #e0a030;padding:.3rem .6rem}
details pre{background:#f7f7f7;border:1px solid #ddd;padding:.5rem;font-size:.8rem;overflow-x:auto}
"""


def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset(), cls: str = "") -> str:
    out = [f"<table class='{cls}'><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td class='n'>{_e(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _pct(a, b) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def _stats(values: list[float]) -> list:
    if not values:
        return [0, "-", "-", "-", "-"]
    return [len(values), f"{statistics.mean(values):.2f}", f"{statistics.median(values):g}",
            f"{min(values):g}", f"{max(values):g}"]


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>" + csp_meta(policy()) +
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def report_html(report: Report, folder_name: str, similarity_summary: str = "") -> str:
    parts = [f"<h1>Class report: {_e(folder_name)}</h1>",
             f"<p class='note'>Written {_e(time.strftime('%Y-%m-%d %H:%M'))} from the gradebook (scores) and "
             "the grading ledger (feedback, reasons). Every table counts every submission: one that could not be "
             "graded scores 0 in each test and exercise, so the mean, the full marks and the pass rates share "
             "one denominator (the submissions). A chapter a student never submitted is blank, never 0. "
             "Scores are the gradebook's: a grader's manual score over the auto score, less the late penalty. "
             f"The similarity of answer cells is on <a href='{SIMILARITY_HTML}'>its own page</a>"
             f"{_e(similarity_summary)}.</p>"]
    parts.append("<h2 id='scores'>Score distribution per chapter</h2><div class='figs'>")
    for chapter in report.chapters:
        values = list(report.scores[chapter].values())
        parts.append(f"<img alt='score histogram of {_e(chapter)}' "
                     f"src='{_histogram(chapter, values, report.max_score[chapter])}'>")
    parts.append("</div>")
    parts.append("<p class='note'>“of” is the automatic points; a chapter's written answers add “by hand” "
                 "points to a score once a person has graded them in formgrader, so a score may pass “of”. "
                 "“pending” counts the answered written points nobody has graded yet.</p>")
    parts.append(_table(["chapter", "submissions", "mean", "median", "min", "max", "of", "full marks",
                         "by hand", "pending"],
                        [[c, *_stats(list(report.scores[c].values())), f"{report.max_score[c]:g}",
                          sum(v >= report.max_score[c] for v in report.scores[c].values()),
                          f"{report.hand_max.get(c, 0):g}", _pending_total(report, c)]
                         for c in report.chapters], numeric=set(range(1, 10)), cls="summary"))
    parts.append("<details open><summary>Every student's score (from the gradebook; blank: not submitted)"
                 "</summary>")
    parts.append(_table(["student", *report.chapters, "late", "by hand"],
                        [[s, *[f"{report.scores[c][s]:g}" if s in report.scores[c] else "" for c in report.chapters],
                          _late(report, s), _pending(report, s)]
                         for s in sorted({s for c in report.chapters for s in report.scores[c]})],
                        numeric=set(range(1, len(report.chapters) + 1)), cls="students"))
    parts.append("</details>")
    parts.append("<h2 id='exercises'>Pass rate per exercise</h2><div class='figs'>")
    for chapter in report.chapters:
        names = list(report.exercises[chapter])
        if names:
            rows = report.exercises[chapter]
            parts.append(f"<img alt='pass rate per exercise of {_e(chapter)}' "
                         f"src='{_bars(chapter, names, [rows[n][0] / max(1, rows[n][1]) for n in names])}'>")
    parts.append("</div>")
    parts.append(_table(["chapter", "exercise", "full marks", "graded", "pass rate", "mean points", "of"],
                        [[c, n, r[0], r[1], _pct(r[0], r[1]), f"{r[2] / max(1, r[1]):.2f}", f"{r[3]:g}"]
                         for c in report.chapters for n, r in report.exercises[c].items()],
                        numeric={2, 3, 4, 5, 6}, cls="exercises"))
    parts.append("<h2 id='tests'>Pass rate per hidden test</h2>")
    parts.append(_table(["chapter", "test", "points", "passed", "graded", "pass rate"],
                        [[c, t, f"{r[2]:g}", r[0], r[1], _pct(r[0], r[1])]
                         for c in report.chapters for t, r in report.tests[c].items()],
                        numeric={2, 3, 4, 5}, cls="tests"))
    parts.append("<h2 id='mistakes'>Most common named mistakes</h2>"
                 "<p class='note'>A mistake is the message of a hidden test that lost points, without the note "
                 "of which case it failed on; counted once per student.</p>")
    parts.append(_table(["chapter", "exercise", "mistake", "students", "who"],
                        [[c, x, m, len(s), ", ".join(s)] for c, x, m, s in report.mistakes],
                        numeric={3}, cls="mistakes") if report.mistakes else "<p>None: every graded test passed.</p>")
    parts.append("<h2 id='ungraded'>Submissions that could not be graded</h2>")
    parts.append(_table(["student", "chapter", "why"], [list(r) for r in report.ungraded], cls="ungraded")
                 if report.ungraded else "<p>None.</p>")
    parts.append("<h2 id='notes'>Notes on graded submissions</h2>"
                 "<p class='note'>Cells the grader interrupted at their time limit: the tests that ran still "
                 "count, but such a notebook does not run as handed in.</p>")
    parts.append(_table(["student", "chapter", "note"], [list(r) for r in report.notes], cls="notes")
                 if report.notes else "<p>None.</p>")
    parts.append("<h2 id='runs'>Grading runs</h2>")
    if report.runs:
        parts.append(_table(["started", "shard", "workers", "graded", "could not be graded", "already graded",
                             "seconds", "submissions per minute", "ended"],
                            [[r["started"], r.get("shard") or "-", r.get("workers", ""), r["graded"], r["failed"],
                              r["skipped"], f"{r['seconds']:.1f}", _rate(r),
                              "interrupted" if r.get("interrupted") else "finished"]
                             for r in report.runs], numeric={2, 3, 4, 5, 6, 7}, cls="runs"))
    else:
        parts.append("<p>No run recorded in this folder.</p>")
    return _page(f"Class report: {folder_name}", "\n".join(parts))


def _rate(run: dict) -> str:
    """Submissions graded per minute; '-' for a run that graded none (all already graded)."""
    done = run["graded"] + run["failed"]
    return f"{60 * done / run['seconds']:.1f}" if done and run["seconds"] else "-"


def _late(report: Report, student: str) -> str:
    """Each chapter the student handed in late: how late and the penalty."""
    from .gradebook import late_text
    return "; ".join(f"{c}: {late_text(v['seconds_late'])}, -{v['penalty']:g}"
                     for (c, s), v in sorted(report.late.items()) if s == student and v["seconds_late"] > 0)


def _pending(report: Report, student: str) -> str:
    """Each chapter whose written answers wait for a person: 'CH: 2 points pending'."""
    return "; ".join(f"{c}: {v:g} points pending" for (c, s), v in sorted(report.pending.items()) if s == student)


def _pending_total(report: Report, chapter: str) -> str:
    """'4 points (2 students)' of one chapter's answered written answers nobody has graded yet."""
    waiting = [v for (c, _), v in report.pending.items() if c == chapter]
    return f"{sum(waiting):g} points ({len(waiting)} students)" if waiting else "0"


def report_rows(report: Report) -> list[list]:
    """The report's tables, long form: table, chapter, item, value, of, detail."""
    rows = []
    for c in report.chapters:
        for s, v in report.scores[c].items():
            rows.append(["score", c, s, f"{v:g}", f"{report.max_score[c]:g}", ""])
        for n, r in report.exercises[c].items():
            rows.append(["exercise full marks", c, n, r[0], r[1], f"mean points {r[2] / max(1, r[1]):.2f} of {r[3]:g}"])
        for t, r in report.tests[c].items():
            rows.append(["hidden test passed", c, t, r[0], r[1], f"points {r[2]:g}"])
    for c, x, m, s in report.mistakes:
        rows.append(["mistake", c, f"{x}: {m}", len(s), "", " ".join(s)])
    for s, c, why in report.ungraded:
        rows.append(["could not be graded", c, s, "", "", why])
    for (c, s), v in sorted(report.late.items()):
        if v["seconds_late"] > 0:
            rows.append(["late", c, s, round(v["seconds_late"]), v["penalty"], "seconds late, penalty"])
    for (c, s), v in sorted(report.pending.items()):
        rows.append(["by hand pending", c, s, f"{v:g}", f"{report.hand_max.get(c, 0):g}", "written points to grade"])
    for s, c, note in report.notes:
        rows.append(["note", c, s, "", "", note])
    for r in report.runs:
        rows.append(["run", r.get("shard", ""), r["started"], r["graded"] + r["failed"], r["seconds"],
                     f"workers {r.get('workers', '')}, already graded {r['skipped']}"
                     + (", interrupted" if r.get("interrupted") else "")])
    return rows


def same_code_groups(pairs) -> list[list[str]]:
    """Groups of cells that are the same code up to names, comments and order (score 1), largest first."""
    parent: dict[str, str] = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for p in pairs:
        if p.similar and p.score >= 0.999:
            parent[root(p.a)] = root(p.b)
    groups = defaultdict(list)
    for name in parent:
        groups[root(name)].append(name)
    return sorted((sorted(g) for g in groups.values() if len(g) > 2), key=lambda g: (-len(g), g))


def _pair_heading(p, threshold: float) -> str:
    """A pair's score as listed: whether it reached the threshold, or a cell was too short to rank."""
    if not p.ranked:
        return f"score {p.score:.2f} (a cell too short to rank)"
    if p.similar:
        return f"score {p.score:.2f} (tokens {p.tokens:.2f}, statements {p.statements:.2f})"
    return f"score {p.score:.2f} (below {threshold:.2f})"


def similarity_html(pairs_by_chapter: dict, stats_by_chapter: dict, threshold: float, folder_name: str) -> str:
    from . import similarity
    parts = [f"<h1>Similar answer cells: {_e(folder_name)}</h1>",
             "<p class='note'>This page ranks pairs of answer cells for a person to read; it accuses no one. "
             "A high score means the two cells are the same code up to names, comments, docstrings and the "
             "order of independent statements; short or heavily constrained exercises are alike in every "
             f"correct answer. Pairs scoring at least {threshold:.2f} are listed (score = the size-weighted Dice "
             "coefficient of the two cells' syntax subtrees in a canonical form; the released stub's own code is "
             "left out first). <b>(reference solution)</b> is the published reference.</p>",
             "<p class='note'>A pair is listed too, whatever its score, when both submissions lost points on the "
             "same hidden tests with the same named mistake and few in the class did (<b>same wrong result</b>: "
             "each mistake weighs log(graded / n) for the n submissions that made it, nothing when a quarter of "
             f"the class or more did; listed from {similarity.SHARED_WEIGHT:.2f}, one mistake a tenth of the "
             "class made). Such a pair may have learnt the same wrong idea together; it is a question to ask, "
             "not a finding. Pairs with both reasons come first.</p>"]
    for chapter, pairs in pairs_by_chapter.items():
        parts.append(f"<h2>{_e(chapter)}</h2>")
        stats = stats_by_chapter.get(chapter, {})
        by_exercise = defaultdict(list)
        for p in pairs:
            by_exercise[p.exercise].append(p)
        parts.append(_table(["exercise", "cells compared", "not ranked (stub or too short)", "pairs listed",
                             "with the reference", "same wrong result"],
                            [[x, s["compared"], s["not ranked"], len(by_exercise[x]),
                              sum(p.a == similarity.REFERENCE for p in by_exercise[x]),
                              sum(p.shared is not None for p in by_exercise[x])]
                             for x, s in stats.items()], numeric={1, 2, 3, 4, 5}, cls="similarity-summary"))
        for exercise, listed in by_exercise.items():
            parts.append(f"<h3>{_e(exercise)}</h3>")
            groups = same_code_groups(listed)
            cell = {}
            for p in listed:
                cell.setdefault(p.a, p.source_a)
                cell.setdefault(p.b, p.source_b)
            for members in groups:
                first = members[0]
                parts.append(f"<p class='group'><b>The same code</b> (score 1.00) in {len(members)} cells: "
                             f"{_e(', '.join(members))}.</p><details><summary>{_e(first)}'s cell</summary>"
                             f"<pre>{_e(cell[first])}</pre></details>")
                variants = defaultdict(list)  # the same code written differently: beside the first
                for m in members[1:]:
                    if cell[m] != cell[first]:
                        variants[cell[m]].append(m)
                for text, who in list(variants.items())[:SHOWN_PAIRS]:
                    parts.append(f"<div class='pair'><h4>{_e(first)}</h4><h4>{_e(', '.join(who))} &mdash; "
                                 f"the same code written differently</h4>"
                                 f"<pre>{_e(cell[first])}</pre><pre>{_e(text)}</pre></div>")
            grouped = {m: i for i, g in enumerate(groups) for m in g}
            # a pair of one group is shown by its group, unless it shares failures too
            listed = [p for p in listed if p.shared or p.a not in grouped or grouped.get(p.a) != grouped.get(p.b)]
            # the most similar pairs, and those with a shared failure however low their score
            shown = listed[:SHOWN_PAIRS] + [p for p in listed[SHOWN_PAIRS:] if p.shared][:SHOWN_PAIRS]
            for p in shown:
                parts.append(f"<div class='pair'><h4>{_e(p.a)}</h4><h4>{_e(p.b)} &mdash; "
                             f"{_e(_pair_heading(p, threshold))}</h4>"
                             + (f"<p class='shared'>{_e(p.shared.reason())}</p>" if p.shared else "")
                             + f"<pre>{_e(p.source_a)}</pre><pre>{_e(p.source_b)}</pre></div>")
            if len(listed) > len(shown):
                parts.append(f"<p class='note'>{len(listed) - len(shown)} more pairs in {SIMILARITY_CSV}.</p>")
    if not pairs_by_chapter:
        parts.append("<p>No answer cells to compare.</p>")
    return _page(f"Similar answer cells: {folder_name}", "\n".join(parts))


def shared_failures(folder: Path, chapters, gradebook: bool = True) -> dict:
    """chapter -> ``similarity.shared_failures`` of its graded submissions, from the ledger (and the
    gradebook's grades, unless gradebook is False: then the ledger's scores)."""
    from . import similarity
    from .gradebook import grade_scores
    grades = grade_scores(folder) if gradebook else {}
    lost: dict[str, dict] = {c: {} for c in chapters}
    graded = dict.fromkeys(chapters, 0)
    for e in Ledger(folder).entries().values():
        if e["chapter"] in lost and e.get("status") == "ok":
            graded[e["chapter"]] += 1
            lost[e["chapter"]][e["student"]] = lost_tests(e, grades.get((e["chapter"], e["student"])))
    return {c: similarity.shared_failures(lost[c], graded[c]) for c in chapters}


def write(folder: Path, submitted: Path | None = None, threshold: float | None = None,
          scores: dict | None = None) -> dict:
    """Write the four files into FOLDER; answer cells come from SUBMITTED (default FOLDER/submitted)."""
    from . import similarity
    folder = Path(folder).resolve()
    submitted = Path(submitted) if submitted else folder / "submitted"
    threshold = similarity.THRESHOLD if threshold is None else threshold
    timings = {}
    started = time.perf_counter()
    report = tables(folder, scores)
    timings["tables"] = time.perf_counter() - started
    started = time.perf_counter()
    pairs_by_chapter, stats_by_chapter = {}, {}
    failures = shared_failures(folder, report.chapters, scores is None)
    for chapter in report.chapters:
        students = list(report.scores[chapter])
        cells = similarity.class_cells(submitted, chapter, students)
        pairs, stats = similarity.rank(chapter, cells, similarity.stubs(chapter), similarity.reference(chapter),
                                       threshold, failures[chapter])
        pairs_by_chapter[chapter], stats_by_chapter[chapter] = pairs, stats
    timings["similarity"] = time.perf_counter() - started
    started = time.perf_counter()
    listed = sum(p.similar for ps in pairs_by_chapter.values() for p in ps)
    with_reference = sum(p.similar and p.a == similarity.REFERENCE for ps in pairs_by_chapter.values() for p in ps)
    failing = sum(p.shared is not None for ps in pairs_by_chapter.values() for p in ps)
    (folder / SIMILARITY_HTML).write_text(similarity_html(pairs_by_chapter, stats_by_chapter, threshold,
                                                          folder.name))
    with open(folder / SIMILARITY_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["chapter", "exercise", "a", "b", "score", "tokens", "statements", "ranked",
                         "shared failure weight", "same wrong result"])
        for pairs in pairs_by_chapter.values():
            for p in pairs:
                writer.writerow([p.chapter, p.exercise, p.a, p.b, f"{p.score:.3f}", f"{p.tokens:.3f}",
                                 f"{p.statements:.3f}", "yes" if p.ranked else "no",
                                 f"{p.shared.weight:.2f}" if p.shared else "", p.shared.reason() if p.shared else ""])
    (folder / REPORT_HTML).write_text(report_html(
        report, folder.name, f": {listed} pairs at or above {threshold:.2f}, {with_reference} with the reference; "
                             f"{failing} with the same rare wrong result"))
    with open(folder / REPORT_CSV, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["table", "chapter", "item", "value", "of", "detail"])
        writer.writerows(report_rows(report))
    timings["pages"] = time.perf_counter() - started
    return {"files": [folder / REPORT_HTML, folder / REPORT_CSV, folder / SIMILARITY_HTML, folder / SIMILARITY_CSV],
            "timings": timings, "report": report, "pairs": pairs_by_chapter}
