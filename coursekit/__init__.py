"""What the course generator and the grader share: its conventions and its route to nbgrader.

``conventions``: names, paths, markers and cell roles of the course (no nbgrader runs).
``source``: the chapter-source format (``course/NN_name.py`` read into cells).
``sample_submissions``: submissions made from a learner notebook and the reference.
``similarity_variants``: disguised copies and independent solutions (data for the similarity report's measurement).
``nbgrader_course``: the one way this project makes an nbgrader course and runs its apps.
"""
