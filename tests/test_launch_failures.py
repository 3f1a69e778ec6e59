"""When a distributed run goes wrong, the launcher names the rank, the user's line and why, in
seconds: the ranks' collective records, the watcher that reads them, the final report."""

from __future__ import annotations

import faulthandler
import importlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from accelify.errors import UserError
from accelify.runtime import collective_record, failure_record
from accelify.runtime.collective_record import IN_COLLECTIVE, LEAVING, RUNNING, Record
from accelify.runtime.launch import launcher, outcome, shapes
from accelify.runtime.launch.rank_guards import RankGuard, rank_guard
from accelify.runtime.launch.watch import Watcher, guarded_words, parse_stack
from conftest import FIXTURES, launch, launch_timed, run_accelify, run_in_own_group

FAILURES = FIXTURES / "runtime" / "failures"
HERE = Path(__file__).name


def record(rank: int, state: int, operation: str = "", where: str = "", **fields) -> Record:
    values = {"pid": os.getpid(), "sequence": 7, "passes": 3, "since": time.time() - 60.0}
    values.update(fields)
    return Record(rank, values["pid"], state, values["sequence"], values["passes"],
                  values["since"], operation, where)  # fmt: skip


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- the rank's record ------------------------------------------------------------------------
def test_a_rank_records_the_collective_it_is_in_at_the_users_line(tmp_path, monkeypatch):
    monkeypatch.setattr(collective_record, "_recorder", None)
    recorder = collective_record._Recorder(tmp_path, 3, skip=(collective_record.__file__,))
    monkeypatch.setattr(collective_record, "_recorder", recorder)

    @collective_record.collective("gather")
    def gather() -> Record | None:
        inner()  # nested collectives are the outer one
        return collective_record.read(tmp_path, 3)

    @collective_record.collective("reduce")
    def inner() -> None:
        pass

    line = sys._getframe().f_lineno + 1
    inside = gather()
    after = collective_record.read(tmp_path, 3)
    assert inside is not None and after is not None
    assert (inside.state, inside.operation, inside.sequence) == (IN_COLLECTIVE, "gather", 1)
    assert inside.where == f"{__file__}:{line}"
    assert (after.state, after.operation, after.sequence) == (RUNNING, "gather", 1)
    collective_record.leaving()
    assert collective_record.read(tmp_path, 3).state == LEAVING


def test_a_collective_that_needs_the_same_shapes_records_the_ones_this_rank_passed(
    tmp_path, monkeypatch
):
    import torch

    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)

    @collective_record.collective("all_gather", same_shapes=True)
    def all_gather(outputs, tensor):
        inner(tensor.double())  # nested: the outer call's shapes stay
        return collective_record.read(tmp_path, 0)

    @collective_record.collective("reduce", same_shapes=True)
    def inner(tensor):
        pass

    @collective_record.collective("gather")
    def gather(tensor):  # rows may differ between ranks: no shapes kept
        pass

    inside = all_gather([torch.ones(3, 2)], torch.ones(3, 2, dtype=torch.float16))
    assert (inside.shaped, inside.shapes) == (1, "(3, 2) float16")
    assert inside.shaped_operation == "all_gather"
    gather(torch.ones(5))
    after = collective_record.read(tmp_path, 0)
    assert (after.sequence, after.shaped, after.shapes) == (2, 1, "(3, 2) float16")
    inner({"loss": torch.ones(4), "count": torch.ones((), dtype=torch.int64), "name": "x"})
    assert collective_record.read(tmp_path, 0).shapes == "[(4,) float32; () int64; -]"


def shaped(rank: int, state: int, shapes: str, operation: str = "reduce", **fields) -> Record:
    fields.setdefault("sequence", 7)
    return replace(
        record(rank, state, operation, "train.py:12", **fields),
        shaped=fields["sequence"],
        shapes=shapes,
        shaped_operation=operation,
    )


def test_a_rank_waiting_in_a_reduce_its_peer_passed_other_shapes_is_told_both_shapes():
    """Gloo gave rank 1 a wrong sum of its 3 values and rank 0 waits for good: the shapes are
    the cause, not a rank that went on."""
    ranks = {
        0: shaped(0, IN_COLLECTIVE, "(4,) float32"),
        1: replace(shaped(1, RUNNING, "(3,) float32"), where="train.py:12"),
    }
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is not None and verdict.kind == "shapes" and verdict.culprit is None
    assert (
        "the ranks passed reduce (collective #7) tensors of different shapes or dtypes"
        in verdict.text
    )
    assert "  rank 0: (4,) float32 at train.py:12\n" in verdict.text + "\n"
    assert "  rank 1: (3,) float32 at train.py:12 (went on with a wrong result)" in verdict.text
    assert "accelerator.pad_across_processes" in verdict.text
    # rank 1 went on to a backward that waits for rank 0: the shapes still say why
    ranks[1] = replace(
        shaped(1, IN_COLLECTIVE, "(3,) float32"), operation="backward", sequence=8, shaped=7
    )
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is not None and verdict.kind == "shapes"
    assert "rank 1: (3,) float32, and went on with a wrong result: it is at collective #8" in (
        verdict.text
    )


def test_a_peer_whose_collective_of_that_number_is_another_operation_is_no_shape_mismatch():
    """Rank 0 reduces under `if accelerator.is_main_process:` while rank 1's next epoch's
    loader broadcasts its seed: both are collective #13, one the reduce of a float, the other a
    broadcast of an int64. The ranks are in different collectives, not one of different shapes:
    no shapes report (the mismatch of collectives names the guard)."""
    ranks = {
        0: shaped(0, IN_COLLECTIVE, "() float32", sequence=13),
        1: replace(
            shaped(1, IN_COLLECTIVE, "() int64", operation="broadcast", sequence=13),
            where="train.py:39",
        ),
    }
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is None or verdict.kind != "shapes"
    assert shapes.other_shapes(ranks, ranks[0]) == {}


def test_shapes_that_differ_are_no_report_while_the_same_or_a_moment_old():
    now = time.time()
    same = {0: shaped(0, IN_COLLECTIVE, "(4,) float32"), 1: shaped(1, RUNNING, "(4,) float32")}
    assert watcher().inspect(same, now, Path("/nonexistent")) is None
    # reduce(x, "none") communicates nothing: a rank is in it for microseconds
    moment = {
        0: shaped(0, IN_COLLECTIVE, "(4,) float32", since=now - 0.1),
        1: shaped(1, RUNNING, "(3,) float32"),
    }
    assert watcher().inspect(moment, now, Path("/nonexistent")) is None
    # the peer's record no longer holds that collective's shapes: no guess
    later = {
        0: shaped(0, IN_COLLECTIVE, "(4,) float32"),
        1: replace(shaped(1, RUNNING, "(3,) float32"), shaped=6),
    }
    verdict = watcher().inspect(later, now, Path("/nonexistent"))
    assert verdict is None or verdict.kind != "shapes"


def test_a_backward_counts_as_a_collective_only_when_it_reduces(tmp_path, monkeypatch):
    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    with collective_record.backward_pass(lambda: False):
        assert collective_record.read(tmp_path, 0).state == RUNNING
    with collective_record.backward_pass(lambda: True):
        inside = collective_record.read(tmp_path, 0)
    assert (inside.state, inside.operation, inside.passes) == (IN_COLLECTIVE, "backward", 2)


def test_a_script_that_takes_the_stack_signal_is_never_sent_it(tmp_path, monkeypatch):
    """The record starts before the script; a script that then handles the stack signal itself
    (SIGUSR2 where there are no real-time signals: a preemption handler that saves and requeues)
    must not get the launcher's asks for stacks: the stack file goes, and the watcher asks only
    ranks that have one."""
    stack = (tmp_path / "0.stack").open("w")
    monkeypatch.setattr(collective_record, "_stack_file", stack)
    collective_record._leave_the_stack_signal_to_the_script()  # default: the signal stays ours
    assert (tmp_path / "0.stack").exists()
    previous = signal.signal(collective_record.STACK_SIGNAL, lambda *_: None)
    try:
        collective_record._leave_the_stack_signal_to_the_script()
    finally:
        signal.signal(collective_record.STACK_SIGNAL, previous)
        stack.close()
    assert not (tmp_path / "0.stack").exists()
    assert collective_record._stack_file is None


def test_a_backward_inside_a_recorded_backward_is_the_same_pass(tmp_path, monkeypatch):
    """`accelerator.backward` calls ``loss.backward()``, which a script's own DDP model (built
    beside the Accelerator's) records too: one pass, counted once, and one collective when
    either reduces (the script's model reduces under the Accelerator's accumulation)."""
    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    # the inner pass starts inside the outer one, as `with` nested in it
    with (
        collective_record.backward_pass(lambda: False),
        collective_record.backward_pass(lambda: True),
    ):
        inside = collective_record.read(tmp_path, 0)
    assert (inside.state, inside.passes, inside.sequence) == (IN_COLLECTIVE, 1, 1)
    # the inner pass starts inside the outer one, as `with` nested in it
    with (
        collective_record.backward_pass(lambda: True),
        collective_record.backward_pass(lambda: True),
    ):
        inside = collective_record.read(tmp_path, 0)
    assert (inside.state, inside.passes, inside.sequence) == (IN_COLLECTIVE, 2, 2)
    assert collective_record.read(tmp_path, 0).state == RUNNING


def test_the_accelerators_backward_record_is_the_general_paths(tmp_path, monkeypatch):
    """`backward_begins`/`backward_ends` (`Accelerator.backward`'s one call at each end) write
    what `begin_pass`/`end_pass` write: the pass counted, the collective numbered at the
    caller's line (the same line again from its cached place), a pass that does not reduce
    counted only, and a pass begun inside a collective or a pass left to the general path."""
    recorder = collective_record._Recorder(tmp_path, 0, skip=(collective_record.__file__,))
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    seen = []
    for _ in range(2):  # the second finds its place cached
        line = sys._getframe().f_lineno + 1
        begun = recorder.backward_begins(True, sys._getframe())
        seen.append(collective_record.read(tmp_path, 0))
        recorder.backward_ends(begun)
        assert collective_record.read(tmp_path, 0).state == RUNNING
    assert [(r.state, r.operation, r.sequence, r.passes) for r in seen] == [
        (IN_COLLECTIVE, "backward", 1, 1),
        (IN_COLLECTIVE, "backward", 2, 2),
    ]
    assert {r.where for r in seen} == {f"{__file__}:{line}"}
    # the end writes the time and the state alone (no odd generation): a whole record, its
    # place and numbers kept, its time the end's
    begun = recorder.backward_begins(True, sys._getframe())
    between = time.time()  # after the begin's time: only the end's own time is as late
    recorder.backward_ends(begun)
    ended = collective_record.read(tmp_path, 0)
    assert ended is not None and ended.since >= between
    assert (ended.state, ended.operation, ended.sequence, ended.passes) == (
        RUNNING,
        "backward",
        3,
        3,
    )
    recorder.backward_ends(recorder.backward_begins(False, sys._getframe()))
    after = collective_record.read(tmp_path, 0)
    assert (after.state, after.sequence, after.passes) == (RUNNING, 3, 3)  # written at the next
    with collective_record.during("gather"):  # a backward inside a collective: no new number
        begun = recorder.backward_begins(True, sys._getframe())
        inside = collective_record.read(tmp_path, 0)
        recorder.backward_ends(begun)
        assert collective_record.read(tmp_path, 0).state == IN_COLLECTIVE
    assert (inside.operation, inside.sequence, inside.passes) == ("gather", 4, 4)
    left = collective_record.read(tmp_path, 0)  # the collective's end writes its passes too
    assert (left.state, left.passes) == (RUNNING, recorder.passes)
    with collective_record.backward_pass(lambda: True):  # a pass inside a pass: the same pass
        begun = recorder.backward_begins(True, sys._getframe())
        recorder.backward_ends(begun)
        inside = collective_record.read(tmp_path, 0)
    assert (inside.state, inside.sequence, inside.passes) == (IN_COLLECTIVE, 5, 6)
    assert collective_record.read(tmp_path, 0).state == RUNNING


