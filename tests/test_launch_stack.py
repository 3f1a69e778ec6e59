"""The launcher asks a busy rank for its stack (`watch._stack`) and must read the whole dump.

faulthandler writes a dump a few bytes per ``write`` and ends it with no marker; the main thread
comes last. A rank descheduled between two threads' sections (a loaded CI node) once left a
file ending at a line's end with none of the main thread's frames, and the hang report lost the
rank's line ("it is at ...").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from accelify.runtime.collective_record import STACK_SIGNAL, stack_path
from accelify.runtime.launch import watch
from accelify.runtime.launch.watch import _stack

#: A rank that dumps its stack the way faulthandler does, but slowly: a helper thread's section,
#: a pause longer than the launcher's old wait, then the main thread's. An older dump is already
#: in the file, as after an earlier report.
SLOW_DUMPER = textwrap.dedent(
    """
    import json, signal, sys, time, threading
    path, signum = sys.argv[1], int(sys.argv[2])
    main = threading.main_thread().ident
    out = open(path, "w")
    out.write(json.dumps({"main_thread": main, "skip": []}) + "\\n")
    out.write(f"Current thread 0x{main:016x} (most recent call first):\\n")
    out.write('  File "/old/dump.py", line 1 in <module>\\n')
    out.flush()

    def dump(*_):
        out.write("Thread 0x00007f0000000001 (most recent call first):\\n")
        out.write('  File "/lib/threading.py", line 320 in wait\\n\\n')
        out.flush()
        time.sleep(0.5)
        out.write(f"Current thread 0x{main:016x} (most recent call first):\\n")
        out.write('  File "/user/train.py", line 9 in <module>\\n')
        out.flush()

    signal.signal(signum, dump)
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
    """
)


def test_the_stack_is_read_once_the_main_threads_section_is_written(
    tmp_path: Path, monkeypatch
) -> None:
    # A deadline far beyond any load's delay: a read that waited for it is told apart from one
    # that returned once the section was there (under 5 s was a bound that a loaded machine's
    # slow dumper, 0.5 s asleep between its sections, could cross)
    monkeypatch.setattr(watch, "STACK_WAIT", 120.0)
    path = stack_path(tmp_path, 1)
    rank = subprocess.Popen(
        [sys.executable, "-c", SLOW_DUMPER, str(path), str(int(STACK_SIGNAL))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        started = time.monotonic()
        frames = _stack(tmp_path, 1, rank.pid)
    finally:
        rank.kill()
        rank.wait()
    assert frames == [("/user/train.py", 9, "<module>")]
    assert time.monotonic() - started < 60  # it did not wait for the deadline either
    dumps = json.loads(path.read_text().partition("\n")[0])
    assert dumps["main_thread"]  # the file kept its header: the rank's own record


def test_a_rank_that_never_answers_gives_no_stack(tmp_path: Path, monkeypatch) -> None:
    """Without a dump, no frames (not the older dump's): the report then says no place."""
    monkeypatch.setattr(watch, "STACK_WAIT", 1.0)
    path = stack_path(tmp_path, 0)
    path.write_text(
        json.dumps({"main_thread": 1, "skip": []})
        + "\nCurrent thread 0x0000000000000001 (most recent call first):\n"
        + '  File "/old/dump.py", line 1 in <module>\n'
    )
    sleeper = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                f"signal.signal({int(STACK_SIGNAL)}, signal.SIG_IGN)\n"
                                "print('ready', flush=True)\ntime.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
        assert _stack(tmp_path, 0, sleeper.pid) == []
    finally:
        sleeper.kill()
        sleeper.wait()
    assert os.path.exists(path)


#: A rank that says when it is asked for its stack (``asked`` on stdout), then dumps a whole one
#: only once the file ``argv[3]`` exists: the test decides whether the dump comes before or
#: after the watch is halted.
DUMPS_WHEN_TOLD = textwrap.dedent(
    """
    import json, os, signal, sys, time, threading
    path, signum, told = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    main = threading.main_thread().ident
    out = open(path, "w")
    out.write(json.dumps({"main_thread": main, "skip": []}) + "\\n")
    out.flush()

    def dump(*_):
        print("asked", flush=True)
        while not os.path.exists(told):
            time.sleep(0.01)
        out.write(f"Current thread 0x{main:016x} (most recent call first):\\n")
        out.write('  File "/user/train.py", line 9 in <module>\\n')
        out.flush()

    signal.signal(signum, dump)
    print("ready", flush=True)
    while True:
        time.sleep(0.01)
    """
)


def test_a_halted_watch_reads_no_stack_dumped_after_the_halt(tmp_path: Path, monkeypatch) -> None:
    """A Ctrl-C halts the watch (`watch.Watcher.halt`) while it waits for a busy rank's stack:
    the wait ends there, and a dump that comes after the halt is not read into a report nobody
    waits for. Before, the watch went on waiting for the dump (up to `watch.STACK_WAIT`), the
    launcher's stop waited for the watch, and the half-made report was printed after the stop.
    Told by what the wait returns, never by how long it took: the deadline is far beyond any
    load's delay, and a wait the halt did not end reads the whole dump that follows it."""
    monkeypatch.setattr(watch, "STACK_WAIT", 600.0)
    told = tmp_path / "told"
    rank = subprocess.Popen(
        [sys.executable, "-c", DUMPS_WHEN_TOLD, str(stack_path(tmp_path, 1)),
         str(int(STACK_SIGNAL)), str(told)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    watcher = watch.Watcher(tmp_path, hang_timeout=1)
    read: list[list[tuple[str, int, str]]] = []
    waiting = threading.Thread(
        target=lambda: read.append(_stack(tmp_path, 1, rank.pid, watcher._halted))
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        waiting.start()
        assert rank.stdout.readline() == "asked\n"  # the watch waits for the dump
        watcher.halt()
        told.touch()  # the rank dumps its whole stack, after the halt
        waiting.join(timeout=120)
    finally:
        rank.kill()
        rank.wait()
    assert not waiting.is_alive(), "the halted watch still waits for the rank's stack"
    assert read == [[]]
