"""Each line ``print`` writes reaches the terminal whole, whichever rank printed it; the
script's streams stay as Python made them.

Ranks share the launcher's stdout and stderr. Under ``PYTHONUNBUFFERED=1`` (common in container
images and CI) every write goes through at once, and ``print`` writes its text and its newline
in two calls: two ranks printing at once produce ``rank 0: donerank 1: done`` and an empty line.
A write of at most ``PIPE_BUF`` bytes is never split, so there ``print`` writes what one call
prints in one write. The streams themselves are not touched: made line-buffered (as they once
were), they held a partial line (``print("loading", end="")``) back until its newline, so
through a pipe it came after the stderr lines written after it, and a rank killed before the
newline lost it. Without ``PYTHONUNBUFFERED`` Python buffers the streams itself and nothing here
changes.
"""

from __future__ import annotations

import builtins
import functools
import io
import sys
from typing import Any

_PRINT = builtins.print


def write_whole_lines() -> None:
    """Once per process, when stdout or stderr writes through (``PYTHONUNBUFFERED``)."""
    if builtins.print is _PRINT and any(map(_writes_through, (sys.stdout, sys.stderr))):
        builtins.print = _print_in_one_write


def _writes_through(stream: object) -> bool:
    return isinstance(stream, io.TextIOWrapper) and stream.write_through


@functools.wraps(_PRINT)
def _print_in_one_write(
    *values: object,
    sep: str | None = " ",
    end: str | None = "\n",
    file: Any = None,
    flush: bool = False,
) -> None:
    stream = sys.stdout if file is None else file
    if not _writes_through(stream):
        return _PRINT(*values, sep=sep, end=end, file=file, flush=flush)
    text = io.StringIO()
    try:
        _PRINT(*values, sep=sep, end=end, file=text)  # print's own words and errors
    finally:
        # what print had written when a value's __str__ raised, as print would have
        printed = text.getvalue()
        if printed:
            stream.write(printed)
    if flush:
        stream.flush()
    return None
