"""Progress reporting that suits where the output goes: a bar on a terminal, plain lines in a log file.

A tqdm bar redraws itself with carriage returns; in a file (SLURM's output, CI, ``nohup``) every
redraw stays, and a 20-epoch run leaves hundreds of them. So the mode is one of:

- ``bar``: tqdm's bar (the default when the stream is a terminal);
- ``plain``: one ordinary line every :data:`PLAIN_SECONDS` seconds (``DDP_UTILS_PROGRESS_SECONDS``)
  and a last one when done (the default otherwise);
- ``off``: nothing.

``DDP_UTILS_PROGRESS=bar|plain|off`` chooses for a process and its children; a command's
``--progress`` option sets that variable (:func:`set_progress_mode`). :func:`progress` makes the
reporter; every bar of ddp_utils (the label scan, downloads, the training epoch) goes through it.
How often a reporter refreshes is its ``interval`` argument; the module's constants and
``DDP_UTILS_PROGRESS_SECONDS`` are only the defaults, never changed at run time.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

PROGRESS_ENV = "DDP_UTILS_PROGRESS"
PROGRESS_MODES = ("bar", "plain", "off")
PLAIN_SECONDS = 10.0  # how often a plain progress line is printed, unless $DDP_UTILS_PROGRESS_SECONDS says
PLAIN_SECONDS_ENV = "DDP_UTILS_PROGRESS_SECONDS"
BAR_SECONDS = 0.5  # how often a bar redraws (and its caller may refresh the description), unless given


def progress_mode(mode: str | None = None, stream: TextIO | None = None) -> str:
    """The progress mode: ``mode`` if given, else ``$DDP_UTILS_PROGRESS``, else bar on a terminal, plain otherwise.

    Args:
        mode: ``"bar"``, ``"plain"``, ``"off"``, or None to decide from the environment and ``stream``.
        stream: where the progress goes (default ``sys.stderr``).

    Returns:
        One of :data:`PROGRESS_MODES`.

    Raises:
        ValueError: an unknown mode (given or in the environment), named.

    Examples:
        >>> import io
        >>> progress_mode("off")
        'off'
        >>> os.environ.pop(PROGRESS_ENV, None) and None
        >>> progress_mode(stream=io.StringIO())  # not a terminal
        'plain'
    """
    source = "progress mode"
    if mode is None:
        mode, source = os.environ.get(PROGRESS_ENV, "").strip() or None, PROGRESS_ENV
    if mode is None:
        stream = sys.stderr if stream is None else stream
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "plain"
    if mode not in PROGRESS_MODES:
        raise ValueError(f"{source} {mode!r} is not one of {', '.join(PROGRESS_MODES)}")
    return mode


def set_progress_mode(mode: str | None) -> None:
    """Fix the progress mode for this process and the processes it starts (sets ``DDP_UTILS_PROGRESS``).

    Args:
        mode: ``"bar"``, ``"plain"`` or ``"off"``; None leaves the environment as it is.

    Raises:
        ValueError: an unknown mode.

    Examples:
        >>> set_progress_mode("off")
        >>> progress_mode(), os.environ[PROGRESS_ENV]
        ('off', 'off')
        >>> del os.environ[PROGRESS_ENV]  # the example's own clean-up: the variable was not set before
    """
    if mode is not None:
        os.environ[PROGRESS_ENV] = progress_mode(mode)


def plain_seconds() -> float:
    """Seconds between plain progress lines: ``$DDP_UTILS_PROGRESS_SECONDS``, else :data:`PLAIN_SECONDS`.

    Raises:
        ValueError: the variable is not a number >= 0, named.

    Examples:
        >>> os.environ.pop(PLAIN_SECONDS_ENV, None) and None
        >>> plain_seconds()
        10.0
    """
    value = os.environ.get(PLAIN_SECONDS_ENV, "").strip()
    if not value:
        return PLAIN_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{PLAIN_SECONDS_ENV}={value!r} is not a number of seconds >= 0")
    return seconds


def _number(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value / 2**20:.1f}MB"
    return f"{value:g}" if isinstance(value, float) else str(value)


class PlainProgress:
    """tqdm's few methods that ddp_utils uses, printing a plain line every ``interval`` seconds instead.

    Args:
        total: the number of steps (None: unknown).
        desc: the text before the count.
        unit: ``"B"`` shows bytes as MB; anything else counts steps.
        interval: seconds between lines (default :func:`plain_seconds`).
        file: where the lines go (default ``sys.stderr``).
        initial: steps already done (a resumed epoch counts from where it stopped, as tqdm's ``initial``).

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = PlainProgress(3, desc="scan", interval=3600, file=out)
        >>> for _ in range(3):
        ...     bar.update(1)
        >>> bar.close()
        >>> out.getvalue().splitlines()[-1].split(" ")[:3]
        ['scan', '3/3', '100%']
    """

    def __init__(
        self,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        interval: float | None = None,
        file: TextIO | None = None,
        initial: int = 0,
        **_tqdm_options: Any,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.interval = plain_seconds() if interval is None else interval
        self.file = sys.stderr if file is None else file
        self.n = self.initial = initial
        self.start = self.printed = time.monotonic()
        self.closed = False

    def due(self) -> bool:
        """Whether the next line is due: a caller computes an expensive description only then."""
        return time.monotonic() - self.printed >= self.interval

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.due():
            self._print()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def _print(self) -> None:
        self.printed = time.monotonic()
        elapsed = self.printed - self.start
        count = _number(self.n, self.unit)
        if self.total:
            count += f"/{_number(self.total, self.unit)} {100 * self.n / self.total:.0f}%"
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else math.nan
        speed = f"{_number(rate, self.unit)}/s" if self.unit == "B" else f"{rate:.2f} {self.unit}/s"
        print(f"{self.desc} {count} {elapsed:.1f}s {speed}".strip(), file=self.file, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print()

    def __iter__(self) -> Any:
        raise TypeError("PlainProgress counts with update(); iterate over the data and call update(1)")

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _TqdmProgress:
    """A tqdm bar with :meth:`due` (time to refresh the description, at most every ``interval`` seconds,
    :data:`BAR_SECONDS` by default); the bar redraws itself no more often."""

    def __init__(self, interval: float | None = None, **options: Any) -> None:
        from tqdm import tqdm  # lazy: a process that shows no bar never imports it

        self.interval = BAR_SECONDS if interval is None else interval
        options.setdefault("mininterval", self.interval)
        options.setdefault("file", sys.stderr)
        self.bar = tqdm(**options)
        self.refreshed: float | None = None  # never yet: the first refresh is due at once, whatever the clock reads

    def due(self) -> bool:
        if self.refreshed is None or time.monotonic() - self.refreshed > self.interval:
            self.refreshed = time.monotonic()
            return True
        return False

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.bar.set_description(desc, refresh=refresh)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> _TqdmProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()


class _NoProgress:
    """Mode ``off``: counts, never prints, never asks for a description."""

    def __init__(self, total: int | None = None, initial: int = 0, **_options: Any) -> None:
        self.total, self.n = total, initial

    def due(self) -> bool:
        return False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(
    total: int | None = None,
    desc: str = "",
    mode: str | None = None,
    interval: float | None = None,
    **tqdm_options: Any,
) -> Any:
    """A progress reporter for ``total`` steps in the mode :func:`progress_mode` picks.

    All three kinds have ``update(n)``, ``set_description(text)``, ``close()``, ``due()`` (whether a
    refresh is due now: a caller that must do work for the description, such as reading a loss
    back from a GPU, does it only then) and work as context managers.

    Args:
        total: the number of steps (or bytes with ``unit="B"``).
        desc: the text before the count.
        mode: ``"bar"``, ``"plain"``, ``"off"``, or None (see :func:`progress_mode`).
        interval: seconds between refreshes (and ``due()``): default :data:`BAR_SECONDS` for a bar,
            :func:`plain_seconds` for plain lines.
        tqdm_options: passed to tqdm in mode bar (``unit``, ``unit_scale``, ``leave``...); ``unit`` and
            ``file`` also shape the plain lines.

    Raises:
        ValueError: an unknown mode.

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> with progress(2, desc="labels", mode="plain", file=out) as bar:
        ...     bar.update(2)
        >>> out.getvalue().split(" ")[:3]
        ['labels', '2/2', '100%']
        >>> progress(2, mode="off").due()
        False
        >>> progress(2, mode="plain", interval=3600, file=out).due()  # the next line is an hour away
        False
    """
    mode = progress_mode(mode, tqdm_options.get("file"))
    if mode == "off":
        return _NoProgress(total)
    if mode == "plain":
        return PlainProgress(total, desc=desc, interval=interval, **tqdm_options)
    return _TqdmProgress(interval, total=total, desc=desc, **tqdm_options)
