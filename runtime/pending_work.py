"""Know when the collectives a backward launched have been freed, so a rank can exit cleanly.

Why this exists (torch 2.13, seen as "terminate called without an active exception" and SIGABRT
on a rank that had finished its script, about one 2-rank run in ten on a loaded machine):
`torch.autograd.backward` stashes a Python object (a `contextvars.Context`) in the C++
thread-local state for the duration of the backward. Every collective launched inside it (DDP's
gradient all-reduce, FSDP's reduce-scatter) copies that state into its work object, and the
communication library's worker thread is usually the last owner of the work. Freeing it there
drops the Python object, which needs the GIL; once the interpreter has begun to finalize, a thread
that asks for the GIL is ended with `pthread_exit`, the unwind runs through a `noexcept`
destructor, and C++ calls `std::terminate`. The runtime frees its own group at exit, which joins
those threads (`accelify.runtime.state._ExitGuard`), once each engine has let go of it
(`Backend.at_exit`: DDP's reducers, then every Python reference to a group, found by identity:
FSDP's device meshes, which DTensor's caches keep, DeepSpeed's module globals, engine and
parameters, a script's own ``dist.new_group`` kept in a global; `let_go_of_groups`). Only a
group some other C++ object owns still lives until finalization.

The same holds for the tensors a collective keeps: a tensor whose Python object was dropped
while the work still held it (the outputs of a gather, once concatenated) is freed by the worker
thread through the same GIL-taking path.

So each `Accelerator.backward`, and each collective the runtime itself launches (`tracks`), puts
a token of ours into the same thread-local state. Every work launched meanwhile holds the token
for exactly as long as it holds torch's Context and its tensors, so once no work holds the
token, no work that can touch Python is left, and exiting is safe. At exit the runtime waits for
that, with the GIL released, rather than for a guessed amount of time. Collectives a script launches
through `torch.distributed` itself are not tagged.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

_KEY = "accelify.collectives_in_flight"
_stash = getattr(torch._C, "_stash_obj_in_tls", None)
_remove = getattr(torch._C, "_remove_obj_from_tls", None)
_stashed = getattr(torch._C, "_is_key_in_tls", None)
#: All three are needed: torch 2.11 has the stash and not the removal (a token stashed there
#: could never be taken out, and every tracked block failed as it ended); without them nothing
#: is tracked and a rank exits as it would without this module.
_TRACKABLE = _stash is not None and _remove is not None and _stashed is not None
TRACKABLE = _TRACKABLE


class _Token:
    """Held only by the C++ state of the works launched in tracked blocks."""

    __slots__ = ()


#: The one token every tracked block stashes. Each stash wraps it in one C++ holder that takes
#: one reference to it, shared by every copy of the thread's state (each work launched in the
#: block) and dropped with the last of them: the token's references beyond `_OWN` are the tracked
#: blocks whose works are still held. One object for the life of the process, so that a step
#: allocates nothing here (a token, a weak reference and a set entry per block cost the step
#: more than DDP's own Python did: bench/step_cost.py).
_TOKEN = _Token()
TOKEN = _TOKEN  # what `IN_BACKWARD` is set to
_OWN = sys.getrefcount(_TOKEN)  # this module's two references and getrefcount's argument
F = TypeVar("F", bound=Callable[..., Any])


def in_flight() -> int:
    """How many tracked blocks still have a work that holds the thread's state they launched it
    with."""
    return sys.getrefcount(_TOKEN) - _OWN


class tracked:  # used as a function: `with tracked(enabled):`
    """Track the collectives launched inside this block (a backward, a gather, a barrier).

    A class rather than a generator context manager: it runs on every training step (in
    `Accelerator.backward` and the prepared optimizer's step), so entering costs no generator,
    and two C calls at most. Blocks nest: an inner one finds the token stashed by an outer one
    (torch's own thread-local map says so) and leaves it there.
    """

    __slots__ = ("stashed",)

    def __init__(self, enabled: bool) -> None:
        self.stashed = enabled and _TRACKABLE

    def __enter__(self) -> None:
        if self.stashed:
            if _stashed(_KEY):  # type: ignore[misc]
                self.stashed = False  # an outer block on this thread tracks
            else:
                _stash(_KEY, _TOKEN)  # type: ignore[misc]

    def __exit__(self, *exc_info: object) -> None:
        if self.stashed:
            _remove(_KEY)  # type: ignore[misc]


#: The backward's own tracking, without a stash of ours: `torch.autograd.backward` stashes a copy
#: of the thread's context (``contextvars.copy_context()``) for the duration of the pass, and every
#: work launched inside holds that copy, as it holds the token's stash in a `tracked` block. While
#: this variable is set to the token, the copy holds the token too (a context's mapping keeps one
#: reference to each value), for exactly as long as any work holds the copy, and `in_flight`
#: counts it. Setting and resetting it are two C calls, where a stash of ours is one more entry in
#: the map that torch copies into every work and every autograd node's run (a 32-wide
#: DDP step made 1.1 % more instructions with the stash: callgrind, docs/benchmarks.md).
#: Only collectives launched inside the autograd engine's pass are covered: an engine that
#: communicates around it (DeepSpeed's backward) keeps `tracked`.
IN_BACKWARD: contextvars.ContextVar[_Token] = contextvars.ContextVar("accelify_in_backward")
_copies_the_context: bool | None = None


def backward_copies_the_context() -> bool:
    """Whether this torch's backward stashes a copy of the caller's context, with
    `IN_BACKWARD` in it, where the works it launches copy the thread's state from (asked once:
    a one-node backward whose hook looks)."""
    global _copies_the_context
    if _copies_the_context is None:
        _copies_the_context = _TRACKABLE and _looks_inside_a_backward()
    return _copies_the_context


def _looks_inside_a_backward() -> bool:
    """Run the one-node backward and say whether its hook saw the token in torch's copy.

    Whatever the caller is inside: a backward is valid under ``torch.no_grad()`` or
    ``torch.inference_mode()`` (the loss was built before), so the probe builds its own graph
    under `torch.enable_grad` outside inference mode, on the CPU whatever the default device.
    It runs the pass with ``torch.autograd.grad``, which enters the engine the same way
    (``_engine_run_backward`` stashes the copy for both), not ``torch.autograd.backward``: the
    probe is no pass of the script's, and that entry is the one that whoever watches the
    script's passes wraps (the runtime's recording in `ddp_collectives`, `accelify verify`'s
    probe, which took the look's ``2`` for a loss of the script). A torch whose backward still
    cannot run it answers False: the caller then stashes its token (`tracked`), which covers
    every work, at one C call more a step.
    """
    get = getattr(torch._C, "_get_obj_in_tls", None)
    if get is None:
        return False
    seen: list[bool] = []

    def look(grad: torch.Tensor) -> None:
        context = get("context") if _stashed("context") else None  # type: ignore[misc]
        seen.append(isinstance(context, contextvars.Context) and context.get(IN_BACKWARD) is TOKEN)

    with torch.inference_mode(False), torch.enable_grad():
        leaf = torch.ones((), device="cpu", requires_grad=True)
        leaf.register_hook(look)
        marker = IN_BACKWARD.set(TOKEN)
        try:
            torch.autograd.grad(leaf * 2, leaf)
        except RuntimeError:
            return False
        finally:
            IN_BACKWARD.reset(marker)
    return seen == [True]


def tracks(function: F) -> F:
    """Track the collectives `function` launches, when a process group is up."""

    @functools.wraps(function)
    def tracking(*args: Any, **kwargs: Any) -> Any:
        with tracked(dist.is_available() and dist.is_initialized()):
            return function(*args, **kwargs)

    return tracking  # type: ignore[return-value]


def wait_until_freed(timeout: float) -> bool:
    """Block, without the GIL, until every tracked work has been freed; False on timeout.

    The works are complete by the time a rank exits (each step waited for them); what is left is
    a worker thread dropping its last reference, which takes microseconds once it runs.
    """
    deadline = time.monotonic() + timeout
    while in_flight():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
