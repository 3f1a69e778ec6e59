"""`accelify verify`'s runs, forked from one process that imported torch once
(accelify/verify/forks.py): each run is set up as a process started on its own would be."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from accelify.verify import runs as runs_module
from accelify.verify.records import PROBE_FAILED
from accelify.verify.runs import ForkedProcess, RunSettings, start_runs, stop_all

SEES = """\
import os, sys
print("cwd", os.getcwd())
print("path", sys.path[:2])
print("argv", sys.argv[1:])
print("out", os.environ["ACCELIFY_VERIFY_OUT"])
print("group", os.getpgrp() == os.getpid())
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(
    "forked",
    [
        pytest.param(
            True,
            id="forked",
            marks=pytest.mark.skipif(sys.platform != "linux", reason="forked on Linux only"),
        ),
        pytest.param(False, id="started-alone"),
    ],
)
def test_each_run_is_set_up_as_a_process_of_its_own_forked_or_not(
    forked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same lines whether the runs are forked from one process (Linux) or each started as
    `python -m accelify.verify.probe` (elsewhere)."""
    if not forked:
        monkeypatch.setattr(runs_module.sys, "platform", "elsewhere")
    script = tmp_path / "sees.py"
    script.write_text(SEES)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    settings = RunSettings(steps=1, timeout=120, args=("3",))
    runs = start_runs([(script, "first", 1), (script, "second", 1)], scratch, settings)
    try:
        assert all(isinstance(run.process, ForkedProcess) == forked for run in runs)
        first, second = (run.finish() for run in runs)
    finally:
        stop_all(runs)
    for run in (first, second):
        assert run.returncode == 3, run.output
        workdir = scratch / f"{run.label}-work"
        assert run.stdout.splitlines() == [
            f"cwd {workdir}",
            # the script's folder, then the working directory, as for `python -m ...probe`
            f"path {[str(script.parent), str(workdir)]}",
            "argv ['3']",
            f"out {scratch / f'{run.label}-records'}",
            "group True",
        ]
        assert run.output.endswith("to stderr\n")
    assert runs[0].process.pid != runs[1].process.pid


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "started-alone"])
def test_each_run_imports_the_modules_of_its_own_project(
    forked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`verify ../a/train.py train.py`: the run labelled "original" imports the original
    project's trainer.py, the run labelled "converted" the converted project's (each run's
    search path by its label), though both run the same copied script away from either."""
    if not forked or sys.platform != "linux":
        monkeypatch.setattr(runs_module.sys, "platform", "elsewhere")
    projects = {}
    for name in ("original", "converted"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "trainer.py").write_text(f"WHICH = {name!r}\n")
        (folder / "train.py").write_text("import trainer\nprint(trainer.WHICH)\n")
        projects[name] = folder
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = scratch / "train.py"  # verify runs copies, away from either project
    script.write_text((projects["original"] / "train.py").read_text())
    settings = RunSettings(
        steps=1,
        timeout=120,
        search_path=projects["original"],
        search_paths=(("converted", projects["converted"]),),
    )
    runs = start_runs([(script, "original", 1), (script, "converted", 1)], scratch, settings)
    try:
        first, second = (run.finish() for run in runs)
    finally:
        stop_all(runs)
    assert first.stdout.splitlines() == ["original"], first.output
    assert second.stdout.splitlines() == ["converted"], second.output


@pytest.mark.skipif(sys.platform != "linux", reason="verify forks its runs on Linux only")
def test_a_forked_run_is_stopped_by_its_own_group(tmp_path: Path):
    """Stopping one run (SIGTERM to its process group) leaves the other running; the
    supervisor ends once both have."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    quick = tmp_path / "quick.py"
    quick.write_text("import time\ntime.sleep(1)\nprint('done')\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runs = start_runs([(sleeper, "sleeper", 1), (quick, "quick", 1)], scratch, RunSettings(1, 120))
    try:
        pid = runs[0].process.pid
        while "up" not in (scratch / "sleeper.log").read_text():
            assert runs[0].process.poll() is None
            time.sleep(0.05)
        runs[0].stop()
        assert runs[0].process.poll() == -signal.SIGTERM
        quick_run = runs[1].finish()
        assert quick_run.returncode == 0 and quick_run.stdout == "done\n"
    finally:
        stop_all(runs)
    supervisor = runs[0].process.forked.process
    assert supervisor.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(sys.platform != "linux", reason="verify forks its runs on Linux only")
def test_a_supervisor_that_cannot_import_torch_fails_every_run_as_the_probes_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('no torch here')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    script = tmp_path / "script.py"
    script.write_text("print('never runs')\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runs = start_runs([(script, "first", 1), (script, "second", 2)], scratch, RunSettings(1, 120))
    try:
        first, second = (run.finish() for run in runs)
    finally:
        stop_all(runs)
    assert first.returncode == second.returncode == PROBE_FAILED
    assert "ImportError: no torch here" in first.output  # the supervisor's error, in the first's
    assert "never runs" not in first.output + second.output
