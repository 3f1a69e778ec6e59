"""Ctrl-C and the launcher's other stops end a run at once, quietly, and leave nothing behind:
with the ranks inside a collective, in the first seconds of a launch, on forked and fresh ranks
alike (issue 20)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelify.runtime import collective_record
from accelify.runtime.collective_record import CRASHED, IN_COLLECTIVE, LEAVING, RUNNING, Record
from accelify.runtime.environment import FAILURE_DIR
from accelify.runtime.launch import launcher, leftovers, lifeline, outcome, watch
from conftest import _kill_group, start

#: Rank 1 sleeps while rank 0 waits for it in a barrier.
WAITS_IN_A_BARRIER = textwrap.dedent(
    f"""
    import os
    import time
    import torch
    from torch import nn
    from accelify import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(4, 1))
    accelerator.backward(model(torch.randn(2, 4)).sum())
    accelerator.print("RECORDS", os.environ["{FAILURE_DIR}"], flush=True)
    if accelerator.process_index == 1:
        time.sleep(600)
    accelerator.wait_for_everyone()
    """
)

#: fcntl's option that sizes a pipe (Linux; Python 3.10's fcntl names it)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

FRESH = pytest.mark.parametrize("fresh", ["0", "1"], ids=["forked", "fresh"])


def _environment(fresh: str) -> dict[str, str]:
    return {**os.environ, "ACCELIFY_FRESH_RANKS": fresh}


def _after_the_stop(process: subprocess.Popen[str]) -> str:
    """The launcher's stderr once it has ended. A stop it lost leaves the run going (the ranks
    wait or sleep for minutes): that fails here, by name, not as a timeout with no word."""
    try:
        return process.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        pytest.fail("the launcher was sent its stop and the run went on for 60 s: it was lost")


def _wait_in_a_collective(records: Path, rank: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        record = collective_record.read(records, rank)
        if record is not None and record.state == IN_COLLECTIVE:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never entered its collective")


def _wait_past_its_backward(records: Path, rank: int, deadline: float) -> None:
    """Until the rank has made its backward pass and is out of it (`WAITS_IN_A_BARRIER`'s rank 1
    then sleeps)."""
    while time.monotonic() < deadline:
        record = collective_record.read(records, rank)
        if record is not None and record.state == RUNNING and record.passes:
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never came out of its backward pass")


#: `WAITS_IN_A_BARRIER`, each rank writing to ``$IN_FLIGHT<rank>``, as its exit ends, how many
#: of the runtime's collectives are still held (`pending_work.in_flight`): its handler is
#: registered before the Accelerator's exit guard (`_ExitGuard.close`), so it runs after it.
SAYS_WHAT_IS_HELD_AT_EXIT = WAITS_IN_A_BARRIER.replace(
    "from accelify import Accelerator\n",
    "from accelify import Accelerator\n"
    "import atexit\n"
    "from accelify.runtime import pending_work\n"
    "def held():\n"
    "    with open(os.environ['IN_FLIGHT'] + os.environ['RANK'], 'w') as file:\n"
    "        file.write(str(pending_work.in_flight()))\n"
    "atexit.register(held)\n",
)


@pytest.mark.distributed
@FRESH
def test_ctrl_c_while_a_rank_waits_in_a_collective_ends_the_run_at_once(
    fresh: str, tmp_path: Path
) -> None:
    """The interrupted barrier's work stayed held by the traceback Python keeps of the
    KeyboardInterrupt (``sys.last_value``) until finalization, and the exit guard waited
    `_ExitGuard.EXIT_WAIT` twice for it: 21 s from Ctrl-C to the end. Now the guard lets go
    of that traceback and the work is freed: nothing the runtime launched is still held once
    the guard is done, on either rank (with the work held, rank 0 said 1, whatever the
    machine's load: no wait frees it before finalization)."""
    script = tmp_path / "waits.py"
    script.write_text(SAYS_WHAT_IS_HELD_AT_EXIT)
    held = tmp_path / "in_flight"
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    environment = {**_environment(fresh), "IN_FLIGHT": str(held)}
    process = start(command, cwd=tmp_path, env=environment)
    try:
        word, records = process.stdout.readline().split()
        assert word == "RECORDS"
        attempt = collective_record.attempt_directory(Path(records), 0)
        _wait_in_a_collective(attempt, 0, time.monotonic() + 120)
        _wait_past_its_backward(attempt, 1, time.monotonic() + 120)
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the launcher's group
        stderr = _after_the_stop(process)
    finally:
        _kill_group(process.pid)
    assert process.returncode == 130, stderr
    assert _stop_lines(stderr) == _as_the_signal_came(SAYS_WHAT_IS_HELD_AT_EXIT), stderr
    assert "Traceback" not in stderr, stderr
    in_flight = {rank: Path(f"{held}{rank}").read_text() for rank in (0, 1)}
    assert in_flight == {0: "0", 1: "0"}, stderr


def _as_the_signal_came(source: str) -> list[str]:
    """What the launcher says of a Ctrl-C while rank 0 waits in the barrier of
    `WAITS_IN_A_BARRIER` (or a variant, ``source``) and rank 1 sleeps: each rank, as it came."""
    line = source.splitlines().index("accelerator.wait_for_everyone()") + 1
    return [
        "accelify launch: stopped by SIGINT; every rank was stopped",
        f"  rank 0 was waiting in wait_for_everyone at waits.py:{line} "
        "(`accelerator.wait_for_everyone()`)",
        "  rank 1 was running",
    ]


def _stop_lines(stderr: str) -> list[str]:
    """The launcher's last block, from its "stopped by" line on, with how long rank 0 had
    waited left out (`` for 3 s``: as long as the machine took to get there)."""
    lines = stderr.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if " stopped by " in line), len(lines))
    return [re.sub(r" for \d+ s$", "", line) for line in lines[start:]]


