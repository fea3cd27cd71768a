"""A whole term's workflow on a generated class of 31 students, timed, with every number cross-checked.

    .venv/bin/python benchmarks/class_end_to_end.py [--out FOLDER] [--cell-timeout 60] [--screenshot PNG]

Two chapters (2: 26 students, 1: 8 students), handed in three ways: nbgrader's exchange layout
(Unicode names, a late submission, a syntax error, a deleted test cell, an endless loop, tampering, a
Chapter 1 notebook in Chapter 2's folder), a Canvas download (resubmissions, a late upload, an empty
file, a file that is not JSON, a newer notebook format, one half of a copied pair) and a Moodle
download (Chapter 1, one Chapter 2 notebook handed in there). Then, as an instructor would:

1. ``release`` both chapters with a due date and a late policy of 1 point per started day;
2. ``collect`` each source (every file's fate is checked against what it should be);
3. a Chapter 8 notebook put straight into ``submitted/`` (``grade-class`` must refuse it);
4. ``grade-class``;
5. formgrader (``jupyter server`` with nbgrader's extension, the course folder as its root): its API
   lists every submission autograded; its manual-grading page of one notebook, opened in headless
   Chromium, shows the autograded scores (screenshot); a written answer and one lost test are scored
   by hand in that page's boxes, as an instructor types them;
6. a late resubmission collected and ``grade-class`` again (only it is regraded), then
   ``grade-class --force`` (every manual score must survive);
7. ``report``, ``export``, ``export --format canvas`` and ``--format moodle``, ``nbgrader export``.

Every submission's score must be one number in all of: nbgrader's ``grades.csv``, formgrader's API,
``class-grades.csv``, the class report (page and CSV), the Canvas and Moodle files; and the named cases
must score what they should. The script prints the time of each step, and exits 1 on any disagreement.
The submissions contain the reference solution: instructors only, like ``examples/sample_class.py``.
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the book tests' Chromium driver

from coursekit.conventions import with_python_bin_on_path  # noqa: E402
from coursekit.sample_submissions import learner_notebook, submission  # noqa: E402

CH1, CH2, CH8 = "01_bahdanau_attention", "02_self_attention", "08_modern_attention"
WRITTEN = {CH1: "written_weekday_weights", CH2: "written_key_bias_gradient"}
DUE = datetime.datetime(2026, 3, 1, 23, 59, tzinfo=datetime.timezone.utc)
ON_TIME = DUE - datetime.timedelta(days=2)

UNSCALED = ("def scaled_dot_product_attention(query, key, value, mask=None):\n"
            "    scores = query @ key.transpose(-2, -1)  # not divided by sqrt(d_k)\n"
            "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = torch.softmax(scores, dim=-1)\n    return weights @ value, weights\n")
UPPER = "def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).triu()\n"
# a correct answer in a style of its own, and a classmate's copy of it with new names and comments
EINSUM = ("def scaled_dot_product_attention(query, key, value, mask=None):\n"
          "    d = query.size(-1)\n"
          "    logits = torch.einsum('...qd,...kd->...qk', query, key) / d ** 0.5\n"
          "    if mask is not None:\n        logits = logits.masked_fill(~mask, float('-inf'))\n"
          "    attn = logits.softmax(dim=-1)\n"
          "    return torch.einsum('...qk,...kd->...qd', attn, value), attn\n")
EINSUM_COPY = ("def scaled_dot_product_attention(q, k, v, mask=None):\n"
               "    # scale by the head size\n    size = q.size(-1)\n"
               "    s = torch.einsum('...qd,...kd->...qk', q, k) / size ** 0.5\n"
               "    if mask is not None:\n        s = s.masked_fill(~mask, float('-inf'))  # hide\n"
               "    p = s.softmax(dim=-1)\n"
               "    return torch.einsum('...qk,...kd->...qd', p, v), p\n")
TAMPERING = "import torch\ntorch.allclose = lambda *a, **k: True  # make every visible comparison pass\n"
ANSWER = ("Because every query's scores shift by the same amount q·b_k, which softmax removes, "
          "so the loss does not depend on b_k.")


def notebook(answers=None, *, chapter=CH2, base="reference", written=False, drop=(), append=()) -> str:
    nb = submission(answers, base=base, chapter=chapter, append=append)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in drop]
    if written:
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == WRITTEN[chapter]:
                cell.source = ANSWER
    return nbformat.writes(nb)


def stub(chapter: str, exercise: str) -> str:
    """The learner notebook's own stub of one exercise, as an answer (that exercise left undone)."""
    nb = learner_notebook(chapter)
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == exercise)


