"""Progress of long work on stderr, with the stage it is in: a tqdm bar on a terminal, plain
periodic lines elsewhere (a log, CI, ``| tee``), nothing for work shorter than ``DELAY``.

``Progress("plan")`` is silent until ``DELAY`` seconds have passed (``show_now=True``: at once);
``stage("simulating", total)`` names what runs now (a bar per stage on a terminal, a line when a
stage starts elsewhere), ``update(n)`` counts work done, ``close()`` ends it (a last line off a
terminal). A daemon thread keeps the display alive while the caller is blocked in one long call (an
XLA compilation): the bar's clock ticks, and off a terminal a line is written every ``INTERVAL``
seconds. The environment variable ``DIFFPIPE_PROGRESS=0`` turns the automatic display off (the test
suite sets it, so that a command's stderr is its one error line); ``show_now`` still shows. No
diffpipe imports: any layer may use it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

#: Work shorter than this shows nothing (seconds).
DELAY = 2.0
#: Seconds between the plain lines written when stderr is not a terminal.
INTERVAL = 10.0
#: ``DIFFPIPE_PROGRESS`` values that turn the automatic display off.
OFF = ("0", "off", "false", "no")
#: How often the display thread wakes (seconds).
_TICK = 0.25


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """The progress of one command (``label``) on ``stream`` (default stderr); see the module docstring.

    Args:
        label: the command it counts for (``plan``, ``sweep``, ...).
        enabled: False: silent.
        show_now: show from the start (else after ``delay`` seconds).
        stream: where to write (default ``sys.stderr``).
        delay, interval: default ``DELAY`` and ``INTERVAL``.
        terminal: draw a bar (default: whether ``stream`` is a terminal and tqdm imports).
    """

    def __init__(self, label: str, enabled: bool = True, *, show_now: bool = False, stream: TextIO | None = None,
                 delay: float | None = None, interval: float | None = None, terminal: bool | None = None):
        if not show_now and os.environ.get("DIFFPIPE_PROGRESS", "").strip().lower() in OFF:
            enabled = False
        self.label, self.enabled = label, bool(enabled)
        self.stream = sys.stderr if stream is None else stream
        self.delay = 0.0 if show_now else float(DELAY if delay is None else delay)
        self.interval = float(INTERVAL if interval is None else interval)
        self.name, self.total, self.done = "starting", None, 0
        self.start = self.stage_start = time.perf_counter()
        self.shown, self.last_line, self.bar = False, -float("inf"), None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tqdm = None
        if terminal is None:
            terminal = _is_terminal(self.stream)
        if terminal and self.enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            self._tqdm = tqdm
        self._thread = None
        if self.enabled and self.delay <= 0:
            self._show()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name=f"diffpipe-{label}-progress", daemon=True)
            self._thread.start()

    # -- the caller's side -----------------------------------------------------------------------------
    def stage(self, name: str, total: int | None = None) -> None:
        """Start stage ``name`` (``total`` units of work, None: unknown)."""
        if not self.enabled:
            return
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            self.name, self.total, self.done = name, total, 0
            self.stage_start = time.perf_counter()
            if self.shown:
                self._show()

    def phase(self, name: str) -> None:
        """Rename what runs now, inside the stage, its count kept (``searching: compiling 1f1b``)."""
        if not self.enabled:
            return
        with self._lock:
            self.name = name
            if self.bar is not None:
                self.bar.set_description_str(f"{self.label}: {name}", refresh=False)

    def update(self, n: int = 1) -> None:
        """``n`` more units of the stage's work done."""
        if not self.enabled:
            return
        with self._lock:
            self.done += n
            if self.bar is not None:
                self.bar.update(n)

    def close(self) -> None:
        """End the display (a last line off a terminal, when anything was shown)."""
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            elif self.shown:
                self._write(f"{self._prefix()}done in {time.perf_counter() - self.start:.0f} s")
            self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the display -----------------------------------------------------------------------------------
    def _prefix(self) -> str:
        return f"diffpipe {self.label}: "

    def _line(self) -> str:
        elapsed = time.perf_counter() - self.start
        count = ""
        if self.total:
            count = f" {self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%)"
        elif self.done:
            count = f" {self.done:,} done"
        return f"{self._prefix()}{self.name}{count}, {elapsed:.0f} s"

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: stop quietly
            self._stop.set()

    def _show(self) -> None:
        """Under the lock: draw the stage (a new bar, or a line)."""
        self.shown = True
        if self._tqdm is not None:
            self.bar = self._tqdm(total=self.total, initial=self.done, desc=f"{self.label}: {self.name}",
                                  file=self.stream, leave=False, dynamic_ncols=True)
        else:
            self._write(self._line())
            self.last_line = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.wait(_TICK):
            with self._lock:
                now = time.perf_counter()
                if not self.shown:
                    if now - self.start >= self.delay:
                        self._show()
                elif self.bar is not None:
                    self.bar.refresh()
                elif self._tqdm is None and now - self.last_line >= self.interval:
                    self._write(self._line())
                    self.last_line = now


__all__ = ["DELAY", "INTERVAL", "Progress"]