def test_a_forked_child_never_writes_its_ranks_record(tmp_path, monkeypatch):
    """A DataLoader worker or a multiprocessing child forked by the rank inherits its record: a
    collective, a backward, an exception or the end of the script there is the child's, and
    the rank's record (read by the watcher) must not say it."""
    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            with collective_record.during("all_reduce"):
                collective_record.crashed()
            collective_record.leaving(3)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    after = collective_record.read(tmp_path, 0)
    assert (after.pid, after.state, after.sequence) == (os.getpid(), RUNNING, 0)
    with collective_record.during("gather"):  # the rank's own record goes on
        assert collective_record.read(tmp_path, 0).operation == "gather"


def test_a_forked_childs_exception_is_not_recorded_as_its_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELIFY_FAILURE_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    for name in ("_HOOK", "_ON_EXCEPTION", "_ENTRY"):
        monkeypatch.setattr(failure_record, name, [])
    failure_record.install(0, on_exception=lambda: None)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            error = ValueError("raised in a forked child")
            sys.excepthook(ValueError, error, None)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("pending_at", ["_below_entry", "getsignal"])
def test_a_ctrl_c_that_reaches_an_ending_rank_inside_its_excepthook_is_taken_quietly(
    pending_at: str, tmp_path: Path
) -> None:
    """The launcher's relayed SIGINT can reach a rank just as its own exception enters the hook:
    raised there as a KeyboardInterrupt, Python printed "Error in sys.excepthook" and both
    tracebacks, and the record went unwritten. The signal is raised at a set point in the hook
    (``_below_entry``: where flake20 saw it could come before the hook ignored it; ``getsignal``:
    pending as the hook's first check starts). In a forked child, whose main thread it is."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 2
        try:
            os.environ["ACCELIFY_FAILURE_DIR"] = str(tmp_path)
            for name in ("ACCELIFY_RANK_TRACEBACKS", "TORCHELASTIC_MAX_RESTARTS"):
                os.environ.pop(name, None)
            stderr = os.open(tmp_path / "stderr", os.O_WRONLY | os.O_CREAT)
            os.dup2(stderr, 2)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            failure_record._HOOK[:] = []
            failure_record.install(0, on_exception=lambda: None)
            owner = failure_record if pending_at == "_below_entry" else signal
            real = getattr(owner, pending_at)
            raised: list[bool] = []

            def step(*args: object) -> object:
                if not raised:
                    raised.append(True)
                    signal.raise_signal(signal.SIGINT)
                return real(*args)

            setattr(owner, pending_at, step)
            try:
                raise ValueError("the rank's own failure")
            except ValueError as error:
                try:
                    sys.excepthook(ValueError, error, error.__traceback__)
                except KeyboardInterrupt:
                    code = 3  # what Python reports as "Error in sys.excepthook"
                else:
                    code = 0 if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (tmp_path / "stderr").read_text()
    record = failure_record.Failure.read(tmp_path / "0" / "0.json")
    assert record is not None and "the rank's own failure" in record.summary
    assert "Traceback" not in (tmp_path / "stderr").read_text()


# --- the watcher --------------------------------------------------------------------------------
def watcher() -> Watcher:
    return Watcher(Path("/nonexistent"), hang_timeout=300.0)


def test_ranks_waiting_in_different_collectives_are_a_mismatch_naming_both_lines():
    ranks = {
        0: record(0, IN_COLLECTIVE, "gather", "train.py:88", passes=5),
        1: record(1, IN_COLLECTIVE, "wait_for_everyone", "train.py:120", passes=4),
    }
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is not None and verdict.kind == "mismatch"
    assert "rank 0 waits in gather at train.py:88" in verdict.text
    assert "rank 1 waits in wait_for_everyone at train.py:120" in verdict.text
    assert verdict.culprit == 1  # it stopped training first
    assert "rank 1 left the training loop early" in verdict.text


def test_ranks_waiting_in_the_same_call_at_different_places_in_the_sequence_are_a_mismatch():
    """Two gathers that cannot pair: rank 0's is its 8th collective, rank 1's its 7th."""
    ranks = {
        0: record(0, IN_COLLECTIVE, "gather", "train.py:88", sequence=8),
        1: record(1, IN_COLLECTIVE, "gather", "train.py:88", sequence=7),
    }
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is not None and verdict.kind == "mismatch"
    assert "collective #8" in verdict.text and "collective #7" in verdict.text


GUARDED = """\
from accelify import Accelerator

accelerator = Accelerator()


@accelerator.on_main_process
def log(loss):
    accelerator.gather(loss)


def save(loss):
    if not accelerator.is_main_process:
        return
    accelerator.wait_for_everyone()


for step in range(10):
    if accelerator.process_index == 0 and step % 2:
        accelerator.reduce(
            step
        )
    accelerator.gather(step)
    best = step > 3
    if best:
        accelerator.wait_for_everyone()
"""


def test_a_call_only_some_ranks_reach_is_named_with_its_guard(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED)
    path = str(script)
    assert rank_guard(path, 8) == RankGuard(6, "@accelerator.on_main_process")
    assert rank_guard(path, 14) == RankGuard(12, "if not accelerator.is_main_process:")
    guard = RankGuard(18, "if accelerator.process_index == 0 and step % 2:")
    assert rank_guard(path, 19) == rank_guard(path, 21) == guard  # every line of the call
    assert rank_guard(path, 22) is None  # every rank gathers
    assert rank_guard(path, 25) is None  # a rank's own value: not a rank guard
    assert rank_guard(str(tmp_path / "gone.py"), 3) is None
    (tmp_path / "broken.py").write_text("if (:\n")
    assert rank_guard(str(tmp_path / "broken.py"), 1) is None


ELSE_GUARDED = """from accelify import Accelerator

accelerator = Accelerator()
if accelerator.process_index == 1:
    total = 0
else:
    total = accelerator.reduce(
        1
    )
if accelerator.process_index == 1:
    total = 0
elif accelerator.is_main_process:
    total = accelerator.gather(1)
"""


def test_a_collective_in_the_else_of_a_rank_test_is_named_as_the_branch_the_rank_did_not_take(
    tmp_path,
):
    """``if accelerator.process_index == 1: ... else: reduce(...)``: rank 1 took the ``if``,
    so it did not skip the test's branch: the words say the call runs in its else (trial19's
    report said "runs under `if ...` which rank 1 skipped"). A call in an ``elif`` that reads
    the rank itself runs under that ``elif``."""
    script = tmp_path / "else_guarded.py"
    script.write_text(ELSE_GUARDED)
    path = str(script)
    outer = RankGuard(4, "if accelerator.process_index == 1:", in_else=True)
    assert rank_guard(path, 7) == rank_guard(path, 9) == outer  # every line of the call
    words = guarded_words(0, ((path, 7), outer), [1], "left")
    assert "runs in the else of `if accelerator.process_index == 1:` (" in words, words
    assert "else_guarded.py:4), which rank 1 took and left;" in words, words
    inner = rank_guard(path, 13)
    assert inner == RankGuard(12, "elif accelerator.is_main_process:")
    words = guarded_words(0, ((path, 13), inner), [1], "went on")
    assert "runs under `elif accelerator.is_main_process:`" in words, words
    assert "which rank 1 skipped and went on" in words, words


def test_ranks_waiting_in_the_same_collective_are_not_a_mismatch():
    ranks = {r: record(r, IN_COLLECTIVE, "gather", "train.py:88") for r in (0, 1)}
    assert (
        Watcher(Path("/nonexistent"), hang_timeout=0).inspect(
            ranks, time.time(), Path("/nonexistent")
        )
        is None
    )


def test_a_collective_entered_a_moment_ago_is_not_yet_a_mismatch():
    now = time.time()
    ranks = {
        0: record(0, IN_COLLECTIVE, "gather", "train.py:88"),
        1: record(1, IN_COLLECTIVE, "backward", "train.py:60", since=now - 1.0),
    }
    assert watcher().inspect(ranks, now, Path("/nonexistent")) is None


def test_a_rank_leaving_while_its_peer_waits_is_named():
    ranks = {
        0: record(0, IN_COLLECTIVE, "backward", "train.py:60", passes=5),
        1: record(1, LEAVING, "backward", "train.py:60", passes=4),
    }
    verdict = watcher().inspect(ranks, time.time(), Path("/nonexistent"))
    assert verdict is not None and (verdict.kind, verdict.culprit) == ("left", 1)
    assert "rank 1 is leaving" in verdict.text and "after 4 backward passes" in verdict.text


def test_a_rank_past_its_last_collective_is_named_at_once_while_its_peer_waits_for_the_next():
    """Rank 1 called sys.exit(3) after collective #7 and its exit guard says it will make no
    other; rank 0 entered collective #8 a moment ago: it waits for good, and the report comes at
    the next poll, not `GRACE` later. Not before the leaver's exit guard says so (an atexit
    handler could still call the collective), nor for a peer still in the leaver's last
    collective (it may be taking its result)."""
    now = time.time()
    waiter = record(0, IN_COLLECTIVE, "backward", "train.py:60", sequence=8, since=now - 0.1)
    leaver = replace(record(1, LEAVING, "backward", "train.py:60", sequence=7), exit_code=3)
    ranks = {0: waiter, 1: replace(leaver, over=True)}
    verdict = watcher().inspect(ranks, now, Path("/nonexistent"))
    assert verdict is not None and (verdict.kind, verdict.culprit) == ("left", 1)
    assert "rank 1 is leaving" in verdict.text
    assert "rank 0 waits in backward (DDP reduces gradients there) at train.py:60" in verdict.text
    assert watcher().inspect({0: waiter, 1: leaver}, now, Path("/nonexistent")) is None
    in_its_last = replace(waiter, sequence=7)
    assert watcher().inspect({0: in_its_last, 1: ranks[1]}, now, Path("/nonexistent")) is None
    # a leaver whose process is gone is past its last collective too (a script that runs its
    # process group itself, which has no exit guard)
    gone = replace(leaver, pid=dead_pid())
    verdict = watcher().inspect({0: waiter, 1: gone}, now, Path("/nonexistent"))
    assert verdict is not None and verdict.culprit == 1 and "rank 1 has exited" in verdict.text


def test_a_leaving_ranks_record_says_when_its_collectives_are_over(tmp_path, monkeypatch):
    recorder = collective_record._Recorder(tmp_path, 1, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    collective_record.collectives_over()  # still running: it may call more
    assert not collective_record.read(tmp_path, 1).over
    collective_record.leaving(3)
    left = collective_record.read(tmp_path, 1)
    collective_record.collectives_over()
    over = collective_record.read(tmp_path, 1)
    assert (over.state, over.exit_code, over.over) == (LEAVING, 3, True)
    assert over.since == left.since  # the time it began to leave, kept
    collective_record.leaving()  # the exit guard says it again: the code stays the script's
    assert collective_record.read(tmp_path, 1) == over


def test_a_failing_rank_skips_the_final_collections_and_a_healthy_one_keeps_them(
    tmp_path, monkeypatch
):
    """The rank's last atexit handler: after a failure (an exception, a non-zero exit code, a
    run the launcher released) Python's final collections are skipped, for the report waits on
    the rank's exit; a rank that ends well keeps Python's whole exit."""
    from accelify.runtime import rank_entry

    recorder = collective_record._Recorder(tmp_path, 0, skip=())
    monkeypatch.setattr(collective_record, "_recorder", recorder)
    monkeypatch.setattr(collective_record, "_released_flag", str(tmp_path / "released"))
    frozen: list[bool] = []
    monkeypatch.setattr(rank_entry.gc, "freeze", lambda: frozen.append(True))
    outcomes = []
    for leave in (
        lambda: collective_record.leaving(0),
        lambda: collective_record.release(tmp_path),
        lambda: collective_record.leaving(3),
        collective_record.crashed,
    ):
        recorder.state, recorder.exit_code = RUNNING, 0
        (tmp_path / "released").unlink(missing_ok=True)
        leave()
        rank_entry._after_the_scripts_exit_handlers()
        outcomes.append(bool(frozen))
        frozen.clear()
    # a healthy end; released by the launcher while it ends; sys.exit(3); an exception
    assert outcomes == [False, True, True, True]


#: Run in a fresh process (it freezes gc and starts a process group): whether the exit guard's
#: search for the group's holders lets go of each, frozen ones included, and skips the heap when
#: the engine's own objects were the only holders.
LET_GO = """
import gc, sys
import torch
import torch.distributed as dist
from accelify.runtime.backends import base

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
group = dist.group.WORLD
registry = {}  # a module's global made as it was imported: frozen (rank_entry)
gc.freeze()
holder = type("Wrapper", (), {})()
holder.process_group = group
if sys.argv[1] == "frozen-too":
    registry["world"] = group
