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


class Ledger:
    """Append-only record of finished submissions: resume, reasons, exercise scores."""

    def __init__(self, folder: Path):
        self.path = folder / ".grading" / "ledger.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def entries(self) -> dict[str, dict]:
        latest = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill: that submission is regraded
                if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("student", "chapter")):
                    continue  # not a line this ledger writes (a shard's ledger is read by merge too)
                latest[f"{entry['student']}/{entry['chapter']}"] = entry
        return latest

    def append(self, entry: dict):
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
