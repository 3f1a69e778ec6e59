"""Where each rank stands, for the launcher to read while the run goes on: the collective it is
in (the operation, its sequence number, and the user's ``file:line`` that called it), how many
backward passes it has made, and whether it is leaving or has crashed.

A hang in a distributed run is one rank waiting in a collective that a peer never reaches. Torch
says nothing about it until its 30-minute timeout, and then only that it timed out. Each rank
keeps one small record, a fixed-size file it writes through a shared memory map (a few
microseconds per collective, no system call), and `accelify.runtime.launch.watch` compares the
ranks' records: two ranks in different collectives, a rank waiting while its peer leaves, a rank
waiting past ``--hang-timeout`` while a peer is busy elsewhere. For the last, each rank lets the
launcher ask for its Python stack (`faulthandler` on `STACK_SIGNAL`), into a file beside the
record. A process the rank forks (a DataLoader worker, a multiprocessing child) keeps no record:
what it does is not the rank's, and the rank's record is its own pid's alone.

Only the outermost collective is recorded (a ``gather_for_metrics`` that gathers is one
``gather``), and only what is a collective on every rank that calls it: a backward counts when
it reduces gradients. Nothing is recorded on one process or outside `accelify launch`. This
module does not import torch at import time: the launcher reads records with `read`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import importlib.util
import json
import mmap
import os
import signal
import struct
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import IO, Any, TypeVar

from accelify.runtime.environment import FAILURE_DIR

#: What the rank is doing, as the launcher sees it.
RUNNING, IN_COLLECTIVE, LEAVING, CRASHED = 0, 1, 2, 3
#: The signal on which a rank dumps its Python stack for the launcher: a real-time signal, which
#: no scheduler, trainer or library we know sends or handles. SIGUSR1 and SIGUSR2 are the
#: preemption signals of Lightning, submitit and Slurm's ``--signal``: a script that handled one
#: once its training had started replaced faulthandler's dump, and the launcher's ask for a stack
#: ran the script's handler (a checkpoint and a requeue) instead. Without real-time signals
#: (macOS) SIGUSR2, and a script that takes it before its group starts is never asked
#: (`_leave_the_stack_signal_to_the_script`).
STACK_SIGNAL: int = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2

# generation (odd while a write is under way), pid, state, exit code (while leaving), collective
# sequence number, backward passes, time the state began, main thread id, operation, where,
# the sequence number of the last collective whose tensors were described and their shapes
# (`shapes_of`), whether its collectives are over (`collectives_over`)
_LAYOUT = struct.Struct("<IiiiqqdQ32s240sq32s96s?")
_GENERATION = struct.Struct("<I")
#: The layout's parts, written alone where the rest has not changed (`_Recorder.enter` and
#: `leave` run at every collective: one pack of all the fields cost a 32-wide step 1 % of its
#: instructions). The head: generation to main thread id; the place: operation and where.
_HEAD = struct.Struct("<IiiiqqdQ")
_PLACE, _PLACE_OFFSET = struct.Struct("32s240s"), _HEAD.size
_SHAPED, _SHAPED_OFFSET = struct.Struct("<q32s96s"), _HEAD.size + _PLACE.size
#: The head but the main thread's id, written in one pack by a step's backward as it begins
#: (`_Recorder.backward_begins`; its end writes the time and the state alone, `_write_running`):
#: the odd generation first, as each field's own store did, in a third of the instructions of
#: five stores through the typed views
_STEP_HEAD = struct.Struct("<Iiiiqqd")
#: The file's size: the layout, padded to whole 8-byte words, so that the head's numbers are
#: written as items of typed views of the map (one store each, where a pack is a call):
#: the generation is word 0 of 32 bits, the state word 2, the sequence and passes words 2 and 3
#: of 64 bits, the time word 4 of the doubles.
_SIZE = -(-_LAYOUT.size // 8) * 8
_STATE_ITEM, _SEQUENCE_ITEM, _PASSES_ITEM, _SINCE_ITEM = 2, 2, 3, 4
#: The views are of the machine's byte order, the layout's is little-endian: elsewhere every
#: write packs the whole layout.
_VIEWS = sys.byteorder == "little"
_OVER, _OVER_OFFSET = struct.Struct("<?"), _LAYOUT.size - 1
F = TypeVar("F", bound=Callable[..., Any])
_now = time.time  # read at every backward: one name, not a module's attribute


@dataclass(frozen=True)
class Record:
    rank: int
    pid: int
    state: int
    sequence: int  # collectives entered so far; the current one while in one
    passes: int  # backward passes so far
    since: float  # time.time() when the current state began
    operation: str  # the current or the last collective
    where: str  # "path:line" of the user's call of that collective
    #: the code the rank is leaving with (``sys.exit(3)``), known while it is LEAVING: the agent
    #: may stop a rank still tearing down after a peer crashed of its leaving
    exit_code: int = 0
    #: a leaving rank past every collective it could still make (`collectives_over`): a peer
    #: waiting in a collective this rank never entered waits for good
    over: bool = False
    #: the sequence number of the last collective that must see the same shapes on every rank
    #: (an all-reduce, a broadcast), and the shapes and dtypes this rank passed it
    #: (``(4,) float32``): a peer that passed other shapes made the collective abort a rank or
    #: hand back a wrong result while the other waits
    shaped: int = 0
    shapes: str = ""
    #: which collective that was: two ranks' collectives of one sequence number are another
    #: operation each when one rank is elsewhere in the script (a reduce under a rank test
    #: while the other rank's loader broadcasts): a mismatch of collectives, not of shapes
    shaped_operation: str = ""

    @property
    def file(self) -> str:
        return self.where.rpartition(":")[0]

    @property
    def line(self) -> int:
        text = self.where.rpartition(":")[2]
        return int(text) if text.isdigit() else 0


def record_path(directory: Path, rank: int) -> Path:
    return directory / f"{rank}.state"


def stack_path(directory: Path, rank: int) -> Path:
    return directory / f"{rank}.stack"


def attempt_directory(root: Path, attempt: int | str) -> Path:
    """One folder per elastic restart attempt, shared with the failure records."""
    return root / str(attempt)


def release_path(directory: Path) -> Path:
    """Written by the launcher's watcher once it has reported a run that cannot finish: a rank
    waiting at exit for peers that will not come stops waiting (`released`)."""
    return directory / "released"


def release(directory: Path) -> None:
    """Let the ranks of this attempt that wait for their peers at exit go (the launcher's side)."""
    with contextlib.suppress(OSError):
        release_path(directory).touch()


def released() -> bool:
    """Whether the launcher has decided that this rank's run cannot finish (its watcher reported
    it): a rank that waits at exit for its peers waits no longer. Never, outside `accelify
    launch` or before this rank's record exists."""
    return _released_flag is not None and os.path.exists(_released_flag)


def read(directory: Path, rank: int) -> Record | None:
    """The rank's record, or None while it has none or is in the middle of writing it (two
    reads that agree, with an even generation, are one whole write)."""
    path = record_path(directory, rank)
    try:
        data, again = path.read_bytes(), path.read_bytes()
    except OSError:
        return None
    if len(data) < _LAYOUT.size or data != again:
        return None
    fields = _LAYOUT.unpack_from(data)
    generation, pid, state, code, sequence, passes, since, _, op, where, shaped = fields[:11]
    shaped_op, shapes, over = fields[11:]
    if generation % 2 or generation == 0:
        return None  # torn: read again at the next poll
    return Record(
        rank,
        *(pid, state, sequence, passes, since, _text(op), _text(where), code, over),
        *(shaped, _text(shapes), _text(shaped_op)),
    )


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


class _Recorder:
    """This rank's record, written in place through a memory map."""

    def __init__(self, directory: Path, rank: int, skip: tuple[str, ...]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = record_path(directory, rank)
        with open(path, "wb") as created:
            created.write(b"\0" * _SIZE)
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the life of the process
        self._view(mmap.mmap(self._file.fileno(), _SIZE))
        self._skip = skip
        self._generation = 0
        self._pid = os.getpid()
        self._main = threading.main_thread().ident or 0
        #: file name -> whether it is a library's (`_caller`); keyed by the name, a string
        #: whose hash Python keeps, where a code object's is computed anew at each lookup
        self._library: dict[str, bool] = {}
        #: (id of a code object, instruction) -> that code object and its "path:line"
        self._places: dict[tuple[int, int], tuple[CodeType, bytes]] = {}
        #: `backward_begins`' last hit in ``_places``, asked first: the code object (held, so
        #: compared by identity), the instruction and the place
        self._last_code: CodeType | None = None
        self._last_instruction = -1
        self._last_where = b""
        self.depth = 0
        self.sequence = 0
        self.passes = 0
        self.operation = b""
        self.where = b""
        self.shaped = 0
        self.shaped_operation = b""
        self.shapes = b""
        self.state = RUNNING
        self.exit_code = 0
        self.over = False
        self.in_backward = False
        self._written: tuple[bytes, bytes] = (b"", b"")
        self._write(RUNNING)

    def forget_in_the_child(self) -> None:
        """In a child forked by the rank: what this object still writes (a collective the
        child was forked inside) goes to memory of its own, never to the rank's file."""
        self._view(mmap.mmap(-1, _SIZE))
        self._file.close()

    def _view(self, mapped: mmap.mmap) -> None:
        """Write through ``mapped`` from now on: the map, and the typed views of its head."""
        self._map = mapped
        self._words = memoryview(mapped).cast("I")
        self._ints = memoryview(mapped).cast("i")
        self._quads = memoryview(mapped).cast("q")
        self._doubles = memoryview(mapped).cast("d")

    # The writes run at every collective (every backward that reduces), so each writes only what
    # changed: the head (its generation odd: a reader skips the record while it is odd, and the
    # generation is the head's first field, stored first), the place and the shapes when they
    # are new, then the even generation. `_write` writes every field.
    def _write(self, state: int) -> None:
        self.state = state
        generation = self._generation = self._generation + 2
        _LAYOUT.pack_into(
            self._map,
            0,
            generation - 1,
            self._pid,
            state,
            self.exit_code,
            self.sequence,
            self.passes,
            time.time(),
            self._main,
            self.operation,
            self.where,
            self.shaped,
            self.shaped_operation,
            self.shapes,
            self.over,
        )
        self._written = self.operation, self.where
        _GENERATION.pack_into(self._map, 0, generation)

    def _write_head(self, state: int, place: bool = False, shaped: bool = False) -> None:
        """The state, counts and time; with ``place``, the operation and where (unless the
        record holds those already: a step's backward is at the same line every time); with
        ``shaped``, the shapes."""
        if not _VIEWS:
            return self._write(state)
        self.state = state
        generation = self._generation = self._generation + 2
        words = self._words
        words[0] = generation - 1
        self._ints[_STATE_ITEM] = state
        quads = self._quads
        quads[_SEQUENCE_ITEM] = self.sequence
        quads[_PASSES_ITEM] = self.passes
        self._doubles[_SINCE_ITEM] = time.time()
        if place:
            written = self._written
            if written[0] is not self.operation or written[1] is not self.where:
                _PLACE.pack_into(self._map, _PLACE_OFFSET, self.operation, self.where)
                self._written = self.operation, self.where
        if shaped:
            _SHAPED.pack_into(
                self._map, _SHAPED_OFFSET, self.shaped, self.shaped_operation, self.shapes
            )
        words[0] = generation
        return None

    def enter(
        self, operation: bytes, shapes: bytes | None = None, frame: FrameType | None = None
    ) -> None:
        """``shapes``: those of the tensors a collective that needs the same on every rank was
        passed (`shapes_of`), None for any other. ``frame``: where to start looking for the
        user's line (by default the caller)."""
        self.depth += 1
        if self.depth > 1:
            return
        self.sequence += 1
        self.operation = operation
        self.where = self._caller(frame or sys._getframe(1))
        if shapes is not None:
            self.shaped = self.sequence
            self.shaped_operation = operation
            self.shapes = shapes
        self._write_head(IN_COLLECTIVE, place=True, shaped=shapes is not None)

    def wait_for_peers_to_start(self, operation: bytes) -> None:
        """In the process group's rendezvous: waiting for every rank, as in a collective, but
        not one of the numbered collectives (each rank starts its group once)."""
        self.operation = operation
        self.where = self._caller(sys._getframe(1))
        self.depth += 1
        self._write(IN_COLLECTIVE)

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0 and self.state == IN_COLLECTIVE:
            # the operation and the place stay as they were: the record holds them already
            self._write_running()

    def _write_running(self) -> None:
        """Out of a collective: the passes (backward passes run inside it), the time and the
        state, each in one aligned store that no reader sees half done, the state last; without
        the odd generation, which guards writes of fields that must agree (a reader between
        them sees the collective it was in, entered just now: a wait of no length; the passes
        only grow). A step's backward ends here too (inline in `backward_ends`, where the
        passes did not change): a pack and two stores fewer."""
        if not _VIEWS:
            self._write(RUNNING)
            return
        self.state = RUNNING
        self._quads[_PASSES_ITEM] = self.passes
        self._doubles[_SINCE_ITEM] = time.time()
        self._ints[_STATE_ITEM] = RUNNING

    def begin_pass(self, reduces: bool, frame: FrameType) -> int:
        """A backward pass begins (`Accelerator.backward`, `backward_pass`), a collective when
        it ``reduces``; ``frame`` is the backward's caller. A pass inside a pass is the same
        pass (counted once), a collective of its own when it reduces. Returns what `end_pass`
        undoes: `_NESTED` or `_OUTER`, plus `_REDUCES`."""
        if self.in_backward:
            if not reduces:
                return _NESTED
            self.enter(_BACKWARD, None, frame)
            return _NESTED | _REDUCES
        self.passes += 1
        self.in_backward = True
        if not reduces:
            return _OUTER
        self.enter(_BACKWARD, None, frame)
        return _OUTER | _REDUCES

    def end_pass(self, begun: int) -> None:
        if begun & _REDUCES:
            self.leave()
        if begun & _OUTER:
            self.in_backward = False

    # `Accelerator.backward`'s pass, the one record every step makes: `begin_pass`, `enter`,
    # `_caller` and `_write_head` (and `end_pass`, `leave`, `_write_head`) in one call each, the
    # user's place found by the caller's own code object and instruction when it was found
    # there before. Seven Python calls fewer a step (callgrind: about 9 k of the 32-wide
    # step's 23 k instructions over raw DDP's backward, bench/step_instructions.py). Anything
    # else (a pass inside a pass, a collective under way, a big-endian map) takes the general
    # path.
    def backward_begins(self, reduces: bool, frame: FrameType) -> int:
        """`begin_pass`, for the outermost pass outside any collective; ``frame`` is the
        backward's caller, looked at now and not kept."""
        if self.in_backward or self.depth or not _VIEWS:
            return self.begin_pass(reduces, frame)
        passes = self.passes = self.passes + 1
        self.in_backward = True
        if not reduces:
            return _OUTER
        self.depth = 1
        sequence = self.sequence = self.sequence + 1
        code, instruction = frame.f_code, frame.f_lasti
        if code is self._last_code and instruction == self._last_instruction:
            where = self._last_where  # the same call as the last pass's: a step's backward
        else:
            place = self._places.get((id(code), instruction))
            # a hit is the user's frame itself: only the user's frames are cached, each entry
            # holding its code object (so the id is no other's)
            if place is not None:
                where = self._last_where = place[1]
                self._last_code, self._last_instruction = code, instruction
            else:
                where = self._caller(frame)
        self.operation = _BACKWARD
        self.where = where
        self.state = IN_COLLECTIVE
        generation = self._generation = self._generation + 2
        mapped = self._map
        _STEP_HEAD.pack_into(
            mapped,
            0,
            generation - 1,
            self._pid,
            IN_COLLECTIVE,
            self.exit_code,
            sequence,
            passes,
            _now(),
        )
        written = self._written
        if written[0] is not _BACKWARD or written[1] is not where:
            _PLACE.pack_into(mapped, _PLACE_OFFSET, _BACKWARD, where)
            self._written = _BACKWARD, where
        self._words[0] = generation
        return _OUTER_REDUCES

    def backward_ends(self, begun: int) -> None:
        """`end_pass` of `backward_begins`."""
        if begun != _OUTER_REDUCES or self.depth != 1 or self.state != IN_COLLECTIVE or not _VIEWS:
            self.end_pass(begun)
            return
        self.depth = 0
        self.in_backward = False
        self.state = RUNNING
        # only the time and the state change (`_write_running`), inline: two stores, no pack
        self._doubles[_SINCE_ITEM] = _now()
        self._ints[_STATE_ITEM] = RUNNING

    def finish(self, state: int, exit_code: int = 0) -> None:
        """Leaving or crashed, once: a rank that crashed stays so, and the time a rank began
        to leave is kept (the script's end, then its exit guard, both say it)."""
        if self.state not in (CRASHED, state):
            self.exit_code = exit_code
            self._write(state)

    def end_collectives(self) -> None:
        """A leaving rank past its last collective: said once (its time stays the leaving's)."""
        if self.state == LEAVING and not self.over:
            self.over = True
            self._generation += 1
            _GENERATION.pack_into(self._map, 0, self._generation)
            _OVER.pack_into(self._map, _OVER_OFFSET, True)
            self._generation += 1
            _GENERATION.pack_into(self._map, 0, self._generation)

    def _caller(self, frame: FrameType | None) -> bytes:
        """The innermost frame from ``frame`` out that is outside accelify, torch and the
        standard library: the line of the user's script that called the collective."""
        library = self._library
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            known = library.get(name)
            if known is None:
                known = library[name] = name.startswith(self._skip)
            if not known:
                break
            frame = frame.f_back
        if frame is None:
            return b""
        # by the code object and the instruction, not the line: a frame's line is found by
        # scanning its code's line table up to the instruction, every time (a module-level
        # training loop's is the whole script's); the entry holds the code object, so that
        # its id is not another's while the entry lasts
        key = (id(code), frame.f_lasti)
        place = self._places.get(key)
        if place is None:
            place = self._places[key] = (code, f"{name}:{frame.f_lineno}".encode()[:240])
        return place[1]


#: (shape, dtype) -> its words; a script passes the same few shapes again and again
_SHAPE_WORDS: dict[tuple[tuple[int, ...], Any], bytes] = {}
_SHAPES_SIZE = 96
_MOST_SHAPES = 4096
_MOST_LEAVES = 4


def shapes_of(args: tuple[Any, ...]) -> bytes:
    """``(4,) float32``: the first tensor among a collective's positional arguments (torch's
    ``all_gather(outputs, tensor)`` passes its own in the second), or the first leaves of a
    container passed first (the runtime's ``reduce({"loss": l, "acc": a})``). What a rank
    records for a collective every rank must call with the same shapes: gloo aborts the rank
    sent more bytes than its tensor holds, and hands the other a wrong result, while NCCL
    hangs; the launcher compares the ranks' words once one of them aborts or waits alone."""
    torch = sys.modules.get("torch")
    if torch is None:
        return b""
    tensor_type = torch.Tensor
    for value in args:
        if isinstance(value, tensor_type):
            return _words(value)
    first = args[0] if args else None
    if not isinstance(first, (list, tuple, dict)):
        return b""
    leaves = list(first.values() if isinstance(first, dict) else first)[:_MOST_LEAVES]
    words = [_words(leaf) if isinstance(leaf, tensor_type) else b"-" for leaf in leaves]
    if len(first) > _MOST_LEAVES:
        words.append(b"...")
    return b"[" + b"; ".join(words)[: _SHAPES_SIZE - 2] + b"]"


def _words(tensor: Any) -> bytes:
    key = (tuple(tensor.shape), tensor.dtype)
    words = _SHAPE_WORDS.get(key)
    if words is None:
        if len(_SHAPE_WORDS) >= _MOST_SHAPES:  # a script whose shapes vary without end
            _SHAPE_WORDS.clear()
        dims = ", ".join(map(str, key[0])) + ("," if len(key[0]) == 1 else "")
        dtype = str(key[1]).removeprefix("torch.")
        words = _SHAPE_WORDS[key] = f"({dims}) {dtype}".encode()[:_SHAPES_SIZE]
    return words


_recorder: _Recorder | None = None
#: Where the launcher says it released this rank (`released`); None without a record.
_released_flag: str | None = None
_stack_file: IO[str] | None = None
#: Whether this process enabled faulthandler's dump on fatal signals (not the user).
_enabled_the_fatal_dump = False
#: A process forked by the rank: it records nothing (`_forget_in_a_forked_child`).
_forked = False


def install(rank: int) -> None:
    """Start this rank's record (under `accelify launch`: from the rank's entry, before the
    script, else when the runtime starts the process group). Called again as the group starts."""
    global _recorder, _released_flag, _stack_file, _enabled_the_fatal_dump
    root = os.environ.get(FAILURE_DIR)
    if not root or _forked:
        return
    if _recorder is not None:
        _leave_the_stack_signal_to_the_script()
        return
    directory = attempt_directory(Path(root), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    skip = library_prefixes()
    try:
        _recorder = _Recorder(directory, rank, skip)
    except OSError:
        return  # the record only improves the launcher's report
    _released_flag = str(release_path(directory))
    record_torch_collectives()
    if signal.getsignal(STACK_SIGNAL) is signal.SIG_DFL:
        try:
            _stack_file = open(stack_path(directory, rank), "w", encoding="utf-8")  # noqa: SIM115
            header = {"main_thread": threading.main_thread().ident, "skip": list(skip)}
            _stack_file.write(json.dumps(header) + "\n")
            _stack_file.flush()
            faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
            if not faulthandler.is_enabled():  # the user's own (PYTHONFAULTHANDLER) is kept
                # a rank killed by SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL leaves its stack
                # here, so that the launcher can say on which line it died
                faulthandler.enable(file=_stack_file, all_threads=True)
                _enabled_the_fatal_dump = True
        except (OSError, RuntimeError, ValueError):
            _stack_file = None


def _forget_in_a_forked_child() -> None:
    """A process forked by the rank inherits its record, mapped shared, and its stack file: a
    collective, a backward, an exception or the end of the script in the child wrote the
    rank's record (the watcher then saw the rank in the child's collective, or crashed, or
    leaving), and a fatal signal there wrote the rank's stack file. The child records nothing,
    and starts no record of its own under the rank's number. (A process that kept no record,
    such as the launcher, forks children that may start their own.)"""
    global _recorder, _stack_file, _forked, _enabled_the_fatal_dump
    recorder, _recorder = _recorder, None
    if recorder is None:
        return
    _forked = True
    recorder.forget_in_the_child()
    if _stack_file is not None:
        faulthandler.unregister(STACK_SIGNAL)
        if _enabled_the_fatal_dump:
            faulthandler.disable()
            _enabled_the_fatal_dump = False
        _stack_file = None


os.register_at_fork(after_in_child=_forget_in_a_forked_child)


def _leave_the_stack_signal_to_the_script() -> None:
    """A script that handles `STACK_SIGNAL` itself (a preemption handler that saves and
    requeues, as submitit's) took it over after the entry registered it: the launcher must not
    send it any more. Without the stack file it does not ask (`watch._stack`)."""
    global _stack_file
    if _stack_file is None or signal.getsignal(STACK_SIGNAL) in (signal.SIG_DFL, None):
        return
    with contextlib.suppress(OSError):
        os.unlink(_stack_file.name)
    _stack_file = None


#: torch.distributed's collectives, which scripts also call themselves (a hand-written
#: ``dist.all_reduce`` beside the runtime's ``gather``): recorded like the runtime's own.
TORCH_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
)


def record_torch_collectives() -> None:
    """Record torch.distributed's collectives where code calls them through the module
    (``dist.all_reduce(t)``, the usual spelling), or through a name imported after this ran
    (the rank's entry runs it as torch imports the module). Only on the default group: a
    collective on a subgroup is not made by every rank, so its sequence number would not match
    the peers'. Calls made before the rank's record exists go straight through."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    for name in TORCH_COLLECTIVES:
        function = getattr(dist, name, None)
        if function is not None and not hasattr(function, "__accelify_operation__"):
            setattr(dist, name, _on_the_default_group(dist, name, function))


#: torch's collectives whose tensors must have the same shapes and dtypes on every rank.
#: Collectives every rank must pass the same shapes. Not ``all_gather`` nor ``gather``: torch
#: documents uneven tensors for them on some backends, and a report of "different shapes" there
#: would stop a valid run whose third rank is only slow.
SAME_SHAPES = frozenset({"all_reduce", "broadcast", "reduce", "all_gather_into_tensor"})
#: Collectives whose shapes are recorded too, though they may differ between ranks: the
#: launcher names them only once a rank aborted inside one (gloo's "Received data size doesn't
#: match", when a rank's tensor is not the size the gather's outputs hold for it), never while a
#: rank only waits there.
SHAPES_ON_ABORT = frozenset({"gather", "all_gather"})


def _on_the_default_group(dist: Any, name: str, function: F) -> F:
    recorded = collective(name, same_shapes=name in SAME_SHAPES | SHAPES_ON_ABORT)(function)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        if group is not None and group is not dist.group.WORLD:
            return function(*args, **kwargs)
        return recorded(*args, **kwargs)

    call.__accelify_operation__ = name  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


def library_prefixes() -> tuple[str, ...]:
    """Folders whose frames are never "the user's line": accelify (its source folders, which an
    editable install keeps apart), torch, DeepSpeed, the standard library and the installed
    packages (site-packages, the user's and the system's too, Debian's dist-packages: a
    library's wrapper or loop around the user's code)."""
    folders = {os.path.dirname(contextlib.__file__)}
    folders |= {path for path in map(sysconfig.get_path, ("purelib", "platlib")) if path}
    folders |= set(_site_folders())
    folders = {os.path.normpath(folder) for folder in folders}
    for name in ("accelify", "accelify.runtime", "accelify.rules", "torch", "deepspeed"):
        folder = _folder_of(name)
        if folder:
            folders.add(folder)
    return tuple(folder + os.sep for folder in sorted(folders))


def _site_folders() -> list[str]:
    """``site``'s package folders (the system's, Debian's ``dist-packages``, the user's): a
    virtual environment's ``site`` may lack them, an embedded interpreter may have no ``site``."""
    try:
        import site
    except ImportError:
        return []
    found: list[str] = []
    for getter in ("getsitepackages", "getusersitepackages"):
        try:
            paths = getattr(site, getter)()
        except (AttributeError, OSError, TypeError, ValueError):
            continue
        found.extend([paths] if isinstance(paths, str) else list(paths))
    # a Debian python's ``dist-packages`` (also reached from a venv with system packages)
    found += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return [path for path in found if path]


def _folder_of(package: str) -> str:
    """The package's folder, found without importing it (a rank's record starts before the
    script imports torch)."""
    module = sys.modules.get(package)
    if module is not None:
        return os.path.dirname(getattr(module, "__file__", None) or "")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return ""
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) if origin else ""