held = [group]
del group
dist.destroy_process_group()
searched = []
get_referrers = base.gc.get_referrers
base.gc.get_referrers = lambda *a: searched.append(1) or get_referrers(*a)
base.let_go_of_groups(held, [holder])
print(holder.process_group, registry.get("world"), bool(searched), gc.get_freeze_count() > 0)
"""


@pytest.mark.parametrize(
    ("holders", "expected"),
    [("engine-only", "None None False True"), ("frozen-too", "None None True False")],
)
def test_the_exit_guard_lets_go_of_the_groups_frozen_holders_included(tmp_path, holders, expected):
    result = run_in_own_group([sys.executable, "-c", LET_GO, holders], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == expected


#: Started as `accelify launch` starts a rank: torch's objects are frozen once it is imported
#: (gc no longer lists them), the script's own, made after, are not, and the garbage it leaves in
#: reference cycles is still finalized by the interpreter's last collection.
FROZEN_AT_IMPORT = """
import gc, os
print("before torch", gc.get_freeze_count())
import torch
gc.disable()  # what is finalized below, the interpreter's exit finalizes


class Log:
    def __init__(self):
        self.me = self  # a cycle: freed only by a collection

    def __del__(self):
        os.write(1, b"finalized at exit\\n")


log = Log()
listed = {id(o) for o in gc.get_objects()}
print("torch listed", id(vars(torch)) in listed, "script's listed", id(log) in listed)
del log
"""


def test_a_ranks_entry_freezes_torchs_objects_and_still_finalizes_the_scripts(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(FROZEN_AT_IMPORT)
    command = [sys.executable, "-m", "accelify.runtime.rank_entry", str(script)]
    result = run_in_own_group(command, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "before torch 0",
        "torch listed False script's listed True",
        "finalized at exit",
    ]


BAD_FLAG = """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.parse_args()
"""


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_a_bad_script_flag_prints_its_usage_on_rank_0_only(tmp_path, rank, said):
    """Every rank parses the same command line: its usage and error once, not once per rank
    (trial24 saw them twice on ``-n 2``); every rank still exits 2."""
    script = tmp_path / "train.py"
    script.write_text(BAD_FLAG)
    command = [sys.executable, "-m", "accelify.runtime.rank_entry", str(script), "--epoch-count"]
    env = {**os.environ, "RANK": rank}
    result = run_in_own_group(command, tmp_path, timeout=60, env=env)
    assert result.returncode == 2
    assert ("error: unrecognized arguments: --epoch-count" in result.stderr) is said, result.stderr


def test_a_long_wait_for_a_busy_peer_is_a_hang_only_past_the_timeout():
    now = time.time()
    waiting = record(0, IN_COLLECTIVE, "gather", "train.py:88", since=now - 100.0)
    busy = record(1, RUNNING, "gather", "train.py:88", since=now - 100.0)
    patient = Watcher(Path("/nonexistent"), hang_timeout=300.0)
    assert patient.inspect({0: waiting, 1: busy}, now, Path("/nonexistent")) is None
    off = Watcher(Path("/nonexistent"), hang_timeout=0)
    assert off.inspect({0: waiting, 1: busy}, now + 1000, Path("/nonexistent")) is None


def test_a_rank_that_crashed_is_left_to_the_agent():
    ranks = {
        0: record(0, IN_COLLECTIVE, "gather", "train.py:88"),
        1: record(1, collective_record.CRASHED, "reduce", "train.py:90"),
    }
    assert watcher().inspect(ranks, time.time(), Path("/nonexistent")) is None


def test_a_dead_ranks_wait_is_no_wait():
    ranks = {
        0: record(0, IN_COLLECTIVE, "gather", "train.py:88", pid=dead_pid()),
        1: record(1, IN_COLLECTIVE, "reduce", "train.py:90"),
    }
    assert watcher().inspect(ranks, time.time(), Path("/nonexistent")) is None


def test_the_watcher_releases_the_ranks_waiting_at_exit_once_it_has_reported(tmp_path, monkeypatch):
    """A rank that left early waits at exit for peers that will not come; once the watcher has
    said so, it lets the rank go (the report is out: waiting on only delays the run's end).
    While nothing is reported (a peer busy outside any collective), nobody is released."""
    monkeypatch.setattr(Watcher, "_end", lambda self, verdict, directory: None)  # no stopping
    directory = collective_record.attempt_directory(tmp_path, 0)
    waiter = collective_record._Recorder(directory, 0, skip=())
    leaver = collective_record._Recorder(directory, 1, skip=())
    leaver.finish(LEAVING, 3)
    out = io.StringIO()
    watcher = Watcher(tmp_path, hang_timeout=0, out=out, grace=0.0, poll=0.01)
    watcher.start()
    try:
        time.sleep(0.3)  # many polls: rank 0 is busy, the run may still end well
        assert not collective_record.release_path(directory).exists(), out.getvalue()
        waiter.enter(b"gather")  # now it waits for a rank that has left
        deadline = time.monotonic() + 30
        while not collective_record.release_path(directory).exists():
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert "rank 1 is leaving" in out.getvalue()


def _store_with_keys_after(seconds: float | None) -> SimpleNamespace:
    """A store whose keys are all set ``seconds`` from now (never, for None)."""
    ready = None if seconds is None else time.monotonic() + seconds
    return SimpleNamespace(check=lambda keys: ready is not None and time.monotonic() >= ready)


def test_a_rank_waiting_for_its_peers_at_exit_stops_once_released_and_not_before(
    tmp_path, monkeypatch
):
    from accelify.runtime import state

    monkeypatch.setattr(state._ExitGuard, "EXIT_WAIT", timedelta(seconds=60))
    flag = collective_record.release_path(tmp_path)
    monkeypatch.setattr(collective_record, "_released_flag", str(flag))
    # a healthy run: the peers come a moment later, and the rank waits for them
    started = time.monotonic()
    state._wait_for_keys(_store_with_keys_after(0.5), ["left/0", "left/1"])
    assert 0.5 <= time.monotonic() - started < 30
    # the peers never come: released by the launcher, the rank goes at once
    threading.Timer(0.2, collective_record.release, [tmp_path]).start()
    started = time.monotonic()
    state._wait_for_keys(_store_with_keys_after(None), ["left/0", "left/1"])
    assert time.monotonic() - started < 30  # not EXIT_WAIT's 60 s
    assert flag.exists()
    # outside `accelify launch` (no record) nothing releases it: it waits EXIT_WAIT
    monkeypatch.setattr(collective_record, "_released_flag", None)
    monkeypatch.setattr(state._ExitGuard, "EXIT_WAIT", timedelta(seconds=0.3))
    started = time.monotonic()
    state._wait_for_keys(_store_with_keys_after(None), ["left/0"])
    assert time.monotonic() - started >= 0.3


def test_the_stack_shows_the_main_threads_frames_down_to_the_users_line(tmp_path):
    dump = tmp_path / "0.stack"
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)
    helper.start()
    try:
        with dump.open("w") as out:
            skip = [os.path.dirname(threading.__file__) + os.sep]
            out.write(json.dumps({"main_thread": threading.main_thread().ident, "skip": skip}))
            out.write("\n")
            out.flush()
            line = sys._getframe().f_lineno + 1
            faulthandler.dump_traceback(out, all_threads=True)
    finally:
        stop.set()
        helper.join()
    frames = parse_stack(dump.read_text())
    assert frames[-1] == (
        __file__,
        line,
        "test_the_stack_shows_the_main_threads_frames_down_to_the_users_line",
    )


def test_a_stack_taken_as_the_rank_imports_ends_at_the_users_import(tmp_path, monkeypatch):
    """A rank still importing (torch, under load) when its stack is asked for: below the user's
    ``import`` are the import system's frozen frames, then the library's; the place named is the
    user's line, not ``<frozen importlib._bootstrap>``."""
    library = tmp_path / "library"
    library.mkdir()
    dump = tmp_path / "0.stack"
    (library / "dumps_as_it_imports.py").write_text(
        "import faulthandler\n"
        f"with open({str(dump)!r}, 'a') as out:\n"
        "    faulthandler.dump_traceback(out, all_threads=True)\n"
    )
    skip = [str(library) + os.sep, os.path.dirname(os.__file__) + os.sep]  # and the stdlib
    header = {"main_thread": threading.main_thread().ident, "skip": skip}
    dump.write_text(json.dumps(header) + "\n")
    monkeypatch.syspath_prepend(str(library))
    monkeypatch.delitem(sys.modules, "dumps_as_it_imports", raising=False)
    line = sys._getframe().f_lineno + 1
    importlib.import_module("dumps_as_it_imports")
    frames = parse_stack(dump.read_text())
    assert not any(path.startswith("<frozen") for path, _, _ in frames)
    assert frames[-1][:2] == (__file__, line)


def test_a_decorators_library_frame_between_the_users_is_no_caller():
    """``@torch.no_grad()`` runs the user's function from torch's ``_contextlib`` wrapper: the
    call chain names the user's lines only (docs/launch.md: never accelify's or torch's frames)."""
    header = {"main_thread": 1, "skip": ["/venv/site-packages/torch/", "/usr/lib/python3.11/"]}
    dump = "\n".join(
        [
            json.dumps(header),
            "Current thread 0x0000000000000001 (most recent call first):",
            '  File "/venv/site-packages/torch/distributed/c10d.py", line 9 in all_gather',
            '  File "/work/train.py", line 43 in evaluate',
            '  File "/venv/site-packages/torch/utils/_contextlib.py", line 124 in decorate_context',
            '  File "/work/train.py", line 77 in main',
            '  File "/work/train.py", line 91 in <module>',
            '  File "/usr/lib/python3.11/runpy.py", line 88 in _run_code',
        ]
    )
    assert parse_stack(dump) == [
        ("/work/train.py", 91, "<module>"),
        ("/work/train.py", 77, "main"),
        ("/work/train.py", 43, "evaluate"),
    ]


# --- the final report ---------------------------------------------------------------------------
def failure(exitcode: int, timestamp: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp)


def write_failure(records: Path, rank: int, summary: str, at: int, where: str = "") -> None:
    attempt = records / "0"
    attempt.mkdir(parents=True, exist_ok=True)
    text = {
        "rank": rank,
        "time_ns": at,
        "summary": summary,
        "traceback": f"Traceback\n{summary}\n",
        "where": where,
    }
    (attempt / f"{rank}.json").write_text(json.dumps(text))


#: torch 2.13's message, wrapped as torch wraps it (trial24's tsc_n2.txt)
UNUSED_PARAMETERS = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting "
    "a new one. This error indicates that your module has parameters that were not used in "
    "producing loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \n"
    "making sure all `forward` function outputs participate in calculating loss. \n"
    "If you already have done the above, then the distributed data parallel module wasn't able "
    "to locate the output tensors in the return value of your module's `forward` function.\n"
    "Parameter indices which did not receive grad for rank 0: 2 3\n"
)


