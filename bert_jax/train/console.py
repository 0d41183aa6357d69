"""What process 0 shows on the terminal while it trains: the progress bar, and lines that
never land inside it.

tqdm draws its bar on stderr; a plain `print` (stdout) or a log record (stderr) written
while the bar is up lands on the end of the bar's line. `say` writes through tqdm.write,
which clears the bars, writes the line and draws them again (a plain print when no bar is
up); `Bar` makes log records do the same while it is drawn.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional


def say(message: str) -> None:
    """One line on stdout, above any progress bar."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stdout)
    sys.stdout.flush()


class _AboveTheBar(logging.Handler):
    """A root logger's handler, made to clear the bars before its record and redraw them
    after (its own level and filters still decide what it writes)."""

    def __init__(self, inner: logging.Handler):
        super().__init__(inner.level)
        self.inner = inner

    def handle(self, record: logging.LogRecord) -> bool:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            return bool(self.inner.handle(record))


class Bar:
    """A tqdm progress bar of `steps` steps from `start` on stderr (None when not `show`);
    while it is up, the root logger's handlers (absl's included) write above it."""

    def __init__(self, show: bool, start: int, steps: int, name: str):
        self.bar, self._handlers = None, None
        if not show:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True, desc=name)
        root = logging.getLogger()
        self._handlers = list(root.handlers)
        root.handlers = [_AboveTheBar(h) for h in self._handlers]

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_postfix(self, **values) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**values)

    def close(self) -> None:
        if self._handlers is not None:
            logging.getLogger().handlers = self._handlers
            self._handlers = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def bar(show: bool, start: int, steps: int, name: str) -> Optional[Bar]:
    return Bar(show, start, steps, name) if show else None