#: Rank 1 cannot answer the launcher's ask for its stack (as a rank descheduled on a loaded node,
#: or stopped): its own handler of the stack signal, set once its group has started, notes the
#: ask in the file ``$ASKED`` and dumps nothing; it sleeps while rank 0 waits in a barrier.
CANNOT_SAY_WHERE = WAITS_IN_A_BARRIER.replace(
    "    time.sleep(600)",
    "    import signal\n"
    "    from accelify.runtime.collective_record import STACK_SIGNAL\n"
    '    signal.signal(STACK_SIGNAL, lambda *_: open(os.environ["ASKED"], "w").close())\n'
    "    time.sleep(600)",
)


@pytest.mark.distributed
def test_ctrl_c_while_the_watch_puts_a_hang_report_together_ends_the_run_at_once(
    tmp_path: Path,
) -> None:
    """A Ctrl-C while the launcher's watch waits for a busy rank's stack, for its hang report:
    the launcher waited for the watch (up to 5 s, and up to `watch.STACK_WAIT` for a rank that
    cannot answer; 12 s once on a loaded machine), and the half-made report could be printed
    after the stop. Now the watch is halted as the signal comes: it says nothing more, and the
    launcher ends as at any Ctrl-C, with what each rank was doing as the signal came (the halt's
    own reading of the records). That the halted watch no longer waits for the stack is
    test_launch_stack's (`test_a_halted_watch_reads_no_stack_dumped_after_the_halt`), told by
    what it reads, not by how long the stop took (a bound a loaded machine could cross)."""
    script = tmp_path / "waits.py"
    script.write_text(CANNOT_SAY_WHERE)
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2"]
    command += ["--hang-timeout", "1", str(script)]
    asked = tmp_path / "asked"
    process = start(command, cwd=tmp_path, env={**_environment("0"), "ASKED": str(asked)})
    try:
        word, records = process.stdout.readline().split()
        assert word == "RECORDS"
        attempt = collective_record.attempt_directory(Path(records), 0)
        deadline = time.monotonic() + 120
        _wait_in_a_collective(attempt, 0, deadline)
        _wait_past_its_backward(attempt, 1, deadline)
        while not asked.exists():  # the watch has asked rank 1 for its stack, and waits for it
            assert time.monotonic() < deadline, "the watch never asked rank 1 for its stack"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        stderr = _after_the_stop(process)
    finally:
        _kill_group(process.pid)
    assert process.returncode == 130, stderr
    assert _stop_lines(stderr) == _as_the_signal_came(CANNOT_SAY_WHERE), stderr
    assert len(stderr.strip().splitlines()) == 3, stderr  # and nothing else: no hang report