def test_ddps_unused_parameter_error_is_said_whole_with_accelifys_fix(tmp_path):
    """The one-line summary was cut where torch wraps the line ("..., and by "), and its advice
    names a DDP argument the script never passes: the sentence is said whole, then the
    Accelerator's spelling of the fix."""
    write_failure(tmp_path, 0, UNUSED_PARAMETERS, at=1)
    text, code = outcome.failed_run({0: failure(1), 1: failure(-signal.SIGTERM)}, tmp_path, 0)
    assert code == 1
    lines = text.splitlines()
    summary = next(line for line in lines if "failed first:" in line)
    assert summary.endswith(
        "and by making sure all `forward` function outputs participate in calculating loss."
    )
    fix = lines[lines.index(summary) + 1]
    assert fix.startswith("accelify launch: some parameters of the prepared model got no grad")
    assert (
        "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])"
        in fix
    )


def test_a_one_line_message_is_not_joined_to_the_next(tmp_path):
    write_failure(tmp_path, 0, "ValueError: bad shape\nexpected 3 got 4\n", at=1)
    text, _ = outcome.failed_run({0: failure(1), 1: failure(-signal.SIGTERM)}, tmp_path, 0)
    assert "failed first: ValueError: bad shape\n" in text + "\n"


def test_a_rank_whose_peer_left_is_a_victim_and_the_leavers_exit_code_is_the_runs(tmp_path):
    write_failure(tmp_path, 0, "RuntimeError: [pair.cc:553] Connection closed by peer", at=1)
    text, code = outcome.failed_run({0: failure(1), 1: failure(3)}, tmp_path, attempt=0)
    assert code == 3
    assert text.splitlines()[0].startswith("accelify launch: rank 1 failed with exit code 3")
    victim = "rank 0 failed because its peer had gone (RuntimeError: Connection closed by peer)"
    assert victim in text


def test_a_leaver_the_agent_stopped_while_it_tore_down_keeps_its_exit_code(tmp_path):
    """Rank 1 calls sys.exit(3); rank 0's backward fails at once on the closed connection and
    aborts (SIGABRT, gloo's thread at teardown) while rank 1 is still tearing down, so the agent
    sees rank 0 first and stops rank 1 with SIGTERM. Rank 1's record says it was leaving with 3:
    it is the cause, and 3 is the run's exit code (seen once in a full suite run of
    raw_ddp_exits.py, where the run exited 134 blaming rank 0)."""
    recorder = collective_record._Recorder(tmp_path / "0", 1, skip=())
    recorder.finish(LEAVING, 3)
    write_failure(tmp_path, 0, "RuntimeError: [pair.cc:553] Connection closed by peer", at=1)
    failures = {0: failure(-signal.SIGABRT), 1: failure(-signal.SIGTERM)}
    text, code = outcome.failed_run(failures, tmp_path, attempt=0)
    assert code == 3
    assert text.splitlines()[0] == (
        "accelify launch: rank 1 failed with exit code 3, while its peers were still running"
    )
    assert "rank 0 failed because its peer had gone" in text
    assert collective_record.read(tmp_path / "0", 1).exit_code == 3


def test_a_leaver_the_watcher_named_keeps_its_exit_code_when_its_peer_ends_first(tmp_path):
    """exit_code.py: the watcher names rank 1 leaving with 3 and releases it; rank 1 closes its
    connections, and rank 0, waiting in its backward, fails at once. Rank 0 may be out of the
    way first, and the agent then stops rank 1 with SIGTERM while it still tears down: the run
    exits 3 all the same, and says so (it exited 1, without rank 1's line)."""
    recorder = collective_record._Recorder(tmp_path / "0", 1, skip=())
    recorder.finish(LEAVING, 3)
    write_failure(tmp_path, 0, "RuntimeError: [pair.cc:553] Connection closed by peer", at=1)
    verdict = outcome.Verdict("accelify launch: rank 1 is leaving ...", culprit=1, kind="left")
    for rank_1_ended_by in (3, -signal.SIGTERM):  # first, or stopped by the agent
        failures = {0: failure(1), 1: failure(rank_1_ended_by)}
        text, code = outcome.failed_run(failures, tmp_path, attempt=0, verdict=verdict)
        assert code == 3, rank_1_ended_by
        assert text.splitlines()[0] == "accelify launch: rank 1 failed with exit code 3", text
        assert "rank 0 failed because its peer had gone" in text
    # a leaver that ended with 0 (its script's end) and was stopped: the run failed, with 1
    recorder.exit_code = 0
    recorder._write(LEAVING)
    text, code = outcome.failed_run(
        {0: failure(1), 1: failure(-signal.SIGTERM)}, tmp_path, attempt=0, verdict=verdict
    )
    assert code == 1 and "exit code" not in text


def test_a_rank_aborted_inside_a_collective_is_told_where_to_look(tmp_path):
    """gloo aborts a rank sent more bytes than its tensor holds (the ranks reduced tensors of
    different sizes): the rank dies of SIGABRT inside the collective. The records keep no
    peer's collective here: the line to compare is named, and `--debug` is not advised (its
    checks compare shapes of reduce and broadcast only, never which collective each rank is
    in: trial17 reran with it and learnt nothing more)."""
    recorder = collective_record._Recorder(tmp_path / "0", 0, skip=())
    recorder.enter(b"reduce")
    write_failure(tmp_path, 1, "RuntimeError: Connection reset by peer", at=1)
    text, code = outcome.failed_run({0: failure(-signal.SIGABRT), 1: failure(1)}, tmp_path, 0)
    assert code == 128 + signal.SIGABRT
    assert text.splitlines()[0].startswith("accelify launch: rank 0 was killed by SIGABRT")
    assert (
        "rank 0 aborted inside reduce: the communication library aborts a rank when the ranks "
        "pass it tensors of different sizes or dtypes, or when one rank's collective meets "
        "another collective of its peers; the ranks' records do not say which: compare what "
        "each rank passes to the collective at "
    ) in text
    assert "--debug" not in text
    assert "rank 1 failed because its peer had gone" in text
    recorder.leave()  # aborted outside any collective (an extension's own abort): no such line
    text, _ = outcome.failed_run({0: failure(-signal.SIGABRT), 1: failure(1)}, tmp_path, 0)
    assert "aborted inside" not in text


def _enter_at(recorder: collective_record._Recorder, operation: bytes, path: Path, line: int):
    """``recorder`` enters ``operation`` as if called from ``path``'s ``line``."""
    code = compile(
        "\n" * (line - 1) + "recorder.enter(operation, frame=sys._getframe())", str(path), "exec"
    )
    exec(code, {"recorder": recorder, "operation": operation, "sys": sys})


def test_a_rank_aborted_in_another_collective_than_its_peers_names_each_ranks_call(
    tmp_path, monkeypatch
):
    """trial17's fail_hang.py: rank 0 gathers under `if accelerator.is_main_process:` (line 4),
    rank 1 goes on to gather_object (line 6); gloo pairs the two and aborts rank 1 inside
    gather_object. Rank 0's line, the one to fix, was never named (only rank 1's, and rank 0 as
    a victim); each rank's call is, and the guard of rank 0's."""
    monkeypatch.chdir(tmp_path)  # paths are shown from the working folder
    script = tmp_path / "fail_hang.py"
    script.write_text(
        "from accelify import Accelerator\n"
        "accelerator = Accelerator()\n"
        "if accelerator.is_main_process:\n"
        "    all_r1 = accelerator.gather(r1)\n"
        "    print(all_r1)\n"
        "total = sum(gather_object([total]))\n"
    )
    main = collective_record._Recorder(tmp_path / "0", 0, skip=())
    other = collective_record._Recorder(tmp_path / "0", 1, skip=())
    _enter_at(main, b"gather", script, 4)
    _enter_at(other, b"gather_object", script, 6)
    main.finish(collective_record.CRASHED)  # its peer's abort reset the connection
    write_failure(tmp_path, 0, "RuntimeError: Connection reset by peer", at=1)
    text, code = outcome.failed_run({0: failure(1), 1: failure(-signal.SIGABRT)}, tmp_path, 0)
    assert code == 128 + signal.SIGABRT
    lines = text.splitlines()
    assert lines[0].startswith("accelify launch: rank 1 was killed by SIGABRT"), text
    assert lines[1] == (
        "accelify launch: mismatched collectives (#1 of each rank): rank 1 in gather_object at "
        "fail_hang.py:6 (`total = sum(gather_object([total]))`); rank 0 in gather at "
        "fail_hang.py:4 (`all_r1 = accelerator.gather(r1)`): a collective one rank makes alone "
        "meets another one of its peers, and the communication library aborts"
    ), text
    assert lines[2].startswith(
        "accelify launch: rank 0 went into a collective that only some ranks reach: "
        "fail_hang.py:4 (`all_r1 = accelerator.gather(r1)`) runs under "
        "`if accelerator.is_main_process:` (fail_hang.py:3), which rank 1 skipped and went on "
        "to another collective"
    ), text
    assert "--debug" not in text