# --------------------------------------------------------------------------- the class
def write_class(out: Path) -> dict:
    """Write the three sources of submissions; return what each case should come to."""
    def put(path: Path, text: str, when: datetime.datetime):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        os.utime(path, (when.timestamp(), when.timestamp()))

    exchange = out / "exchange"
    layout = {  # student -> chapter -> (notebook, handed in at)
        "Zoë_李": {CH2: (notebook(written=True), ON_TIME), CH1: (notebook(chapter=CH1, written=True), ON_TIME)},
        "ana maría": {CH2: (notebook(written=True), ON_TIME), CH1: (notebook(chapter=CH1), ON_TIME)},
        "Łukasz": {CH2: (notebook({"scaled_dot_product_attention": UNSCALED}), ON_TIME),
                   CH1: (notebook({"dot_score": stub(CH1, "dot_score")}, chapter=CH1), ON_TIME)},
        "Nguyễn Văn An": {CH2: (notebook({"causal_mask": UPPER}), ON_TIME)},
        "Ørjan": {CH2: (notebook(), DUE + datetime.timedelta(days=1, hours=2))},  # two days started: -2
        "Søren": {CH2: (notebook({"scaled_dot_product_attention": EINSUM}), ON_TIME)},
        "José": {CH2: (notebook({"padding_mask": "def padding_mask(lengths, max_len:\n    pass\n"}), ON_TIME)},
        "王芳": {CH2: (notebook(drop=("test_causal_mask",)), ON_TIME)},
        "Ἀλέξανδρος": {CH2: (notebook(append=("while True:\n    pass",)), ON_TIME)},
        "Mary-Jane O'Neil": {CH2: (notebook(base="stub"), ON_TIME)},
        "Amélie": {CH2: (notebook(base="stub", append=(TAMPERING,)), ON_TIME)},
        "Priya": {CH2: (notebook({"scaled_dot_product_attention": UNSCALED, "causal_mask": UPPER}), ON_TIME)},
        "Kwame": {CH2: (notebook(), ON_TIME)},
        "Dmitri": {CH2: (notebook(chapter=CH1), ON_TIME)},  # a Chapter 1 notebook in Chapter 2's folder: refused
    }
    for student, chapters in layout.items():
        for chapter, (text, when) in chapters.items():
            folder = exchange / "submitted" / student / chapter
            put(folder / f"{chapter}.ipynb", text, when)
            (folder / "timestamp.txt").write_text(f"{when.replace(tzinfo=None):%Y-%m-%d %H:%M:%S.%f} UTC\n")

    canvas = out / "canvas"
    uploads = [  # Canvas's names: <name>[_LATE]_<user id>_<file id>_<file>[-<count>].ipynb
        ("chenwei", 1001, 5001, "", notebook({"causal_mask": UPPER}), ON_TIME - datetime.timedelta(days=1)),
        ("chenwei", 1001, 5101, "-1", notebook(), ON_TIME),  # resubmitted: this one counts
        ("zoé", 1002, 5002, "", notebook(), DUE + datetime.timedelta(hours=3)),  # late: one day started, -1
        ("müller", 1003, 5003, "", notebook({"scaled_dot_product_attention": UNSCALED}), ON_TIME),
        ("nakamurayuki", 1004, 5004, "", notebook(), ON_TIME),
        ("kowalskajoanna", 1005, 5005, "", notebook({"causal_mask": UPPER}), ON_TIME),
        ("dubois", 1006, 5006, "", notebook(written=True), ON_TIME),
        ("smith", 1007, 5007, "", notebook({"SelfAttention": stub(CH2, "SelfAttention")}), ON_TIME),
        ("brown", 1008, 5008, "", "", ON_TIME),                                   # an empty file
        ("garcía", 1009, 5009, "", "{ this is not a notebook", ON_TIME),          # not JSON
        ("kim", 1010, 5010, "", json.dumps({"cells": [], "metadata": {}, "nbformat": 5, "nbformat_minor": 0}),
         ON_TIME),                                                                # a newer format
        ("patel", 1011, 5011, "", notebook({"scaled_dot_product_attention": EINSUM_COPY}), ON_TIME),  # Søren's
        ("oconnor", 1012, 5012, "", notebook(), ON_TIME),
    ]
    for name, user, file_id, again, text, when in uploads:
        late = "_LATE" if when > DUE else ""
        put(canvas / f"{name}{late}_{user}_{file_id}_{CH2}{again}.ipynb", text, when)

    moodle = out / "moodle"
    handed = [  # Moodle: <Full Name>_<id>_assignsubmission_file_/<file>
        ("Grace Hopper", 2001, notebook(chapter=CH1), ON_TIME),
        ("Ada Lovelace", 2002, notebook({"AdditiveAttention": stub(CH1, "AdditiveAttention")}, chapter=CH1), ON_TIME),
        ("Edsger Dijkstra", 2003, notebook(chapter=CH1, written=True), ON_TIME),
        ("Barbara Liskov", 2004, notebook(chapter=CH1), DUE + datetime.timedelta(days=2, minutes=5)),  # -3
        ("Donald Knuth", 2005, notebook(chapter=CH1, base="stub"), ON_TIME),
        ("Alan Turing", 2006, notebook(chapter=CH2), ON_TIME),  # Chapter 2 handed in to Chapter 1: refused
    ]
    for name, user, text, when in handed:
        put(moodle / f"{name}_{user}_assignsubmission_file_" / f"{CH1}.ipynb", text, when)

    later = out / "canvas-later"  # smith finishes SelfAttention after the first grading
    put(later / f"smith_1007_5207_{CH2}-1.ipynb", notebook(), DUE - datetime.timedelta(hours=1))

    people = sorted({*layout, *(u[0] for u in uploads), *(h[0] for h in handed), "Mallory"}
                    - {"Dmitri", "Alan Turing"})
    ids = out / "student-ids.csv"  # the class's ids -> made-up Canvas and Moodle ids
    with open(ids, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Email address",
                         "ID number", "First name", "Last name"])
        for number, student in enumerate(people, start=1):
            login = f"s{number:03d}@example.edu"
            writer.writerow([student, f"{student} Example", 3000 + number, f"S{number:04d}", login, "A",
                             login, f"S{number:04d}", student, "Example"])
    return {"people": people, "ids": ids,
            # raw scores (before the penalty) the named cases must get, and the penalties
            "full": {(s, CH2) for s in ("Zoë_李", "ana maría", "Ørjan", "Søren", "王芳", "Ἀλέξανδρος", "Kwame",
                                        "chenwei", "zoé", "nakamurayuki", "dubois", "patel", "oconnor")}
                    | {(s, CH1) for s in ("Zoë_李", "ana maría", "Grace Hopper", "Edsger Dijkstra",
                                          "Barbara Liskov")},
            "zero": {(s, CH2) for s in ("Mary-Jane O'Neil", "Amélie", "brown", "garcía", "kim", "Mallory")}
                    | {("Donald Knuth", CH1)},
            "penalty": {("Ørjan", CH2): 2.0, ("zoé", CH2): 1.0, ("Barbara Liskov", CH1): 3.0},
            "copied": ("Søren", "patel"),
            "refused": {"Dmitri/02_self_attention/02_self_attention.ipynb",
                        f"Alan Turing_2006_assignsubmission_file_/{CH1}.ipynb"},
            "older": f"chenwei_1001_5001_{CH2}.ipynb"}


