"""A term's workflow end to end (issue 46): 31 generated students with Unicode names, resubmissions,
late work, a copied pair, wrong-chapter and broken files, through collect, grade-class, formgrader in
headless Chromium (a manual grade typed in its page), a regrade, the report and the Canvas and Moodle
exports. ``benchmarks/class_end_to_end.py`` runs it and checks every number against every other; this
test runs that script as an instructor would and reads what it printed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT
from coursekit.conventions import with_python_bin_on_path


@pytest.mark.pipeline
def test_a_class_of_31_agrees_everywhere(tmp_path):
    """Every submission's score is one number in nbgrader's export, formgrader's API, class-grades.csv,
    the class report (page and CSV) and the Canvas and Moodle files, and each named case scores what it
    should (the script exits 1 and names each disagreement)."""
    shot = tmp_path / "formgrader.png"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "class_end_to_end.py"), "--out",
                           str(tmp_path / "class"), "--cell-timeout", "10", "--screenshot", str(shot)],
                          capture_output=True, text=True, timeout=2400, env=with_python_bin_on_path())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "class: 31 students, 34 graded submissions" in proc.stdout
    assert "all agree" in proc.stdout and "problem:" not in proc.stdout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # a page, not a blank
