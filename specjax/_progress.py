"""A dependency-free text progress bar on standard error, one step per unit of work."""

from __future__ import annotations

import sys
import time


class Progress:
    """A text progress bar on standard error (no dependency), one step per simulation chunk."""

    def __init__(self, total: int, enabled: bool = True, width: int = 30):
        self.total, self.done, self.enabled, self.width = total, 0, enabled, width
        self.start = time.perf_counter()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] "
                         f"{self.done}/{self.total} {elapsed:5.0f}s {label:<40.40}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
