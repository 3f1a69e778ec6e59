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
for exactly as long as it holds torch's Context and its tensors, so when the last token is gone
no work that can touch Python is left, and exiting is safe. At exit the runtime waits for that,
with the GIL released, rather than for a guessed amount of time. Collectives a script launches
through `torch.distributed` itself are not tagged.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

_KEY = "accelify.collectives_in_flight"
_stash = getattr(torch._C, "_stash_obj_in_tls", None)
_remove = getattr(torch._C, "_remove_obj_from_tls", None)
#: Both halves are needed: torch 2.11 has the stash and not the removal (a token stashed there
#: could never be taken out, and every tracked block failed as it ended); without them nothing
#: is tracked and a rank exits as it would without this module.
_TRACKABLE = _stash is not None and _remove is not None


class _Token:
    """Held only by the C++ state of the works launched in one tracked block."""

    __slots__ = ("__weakref__",)


#: A weak reference to each token still held; a token's reference removes itself when the
#: token is freed. Plain C calls (no Python frame) on the training step's path.
_in_flight: set[weakref.ref[_Token]] = set()
_thread = threading.local()  # .active: a token is stashed on this thread (blocks nest)
F = TypeVar("F", bound=Callable[..., Any])


class tracked:  # used as a function: `with tracked(enabled):`
    """Track the collectives launched inside this block (a backward, a gather, a barrier).

    A class rather than a generator context manager: it runs on every training step (in
    `Accelerator.backward` and the prepared optimizer's step), so entering costs no generator.
    """

    __slots__ = ("enabled", "stashed")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stashed = False

    def __enter__(self) -> None:
        if not self.enabled or not _TRACKABLE or getattr(_thread, "active", False):
            return
        token = _Token()
        _in_flight.add(weakref.ref(token, _in_flight.discard))
        _stash(_KEY, token)  # type: ignore[misc]
        del token  # from here on only the thread-local state and the works hold it
        _thread.active = self.stashed = True

    def __exit__(self, *exc_info: object) -> None:
        if self.stashed:
            self.stashed = _thread.active = False
            _remove(_KEY)  # type: ignore[misc]


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
    while len(_in_flight):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