def collective(operation: str, same_shapes: bool = False) -> Callable[[F], F]:
    """Record calls of the decorated function as the collective ``operation``;
    ``same_shapes``: every rank must pass it tensors of the same shapes and dtypes, and the
    record says which this rank passed (`shapes_of`)."""
    encoded = operation.encode()

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            recorder = _recorder
            if recorder is None:
                return function(*args, **kwargs)
            shapes = shapes_of(args) if same_shapes and not recorder.depth else None
            recorder.enter(encoded, shapes)
            try:
                return function(*args, **kwargs)
            finally:
                recorder.leave()

        return recorded  # type: ignore[return-value]

    return decorate


class _Recorded:
    """A block recorded as one collective (a class: cheaper than a generator, on every step)."""

    __slots__ = ("_operation", "_recorder")

    def __init__(self, recorder: _Recorder, operation: bytes) -> None:
        self._recorder = recorder
        self._operation = operation

    def __enter__(self) -> None:
        self._recorder.enter(self._operation)

    def __exit__(self, *exc: object) -> None:
        self._recorder.leave()


def during(operation: str | None) -> contextlib.AbstractContextManager[None]:
    """Record the block as the collective ``operation`` (None: not a collective this time)."""
    if _recorder is None or operation is None:
        return contextlib.nullcontext()
    return _Recorded(_recorder, operation.encode())


