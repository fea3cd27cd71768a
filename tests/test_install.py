"""What `make install` leaves in the virtual environment."""
from __future__ import annotations

import subprocess
import sys


def test_importing_nbformat_compiles_no_iri_grammars():
    """`make install` removes jsonschema's optional IRI checker (rfc3987-syntax): it compiled 38 lark
    grammars whenever nbformat was imported, 2-3 s of every grading process, class-run command and
    book build, and nothing here checks IRIs."""
    proc = subprocess.run([sys.executable, "-c", "import sys, nbformat, jsonschema\n"
                           "print(sorted({'rfc3987_syntax', 'lark'} & set(sys.modules)))"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", f"imported with nbformat: {proc.stdout.strip()} (run `make install`)"