@pytest.mark.distributed
@pytest.mark.parametrize("after", [1, 2, 4])
def test_ctrl_c_in_the_first_seconds_of_a_launch_ends_it_quietly_and_at_once(
    after: float, tmp_path: Path
) -> None:
    """Ctrl-C as the launcher imports torch, as the template does (each rank's client waits for
    its fork) or as the ranks start: exit 130 at once, and no traceback. Before, a client
    waiting for its fork printed KeyboardInterrupt's traceback and the launcher waited for the
    template to finish importing torch (10.8 s after a Ctrl-C at 4 s), and a KeyboardInterrupt
    inside the launcher's own import of torch was caught by the import's ``try``s: the launcher
    went on and ran the script to its end (here: 120 s asleep, a stop lost by name after 60).
    Once the launcher has ended, no process of its run is left: the template it no longer
    waits for (killed mid-import), the rank clients, the ranks. How long the stop took is not
    asserted: any bound under the old 10.8 s is one a loaded machine can cross."""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nimport torch\n\ntime.sleep(120)\n")
    tag = f"{os.getpid()}-first-seconds-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = start(command, cwd=tmp_path, env={**_environment("0"), "ACCELIFY_TEST_RUN": tag})
    try:
        time.sleep(after)
        os.killpg(process.pid, signal.SIGINT)
        stderr = _after_the_stop(process)
        left = _gone_within(tag, 30)
    finally:
        _kill_group(process.pid)
        for pid in _processes_of_the_run(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 130, stderr
    assert left == [], stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    (headline,) = (
        at for at, line in enumerate(lines) if line.startswith("accelify launch: stopped by SIGINT")
    )
    # once the ranks have started, each says what it was doing (`  rank 1 was running`)
    assert all(line.startswith("  rank ") for line in lines[headline + 1 :]), stderr


@pytest.mark.distributed
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_launch_stopped_by_a_signal_leaves_nothing_in_the_temporary_folder(
    signum: int, tmp_path: Path
) -> None:
    """The records folder (each rank's state and stack files) and the template's socket go with
    the run, however the launcher is stopped but SIGKILL."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    script = tmp_path / "waits.py"
    script.write_text(WAITS_IN_A_BARRIER)
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = start(command, cwd=tmp_path, env={**_environment("0"), "TMPDIR": str(temporary)})
    try:
        _, records = process.stdout.readline().split()
        assert Path(records).parent == temporary
        attempt = collective_record.attempt_directory(Path(records), 0)
        _wait_in_a_collective(attempt, 0, time.monotonic() + 120)
        os.kill(process.pid, signum)
        stderr = _after_the_stop(process)
    finally:
        _kill_group(process.pid)
    assert process.returncode == 128 + signum, stderr
    assert [p.name for p in temporary.iterdir() if p.name.startswith(_LEFT_BEHIND)] == []


#: What a launch must not leave in the temporary folder: its own folders, and the elastic
#: agent's log tree (``torchelastic_*``, which the agent makes and never removes)
_LEFT_BEHIND = ("accelify-", "torchelastic_")


@pytest.mark.distributed
@pytest.mark.parametrize(
    "code, script",
    [
        (0, "from accelify import Accelerator\n\nAccelerator().wait_for_everyone()\n"),
        (3, "import sys\nfrom accelify import Accelerator\n\nAccelerator()\nsys.exit(3)\n"),
    ],
    ids=["success", "failure"],
)
def test_a_launch_that_ends_leaves_nothing_in_the_temporary_folder(
    code: int, script: str, tmp_path: Path
) -> None:
    """Every launch left an empty ``torchelastic_*`` tree in $TMPDIR (the agent's log folder,
    made when no ``--log-dir`` is given): the agent's folder is now the run's own, removed with
    it whether the run succeeds or fails (and when stopped by a signal: the test above)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    path = tmp_path / "script.py"
    path.write_text(script)
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(path)]
    environment = {**_environment("0"), "TMPDIR": str(temporary)}
    done = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == code, done.stderr
    assert [p.name for p in temporary.iterdir() if p.name.startswith(_LEFT_BEHIND)] == []


