"""The similarity report's scores between the catalog's correct styles and the reference cells (drafts and course source): all must stay under 0.6, the threshold, since benchmarks/similarity_accuracy.py counts them as independent answers.

    .venv/bin/python drafts/ch10/catalog/similarity.py
"""
import sys, re
sys.path.insert(0, "drafts/ch10/catalog"); sys.path.insert(0, ".")
from autograder.classroom import similarity as S
import coursekit.conventions as C
import submissions
ref = {}
for path in ["drafts/ch10/decoding.py", "course/10_attention_kernels.py"]:
    try: src = open(path).read()
    except FileNotFoundError: continue
    for m in re.finditer(r"# %% \[exercise (\w+)\]\n(.*?)(?=\n# %%|\Z)", src, re.S):
        ref[m.group(1)] = C.strip_solution_markers(m.group(2))
pairs, stats = S.rank("10_attention_kernels", {k: dict(v) for k, v in submissions.STYLES.items()}, reference=ref, threshold=0.0)
for p in pairs: print(f"{p.exercise:26s} {p.a:22s} {p.b:10s} {p.score:.3f}")