def test_a_rank_whose_collective_raised_on_a_peers_other_collective_names_each_ranks_call(
    tmp_path, monkeypatch
):
    """The same fail_hang.py, the other way it ends: rank 0's gather checks the ranks' structures
    first, meets rank 1's gather_object and raises "the ranks passed containers that differ"
    at line 4 (a symptom); each rank's collective is named after it, and the guard."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "fail_hang.py"
    script.write_text(
        "from accelify import Accelerator\n"
        "accelerator = Accelerator()\n"
        "if accelerator.is_main_process:\n"
        "    all_r1 = accelerator.gather(r1)\n"
        "    print(all_r1)\n"
        "total = sum(gather_object([total]))\n"
    )
    main = collective_record._Recorder(tmp_path / "0", 0, skip=())
    other = collective_record._Recorder(tmp_path / "0", 1, skip=())
    _enter_at(main, b"gather", script, 4)
    _enter_at(other, b"gather_object", script, 6)
    main.finish(collective_record.CRASHED)
    summary = (
        "DistributedOperationException: Cannot gather: the ranks passed containers that differ"
    )
    write_failure(tmp_path, 0, summary, at=1, where=f"{script}:4")
    text, code = outcome.failed_run({0: failure(1), 1: failure(-signal.SIGABRT)}, tmp_path, 0)
    assert code == 1
    lines = [line for line in text.splitlines() if line.startswith("accelify launch:")]
    assert lines[1].startswith("accelify launch: rank 0 failed first"), text
    assert lines[2] == (
        "accelify launch: mismatched collectives (#1 of each rank): rank 0 in gather at "
        "fail_hang.py:4 (`all_r1 = accelerator.gather(r1)`); rank 1 in gather_object at "
        "fail_hang.py:6 (`total = sum(gather_object([total]))`): a collective one rank makes "
        "alone meets another one of its peers, and the collective raises"
    ), text
    assert lines[3].startswith(
        "accelify launch: rank 0 went into a collective that only some ranks reach: "
        "fail_hang.py:4 (`all_r1 = accelerator.gather(r1)`) runs under "
        "`if accelerator.is_main_process:` (fail_hang.py:3), which rank 1 skipped"
    ), text


def test_a_rank_aborted_inside_a_collective_its_peer_passed_other_shapes_is_told_both(tmp_path):
    recorder = collective_record._Recorder(tmp_path / "0", 0, skip=())
    recorder.enter(b"all_reduce", b"(10,) float32")
    peer = collective_record._Recorder(tmp_path / "0", 1, skip=())
    peer.enter(b"all_reduce", b"(1000,) float32")
    peer.finish(collective_record.CRASHED)
    write_failure(tmp_path, 1, "RuntimeError: Connection reset by peer", at=1)
    text, code = outcome.failed_run({0: failure(-signal.SIGABRT), 1: failure(1)}, tmp_path, 0)
    assert code == 128 + signal.SIGABRT
    assert text.splitlines()[0].startswith("accelify launch: rank 0 was killed by SIGABRT")
    assert (
        "the ranks passed all_reduce (collective #1) tensors of different shapes or dtypes" in text
    )
    assert "  rank 0: (10,) float32 at " in text and "  rank 1: (1000,) float32 at " in text
    assert "ReduceOp.MAX" in text and "--debug" not in text
    assert "rank 1 failed because its peer had gone" in text


def test_the_earliest_exception_that_is_not_a_victims_is_the_cause(tmp_path):
    write_failure(tmp_path, 0, "RuntimeError: Connection closed by peer", at=1)
    write_failure(tmp_path, 1, "ValueError: boom", at=2)
    text, code = outcome.failed_run({0: failure(1), 1: failure(1)}, tmp_path, attempt=0)
    assert code == 1
    assert "rank 1 failed first: ValueError: boom" in text
    assert text.count("Traceback") == 1


def test_a_rank_killed_by_sigkill_among_ranks_the_agent_stopped_is_the_cause(tmp_path):
    # The out-of-memory killer's SIGKILL, then the agent's SIGTERM for the others, all seen in
    # one poll with the same whole-second timestamp.
    failures = {0: failure(-signal.SIGTERM, 7.0), 1: failure(-signal.SIGKILL, 7.0)}
    text, code = outcome.failed_run(failures, tmp_path, attempt=0)
    assert code == 128 + signal.SIGKILL
    assert text.startswith("accelify launch: rank 1 was killed by SIGKILL (the out-of-memory")
    assert "rank 0" not in text


def test_a_rank_that_raised_first_gives_its_exception_exit_code_though_the_agent_stopped_it(
    tmp_path,
):
    """Both ranks raise the same error; rank 1 exits first, and the agent stops rank 0 with
    SIGTERM while rank 0, which raised first, is still leaving: the run exits 1, not 143."""
    write_failure(tmp_path, 0, "ValueError: shapes", at=1)
    write_failure(tmp_path, 1, "ValueError: shapes", at=2)
    text, code = outcome.failed_run({0: failure(-signal.SIGTERM), 1: failure(1)}, tmp_path, 0)
    assert code == 1
    assert "rank 0 failed first" in text


def test_ranks_that_all_exit_2_from_argument_parsing_are_said_once_without_tracebacks(tmp_path):
    """``launch -n 2 fail.py --bogus``: argparse prints its usage (on rank 0: the others are
    quieted) and raises SystemExit(2) on each rank in its own code (no exit record: not the
    script's own sys.exit). No rank printed a traceback; "(their tracebacks are above)" sent
    the user looking for some."""
    for rank in (0, 1):
        collective_record._Recorder(tmp_path / "0", rank, skip=()).finish(LEAVING, 2)
    text, code = outcome.failed_run({0: failure(2, 7.0), 1: failure(2, 7.0)}, tmp_path, 0)
    assert code == 2
    assert text == (
        "accelify launch: every rank exited 2 (the script's argument parsing: usage above)"
    )


def test_ranks_that_all_call_sys_exit_before_any_collective_left_no_tracebacks(tmp_path):
    """``sys.exit(3)`` at the top of the script on every rank: a SystemExit prints nothing, so
    the report does not point at tracebacks above."""
    for rank in (0, 1):
        collective_record._Recorder(tmp_path / "0", rank, skip=()).finish(LEAVING, 3)
    text, code = outcome.failed_run({0: failure(3, 7.0), 1: failure(3, 7.0)}, tmp_path, 0)
    assert code == 3
    assert text == (
        "accelify launch: ranks 0 and 1 each failed with exit code 3, on their own before any "
        "collective call"
    )


def test_ranks_that_all_exit_before_any_collective_are_named_together(tmp_path):
    """An exception at the top of the script, before Accelerator(): each rank printed its own
    traceback and none is a victim; naming one "while its peers were still running" was false."""
    text, code = outcome.failed_run({0: failure(1, 7.0), 1: failure(1, 7.0)}, tmp_path, 0)
    assert code == 1
    assert text == (
        "accelify launch: ranks 0 and 1 each failed with exit code 1, on their own before any "
        "collective call (their tracebacks are above)"
    )
    text, code = outcome.failed_run(
        {0: failure(2, 7.0), 1: failure(-signal.SIGSEGV, 8.0)}, tmp_path, 0
    )
    assert code == 2
    assert "rank 0 failed with exit code 2, rank 1 was killed by SIGSEGV, on their own" in text


def test_ranks_leaving_with_their_own_codes_before_any_collective_keep_them(tmp_path):
    """Rank 1 calls sys.exit(6), rank 0 sys.exit(5) a moment later and is still tearing down
    when the agent stops it: its record (which now begins with the script) says 5, not SIGTERM
    (seen in what_the_script_sees.py: the run exited 143, 'rank 0 was killed by SIGTERM')."""
    for rank, code in ((1, 6), (0, 5)):
        collective_record._Recorder(tmp_path / "0", rank, skip=()).finish(LEAVING, code)
    failures = {0: failure(-signal.SIGTERM, 7.0), 1: failure(6, 7.0)}
    text, code = outcome.failed_run(failures, tmp_path, attempt=0)
    assert code == 6
    assert text.startswith(
        "accelify launch: rank 0 failed with exit code 5, rank 1 failed with exit code 6, on "
        "their own before any collective call"
    ), text
    assert "SIGTERM" not in text
    assert "runtime" not in text  # its records began with the script: it had started


def test_ranks_that_fail_on_their_own_are_not_called_victims(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("x = 1\nprint(model(x))\ny = load()\n")
    write_failure(tmp_path, 0, "RuntimeError: shapes", at=2, where=f"{train}:2")
    write_failure(tmp_path, 1, "RuntimeError: shapes", at=1, where=f"{train}:2")
    text, _ = outcome.failed_run({0: failure(1), 1: failure(1)}, tmp_path, attempt=0)
    assert "rank 1 failed first at " in text and "train.py:2 (`print(model(x))`): " in text
    assert "rank 0 failed the same way, on its own" in text
    assert "peer had gone" not in text
    write_failure(tmp_path, 0, "KeyError: 'label'", at=2, where=f"{train}:3")
    text, _ = outcome.failed_run({0: failure(1), 1: failure(1)}, tmp_path, attempt=0)
    assert "rank 0 also failed at " in text and "train.py:3 (`y = load()`): KeyError" in text


def test_a_dataloader_workers_exception_is_named_by_its_own_line(tmp_path):
    summary = (
        "ValueError: Caught ValueError in DataLoader worker process 0.\n"
        f"{failure_record.WORKER_TRACEBACK}\n"
        '  File "/x/torch/utils/data/_utils/fetch.py", line 54, in fetch\n'
        "ValueError: bad sample 37"
    )
    write_failure(tmp_path, 1, summary, at=1)
    text, _ = outcome.failed_run({1: failure(1)}, tmp_path, attempt=0)
    assert "rank 1 failed first: ValueError: bad sample 37 (in a DataLoader worker)" in text


def test_an_atexit_handlers_exception_is_said_once_and_every_rank_exiting_0_is_the_runs(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("def flush():\n    raise OSError('log server down')\n")
    attempt = tmp_path / "0"
    attempt.mkdir()
    raised = ((1, "OSError: log server down", 1), (0, "RuntimeError: Connection closed by peer", 2))
    for rank, summary, at in raised:
        record = {"rank": rank, "time_ns": at, "summary": summary, "where": f"{train}:2",
                  "traceback": f"Traceback\n{summary}\n", "handler": "flush"}  # fmt: skip
        (attempt / f"{rank}{failure_record.EXIT_HANDLER_SUFFIX}").write_text(json.dumps(record))
    text, code = outcome.finished(tmp_path, 0, verdict=None)
    assert code == 0
    assert text.count("Traceback") == 1 and "rank 1's atexit handler flush raised;" in text
    assert "rank 1's atexit handler flush raised at " in text and ": OSError: log server" in text
    assert "rank 0's atexit handler flush failed because its peer had gone" in text
    assert outcome.finished(tmp_path / "none", 0, verdict=None) is None  # a clean run: silent


def test_a_handlers_exception_the_watcher_named_is_in_the_report_however_the_peer_ended(tmp_path):
    """exit_handler_save.py: rank 1's atexit handler raised and rank 1 left; the watcher named
    it and released it. Rank 0, waiting in its handler's barrier, then fails on the closed
    connection and exits 0 (Python ignores it), or is still tearing down when the watcher
    stops it (a loaded machine): the run ends through `finished` or `failed_run`, and the
    report, the handler's traceback in it, must be the same."""
    train = tmp_path / "train.py"
    train.write_text("def save():\n    raise OSError('disk full')\n")
    collective_record._Recorder(tmp_path / "0", 1, skip=()).finish(LEAVING, 0)
    record = {"rank": 1, "time_ns": 1, "summary": "OSError: disk full", "where": f"{train}:2",
              "traceback": "Traceback\nOSError: disk full\n", "handler": "save"}  # fmt: skip
    handler_record = tmp_path / "0" / f"1{failure_record.EXIT_HANDLER_SUFFIX}"
    handler_record.write_text(json.dumps(record))
    verdict = outcome.Verdict("accelify launch: rank 1 is leaving: ...", culprit=1, kind="left")
    ended_by_itself = outcome.finished(tmp_path, 0, verdict)
    stopped = outcome.failed_run({0: failure(-signal.SIGTERM)}, tmp_path, 0, verdict)
    assert ended_by_itself == stopped
    text, code = stopped
    assert code == 1
    assert text.count("Traceback") == 1 and "OSError: disk full" in text
    assert text.startswith("accelify launch: rank 1's atexit handler save raised; its traceback")


def test_the_peer_gone_messages_of_gloo_nccl_and_the_store_are_victims():
    for summary in (
        "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:2",
        "torch.distributed.DistStoreError: Socket Timeout",
        "RuntimeError: NCCL communicator was aborted on rank 0.",
    ):
        assert failure_record.is_peer_gone(summary), summary
    assert not failure_record.is_peer_gone("ValueError: Connection settings are wrong")
    # Python's own connection errors come from the script's sockets (a download, a tracker)
    assert not failure_record.is_peer_gone(
        "ConnectionResetError: [Errno 104] Connection reset by peer"
    )
    assert not failure_record.is_peer_gone("BrokenPipeError: [Errno 32] Broken pipe")


def test_a_rank_whose_recorded_exception_explains_nothing_gets_its_traceback_printed(tmp_path):
    """Every record says a peer had gone (the cause on another machine): the rank named kept
    its traceback for the report, which must print it, not say it is above."""
    write_failure(tmp_path, 1, "RuntimeError: Connection closed by peer", at=1)
    text, code = outcome.failed_run({1: failure(1)}, tmp_path, attempt=0)
    assert code == 1
    assert "above" not in text and text.count("Traceback") == 1
    assert "rank 1 failed with exit code 1: RuntimeError: Connection closed by peer" in text


# --- on real ranks ------------------------------------------------------------------------------
def launched(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return launch(FAILURES / script, flags=flags, timeout=180, cwd=FAILURES)


def launcher_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [
        line
        for line in result.stderr.splitlines()
        if "accelify launch:" in line or line.startswith("  ")
    ]


def assert_user_lines_only(result: subprocess.CompletedProcess[str]) -> None:
    for line in launcher_lines(result):
        for ours in ("runtime/", "accelify/", "site-packages"):
            assert ours not in line, line


@pytest.mark.distributed
def test_a_rank_that_exits_with_3_is_named_and_its_code_is_the_runs():
    result = launched("exit_code.py")
    assert result.returncode == 3, result.stderr
    assert (
        "accelify launch: rank 1 is leaving (it called sys.exit at exit_code.py:20 (`sys.exit(3)`))"
        in result.stderr
    )
    assert "rank 1 failed with exit code 3" in result.stderr
    assert "rank 1 called sys.exit alone while the others are still in the loop" in result.stderr
    assert "rank 0 failed first" not in result.stderr
    assert result.stderr.count("Traceback") == 0  # a victim's traceback is one line
    # the leaver's wait for its peers at exit is quiet (torch's socket timeout warnings were)
    assert "socket.cpp" not in result.stderr and "timed out after" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_leaving_with_os_exit_is_named_at_its_line_and_its_code_is_the_runs():
    """``os._exit(5)`` raises nothing and runs no atexit handler: the entry records the call
    itself, so the report names the helper's line, not only the rank's last collective."""
    result = launched("os_exit.py")
    assert result.returncode == 5, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    # the rank's exit or its record, whichever the launcher reads first
    exited = "rank 1 failed with exit code 5 (os._exit at os_exit.py:12 (`os._exit(code)`))"
    leaving = "rank 1 is leaving (it called os._exit at os_exit.py:12 (`os._exit(code)`))"
    assert exited in report[0] or leaving in report[0], report
    assert not any("rank 0 failed first" in line for line in report), report
    assert "called sys.exit" not in result.stderr and "(sys.exit at" not in result.stderr
    assert result.stderr.count("Traceback") == 0
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_raising_in_a_method_of_a_class_in_another_module_is_named_at_that_line():
    """The user's line is the imported module's, inside the method, not the script's call of
    it; the traceback is printed once; the peer whose all-reduce broke is a victim."""
    result = launched("trainer_module_raises.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at trainer_module.py:18 "
        '(`raise ValueError(f"bad batch at step {step}")`): ValueError: bad batch at step 3'
    ) in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert result.stderr.count("ValueError: bad batch at step 3") == 2  # traceback, report
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert "rank 0 failed first" not in result.stderr
    # the traceback is Python's own (its paths are the fixtures', under fixtures/runtime/):
    # the launcher's lines name only the user's files
    for line in result.stderr.splitlines():
        if "accelify launch:" in line:
            assert "accelify/" not in line and "site-packages" not in line, line


@pytest.mark.distributed
def test_a_rank_that_left_its_loop_early_is_not_blamed_on_the_scripts_closing_sys_exit():
    """``sys.exit(main())`` ends every rank's script: rank 1 got there early because it left
    its loop after 3 steps. The report names its last collective and advises every rank to run
    as many steps, not the sys.exit line and advice about calling sys.exit alone."""
    result = launched("early_stop_then_exit_main.py")
    assert result.returncode == 1, result.stderr
    assert "rank 1 is leaving (its script ended, or it called sys.exit)" in result.stderr
    assert "early_stop_then_exit_main.py:16 (`accelerator.reduce(torch.ones(1))`)" in result.stderr
    assert "rank 1 left the loop the others are still in" in result.stderr
    assert "called sys.exit alone" not in result.stderr
    assert "sys.exit(main())" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_guarded_last_collective_is_named_with_its_guard_not_as_a_loop_left_early():
    """Rank 1 skips the script's last collective (under is_main_process) and its script ends:
    the guard is the line to fix; there is no loop it left and no break to agree on."""
    result = launched("main_only_reduce_at_the_end.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 went into a collective that only some ranks reach: main_only_reduce_at_the_end"
        '.py:21 (`total = accelerator.reduce(loss.detach(), "mean")`) runs under '
        "`if accelerator.is_main_process:` (main_only_reduce_at_the_end.py:20), which rank 1 "
        "skipped and left" in result.stderr
    )
    assert "left the loop the others are still in" not in result.stderr
    assert "set_trigger" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_tensors_that_differ_in_more_than_their_rows_fail_the_gather_on_every_rank():
    result = launched("gather_shapes.py")
    assert result.returncode == 1, result.stderr
    assert "gathered" not in result.stdout  # rank 0 printed rows of uninitialised memory
    # both ranks raise at once: either may be first, and the other failed the same way
    assert (
        "failed first at gather_shapes.py:11 (`gathered = accelerator.gather(predictions)`)"
        in result.stderr
    )
    assert "(rank 0: (3, 2); rank 1: (3,))" in result.stderr
    assert "failed the same way, on its own" in result.stderr
    assert "terminate called" not in result.stderr


@pytest.mark.distributed
def test_containers_that_differ_between_ranks_fail_the_gather_on_every_rank():
    result = launched("gather_keys.py")
    assert result.returncode == 1, result.stderr
    assert "gathered" not in result.stdout
    assert "left the loop" not in result.stderr  # rank 1 did not leave: the gathers differed
    assert (
        "failed first at gather_keys.py:13 (`gathered = accelerator.gather_for_metrics(outputs)`)"
        in result.stderr
    )
    assert "the ranks passed containers that differ" in result.stderr
    assert "failed the same way, on its own" in result.stderr


@pytest.mark.distributed
def test_a_reduce_of_different_lengths_names_each_ranks_shape_not_a_rank_that_left():
    result = launched("reduce_lengths.py")
    assert result.returncode == 1, result.stderr
    assert (
        "the ranks passed reduce (collective #1) tensors of different shapes or dtypes"
        in result.stderr
    )
    line = 'reduce_lengths.py:12 (`total = accelerator.reduce(losses, "sum")`)'
    assert f"  rank 0: (4,) float32 at {line}\n" in result.stderr
    assert f"  rank 1: (3,) float32 at {line} (went on with a wrong result)" in result.stderr
    assert "left the loop" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_gather_that_aborts_gloo_names_each_ranks_shape_with_a_gathers_advice():
    """A gather's ranks may pass different shapes (the outputs say which): recorded, and named
    once the destination aborted inside it; was "rerun with --debug"."""
    result = launched("raw_gather_sizes.py")
    assert result.returncode == 128 + signal.SIGABRT, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    assert report[0].startswith("accelify launch: rank 0 was killed by SIGABRT"), report
    line = "raw_gather_sizes.py:13 (`dist.gather(scores, gathered, dst=0)`)"
    assert f"  rank 0: (3,) float32 at {line}\n" in result.stderr
    assert f"  rank 1: (4,) float32 at {line}" in result.stderr
    assert "wrong result" not in result.stderr  # rank 1 only sent its part
    assert "the shape and dtype that the gather's output list holds for that rank" in result.stderr
    assert "--debug" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_an_all_reduce_that_aborts_gloo_names_each_ranks_shape():
    result = launched("raw_all_reduce_sizes.py")
    assert result.returncode == 128 + signal.SIGABRT, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    assert report[0].startswith("accelify launch: rank 1 was killed by SIGABRT"), report
    line = "raw_all_reduce_sizes.py:10 (`dist.all_reduce(counts)`)"
    assert f"  rank 0: (1000,) float32 at {line}" in result.stderr
    assert f"  rank 1: (10,) float32 at {line}" in result.stderr
    assert "--debug" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_collective_reached_under_a_rank_test_that_aborts_gloo_names_the_guard():
    """Rank 0's reduce (dst 0: it only receives) meets rank 1's next gradient all-reduce: gloo
    aborts rank 0 on the sizes, and the launcher names the guarded call, not "tensors of
    different sizes" (the records hold no shapes of one collective: the ranks were in two)."""
    result = launched("reduce_under_main_in_a_method.py")
    assert result.returncode == 128 + signal.SIGABRT, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    assert report[0].startswith("accelify launch: rank 0 was killed by SIGABRT"), report
    assert report[1] == (
        "accelify launch: rank 0 went into a collective that only some ranks reach: "
        "reduce_under_main_in_a_method.py:33 (`self.log_metrics(loss)`) runs under "
        "`if self.accelerator.is_main_process:` (reduce_under_main_in_a_method.py:32), which "
        "rank 1 skipped and went on to other collectives; every rank must make the call: take "
        "the collective out of the guard (gather or wait on every rank, then print or save on "
        "the main process only)"
    ), report
    assert "--debug" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_killed_from_outside_is_named_and_the_run_exits_as_a_shell_says():
    result = launched("killed.py")
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    assert report[0].startswith("accelify launch: rank 1 was killed by SIGKILL"), report
    assert "its last collective: backward at killed.py:17" in report[0]
    assert not any("rank 0 was killed" in line for line in report), report
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_killed_by_a_segfault_is_named_with_the_line_it_died_on():
    result = launched("segfault.py")
    assert result.returncode == 128 + signal.SIGSEGV, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    assert report[0].startswith(
        "accelify launch: rank 1 was killed by SIGSEGV at segfault.py:15 (`ctypes.string_at(0)`)"
    ), report
    assert "Fatal Python error" not in result.stderr  # the dump went to the launcher, not here
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_ranks_own_connection_error_is_the_cause_not_a_victims():
    result = launched("own_connection_error.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at own_connection_error.py:13 "
        '(`raise ConnectionResetError(104, "Connection reset by peer")`): '
        "ConnectionResetError: [Errno 104] Connection reset by peer"
    ) in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert "above" not in result.stderr


@pytest.mark.distributed
def test_a_dataloader_workers_exception_is_named_at_the_datasets_line():
    result = launched("worker_raises.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at worker_raises.py:16 "
        '(`raise ValueError(f"sample {index} is broken")`): '
        "ValueError: sample 37 is broken (in a DataLoader worker)"
    ) in result.stderr
    tracebacks = [line for line in result.stderr.splitlines() if line.startswith("Traceback")]
    assert len(tracebacks) == 1, result.stderr  # rank 1's, once


@pytest.mark.distributed
def test_a_rank_that_breaks_out_of_its_loop_alone_is_named_with_its_step():
    result = launched("early_stop.py")
    assert result.returncode == 1, result.stderr
    assert "mismatched collectives" in result.stderr
    assert "at early_stop.py:15 (`accelerator.backward(loss)`)" in result.stderr
    assert "rank 1 waits in wait_for_everyone at early_stop.py:21" in result.stderr
    assert (
        "rank 1 left the training loop early: it stopped after 4 backward passes" in result.stderr
    )
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_collective_under_a_main_process_guard_is_a_mismatch_reported_in_seconds():
    result, _, after_the_gather = launch_timed(
        FAILURES / "main_only_gather.py", "rank 0 gathers alone", cwd=FAILURES, timeout=240
    )
    assert result.returncode == 1, result.stderr
    assert "rank 0 waits in gather at main_only_gather.py:22" in result.stderr
    assert "rank 1 waits in the model's forward" in result.stderr
    assert "main_only_gather.py:16" in result.stderr
    # from rank 0's gather, not from the launch: starting the ranks takes as long as the
    # machine's load makes it; torch's own timeout for the gather is 30 minutes
    assert after_the_gather is not None, result.stderr
    assert after_the_gather < 120, f"took {after_the_gather:.0f} s after the gather"
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_collective_in_a_helper_under_a_guard_names_the_guarded_call():
    result = launched("helper_gather.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 waits in gather at helper_gather.py:10 "
        "(`losses = accelerator.gather(loss.detach())`), collective #6, after 3 backward passes; "
        "called from helper_gather.py:20 "
        "(`log_loss(accelerator, loss)`)"
    ) in result.stderr
    assert (
        "rank 0 went into a collective that only some ranks reach: helper_gather.py:20 "
        "(`log_loss(accelerator, loss)`) runs under `if accelerator.is_main_process and step == 2:`"
        " (helper_gather.py:19), which rank 1 skipped and went on"
    ) in result.stderr
    assert "left the training loop early" not in result.stderr  # it is still in the loop
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_guarded_barrier_between_epochs_names_its_guard_not_an_early_stop():
    """Rank 0 waits after fewer backward passes, as a rank that left the loop would: the
    analysis, not the counts, tells the two apart."""
    result = launched("epoch_end_barrier.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 went into a collective that only some ranks reach: epoch_end_barrier.py:20 "
        "(`accelerator.wait_for_everyone()`) runs under `if accelerator.is_main_process:` "
        "(epoch_end_barrier.py:19), which rank 1 skipped and went on"
    ) in result.stderr
    assert "left the training loop early" not in result.stderr
    assert "set_trigger" not in result.stderr  # an early stop's advice
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_nan_loss_raised_on_one_rank_names_that_rank_and_its_line():
    result = launched("nan_loss_one_rank.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at nan_loss_one_rank.py:24 "
        '(`raise FloatingPointError(f"the loss is NaN at step {step}")`): '
        "FloatingPointError: the loss is NaN at step 3"
    ) in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert "unreachable" not in result.stdout


@pytest.mark.distributed
def test_a_barrier_under_a_main_process_guard_in_a_trainers_method_names_the_guard():
    result = launched("trainer_class_barrier.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 waits in wait_for_everyone at trainer_class_barrier.py:21 "
        "(`self.accelerator.wait_for_everyone()`)"
    ) in result.stderr
    assert (
        "rank 0 went into a collective that only some ranks reach: trainer_class_barrier.py:21 "
        "(`self.accelerator.wait_for_everyone()`) runs under "
        "`if self.accelerator.is_main_process:` (trainer_class_barrier.py:20), which rank 1 "
        "skipped and went on"
    ) in result.stderr
    assert "left the training loop early" not in result.stderr
    assert "saved" not in result.stdout
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_out_of_memory_in_python_is_named_at_its_line():
    result = launched("memory_error.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at memory_error.py:18 (`cache = bytearray(1 << 62)`): MemoryError"
    ) in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert "unreachable" not in result.stdout


@pytest.mark.distributed
def test_a_rank_raising_in_prepare_is_named_at_the_prepare_line():
    result = launched("prepare_raises.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at prepare_raises.py:12 "
        "(`model, optimizer = accelerator.prepare(model, optimizer)`): RuntimeError: [1]: "
        "params[0] in this process with sizes [2, 4] appears not to match"
    ) in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr


@pytest.mark.distributed
def test_the_scripts_own_torch_distributed_calls_are_recorded_too():
    result = launched("raw_collectives.py")
    assert result.returncode == 1, result.stderr
    assert "rank 0 waits in all_reduce at raw_collectives.py:18" in result.stderr
    assert "rank 1 waits in barrier at raw_collectives.py:20 (`dist.barrier()`)" in result.stderr
    assert "collective #2" in result.stderr  # the subgroup's all-reduce is not counted
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_busy_past_the_hang_timeout_is_shown_with_its_stack():
    result = launched("sleeper.py", "--hang-timeout", "3")
    assert result.returncode == 1, result.stderr
    assert "rank 0 has waited" in result.stderr and "in gather at sleeper.py:13" in result.stderr
    assert "rank 1 has not reached a collective" in result.stderr
    assert "it is at sleeper.py:12 (`time.sleep(600)" in result.stderr
    assert 'File "sleeper.py", line 17, in <module>' in result.stderr
    assert (  # the guard it works under, which the other ranks skip
        "rank 1 is in sleeper.py:12 (`time.sleep(600)  # stands for a loop one rank runs "
        "alone`), which runs under `if accelerator.process_index == 1:` (sleeper.py:11)"
    ) in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_main_process_section_shorter_than_the_timeout_is_healthy():
    result = launched("main_process_section.py", "--hang-timeout", "60")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done: 2 ranks"
    assert "accelify launch:" not in result.stderr


@pytest.mark.distributed
def test_a_script_using_torch_distributed_itself_is_named_with_its_line():
    """No Accelerator: the rank's entry records the failure all the same."""
    result = launched("raw_ddp_raises.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 failed first at raw_ddp_raises.py:19 "
        '(`raise ValueError(f"bad batch at step {step}")`): ValueError: bad batch at step 2'
    ) in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr  # rank 1's, once
    assert "rank_entry" not in result.stderr and "runpy" not in result.stderr


@pytest.mark.distributed
def test_a_script_using_torch_distributed_itself_exits_with_its_leavers_code():
    result = launched("raw_ddp_exits.py")
    assert result.returncode == 3, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    place = "backward at raw_ddp_exits.py:13 (`model(torch.randn(2, 4)).sum().backward()`)"
    # the script's own DDP backward is recorded by the rank's entry. Said by the final report
    # once rank 0's backward failed on the closed connection, or first by the watcher when
    # rank 1 takes more than its grace to exit on a loaded machine (then "rank 1 is leaving").
    exit_call = "raw_ddp_exits.py:15 (`sys.exit(3)`)"
    assert report[0] in (
        f"accelify launch: rank 1 failed with exit code 3 (sys.exit at {exit_call}) after 4 "
        f"backward passes; its last collective: {place}, while its peers were still running",
        f"accelify launch: rank 1 is leaving (it called sys.exit at {exit_call}) after 4 "
        f"backward passes (its last collective: {place}), while:",
    ), report
    assert "rank 1 failed with exit code 3" in result.stderr
    assert "rank 0 failed because its peer had gone" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.distributed
def test_a_rank_waiting_in_a_raw_ddp_backward_for_a_sleeping_peer_is_a_hang_with_both_lines():
    """No Accelerator: DDP's all-reduce runs in C++ inside `loss.backward()`; the rank's entry
    records that backward, or the wait was silent for torch's 30 minutes."""
    result = launched("raw_ddp_sleeper.py", "--hang-timeout", "3")
    assert result.returncode == 1, result.stderr
    assert "rank 0 has waited" in result.stderr
    assert " s in backward at raw_ddp_sleeper.py:16 (`loss.backward()`)" in result.stderr
    assert "rank 1 has not reached a collective" in result.stderr
    assert "it is at raw_ddp_sleeper.py:15 (`time.sleep(600)`)" in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_leaving_a_raw_ddp_loop_is_named_with_its_last_backward():
    result = launched("raw_ddp_leaves.py")
    assert result.returncode == 1, result.stderr
    report = [line for line in result.stderr.splitlines() if "accelify launch:" in line]
    # Said by the final report once rank 0's backward failed on the closed connection, or by the
    # watcher first when rank 1 takes seconds to exit on a loaded machine ("rank 1 has exited").
    assert report[0].startswith("accelify launch: rank 1 "), report
    assert "after 4 backward passes" in report[0], report
    assert "backward at raw_ddp_leaves.py:12 (`loss.backward()`)" in result.stderr
    assert "rank 1 left the loop the others" in result.stderr
    assert "or without an Accelerator an all_reduce of a stop flag" in result.stderr
    assert "rank 0 exited" not in result.stderr and "rank 0 failed first" not in result.stderr


@pytest.mark.distributed
def test_a_rank_breaking_out_of_a_raw_ddp_loop_is_named_not_its_peer_in_backward():
    result = launched("raw_ddp_breaks_to_barrier.py")
    assert result.returncode == 1, result.stderr
    assert "mismatched collectives" in result.stderr
    assert (
        "rank 0 waits in backward (DDP reduces gradients there) at raw_ddp_breaks_to_barrier.py:13 "
        "(`loss.backward()`), collective #6, after 5 backward passes"
    ) in result.stderr
    assert (
        "rank 1 waits in barrier at raw_ddp_breaks_to_barrier.py:16 (`dist.barrier()`), "
        "collective #6, after 4 backward passes"
    ) in result.stderr
    assert "rank 1 left the training loop early" in result.stderr
    assert "has not reached a collective" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_looping_before_it_starts_the_group_is_a_hang_with_its_line():
    """Rank 0 waits in the rendezvous of `Accelerator()`, before any collective: silent until
    the store's timeout, when records began with the process group."""
    result = launched("loops_before_the_group.py", "--hang-timeout", "3")
    assert result.returncode == 1, result.stderr
    assert "rank 0 has waited" in result.stderr
    assert (
        " s in init_process_group at loops_before_the_group.py:20 (`accelerator = Accelerator()`)\n"
    ) in result.stderr  # no collective number: it is before the first
    assert "it is at loops_before_the_group.py:17 (`while True: pass`)" in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
@pytest.mark.parametrize("safe_path", ["", "1"], ids=["default", "PYTHONSAFEPATH"])
def test_the_ranks_path_is_the_one_python_gives_the_script(tmp_path, safe_path):
    """With PYTHONSAFEPATH=1 (as ``python -P``) Python puts neither the script's folder nor the
    working directory first: the entry kept that, and did not put the folder in place of the
    standard library's first entry."""
    script = FAILURES / "what_the_path_is.py"
    env = {"PYTHONSAFEPATH": safe_path}
    alone = run_in_own_group([sys.executable, str(script)], cwd=tmp_path, timeout=60, env={
        **os.environ, **env})  # fmt: skip
    result = launch(script, processes=1, cwd=tmp_path, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(alone.stdout)


@pytest.mark.distributed
def test_a_script_using_torch_distributed_itself_has_its_collectives_recorded():
    result = launched("raw_mismatch.py")
    assert result.returncode == 1, result.stderr
    assert "rank 0 waits in all_reduce at raw_mismatch.py:13 (`dist.all_reduce(total)`)" in (
        result.stderr
    )
    assert "rank 1 waits in barrier at raw_mismatch.py:14 (`dist.barrier()`)" in result.stderr
    assert "collective #4" in result.stderr  # the three all_reduce(total) before it count
    assert "backward pass" not in result.stderr  # not counted without the runtime
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_the_rank_entry_runs_the_script_as_python_would(tmp_path):
    result = launch(FAILURES / "what_the_script_sees.py", "a", flags=(), cwd=tmp_path, timeout=120)
    seen = [eval(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(seen) == 2, result.stdout + result.stderr
    script = FAILURES / "what_the_script_sees.py"
    for each in seen:
        assert each["argv"] == [str(script), "a"]
        assert each["path0"] == str(script.resolve().parent)
        assert each["file"] == str(script) and each["name"] == "__main__"
        assert each["doc"].startswith("Started through the rank's entry")
        assert each["spec"] is None and each["main_is_this_module"] and each["pickles"]
        assert not each["torch_imported"]  # a script may set variables before it imports torch
    assert result.returncode in (5, 6), result.stderr  # the script's own exit codes


@pytest.mark.distributed
def test_an_exception_in_an_atexit_handler_is_said_once_and_the_run_exits_0_as_python_does():
    result = launched("exit_handler_raises.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained"
    assert (
        "rank 1's atexit handler flush_logs raised at exit_handler_raises.py:11 "
        '(`raise OSError("log server unreachable")`): OSError: log server unreachable'
    ) in result.stderr
    assert "every rank exited with code 0, and so does the run" in result.stderr
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert "Exception ignored" not in result.stderr  # the rank's own print: the launcher said it


@pytest.mark.distributed
def test_a_peer_waiting_for_a_rank_whose_atexit_handler_raised_is_told_why():
    result = launched("exit_handler_save.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 1 is leaving: its atexit handler save_at_exit raised at exit_handler_save.py:15 "
        '(`raise OSError("disk full")`): OSError: disk full, while:'
    ) in result.stderr
    assert "rank 0 waits in wait_for_everyone at exit_handler_save.py:16" in result.stderr
    assert "left the loop" not in result.stderr  # it did not: its handler raised
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert result.stderr.count("OSError: disk full") == 2, result.stderr  # verdict, traceback
    assert "rank_entry" not in result.stderr and "site-packages" not in result.stderr


@pytest.mark.distributed
def test_unbuffered_output_through_a_pipe_reads_as_python_alone_gives_it(tmp_path):
    """PYTHONUNBUFFERED=1: nothing is held back (a partial line comes before the stderr line
    written after it) and nothing is lost when the rank is killed."""
    script = FAILURES / "unbuffered_then_killed.py"
    env = {"PYTHONUNBUFFERED": "1"}
    alone = run_in_own_group([sys.executable, str(script)], cwd=tmp_path, timeout=60, env={
        **os.environ, **env})  # fmt: skip
    assert alone.stdout == "loading [a warning on stderr]\n done\nstep 1"
    result = launch(script, processes=1, cwd=tmp_path, timeout=120, env=env)
    assert result.stdout == alone.stdout, result.stderr


@pytest.mark.distributed
def test_an_accelerator_backward_through_the_scripts_own_ddp_model_is_one_pass():
    result = launched("mixed_ddp_early_stop.py")
    assert result.returncode == 1, result.stderr
    assert "rank 1 waits in wait_for_everyone at mixed_ddp_early_stop.py:24" in result.stderr
    assert (
        "rank 1 left the training loop early: it stopped after 4 backward passes, the others "
        "went on to 5"
    ) in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_prepared_models_loss_backward_beside_the_scripts_own_ddp_model_is_recorded():
    result = launched("mixed_ddp_loss_backward.py", "--hang-timeout", "120")
    assert result.returncode == 1, result.stderr
    assert "mismatched collectives" in result.stderr
    assert (
        "rank 0 waits in backward (DDP reduces gradients there) at mixed_ddp_loss_backward.py:20 "
        "(`loss.backward()`)"
    ) in result.stderr
    assert "rank 1 waits in wait_for_everyone at mixed_ddp_loss_backward.py:27" in result.stderr
    assert "rank 1 left the training loop early" in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_second_ddp_models_backward_is_recorded_after_the_first_ones():
    """The first model's backward left the second's reduction pending: rank 0 waiting there is
    in a collective, not busy, and the mismatch is said in seconds, not after the timeout."""
    result = launched("raw_ddp_two_models_break.py", "--hang-timeout", "120")
    assert result.returncode == 1, result.stderr
    assert "mismatched collectives" in result.stderr
    assert (
        "rank 0 waits in backward (DDP reduces gradients there) at raw_ddp_two_models_break.py:18 "
        "(`second_loss.backward()`)"
    ) in result.stderr
    assert "rank 1 waits in barrier at raw_ddp_two_models_break.py:19" in result.stderr
    assert "rank 1 left the training loop early" in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_script_handling_sigusr2_itself_keeps_it_and_its_stack_is_still_shown():
    result = launched("sleeper_with_preemption_handler.py", "--hang-timeout", "3")
    assert result.returncode == 1, result.stderr
    assert "rank 1 has not reached a collective" in result.stderr
    assert "it is at sleeper_with_preemption_handler.py:22 (`time.sleep(600)" in result.stderr
    assert "preempted" not in result.stderr  # the script's handler is not run by the launcher
    assert_user_lines_only(result)


# --- before any rank starts -------------------------------------------------------------------
def test_a_module_the_script_cannot_import_is_said_once_before_any_rank_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('"""Train."""\nimport os\nimport no_such_module_xyz.sub\nprint("ran")\n')
    result = run_accelify("launch", "--cpu", "-n", "2", script, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{script}:3: ModuleNotFoundError: No module named 'no_such_module_xyz'" in result.stderr
    assert result.stderr.count("ModuleNotFoundError") == 1 and "Traceback" not in result.stderr
    assert "ran" not in result.stdout


def test_imports_found_only_when_the_script_runs_are_not_refused(tmp_path, monkeypatch):
    """The script's own folder is on a rank's path (from any working directory); an import
    after another statement, or inside ``try``, may need what the script does first."""
    (tmp_path / "helpers.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text(
        "from __future__ import annotations\n"
        "import os.path\n"
        "from collections import abc\n"
        "import helpers\n"
        "from . import sibling\n"
        "import sys\n"
        "sys.path.insert(0, 'vendor')\n"
        "import vendored_only\n"
        "try:\n"
        "    import optional_extra\n"
        "except ImportError:\n"
        "    pass\n"
    )
    monkeypatch.chdir("/")
    launcher._check_script(script)
    script.write_text("import helpers, missing_one\n")
    with pytest.raises(UserError, match=r"train\.py:1: ModuleNotFoundError: .*'missing_one'"):
        launcher._check_script(script)


@pytest.mark.distributed
def test_an_fsdp_get_state_dict_on_the_main_process_only_is_named_as_a_collective():
    """FSDP's whole state is gathered by torch's DTensor collectives, which the record does not
    see one by one: the runtime records the call, so the main process's lone gather is named at
    its line while its peer leaves (without it: rank 0 was blamed for 'Connection closed by
    peer' with torch's frames, or, with the peer still running, only at --hang-timeout)."""
    result = launched("fsdp_main_only_state.py", "--backend", "fsdp")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 waits in get_state_dict at fsdp_main_only_state.py:25 "
        "(`state = accelerator.get_state_dict(model)`)"
    ) in result.stderr
    assert (
        "runs under `if accelerator.is_main_process:` (fsdp_main_only_state.py:23), "
        "which rank 1 skipped and left"
    ) in result.stderr
    assert "Connection closed by peer" not in result.stderr
    assert_user_lines_only(result)


@pytest.mark.distributed
def test_a_rank_early_stopping_alone_inside_a_trainers_method_is_named_with_its_step():
    result = launched("trainer_early_stop.py")
    assert result.returncode == 1, result.stderr
    assert (
        "rank 0 waits in backward (DDP reduces gradients there) at trainer_early_stop.py:28 "
        "(`self.accelerator.backward(loss)`)"
    ) in result.stderr
    assert (
        "rank 1 waits in wait_for_everyone at trainer_early_stop.py:36 "
        "(`self.accelerator.wait_for_everyone()`)"
    ) in result.stderr
    assert "rank 1 left the training loop early: it stopped after 4 backward passes" in (
        result.stderr
    )
    assert "unreachable" not in result.stdout
    assert_user_lines_only(result)