def test_a_stop_says_what_each_rank_was_doing_as_it_came(tmp_path: Path) -> None:
    """One line per rank from its record as the signal came: the collective it waited in and
    its line, or running, leaving, failing; a rank whose process was gone, no longer running."""
    script = tmp_path / "train.py"
    script.write_text("import torch\ntotal = accelerator.gather(loss)\n")
    where = f"{script}:2"
    records = {
        0: Record(0, 10, IN_COLLECTIVE, 8, 4, 100.0, "gather", where),
        1: Record(1, 11, RUNNING, 7, 4, 130.0, "backward", where),
        2: Record(2, 12, LEAVING, 7, 3, 120.0, "backward", where),
        3: Record(3, 13, CRASHED, 7, 4, 139.0, "backward", where),
        4: Record(4, 14, IN_COLLECTIVE, 8, 4, 139.5, "gather", where),
        5: Record(5, 15, IN_COLLECTIVE, 8, 4, 100.0, "gather", where),
    }
    moment = watch.Moment(140.0, records, frozenset({0, 1, 2, 3, 4}))
    text, code = outcome.stopped(signal.SIGTERM, moment)
    place = f"{watch._shown_path(str(script))}:2 (`total = accelerator.gather(loss)`)"
    assert text.splitlines() == [
        "accelify launch: stopped by SIGTERM; every rank was stopped",
        f"  rank 0 was waiting in gather at {place} for 40 s",
        "  rank 1 was running",
        "  rank 2 was leaving the script (after 3 backward passes)",
        "  rank 3 was failing with an exception",
        f"  rank 4 was waiting in gather at {place}",
        "  rank 5 was no longer running",
    ]
    assert code == 143
    assert outcome.stopped(signal.SIGINT) == (
        "accelify launch: stopped by SIGINT; every rank was stopped",
        130,
    )


def test_a_stop_reads_again_a_record_caught_mid_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank writes its record in place, its generation odd while a write is under way; a
    rank descheduled inside a write (a loaded machine) leaves it so for a while. The stop read
    the records once: such a rank had no line at all. Now a torn record is read again until
    it is whole (here the write ends as the stop first finds it torn); one that stays torn
    (its rank killed mid-write) is left out after `watch.TORN_WAIT`."""
    directory = collective_record.attempt_directory(tmp_path, 0)
    ranks = [collective_record._Recorder(directory, rank, ()) for rank in (0, 1)]
    writing, read = ranks[1], collective_record.read
    whole = writing._generation

    def the_write_ends_once_read_torn(directory: Path, rank: int) -> Record | None:
        record = read(directory, rank)
        if record is None and rank == 1 and whole + 2 not in ended:
            ended.append(whole + 2)
            collective_record._GENERATION.pack_into(writing._map, 0, whole + 2)
        return record

    ended: list[int] = []
    monkeypatch.setattr(collective_record, "read", the_write_ends_once_read_torn)
    try:
        collective_record._GENERATION.pack_into(writing._map, 0, whole + 1)  # a write begins
        moment = watch.Watcher(tmp_path, hang_timeout=0).halt()
        assert ended == [whole + 2]  # the stop found it torn
        assert outcome.stopped(signal.SIGINT, moment)[0].splitlines()[1:] == [
            "  rank 0 was running",
            "  rank 1 was running",
        ]
        collective_record._GENERATION.pack_into(writing._map, 0, whole + 3)  # and never ends
        assert sorted(watch.Watcher(tmp_path, hang_timeout=0).halt().ranks) == [0]
    finally:
        for recorder in ranks:
            recorder._file.close()


def test_the_agents_signal_handler_is_wrapped_only_where_torch_installs_it_by_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop's lines per rank come from the launcher's wrap of torch's private
    ``_terminate_process_handler`` (`launcher._told_of_stops`). This torch's agent installs its
    handler by that name (a torch that stops doing so fails here first): for the run, the
    handler read by that name, as ``PContext.start`` reads it, tells the launcher, then raises
    the agent's ``SignalException``; torch's own is back after. A torch whose process context
    installs its handler another way, or that has no such name or module, is not wrapped: the
    run goes on untold (a stop then says which signal it was, and nothing breaks)."""
    from torch.distributed.elastic import multiprocessing
    from torch.distributed.elastic.multiprocessing import SignalException, api

    torchs = api._terminate_process_handler
    assert launcher._agents_handler() is torchs
    told: list[str] = []
    with launcher._told_of_stops(lambda: told.append("told")), pytest.raises(SignalException):
        api._terminate_process_handler(signal.SIGINT, None)
    assert told == ["told"]
    assert api._terminate_process_handler is torchs

    def elsewise(self: object) -> None:
        """A start that installs no handler by the name."""

    for change in (
        lambda: monkeypatch.setattr(api.PContext, "start", elsewise),
        lambda: monkeypatch.delattr(api, "_terminate_process_handler"),
        lambda: (
            monkeypatch.delattr(multiprocessing, "api"),
            monkeypatch.setitem(sys.modules, api.__name__, None),
        ),
    ):
        change()
        assert launcher._agents_handler() is None
        left = getattr(api, "_terminate_process_handler", None)
        with launcher._told_of_stops(lambda: told.append("untold")):
            assert getattr(api, "_terminate_process_handler", None) is left  # not wrapped
        monkeypatch.undo()
        assert api._terminate_process_handler is torchs


