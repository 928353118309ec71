"""A progress bar for long runs: rich's when it is installed, numbered lines otherwise."""
from __future__ import annotations

import sys
from typing import Callable, TextIO


class Progress:
    """``begin(text)`` before a step, ``done()`` after it, ``log(line)`` for lines that must stay
    on screen (skips, failures). Steps go to stderr; logged lines go to ``log`` when given, else
    to ``out`` (stdout)."""

    def __init__(self, total: int, *, use_rich: bool = True, out: TextIO | None = None,
                 err: TextIO | None = None, log: Callable[[str], None] | None = None):
        self.total = max(int(total), 0)
        self._log = log
        self.count = 0
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._rich = None
        # a bar needs a terminal; logs and pipes get the numbered lines
        if use_rich and self.total and getattr(self.err, "isatty", lambda: False)():
            try:
                from rich.console import Console  # noqa: PLC0415
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,  # noqa: PLC0415
                                           TextColumn, TimeElapsedColumn)
            except ImportError:
                pass
            else:
                console = Console(file=self.err)
                self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                          TimeElapsedColumn(), console=console, transient=True)
                self._task = self._rich.add_task("", total=self.total)
                self._rich.start()

    def begin(self, text: str) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        else:
            width = len(str(self.total))
            print(f"[{self.count + 1:>{width}}/{self.total}] {text}", file=self.err, flush=True)

    def done(self) -> None:
        self.count += 1
        if self._rich is not None:
            self._rich.advance(self._task)

    def log(self, line: str) -> None:
        if self._log is not None:
            self._log(line)
        else:
            # rich's live display redirects stdout, so a plain print lands above the bar
            print(line, file=self.out, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
