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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("helper", ["run_in_own_group", "seconds_after_line"])
def test_a_timed_out_run_fails_and_leaves_no_process_in_another_session(helper, tmp_path):
    pid_file = tmp_path / "child.pid"
    command = [sys.executable, "-c", PARENT, str(pid_file)]
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            if helper == "run_in_own_group":
                run_in_own_group(command, cwd=tmp_path, timeout=5)
            else:
                seconds_after_line(
                    command, "started", cwd=tmp_path, timeout=5, env=dict(os.environ)
                )
        except BaseException as error:
            outcome.append(error)
        else:
            outcome.append(None)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    child = _child_pid(pid_file)
    runner.join(timeout=120)
    try:
        assert not runner.is_alive(), "the helper still waits on the pipes the child holds"
        assert isinstance(outcome[0], AssertionError), outcome
        assert "timed out after 5" in str(outcome[0])
        for _ in range(50):  # SIGKILLed: gone as soon as the kernel has reaped it
            if not _alive(child):
                break
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, 9)