def test_the_sweep_removes_only_the_folders_of_launchers_that_are_gone(tmp_path: Path) -> None:
    """A launcher killed by SIGKILL leaves its folders; the next launch removes those, and
    never a live launcher's, another PID namespace's, another kind's or a file."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = leftovers.prefix("launch").replace(f"-{os.getpid()}-", f"-{child.pid}-")
    namespace = gone.split("-")[2]
    names = {
        "gone": gone + "abc",
        "gone_ranks": gone.replace("-launch-", "-ranks-") + "abc",
        "live": leftovers.prefix("launch") + "abc",
        "other_namespace": gone.replace(f"-{namespace}-", "-1-") + "abc",
        "other_kind": gone.replace("-launch-", "-other-") + "abc",
    }
    for name in names.values():
        (tmp_path / name / "0").mkdir(parents=True)
        (tmp_path / name / "0" / "1.state").write_bytes(b"")
    (tmp_path / (gone + "file")).write_text("")
    removed = leftovers.sweep(str(tmp_path))
    assert sorted(p.name for p in removed) == sorted([names["gone"], names["gone_ranks"]])
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["live"], names["other_namespace"], names["other_kind"], gone + "file"}


def _gone_within(tag: str, seconds: float) -> list[int]:
    """The processes of the run (`_processes_of_the_run`) still there ``seconds`` after the call:
    the launcher's own stop or a lifeline's SIGKILL ends each in milliseconds, however loaded
    the machine; the deadline is for a process left running, which then fails by its pid."""
    deadline = time.monotonic() + seconds
    while (left := _processes_of_the_run(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _processes_of_the_run(tag: str) -> list[int]:
    """The live processes whose environment carries ``tag``: every process the launcher starts
    (the template, the rank clients, the ranks, fresh or forked) inherits its environment."""
    found = []
    marker = f"ACCELIFY_TEST_RUN={tag}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environment = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if marker in environment.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.distributed
@FRESH
def test_a_launcher_killed_by_sigkill_leaves_no_process_of_its_run(
    fresh: str, tmp_path: Path
) -> None:
    """SIGKILL runs nothing of the launcher's: before, its template, its rank clients and its
    ranks went on (a script sleeping an hour kept sleeping). Each dies with the process that
    started it (`accelify.runtime.launch.lifeline`): no process of the run is left."""
    script = tmp_path / "waits.py"
    script.write_text(WAITS_IN_A_BARRIER)
    tag = f"{os.getpid()}-{fresh}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", str(script)]
    process = start(command, cwd=tmp_path, env={**_environment(fresh), "ACCELIFY_TEST_RUN": tag})
    try:
        _, records = process.stdout.readline().split()
        attempt = collective_record.attempt_directory(Path(records), 0)
        _wait_in_a_collective(attempt, 0, time.monotonic() + 120)
        running = set(_processes_of_the_run(tag)) - {process.pid}
        # the ranks, and the template and each rank's client when they are forked
        assert len(running) >= (2 if fresh == "1" else 5), running
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _processes_of_the_run(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_of_the_run(tag) == []
    finally:
        _kill_group(process.pid)
        for pid in _processes_of_the_run(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.distributed
def test_a_launcher_killed_by_sigkill_takes_its_no_python_ranks_along(tmp_path: Path) -> None:
    """A ``--no-python`` rank runs nothing of accelify, and was left running (a program sleeping
    ten minutes here) when its launcher was killed by SIGKILL. The agent now starts it through
    the lifeline (`lifeline.run_tied`), which asks to die with the launcher and executes the
    program in its own place: the program itself dies with the launcher."""
    program = tmp_path / "waits.sh"
    program.write_text('#!/bin/sh\ntouch "$0.started.$RANK"\nexec sleep 600\n')
    program.chmod(0o755)
    tag = f"{os.getpid()}-no-python-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", "2", "--no-python"]
    process = start(
        [*command, str(program)], cwd=tmp_path, env={**os.environ, "ACCELIFY_TEST_RUN": tag}
    )
    try:
        markers = [tmp_path / f"waits.sh.started.{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 120
        while not all(marker.exists() for marker in markers):
            assert time.monotonic() < deadline, "the programs never started"
            time.sleep(0.05)
        assert len(set(_processes_of_the_run(tag)) - {process.pid}) == 2
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _processes_of_the_run(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_of_the_run(tag) == []
    finally:
        _kill_group(process.pid)
        for pid in _processes_of_the_run(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _imported(line: bytes) -> str:
    """The module an ``-X importtime`` line says was imported (nested ones are indented)."""
    return line.decode(errors="replace").rpartition("|")[2].strip()


def test_ctrl_c_as_the_launch_starts_ends_it_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C while Python, click and the launch's command line start, before the launcher's
    own handling begins: click caught the KeyboardInterrupt, printed "Aborted!" and exited 1.
    The launcher's startup is held in place where it is sure to be in that window: its stderr
    is a pipe of one page, not read once ``-X importtime`` says click was imported, and the
    next import's line waits for room; the SIGINT comes there."""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nimport torch\n\ntime.sleep(120)\n")
    command = [sys.executable, "-X", "importtime", "-m", "accelify", "launch", "--cpu", str(script)]
    process = subprocess.Popen(
        command, cwd=tmp_path, stderr=subprocess.PIPE, bufsize=0, start_new_session=True
    )
    try:
        fcntl.fcntl(process.stderr.fileno(), F_SETPIPE_SZ, 4096)
        seen, started = [], time.monotonic()
        for line in iter(process.stderr.readline, b""):  # unbuffered: no more than the line
            seen.append(line)
            assert time.monotonic() - started < 120, b"".join(seen)
            if _imported(line) == "click":
                break
        assert seen and _imported(seen[-1]) == "click", b"".join(seen)
        os.killpg(process.pid, signal.SIGINT)
        rest = process.stderr.read()
        process.wait(timeout=120)
    finally:
        _kill_group(process.pid)
    said = [
        line
        for line in (b"".join(seen) + rest).decode().splitlines()
        if not line.startswith("import time:")
    ]
    assert said == ["accelify launch: stopped by SIGINT before any rank started"], said
    assert process.returncode == 130


def test_a_process_started_for_a_launcher_already_gone_ends_at_once() -> None:
    """The window before the kernel's request is set: a launcher that died first has handed its
    process to another parent, and that process ends as it would have (SIGKILL). One whose
    launcher lives on elsewhere (a rank's own subprocess) or is its parent runs."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = "from accelify.runtime.launch import lifeline\nlifeline.die_with_the_launcher()\n"
    code += "print('runs')"
    try:
        ended = {}
        for name, launcher in (("gone", gone.pid), ("elsewhere", elsewhere.pid), ("parent", 0)):
            environment = {**os.environ, lifeline.LAUNCHER: str(launcher or os.getpid())}
            result = subprocess.run(
                [sys.executable, "-c", code], env=environment, capture_output=True, timeout=120
            )
            ended[name] = (result.returncode, result.stdout.strip())
    finally:
        elsewhere.kill()
        elsewhere.wait()
    assert ended == {
        "gone": (-signal.SIGKILL, b""),
        "elsewhere": (0, b"runs"),
        "parent": (0, b"runs"),
    }
