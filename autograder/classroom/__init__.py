"""A whole class: release, collect, grade in parallel (robust, resumable, shardable), feedback,
export, the class report.

A class lives in an nbgrader course folder (the sqlite gradebook is the record):

    COURSE/
      source/<chapter>/<chapter>.ipynb         instructor notebooks (from `release`)
      release/<chapter>/<chapter>.ipynb        learner notebooks made by generate_assignment
      submitted/<student>/<chapter>/<chapter>.ipynb
      gradebook.db                             nbgrader gradebook (scores per test cell)
      feedback/<student>/<chapter>/<chapter>.html
      class-grades.csv, class-exercises.csv    exports (grades.csv is left to `nbgrader export`)
      class-report.html/.csv                   the class report (``class_report``)
      class-similarity.html/.csv               similar answer cells (``similarity``)
      .grading/ledger.jsonl                    one line per graded submission (resume, reasons)
      .grading/runs.jsonl                      one line per grade-class run (time, throughput)

Worker processes (``workers``) grade one submission each in a private scratch course
and send back the outcome; only the class run's process writes the gradebook (``record``), so nothing is shared
between submissions and an interrupted run leaves every committed grade intact.
"""
