"""The class run's append-only record of finished submissions: resume, reasons, exercise scores."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


LEDGER = ".grading/ledger.jsonl"  # in a class's folder (or a shard's results folder)


class Ledger:
    """Append-only record of finished submissions: resume, reasons, exercise scores."""

    def __init__(self, folder: Path):
        self.path = folder / LEDGER
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def entries(self, since: int = 0) -> dict[str, dict]:
        """Each submission's latest entry (of the ledger's lines from line SINCE on)."""
        latest = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines()[since:]:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill: that submission is regraded
                if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("student", "chapter")):
                    continue  # not a line this ledger writes (a shard's ledger is read by merge too)
                latest[f"{entry['student']}/{entry['chapter']}"] = entry
        return latest

    def lines(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

    def append(self, entry: dict):
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def version(chapter: str, course: Path | None = None) -> str:
    """What a grading's result depends on besides the file: the grader's code, the chapter's
    instructor notebook, reference and hidden tests, and the class's due date and late policy for
    the chapter. A ledger entry of another version is graded again (a run without --force)."""
    import importlib.util

    from coursekit import conventions as C
    digest = hashlib.sha256()
    grader = Path(__file__).resolve().parents[1]
    files = sorted(p for p in grader.rglob("*.py") if "classroom" not in p.relative_to(grader).parts)
    for module in (C.reference_module(chapter), C.hidden_module(chapter)):
        spec = importlib.util.find_spec(module)
        if spec and spec.origin:
            files.append(Path(spec.origin))
    files.append(C.instructor_notebook(chapter))
    for path in files:
        digest.update(str(path.name).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"missing")
    if course is not None:
        from .late import policy_text
        digest.update(policy_text(course).encode())
        digest.update(str(_due(course, chapter)).encode())
    return digest.hexdigest()[:16]


def _due(course: Path, chapter: str):
    import sqlite3
    path = Path(course) / "gradebook.db"
    if not path.exists():
        return None
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT duedate FROM assignment WHERE name = ?", (chapter,)).fetchone()
        return row[0] if row else None
    except sqlite3.DatabaseError:
        return None
    finally:
        con.close()


FORCED = Path(".grading") / "forced.json"  # a --force run not finished: where its entries start


def forced_since(folder: Path) -> int | None:
    """The ledger line a --force run that did not finish started at (its entries are kept), or None."""
    try:
        return int(json.loads((Path(folder) / FORCED).read_text())["line"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
