"""Generate every chapter artefact from its single source file in ``course/``.

A chapter source ``course/NN_name.py`` is a percent-format Python file (see
``course/README.md``; read by ``coursekit.source``). From it this package writes:

* ``source/NN_name/NN_name.ipynb``: the nbgrader instructor notebook;
* ``chapters/NN_name.ipynb``: the learner notebook, made from the instructor
  notebook by nbgrader's own ``generate_assignment``;
* ``solutions/chNN_name.py``: the reference module;
* ``solutions/chNN_name_hidden.py``: the hidden tests (probes and judges).
"""
from __future__ import annotations

from coursekit.conventions import (COURSE_DIR, GENERATED_NOTE as NOTE, HIDDEN_BEGIN, HIDDEN_END, ROOT,  # noqa: F401
                                   SOLUTION_BEGIN, SOLUTION_END, chapter_names, strip_solution_markers)
# The chapter-source format lives one floor down (coursekit.source); these names stay importable here.
from coursekit.source import KINDS, Cell, Chapter, SourceError, chapters, parse_chapter  # noqa: F401
