"""Instructor-only: reference solutions and hidden tests, generated from course/.

Never publish this package; the grader keeps it out of reach of submitted code.
"""
