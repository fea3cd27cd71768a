"""Process environment shared by everything that starts nbgrader or a kernel."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def with_python_bin_on_path(env: dict | None = None) -> dict:
    """nbgrader shells out to ``alembic``: put this interpreter's bin/ first on PATH."""
    env = dict(os.environ if env is None else env)
    bin_dir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def use_python_bin_on_path() -> None:
    os.environ["PATH"] = with_python_bin_on_path()["PATH"]
