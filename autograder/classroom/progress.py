"""A one-line progress bar: done/total, rate, time left."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.started = time.monotonic()

    def step(self, n=1):
        self.done += n
        self.draw()

    def draw(self):
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed * 60
        left = (self.total - self.done) / (self.done / elapsed) if self.done else float("nan")
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        eta = f"{int(left // 60)}:{int(left % 60):02d}" if left == left else "--:--"
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"{rate:5.1f}/min  left {eta} ")
        self.stream.flush()
        if self.done == self.total:
            self.stream.write("\n")
