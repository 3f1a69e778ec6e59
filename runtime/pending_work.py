"""Know when the collectives a backward launched have been freed, so a rank can exit cleanly.

Why this exists (torch 2.13, seen as "terminate called without an active exception" and SIGABRT
on a rank that had finished its script, about one 2-rank run in ten on a loaded machine):
`torch.autograd.backward` stashes a Python object (a `contextvars.Context`) in the C++
thread-local state for the duration of the backward. Every collective launched inside it (DDP's
gradient all-reduce, FSDP's reduce-scatter) copies that state into its work object, and the
communication library's worker thread is usually the last owner of the work. Freeing it there
drops the Python object, which needs the GIL; once the interpreter has begun to finalize, a thread
that asks for the GIL is ended with `pthread_exit`, the unwind runs through a `noexcept`
destructor, and C++ calls `std::terminate`. The process group cannot be destroyed first to join
those threads: torch keeps references to it that live until finalization.

So each `Accelerator.backward` puts a token of ours into the same thread-local state. Every work
launched in that backward holds the token exactly as long as it holds torch's Context, so when
the last token is gone no work that can touch Python is left, and exiting is safe. At exit the
runtime waits for that, with the GIL released, rather than for a guessed amount of time.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator

import torch

_KEY = "accelify.backward_in_flight"
_stash = getattr(torch._C, "_stash_obj_in_tls", None)
_remove = getattr(torch._C, "_remove_obj_from_tls", None)


class _Token:
    """Held only by the C++ state of the works launched in one backward."""

    __slots__ = ("__weakref__",)


_in_flight: weakref.WeakSet[_Token] = weakref.WeakSet()


@contextlib.contextmanager
def tracked(enabled: bool) -> Iterator[None]:
    """Track the collectives launched inside this block (a backward on N ranks)."""
    if not enabled or _stash is None or _remove is None:
        yield
        return
    token = _Token()
    _in_flight.add(token)
    _stash(_KEY, token)
    del token  # from here on only the thread-local state and the works hold it
    try:
        yield
    finally:
        _remove(_KEY)


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
