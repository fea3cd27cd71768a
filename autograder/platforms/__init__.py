"""The grader where courses already grade: a Gradescope autograder zip (``gradescope``) and a
PrairieLearn external grader (``prairielearn``). Both carry the grader and one chapter's hidden
material (``bundle``) and grade through ``autograder.grade_notebook``: the same sandbox, limits,
judge and feedback as the command line."""
