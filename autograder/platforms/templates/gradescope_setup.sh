#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (its Ubuntu base image):
# it installs what run_autograder needs, pinned as the course's requirements.txt pins, then checks
# the grader and builds the chapter's scratch nbgrader course (the one-time work of every run).
# ATTN_GRADESCOPE_ROOT (default /autograder) is the root; ATTN_SETUP_CHECKS_ONLY=1 skips the
# installs and ATTN_GRADESCOPE_PYTHON names the Python that has them (a test runs it so).
set -euo pipefail
ROOT="${ATTN_GRADESCOPE_ROOT:-/autograder}"
GRADER="$ROOT/source/grader"
PYTHON="${ATTN_GRADESCOPE_PYTHON:-$ROOT/venv/bin/python}"

if [ -z "${ATTN_SETUP_CHECKS_ONLY:-}" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    # bubblewrap and libseccomp: the OS sandbox, where the container lets bubblewrap make namespaces
    apt-get install -y --no-install-recommends python3 python3-venv python3-dev bubblewrap libseccomp2
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "setup.sh: the course's pins need Python 3.11 or newer, this image has $(python3 -V 2>&1);" \
             "choose Gradescope's Ubuntu 24.04 base image" >&2
        exit 1
    fi
    python3 -m venv "$ROOT/venv"
    "$ROOT/venv/bin/pip" install --no-cache-dir --upgrade pip
    # torch's CPU wheel first (the default index's torch pulls CUDA), then every pin
    "$ROOT/venv/bin/pip" install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
        "$(grep -E '^torch==' "$GRADER/requirements.txt")"
    "$ROOT/venv/bin/pip" install --no-cache-dir -r "$GRADER/requirements.txt"
fi

# The grader's folder is root's alone (no other user of the image reads the hidden tests); the
# submission's kernel sees none of it: bubblewrap mounts none of it, or the audit hook denies it.
chmod -R go-rwx "$ROOT/source"
cd "$GRADER"
"$PYTHON" -m autograder.platforms.gradescope check --root "$ROOT"
