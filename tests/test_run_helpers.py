"""The suite's own helpers for running commands (tests/conftest.py): a run past its timeout fails
its test, with every process it started stopped, instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (
    FRESH_PROCESSES,
    START_ENVIRONMENT,
    ForkedRun,
    _forkable,
    run_in_own_group,
    seconds_after_line,
    start,
)

#: Starts a child in a session of its own (as torch's elastic agent starts each rank), which
#: inherits the pipes, writes its pid and sleeps; then sleeps itself. The child is a shell, not
#: a second Python: what must happen before the run's timeout is then one Python's start (none
#: for a forked run) and a shell's, not two Pythons' (see TIMEOUT).
PARENT = """
import subprocess, sys, time
child = 'echo $$ > "$1"; exec sleep 600'
subprocess.Popen(["/bin/sh", "-c", child, "sh", sys.argv[1]], start_new_session=True)
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


def _child_pid(path: Path, runner: threading.Thread, outcome: dict[str, object], name: str) -> int:
    """The pid the run's child wrote. A run that ended (or was stopped at its timeout) before
    its child wrote it fails the test with what the helper said of it (the run's exit and its
    output): not a bare "never started" a minute later, which hid why."""
    for _ in range(600):
        if path.exists() and path.read_text():
            return int(path.read_text())
        if not runner.is_alive():
            if path.exists() and path.read_text():
                return int(path.read_text())
            raise AssertionError(f"{name}: the child never started; the run: {outcome.get(name)}")
        time.sleep(0.1)
    raise AssertionError(f"{name}: the child never started")


#: Long enough for the run to start its child on a loaded machine; the test waits it out, idle.
#: The child is a shell (started in milliseconds), but the "fresh" run is a new Python first,
#: and one Python start has taken ~5 s at load ~20 with two static sets side by side
TIMEOUT = 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("started", ["fresh", "forked"])
def test_a_timed_out_run_fails_and_leaves_no_process_in_another_session(tmp_path, started):
    """Both helpers at once (the test's time is one TIMEOUT); the run a fresh process, or a
    fork of the fork server (a script that imports torch first)."""
    if started == "forked":
        if FRESH_PROCESSES:
            pytest.skip("ACCELIFY_TEST_FRESH_PROCESSES=1 forks nothing")
        script = tmp_path / "parent.py"
        script.write_text(f"import torch  # noqa: F401\n{PARENT}")
        # the environment the test process started with: one an earlier test's imports
        # changed in this process would start the run fresh
        env = dict(START_ENVIRONMENT)
        assert _forkable([sys.executable, str(script)], tmp_path, env)
        program = [str(script)]
    else:
        env = dict(os.environ)
        program = ["-c", PARENT]
    helpers = {
        "run_in_own_group": lambda command, cwd: run_in_own_group(command, cwd, TIMEOUT, env),
        "seconds_after_line": lambda command, cwd: seconds_after_line(
            command, "started", cwd, TIMEOUT, env
        ),
    }
    outcomes: dict[str, BaseException | None] = {}

    def run(name: str, folder: Path) -> None:
        try:
            helpers[name]([sys.executable, *program, str(folder / "child.pid")], folder)
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
            children[name] = _child_pid(
                tmp_path / name / "child.pid", runners[name], outcomes, name
            )
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


#: What a run sees of how it was started; it imports torch before any statement of its own, so
#: the helpers start it as a fork of the fork server (tests/fork_server.py)
STARTED = '''"""Reports how it was started."""
import atexit
import json
import os
import sys

import torch  # noqa: F401

atexit.register(print, "atexit ran", flush=True)
main = sys.modules["__main__"]
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "variable": os.environ.get("ACCELIFY_PROBE"),
    "unset": "ACCELIFY_UNSET" in os.environ,
    "name": __name__,
    "file": __file__,
    "main": main.__dict__ is globals() and main.__file__ == __file__,
    "session": os.getsid(0) == os.getpid(),
    "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2),
}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("from the script")
sys.exit(int(sys.argv[1]))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux only")
@pytest.mark.skipif(FRESH_PROCESSES, reason="ACCELIFY_TEST_FRESH_PROCESSES=1 forks nothing")
@pytest.mark.parametrize("ending", ["3", "0", "raise"])
def test_a_forked_run_starts_as_a_fresh_process_would(tmp_path, monkeypatch, ending):
    (tmp_path / "started.py").write_text(STARTED)
    monkeypatch.setenv("ACCELIFY_UNSET", "1")  # set here, not in the run's environment
    # the test process's own environment as it started (a variable an import of an earlier
    # test set in this process would make the run start fresh), with this test's variables
    env = {**START_ENVIRONMENT, "ACCELIFY_PROBE": "sent"}
    command = [sys.executable, "started.py", ending]
    forked = start(command, cwd=tmp_path, env=env)
    assert isinstance(forked, ForkedRun), "not started from the fork server"
    fresh = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert forked.communicate(timeout=120) == fresh.communicate(timeout=120)
    assert forked.returncode == fresh.returncode == (1 if ending == "raise" else int(ending))


@pytest.mark.parametrize(
    ("source", "env", "forked"),
    [
        ('"""Doc."""\nimport os\nimport torch\n', {}, True),
        ("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n", {}, False),
        ("import numpy\nimport torch\n", {}, False),
        ("import torch\n", {"OMP_NUM_THREADS": "1"}, False),
        ("import torch\n", {"ACCELIFY_USE_CPU": "true"}, True),
        ("print('no torch')\n", {}, False),
    ],
    ids=[
        "imports-first",
        "sets-a-variable-first",
        "other-package-first",
        "torch-variable",
        "per-test-variable",
        "no-torch",
    ],
)
def test_only_what_would_import_torch_first_in_the_same_environment_is_forked(
    tmp_path, source, env, forked
):
    """A script that sets a variable torch reads as it starts, or imports a package that may,
    before it imports torch, or an environment torch would start differently in, starts fresh:
    torch in the fork server was imported before that and with its own environment."""
    (tmp_path / "script.py").write_text(source)
    environment = {**START_ENVIRONMENT, **env}
    assert _forkable([sys.executable, "script.py"], tmp_path, environment) is forked
    # the launcher imports torch before it reads or sets anything: only the environment counts
    launch = [sys.executable, "-m", "accelify", "launch", "script.py"]
    assert _forkable(launch, tmp_path, environment) is ("OMP_NUM_THREADS" not in env)