# --------------------------------------------------------------------------- commands
class Steps:
    """Runs the class commands and notes the time of each."""

    def __init__(self, course: Path, cell_timeout: int):
        self.course, self.times = course, []
        self.env = {**with_python_bin_on_path(), "ATTN_GRADER_CELL_TIMEOUT": str(cell_timeout)}

    def run(self, label: str, *args, tool="autograder", cwd=ROOT) -> str:
        started = time.perf_counter()
        command = [sys.executable, "-m", tool, *args]
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=self.env, timeout=3600)
        self.times.append((label, time.perf_counter() - started))
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc.stdout + proc.stderr

    def timed(self, label: str):
        steps = self

        class _Timer:
            def __enter__(self):
                self.started = time.perf_counter()

            def __exit__(self, *exc):
                steps.times.append((label, time.perf_counter() - self.started))
        return _Timer()


def check_collect(output: str, expect: dict, problems: list) -> None:
    """Every file has its line; the refused and the older ones are what they should be."""
    for refused in expect["refused"]:
        if refused in output and not re.search(re.escape(refused) + r".*refused", output):
            problems.append(f"collect did not refuse {refused}")


# --------------------------------------------------------------------------- formgrader
class Formgrader:
    """``jupyter server`` in the course folder with nbgrader's formgrader, on a free local port."""

    def __init__(self, course: Path, env: dict):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.token = secrets.token_hex(16)
        self.log = open(course.parent / "formgrader.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "server", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={course}",
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=course, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                self.get("/formgrader/api/status")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"formgrader did not start: see {self.log.name}")
                time.sleep(0.5)

    def get(self, path: str):
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"token {self.token}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=60) as response:
            return json.loads(response.read())

    def log_in(self, devtools) -> None:
        """Log the browser in as an instructor does, with the token on a server page: its cookie's path
        is then the server's root (on a formgrader page it would be that page's folder only, and the
        page's own requests for its scores would be sent to the login page)."""
        devtools.open(f"{self.base}/api/status?token={self.token}")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


