"""A progress line on stderr for work that runs longer than a second (silent otherwise,
and never on stdout, so `--json` output stays clean)."""

from __future__ import annotations

import sys
import time

SILENT_FOR_S = 1.0  # work shorter than this prints nothing
EVERY_S = 1.0  # at most one update per second on a terminal; one line per 10 s into a log


class Progress:
    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total, self.stream = label, total, stream or sys.stderr
        self.start = self.last = time.perf_counter()
        self.shown = False
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.start < SILENT_FOR_S or now - self.last < (EVERY_S if self.tty else 10 *
                                                                 EVERY_S):
            return
        self.last, self.shown = now, True
        eta = (now - self.start) / max(done, 1) * (self.total - done)
        line = f"{self.label}: {done:,}/{self.total:,} ({eta:.0f} s left)"
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            elapsed = time.perf_counter() - self.start
            self.stream.write(
                f"{chr(13) if self.tty else ''}{self.label}: {self.total:,} done in {elapsed:.1f} "
                "s\n")
            self.stream.flush()