_BACKWARD = b"backward"
#: What `_Recorder.begin_pass` began: a pass inside a pass, the outermost pass, and (added) a
#: collective, for `_Recorder.end_pass` to undo.
_NESTED, _OUTER, _REDUCES = 0, 1, 2
_OUTER_REDUCES = _OUTER | _REDUCES


def backward_pass(reduces: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    """One backward pass; a collective when ``reduces()`` (asked only when recording). A pass
    inside a pass is the same pass (`Accelerator.backward` calls ``loss.backward()``, which
    `ddp_collectives` records for the script's own DDP models): counted once, a collective when
    either reduces (the script's model reduces while the Accelerator's accumulates)."""
    recorder = _recorder
    if recorder is None:
        return contextlib.nullcontext()
    return _Pass(recorder, reduces(), sys._getframe(1))


class _Pass:
    """A backward pass (`_Recorder.begin_pass`), as a block."""

    __slots__ = ("_begun", "_frame", "_recorder", "_reduces")

    def __init__(self, recorder: _Recorder, reduces: bool, frame: FrameType) -> None:
        self._recorder = recorder
        self._reduces = reduces
        self._frame = frame
        self._begun = _NESTED

    def __enter__(self) -> None:
        self._begun = self._recorder.begin_pass(self._reduces, self._frame)
        self._frame = None  # type: ignore[assignment]  # not kept past the pass

    def __exit__(self, *exc: object) -> None:
        self._recorder.end_pass(self._begun)


def recording() -> bool:
    return _recorder is not None


def starting_the_group() -> contextlib.AbstractContextManager[None]:
    """``init_process_group``: a rank waits there until every rank has come (a peer still
    loading its data, or looping before it starts its group, keeps it there)."""
    if _recorder is None:
        return contextlib.nullcontext()
    return _Rendezvous(_recorder)


class _Rendezvous:
    __slots__ = ("_recorder",)

    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder

    def __enter__(self) -> None:
        self._recorder.wait_for_peers_to_start(b"init_process_group")

    def __exit__(self, *exc: object) -> None:
        self._recorder.leave()


def begin(operation: str) -> bool:
    """Enter the collective ``operation`` (for hooks, which cannot wrap a call); returns
    whether it was recorded, to pass to `end`."""
    if _recorder is None:
        return False
    _recorder.enter(operation.encode())
    return True


def end(begun: bool) -> None:
    if begun and _recorder is not None:
        _recorder.leave()


def leaving(exit_code: int = 0) -> None:
    """The rank is past the end of its script (at exit, before it waits for its peers), or
    leaving through ``sys.exit(exit_code)``."""
    if _recorder is not None:
        _recorder.finish(LEAVING, exit_code)


def collectives_over() -> None:
    """A leaving rank will make no collective any more: its exit guard waits for its peers (the
    atexit handlers registered after its process group started, which could still call one,
    have run; those registered before run once the group is gone), or every atexit handler of
    the script has run. A peer that waits in a collective this rank never entered (a higher
    sequence number) waits for good, and the launcher says so at once, not after `GRACE`
    (`accelify.runtime.launch.watch`)."""
    if _recorder is not None:
        _recorder.end_collectives()


def failing() -> bool:
    """Whether this rank's run has failed: it raised, leaves with a non-zero code, or the
    launcher reported that its run cannot finish (`released`). False outside `accelify
    launch`."""
    recorder = _recorder
    if recorder is None:
        return False
    return recorder.state == CRASHED or bool(recorder.exit_code) or released()


def crashed() -> None:
    if _recorder is not None:
        _recorder.finish(CRASHED)
