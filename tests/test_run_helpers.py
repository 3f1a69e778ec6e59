"""The suite's own helpers for running commands (tests/conftest.py): a run past its timeout fails
its test, with every process it started stopped, instead of hanging the suite."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import run_in_own_group, seconds_after_line

#: Starts a child in a session of its own (as torch's elastic agent starts each rank), which
#: inherits the pipes, writes its pid and sleeps; then sleeps itself.
PARENT = """
import subprocess, sys, time
child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], start_new_session=True)
print("started", file=sys.stderr, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead; reaped by init once its parent is gone
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().rpartition(")")[2].split()[0] == "Z")


def _child_pid(path: Path) -> int:
    for _ in range(600):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError("the child never started")


#: Long enough for two Pythons to start on a loaded machine; the test waits it out, idle
TIMEOUT = 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_timed_out_run_fails_and_leaves_no_process_in_another_session(tmp_path):
    """Both helpers at once (the test's time is one TIMEOUT)."""
    helpers = {
        "run_in_own_group": lambda command, cwd: run_in_own_group(command, cwd, TIMEOUT),
        "seconds_after_line": lambda command, cwd: seconds_after_line(
            command, "started", cwd, TIMEOUT, dict(os.environ)
        ),
    }
    outcomes: dict[str, BaseException | None] = {}

    def run(name: str, folder: Path) -> None:
        try:
            helpers[name]([sys.executable, "-c", PARENT, str(folder / "child.pid")], folder)
        except BaseException as error:
            outcomes[name] = error
        else:
            outcomes[name] = None

    runners, children = {}, {}
    for name in helpers:
        folder = tmp_path / name
        folder.mkdir()
        runners[name] = threading.Thread(target=run, args=(name, folder), daemon=True)
        runners[name].start()
    try:
        for name in helpers:
            children[name] = _child_pid(tmp_path / name / "child.pid")
        for name, runner in runners.items():
            runner.join(timeout=120)
            assert not runner.is_alive(), f"{name} still waits on the pipes the child holds"
            assert isinstance(outcomes[name], AssertionError), outcomes
            assert f"timed out after {TIMEOUT}" in str(outcomes[name])
            for _ in range(50):  # SIGKILLed: gone as soon as the kernel has reaped it
                if not _alive(children[name]):
                    break
                time.sleep(0.1)
            assert not _alive(children[name]), name
    finally:
        for child in children.values():
            if _alive(child):
                os.kill(child, 9)
