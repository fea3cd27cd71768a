"""What the course generator and the grader share: its conventions and its route to nbgrader.

``conventions``: names, paths, markers and cell roles of the course (no nbgrader runs).
``nbgrader_course``: the one way this project makes an nbgrader course and runs its apps.
"""