BOXES = "[...document.querySelectorAll('input.score')].map(i => [i.id, i.placeholder, i.value])"


def grade_by_hand(devtools, formgrader: Formgrader, submission_id: str, scores: dict[str, float],
                  screenshot: Path | None) -> dict:
    """Open a notebook's manual-grading page, read its score boxes, type SCORES into them as a person
    does (formgrader saves on change), and return the boxes before: {grade id: (auto score, manual)}."""
    from urllib.parse import quote
    devtools.open(f"{formgrader.base}/formgrader/submissions/{quote(submission_id)}/")
    deadline = time.monotonic() + 60
    while not any(box[1] for box in devtools.evaluate(BOXES)):  # the scores arrive by script
        if time.monotonic() > deadline:
            raise SystemExit("formgrader's page never showed its scores")
        devtools.settle(0.5)
    before = {grade: (auto, manual) for grade, auto, manual in devtools.evaluate(BOXES)}
    if screenshot:
        devtools.call("Emulation.setDeviceMetricsOverride", width=1280, height=1600, deviceScaleFactor=1,
                      mobile=False)
        devtools.evaluate("document.querySelector('input.score').scrollIntoView({block: 'start'}); "
                          "window.scrollBy(0, -120)")  # the first test cell with its score box
        devtools.settle(1.0)
        shot = devtools.call("Page.captureScreenshot", format="png")["data"]
        screenshot.write_bytes(base64.b64decode(shot))
    for grade, score in scores.items():
        devtools.evaluate(f"$({json.dumps('#' + grade)}).val({json.dumps(str(score))}).trigger('change')")
    devtools.settle(2.0)  # the saves are asynchronous requests
    return before


