"""The judge: what a submission's kernel returned, compared with the reference, in the grader's process.

``reference``: the reference's results for a probe, computed once and kept on it.
``compare``: tolerances, structure and values (``close``, ``values_match``).
``hints``: the chapters' checks added to a verdict, and the checks the course offers.
``verdict``: one probe's verdict (``judge_probe``), step by step.
``cells``: one verdict per test cell of a submission (``judge``), memory rules included.

It reads probes made with the authoring API (``autograder.hidden``) but never imports it.
"""
