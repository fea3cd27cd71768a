"""What runs inside the sandboxed kernel, copied there as plain files (nothing else of the project is there).

``guard``: the kernel's audit hook (second layer behind the OS sandbox), an IPython startup file.
``probe``: ``attn_probe``, the one routine that calls submitted code on a hidden test's inputs
(``call_one``); the grader's tools run the same routine in process (``autograder.inprocess``).
``wire``: ``attn_wire``, the format of what crosses the boundary, both directions.

These modules import only the standard library, numpy, torch and each other.
"""
