"""``python -m accelify.verify.forks SPEC.json``: import torch once, then fork one process per run
of the spec (the original and the conversion on one process under the probe, and `accelify
launch` of the conversion's ranks), each set up as if it had been started on its own: its own
process group, working directory, output files and environment. Each process then runs as a
fresh one does from there on and exits the interpreter's usual way (the script's ``atexit``
handlers, its threads joined, its exit code). What is shared is what every run would import
first anyway: torch (2 CPU-seconds a process), torch._dynamo and the probe, which installs
nothing until a run calls it.

The supervisor reports on its stdout, one line each, ``started LABEL PID`` as it forks a run and
``ended LABEL CODE`` as the run ends (CODE as `subprocess.Popen.returncode`: -N for signal N),
then exits when every run has ended. It ignores SIGTERM: stopping a run is signalling that run's
process group, as for a process started on its own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path

from accelify.runtime.launch import forking
from accelify.verify.records import PROBE_FAILED


def main() -> None:
    runs = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    start = os.getcwd()
    try:
        from accelify.verify import probe  # torch, for every run
    except BaseException:  # ours, not a script's: the probe's own exit code
        traceback.print_exc()
        sys.exit(PROBE_FAILED)
    forking.share_what_every_run_loads()  # torch._dynamo too, then frozen
    run = _fork_each(runs)
    _become(run, start)
    if run["launch"]:  # `python -m accelify launch ...`
        import runpy

        sys.argv = ["accelify", *run["arguments"]]
        runpy.run_module("accelify", run_name="__main__", alter_sys=True)
    else:  # `python -m accelify.verify.probe SCRIPT ARGS...`
        sys.argv = [probe.__file__, *run["arguments"]]
        probe.main()


def _fork_each(runs: list[dict]) -> dict:
    """Returns in each forked run with its spec; the supervisor never returns."""
    started: dict[int, str] = {}
    for run in runs:
        pid = os.fork()
        if pid == 0:
            return run
        started[pid] = run["label"]
        _report(f"started {run['label']} {pid}")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while started:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in started:
            _report(f"ended {started.pop(pid)} {os.waitstatus_to_exitcode(status)}")
    os._exit(0)


def _become(run: dict, start: str) -> None:
    """What starting the run as a process of its own would have given it."""
    os.setpgid(0, 0)
    os.chdir(run["workdir"])
    for fd, path in ((1, run["stdout"]), (2, run["stderr"])):
        # appended to: the parent made them, and the supervisor's own errors may be there first
        opened = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    forking.streams_as_started()  # over the run's files, as a fresh run's
    os.environ.update(run["env"])
    forking.seed_again()  # as a fresh process seeds its random generators
    forking.multiprocessing_as_started_here()
    # `python -m` puts its working directory first on the path: the run's, not the supervisor's
    if sys.path and sys.path[0] == start:
        sys.path[0] = os.getcwd()


def _report(line: str) -> None:
    os.write(1, f"{line}\n".encode())


if __name__ == "__main__":
    main()
