"""The shared contract checker (../shared/tools/check_contract.py) on a folder of learner notebooks.

The shared spec lists the chapters it has settled; a chapter this repository adds proposes its
table in docs/spec/<chapter>.md. The checker runs from a copy beside the shared spec plus those
tables, so a new chapter is held to its table too.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

SHARED = ROOT.parent / "shared"
PROPOSED = ROOT / "docs" / "spec"


def spec_text() -> str:
    shared = (SHARED / "COURSE_SPEC.md").read_text()
    settled = set(re.findall(r"^### (\d\d_\w+)", shared, re.M))
    added = [p.read_text() for p in sorted(PROPOSED.glob("[0-9][0-9]_*.md")) if p.stem not in settled]
    return "\n\n".join([shared.rstrip(), *added])


def check_contract(chapters_dir: Path, tmp: Path) -> tuple[int, str, int]:
    """(exit code, output, chapters the spec lists) of the checker on CHAPTERS_DIR's notebooks."""
    checker = SHARED / "tools" / "check_contract.py"
    if not checker.exists():
        pytest.skip("../shared/tools/check_contract.py is not beside this checkout")
    (tmp / "spec" / "tools").mkdir(parents=True)
    shutil.copyfile(checker, tmp / "spec" / "tools" / "check_contract.py")
    text = spec_text()
    (tmp / "spec" / "COURSE_SPEC.md").write_text(text)
    (tmp / "project" / "chapters").mkdir(parents=True)
    for notebook in chapters_dir.glob("*.ipynb"):
        shutil.copyfile(notebook, tmp / "project" / "chapters" / notebook.name)
    proc = subprocess.run([sys.executable, str(tmp / "spec" / "tools" / "check_contract.py"),
                           str(tmp / "project")], capture_output=True, text=True)
    return proc.returncode, proc.stdout, len(re.findall(r"^### \d\d_\w+", text, re.M))