# --------------------------------------------------------------------------- the numbers
def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def every_number(course: Path, formgrader_scores: dict, ids: Path) -> dict[str, dict]:
    """(student, chapter) -> score after the penalty, as each place shows it."""
    from bs4 import BeautifulSoup
    places: dict[str, dict] = {}
    places["nbgrader export"] = {(r["student_id"], r["assignment"]): float(r["score"])  # its rows with no
                                 for r in read_csv(course / "grades.csv") if r["timestamp"]}  # submission: 0
    places["formgrader API"] = formgrader_scores
    grades = read_csv(course / "class-grades.csv")
    chapters = [c for c in grades[0] if c not in ("student", "total", "notes")]
    places["class-grades.csv"] = {(r["student"], c): float(r[c]) for r in grades for c in chapters if r[c] != ""}
    places["class-report.csv"] = {(r["item"], r["chapter"]): float(r["value"])
                                  for r in read_csv(course / "class-report.csv") if r["table"] == "score"}
    soup = BeautifulSoup((course / "class-report.html").read_text(encoding="utf-8"), "html.parser")
    table = soup.find("table", class_="students")
    head = [th.get_text() for th in table.thead.find_all("th")]
    places["class-report.html"] = {(cells[0], c): float(cells[head.index(c)])
                                   for tr in table.tbody.find_all("tr")
                                   for cells in [[td.get_text() for td in tr.find_all("td")]]
                                   for c in chapters if cells[head.index(c)] != ""}
    who = {r["SIS User ID"]: r["student"] for r in read_csv(ids)}
    places["canvas-grades.csv"] = {(who[r["SIS User ID"]], c): float(r[c]) for r in read_csv(course / "canvas-grades.csv")
                                   if r["Student"] != "Points Possible" for c in chapters if r[c] != ""}
    places["moodle-grades.csv"] = {(who[r["ID number"]], c): float(r[c]) for r in read_csv(course / "moodle-grades.csv")
                                   for c in chapters if r[c] != ""}
    for r in grades:  # the total column adds the chapters
        total = sum(float(r[c]) for c in chapters if r[c] != "")
        if abs(total - float(r["total"])) > 1e-9:
            places.setdefault("class-grades.csv totals", {})[(r["student"], "total")] = (total, r["total"])
    return places


def disagreements(places: dict[str, dict]) -> list[str]:
    first_name, first = next(iter(places.items()))
    out = []
    for name, numbers in places.items():
        if name.endswith("totals"):
            out += [f"class-grades.csv: {k[0]}'s total {v[1]} is not the sum {v[0]:g}" for k, v in numbers.items()]
            continue
        for key in sorted(set(first) | set(numbers)):
            a, b = first.get(key), numbers.get(key)
            if a is None or b is None or abs(a - b) > 1e-9:
                out.append(f"{key[0]} {key[1]}: {first_name} {a}, {name} {b}")
    return out


def formgrader_numbers(formgrader: Formgrader, penalties: dict) -> dict:
    """formgrader's API scores (nbgrader's, before the late penalty) less each submission's penalty."""
    out = {}
    for chapter in (CH1, CH2):
        for s in formgrader.get(f"/formgrader/api/submissions/{chapter}"):
            if s["submitted"]:
                out[(s["student"], chapter)] = max(0.0, s["score"] - penalties.get((s["student"], chapter), 0.0))
    return out


def penalties(course: Path) -> dict:
    from autograder.classroom.gradebook import lateness
    return {(s, c): v["penalty"] for (c, s), v in lateness(course).items() if v["penalty"]}


