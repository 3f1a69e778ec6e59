"""Ctrl-C while `accelify launch` starts (Python, click, the config) ends it at once, in one line.

Before the launcher's own handling began, a Ctrl-C there raised KeyboardInterrupt wherever the
process was: inside click, which printed "Aborted!" and exited 1, or inside an import, which
printed a traceback (or whose own ``try`` caught it and went on). Nothing has started by then
(no template, no rank, no port): the process ends there and then with the launcher's line and
exit 130, as a shell expects of a process ended by SIGINT. The launcher takes SIGINT over as
it starts torch (`accelify.runtime.launch.launcher`), and hands it back to Python's own
handler after (`python_handles_it_again`), so that what it starts is stopped in order.

Only the `accelify launch` command of this process's own ``accelify`` or ``python -m
accelify`` sets it: a program that imports accelify.cli (a test's CliRunner) keeps its own
handler; a shell that made the launcher ignore SIGINT (``accelify launch ... &`` in a script)
is obeyed. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

#: What the launcher prints when stopped before any rank started
#: (`accelify.runtime.launch.outcome.stopped_before_any_rank`, not imported here: it is not light)
STOPPED = "accelify launch: stopped by SIGINT before any rank started"


def _stop_now(_signum: int, _frame: object) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(STOPPED + "\n")
        sys.stderr.flush()
    os._exit(128 + signal.SIGINT)


def stop_at_once_while_the_launch_starts() -> None:
    """Set the handler when this process is the ``accelify launch`` command (see above)."""
    if not _the_command() or sys.argv[1:2] != ["launch"]:
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop_now)


def python_handles_it_again(handler: object) -> object:
    """The handler to put back once the launcher has taken SIGINT over: Python's own in place
    of this module's, any other as it was."""
    return signal.default_int_handler if handler is _stop_now else handler


def _the_command() -> bool:
    """Whether ``__main__`` is accelify's entry: the ``accelify`` script or ``python -m
    accelify``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "accelify.__main__":
        return True
    path = getattr(main, "__file__", None)
    return spec is None and path is not None and Path(path).stem == "accelify"
