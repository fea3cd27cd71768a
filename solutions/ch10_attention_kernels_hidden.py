"""Hidden tests (instructor-only) for chapter 10_attention_kernels.

generated from course/10_attention_kernels.py by `make generate`; do not edit.
"""



import solutions.ch10_attention_kernels as ref
from autograder.hidden import HiddenTests

hidden = HiddenTests(ref)