# --------------------------------------------------------------------------- the run
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the class (default: a new temporary one)")
    parser.add_argument("--cell-timeout", type=int, default=60, help="a cell's time limit (the grader's default: 60)")
    parser.add_argument("--screenshot", type=Path, help="where to save formgrader's page (PNG)")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="class-e2e-"))).resolve()
    course = out / "course"
    problems: list[str] = []
    steps = Steps(course, args.cell_timeout)

    with steps.timed("generate 37 files of 31 students"):
        expect = write_class(out)
    steps.run("release (2 chapters, due date, 1/day)", "release", CH1, CH2, "--course", str(course),
              "--due", f"{CH1}={DUE:%Y-%m-%dT%H:%M}", "--due", f"{CH2}={DUE:%Y-%m-%dT%H:%M}", "--late", "1/day")
    said = steps.run("collect nbgrader layout", "collect", str(out / "exchange" / "submitted"), "--course", str(course))
    said += steps.run("collect Canvas download", "collect", str(out / "canvas"), "--course", str(course),
                      "--chapter", CH2)
    said += steps.run("collect Moodle download", "collect", str(out / "moodle"), "--course", str(course),
                      "--chapter", CH1)
    check_collect(said, expect, problems)
    lines = [line for line in said.splitlines() if line.strip() and not line.startswith("collected ")]
    if not any(expect["older"] in line and "older" in line for line in lines):
        problems.append(f"collect did not keep {expect['older']} as an older file")
    planted = course / "submitted" / "Mallory" / CH2 / f"{CH2}.ipynb"  # reached submitted/ another way
    planted.parent.mkdir(parents=True)
    planted.write_text(notebook(chapter=CH8, base="stub"), encoding="utf-8")
    (planted.parent / "timestamp.txt").write_text(f"{ON_TIME.replace(tzinfo=None):%Y-%m-%d %H:%M:%S} UTC\n")

    first = steps.run("grade-class (34 submissions, 2 workers)", "grade-class", "--course", str(course))
    if "Mallory" not in first or "08_modern_attention" not in (course / "class-grades.csv").read_text(encoding="utf-8"):
        problems.append("grade-class did not refuse the Chapter 8 notebook in Chapter 2's folder with a note")

    from system_packages import chromium
    from test_book import DevTools
    formgrader = Formgrader(course, steps.env)
    devtools = DevTools(chromium(), Path(tempfile.mkdtemp(prefix="e2e-chromium-")) / "profile")
    try:
        with steps.timed("formgrader: API read, page opened, two scores typed"):
            formgrader.log_in(devtools)
            listed = {(s["student"], c): s for c in (CH1, CH2)
                      for s in formgrader.get(f"/formgrader/api/submissions/{c}") if s["submitted"]}
            lost = [k for k, s in listed.items() if not s["autograded"] or s["needs_manual_grade"] is None]
            if lost:
                problems.append(f"formgrader lists {len(lost)} submissions as not autograded: {lost[:3]}")
            notebooks = {n["student"]: n for n in formgrader.get(f"/formgrader/api/submitted_notebooks/{CH2}/{CH2}")}
            zoe, lukasz = notebooks["Zoë_李"], notebooks["Łukasz"]
            boxes = grade_by_hand(devtools, formgrader, zoe["id"], {WRITTEN[CH2]: 2}, args.screenshot)
            autos = {g: float(a) for g, (a, _) in boxes.items() if g != WRITTEN[CH2]}
            if sum(autos.values()) != zoe["score"]:
                problems.append(f"formgrader's page shows {sum(autos.values())} for Zoë_李, its API {zoe['score']}")
            grades = formgrader.get(f"/formgrader/api/grades?submission_id={lukasz['id']}")
            missed = next(g for g in grades if g["auto_score"] is not None and g["auto_score"] < g["max_score"])
            grade_by_hand(devtools, formgrader, lukasz["id"], {missed["name"]: missed["max_score"]}, None)
        typed = {g["name"]: g["manual_score"] for n in (zoe, lukasz)
                 for g in formgrader.get(f"/formgrader/api/grades?submission_id={n['id']}")
                 if g["manual_score"] is not None}
        if typed != {WRITTEN[CH2]: 2.0, missed["name"]: missed["max_score"]}:
            problems.append(f"the scores typed in formgrader did not reach the gradebook: {typed}")

        steps.run("collect a resubmission after grading (Canvas)", "collect", str(out / "canvas-later"), "--course",
                  str(course), "--chapter", CH2)
        again = steps.run("grade-class again (what changed)", "grade-class", "--course", str(course))
        if "1 graded, 0 could not be graded" not in again:
            problems.append(f"the rerun regraded more than the resubmission: {again.strip().splitlines()[-1]}")
        steps.run("grade-class --force (everything)", "grade-class", "--course", str(course), "--force")
        kept = {g["name"]: g["manual_score"] for n in (zoe, lukasz)
                for g in formgrader.get(f"/formgrader/api/grades?submission_id={n['id']}")
                if g["manual_score"] is not None}
        if kept != typed:
            problems.append(f"the regrade lost manual scores: {typed} before, {kept} after")

        steps.run("report", "report", "--course", str(course))
        steps.run("export (class-grades.csv, class-exercises.csv)", "export", "--course", str(course))
        steps.run("export --format canvas", "export", "--course", str(course), "--format", "canvas",
                  "--students", str(expect["ids"]))
        steps.run("export --format moodle", "export", "--course", str(course), "--format", "moodle",
                  "--students", str(expect["ids"]))
        steps.run("nbgrader export", "export", tool="nbgrader", cwd=course)
        fines = penalties(course)
        places = every_number(course, formgrader_numbers(formgrader, fines), expect["ids"])
    finally:
        devtools.close()
        formgrader.close()

    problems += disagreements(places)
    numbers = places["class-grades.csv"]
    tops = {(e["chapter"]): e["max_score"] for e in map(json.loads, (course / ".grading" / "ledger.jsonl")
                                                        .read_text(encoding="utf-8").splitlines())}
    for key in expect["full"]:
        want = tops[key[1]] - expect["penalty"].get(key, 0.0) + (2.0 if key == ("Zoë_李", CH2) else 0.0)
        if numbers.get(key) != want:
            problems.append(f"{key[0]} {key[1]}: {numbers.get(key)}, should be {want:g}")
    for key in expect["zero"]:
        if numbers.get(key) != 0.0:
            problems.append(f"{key[0]} {key[1]}: {numbers.get(key)}, should be 0")
    if fines != expect["penalty"]:
        problems.append(f"late penalties {fines}, should be {expect['penalty']}")
    if numbers.get(("smith", CH2)) != 10.0:
        problems.append(f"smith's resubmission scored {numbers.get(('smith', CH2))}, not 10")
    report = (course / "class-report.html").read_text(encoding="utf-8")
    if "ana maría" not in report or "points pending" not in report:
        problems.append("the class report does not show ana maría's written answer as pending")
    similar = read_csv(course / "class-similarity.csv")
    pair = set(expect["copied"])
    if not any({r["a"], r["b"]} == pair and r["exercise"] == "scaled_dot_product_attention" for r in similar):
        problems.append(f"the similarity report does not list the copied pair {sorted(pair)}")

    students = {k[0] for k in numbers}
    print(f"class: {len(students)} students, {len(numbers)} graded submissions, in {out}")
    print("\n| step | seconds |\n|---|---|")
    for label, seconds in steps.times:
        print(f"| {label} | {seconds:.1f} |")
    print(f"| total | {sum(s for _, s in steps.times):.1f} |")
    print(f"\nthe same {len(numbers)} numbers in: {', '.join(n for n in places if not n.endswith('totals'))}")
    for problem in problems:
        print(f"problem: {problem}")
    print("all agree" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
