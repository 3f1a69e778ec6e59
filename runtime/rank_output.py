"""Each printed line reaches the terminal whole, whichever rank printed it.

Ranks share the launcher's stdout and stderr. Under ``PYTHONUNBUFFERED=1`` (common in container
images and CI) Python writes ``print``'s text and its newline in two system calls, and two ranks
printing at once produce ``rank 0: donerank 1: done`` and an empty line. A line written in one
call of at most ``PIPE_BUF`` bytes is never split, so the streams keep writing each line as soon
as it ends (what unbuffered output is for) but in one call.
"""

from __future__ import annotations

import io
import sys


def write_whole_lines() -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.write_through:
            stream.reconfigure(line_buffering=True, write_through=False)
