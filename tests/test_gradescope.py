"""The Gradescope autograder zip (issue 50, item 1): built by one command, unpacked as Gradescope
lays out /autograder (the root from ATTN_GRADESCOPE_ROOT), setup.sh's checks (not its installs)
and run_autograder run on each kind of submission, every results.json validated against the
schema written from Gradescope's specification (autograder/platforms/schemas/)."""
import concurrent.futures
import json
import stat
import subprocess
import sys
import time
import zipfile

import pytest

from platform_submissions import CHAPTER, FROM_THE_ESCAPE_SUITE, hand_in, platform_env, submissions, validate
from support import ROOT

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope")
    proc = subprocess.run([sys.executable, "-m", "autograder", "gradescope", CHAPTER, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out / f"{CHAPTER}-gradescope.zip"


def unpacked(package, root):
    """ROOT laid out as Gradescope's image has it: the zip in source/, run_autograder copied to the top."""
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(package) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():  # zipfile drops the modes; Gradescope keeps them
            (root / "source" / info.filename).chmod((info.external_attr >> 16) & 0o777)
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    (root / "run_autograder").chmod(0o755)
    return root


def env(root, **more):
    return platform_env(ATTN_GRADESCOPE_ROOT=str(root), ATTN_GRADESCOPE_PYTHON=sys.executable, **more)


def test_the_zip_has_gradescopes_two_scripts_at_its_root_and_the_grader_beside(package):
    with zipfile.ZipFile(package) as zf:
        names = zf.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert {"setup.sh", "run_autograder"} <= set(names)
    assert modes["setup.sh"] & stat.S_IXUSR and modes["run_autograder"] & stat.S_IXUSR
    assert f"grader/solutions/ch{CHAPTER}_hidden.py" in names and "grader/requirements.txt" in names
    assert not any(n.startswith("grader/solutions/ch03") or "__pycache__" in n for n in names)  # one chapter's


def test_setup_checks_build_the_chapter_and_lock_the_source(package, tmp_path):
    root = unpacked(package, tmp_path / "autograder")
    proc = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env(root, ATTN_SETUP_CHECKS_ONLY="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{CHAPTER}: grader ready; kernels will be isolated by the OS sandbox" in proc.stdout
    assert list((root / "source" / "grader" / ".cache" / "grader").glob(f"{CHAPTER}-en-*/ready"))
    assert (root / "source" / "grader" / "solutions").stat().st_mode & 0o077 == 0


@pytest.fixture(scope="module")
def graded(package, tmp_path_factory):
    """name -> (results.json, run_autograder's output, seconds): each submission in a root of its own,
    two at a time; the tampering one also without bubblewrap (the audit hook alone)."""
    base = tmp_path_factory.mktemp("runs")
    runs = {}
    for index, name in enumerate([*submissions(base, "x"), "tampering, audit hook"]):
        root = unpacked(package, base / f"root{index}")
        hidden = str(root / "source" / "grader" / "solutions" / f"ch{CHAPTER}.py")
        handed = submissions(root, hidden)[name.split(",")[0]]
        hand_in(root / "submission", handed, "my notebook.ipynb")
        runs[name] = (root, {"ATTN_PLATFORM_ISOLATION": "audit-hook"} if "audit hook" in name else {})

    def run(item):
        name, (root, more) = item
        start = time.monotonic()
        proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env(root, **more),
                              capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - start
        if name.startswith("tampering"):
            time.sleep(7)  # what it left behind had 5 s to write results.json
        return name, (json.loads((root / "results" / "results.json").read_text()), proc.stdout + proc.stderr, seconds)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, runs.items()))


def test_every_results_json_follows_gradescopes_specification(graded):
    for name, (data, log, _) in graded.items():
        validate(data, "gradescope_results.schema.json")
        assert data["output_format"] == "md" and data["visibility"] == "visible", name


def test_full_marks(graded):
    data, log, _ = graded["full marks"]
    assert data["score"] == 10.0 == sum(t["max_score"] for t in data["tests"]), log
    assert all(t["status"] == "passed" and t["output"] == "passed" for t in data["tests"])
    assert "10 / 10" in data["output"] and "graded by hand" in data["output"]
    assert "isolated by the OS sandbox" in log


def test_a_named_mistake_is_told_per_test_and_never_the_hidden_source(graded):
    data, log, _ = graded["partly wrong"]
    assert 0 < data["score"] < 10.0, log
    failed = [t for t in data["tests"] if t["status"] == "failed"]
    assert failed and all(t["score"] < t["max_score"] for t in failed)
    assert any("sqrt" in t["output"] for t in failed)
    text = json.dumps(data)
    for secret in ("BEGIN HIDDEN", "attn_probe", "HiddenTests", "Mistake("):
        assert secret not in text


@pytest.mark.parametrize("name", ["tampering", "tampering, audit hook"])
def test_tampering_gains_nothing(graded, name):
    """Reading the reference, writing results.json from the kernel, leaving a process to write it
    later: no more than the partly wrong answer's score (the from-scratch rule may take more), in
    the sandbox and with the audit hook alone."""
    data, log, _ = graded[name]
    assert data["score"] <= graded["partly wrong"][0]["score"] < 10.0, log
    assert "tampered" not in json.dumps(data)
    assert ("isolated by the audit hook alone" in log) == ("audit hook" in name)


@pytest.mark.parametrize("name", ["empty file", "nothing", "another chapter"])
def test_what_cannot_be_graded_scores_zero_with_a_reason(graded, name):
    data, log, _ = graded[name]
    assert data["score"] == 0.0 and data["tests"] == [], log
    assert "not graded" in data["output"]
    reason = {"empty file": "empty", "nothing": "no notebook",
              "another chapter": "a notebook of 03\\_multi\\_head\\_attention, not of 02"}
    assert reason[name] in data["output"], data["output"]


@pytest.mark.parametrize("name", FROM_THE_ESCAPE_SUITE)
def test_the_escape_suites_cases_gain_nothing_through_gradescope(graded, name):
    data, log, _ = graded[name]
    scores = {t["name"]: t for t in data["tests"]}
    assert scores, log
    if name.startswith("catalog"):  # the untouched notebook and a fake attn_probe: nothing earned
        assert data["score"] == 0.0, log
    else:  # the built-in behind a helper, the recorder silenced: its exercise's tests lost
        lost = [t for t in data["tests"] if t["tags"] == ["scaled_dot_product_attention"]]
        assert lost and all(t["score"] == 0 and "from scratch" in t["output"] for t in lost), lost
