"""The collectives a DDP model makes without being called by name, for the collective record: a
forward that broadcasts buffers or rebuilds its buckets, and a backward whose hooks all-reduce
the gradients.

A rank that waits in one of them waits inside ``model(x)`` or ``loss.backward()``, in torch's
C++; the launcher can only name the wait if the record says so. The runtime's own DDP models
record their backward in `Accelerator.backward`; a model the script wraps itself
(``DistributedDataParallel(model)`` after ``init_process_group``, with or without an
Accelerator) is recorded here, with the same words: its forwards as the runtime's are, its
backward through ``torch.autograd.backward`` (which ``Tensor.backward`` calls), so that a peer
that skipped a step, left its loop or sleeps while this rank waits in ``loss.backward()`` is
named with its line. Inside `Accelerator.backward` that is the same backward pass, counted once
(`collective_record.backward_pass`). Nothing is wrapped until a script builds a DDP model of its
own: the runtime's step costs what it did.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from accelify.runtime import collective_record

#: DDP wrappers whose reducer has readied a backward that reduces: their next training forward
#: rebuilds the buckets (until `_has_rebuilt_buckets`).
REDUCED: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
#: Models whose forwards had nothing left to record, their hooks removed (`record_forwards`):
#: recorded again if ``loss.backward()`` comes to be recorded (`_record_backwards`).
QUIET: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
_RECORDED = "_accelify_recorded"


class _Pending:
    """A reduction a DDP training forward readied: pending until the gradient of one of that
    forward's outputs is computed (the backward that reduces it has begun). Only the hooks on
    those outputs hold it, so it also goes when the outputs' graph is freed without a backward
    (a forward whose loss was dropped)."""

    __slots__ = ("__weakref__",)


#: The reductions pending: a backward is a collective while one is (`_record_backwards`). A
#: backward through one model leaves another's pending (a GAN's two losses, two models each
#: with its own ``backward()``).
PENDING: weakref.WeakSet[_Pending] = weakref.WeakSet()


def record_forwards(model: DistributedDataParallel) -> None:
    """A DDP forward is a collective when it broadcasts the module's buffers (BatchNorm
    statistics, every forward after a training one) and once, when the reducer rebuilds its
    buckets: the first training forward after the first backward that reduced (the third under
    an accumulation of 2). A rank stuck there waits for a peer that went elsewhere, and the
    record says so; a forward that does not communicate is not recorded, or a slow one would
    look like a rank waiting. Once per model. Once ``loss.backward()`` is recorded here (the
    script built a DDP model of its own), every training forward leaves its reduction pending:
    the runtime's models too, whose backward a script may also run with ``loss.backward()``.

    Once the buckets are rebuilt, a model that syncs no buffers has nothing left to record in
    its forwards while ``loss.backward()`` is not recorded: its hooks go (two Python calls on
    every forward, and the module's call through its hooks' slower path, cost a small model's
    step more than the rest of the record: bench/step_cost.py's forward phase)."""
    if getattr(model, _RECORDED, False):
        return
    setattr(model, _RECORDED, True)
    QUIET.discard(model)
    begun: list[bool] = []
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def before(module: DistributedDataParallel, args: Any) -> None:
        rebuilds = (
            not module._has_rebuilt_buckets  # first: true of every step after the first few
            and module in REDUCED
            and torch.is_grad_enabled()
            and (module.static_graph or not module.find_unused_parameters)
        )
        begun.append(
            collective_record.begin("forward")
            if rebuilds or module.will_sync_module_buffers()
            else False
        )

    def after(module: DistributedDataParallel, args: Any, output: Any) -> None:
        if torch.is_grad_enabled() and module.require_backward_grad_sync:
            if not module._has_rebuilt_buckets:  # else nothing asks any more
                REDUCED.add(module)  # a training forward with sync on: its backward reduces
            if _backwards_recorded:
                _pending_until_its_gradients_flow(output)
        if begun:
            collective_record.end(begun.pop())
        if module._has_rebuilt_buckets and not _backwards_recorded and not _syncs_buffers(module):
            for handle in handles:  # the module's call copied its hooks before calling them
                handle.remove()
            setattr(module, _RECORDED, False)
            QUIET.add(module)

    handles.append(model.register_forward_pre_hook(before))
    handles.append(model.register_forward_hook(after, always_call=True))


def _syncs_buffers(model: DistributedDataParallel) -> bool:
    """Whether the model's forwards may broadcast its buffers (`will_sync_module_buffers`
    without the part that `no_sync` turns on and off). ``broadcast_buffers``: torch before
    ``forward_sync_buffers``."""
    syncs = getattr(model, "forward_sync_buffers", getattr(model, "broadcast_buffers", True))
    return bool(syncs) and len(getattr(model, "modules_buffers", ())) > 0


def _pending_until_its_gradients_flow(output: Any) -> None:
    """The outputs DDP readies its reducer with (`_find_tensors`, as its forward does)."""
    tensors = [tensor for tensor in _find_tensors(output) if tensor.requires_grad]
    if not tensors:
        return
    pending = _Pending()
    PENDING.add(pending)

    def reduction_begins(grad: torch.Tensor, pending: _Pending = pending) -> None:
        PENDING.discard(pending)

    for tensor in tensors:
        tensor.register_hook(reduction_begins)


_building_for_the_runtime = False


@contextlib.contextmanager
def built_by_the_runtime() -> Iterator[None]:
    """DDP wrappers built inside are the runtime's: `Accelerator.backward` records their
    backward, and nothing else is wrapped for them."""
    global _building_for_the_runtime
    _building_for_the_runtime = True
    try:
        yield
    finally:
        _building_for_the_runtime = False


def record_the_scripts_models() -> None:
    """Record every DDP model built from now on outside the runtime (once the process group
    exists, under `accelify launch`): DDP's ``__init__`` is wrapped on the class, so a name the
    script imported before (``from torch.nn.parallel import DistributedDataParallel as DDP``)
    and subclasses get it too."""
    start = DistributedDataParallel.__init__
    if getattr(start, "__wrapped__", None) is not None:
        return

    @functools.wraps(start)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        if _building_for_the_runtime or not _on_every_rank(self):
            return
        record_forwards(self)
        _record_backwards()

    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]


def _on_every_rank(model: DistributedDataParallel) -> bool:
    """A model on a subgroup reduces with only some ranks: its collectives would not line up
    with the others' sequence numbers."""
    group = getattr(model, "process_group", None)
    return group is None or group is dist.group.WORLD


#: Whether ``torch.autograd.backward`` is recorded (`_record_backwards`): until then no forward
#: tracks its pending reduction, and the runtime's step costs what it did.
_backwards_recorded = False


def _record_backwards() -> None:
    """Record ``torch.autograd.backward`` (``loss.backward()`` calls it) as DDP's gradient
    all-reduce when a DDP forward readied one: the same record as `Accelerator.backward`'s."""
    global _backwards_recorded
    _backwards_recorded = True
    for model in list(QUIET):  # their training forwards leave their reductions pending again
        record_forwards(model)
    backward = torch.autograd.backward
    if getattr(backward, "__accelify_operation__", None):
        return

    @functools.wraps(backward)
    def recorded_backward(*args: Any, **kwargs: Any) -> Any:
        with collective_record.backward_pass(_reduces):
            return backward(*args, **kwargs)

    recorded_backward.__accelify_operation__ = "backward"  # type: ignore[attr-defined]
    torch.autograd.backward = recorded_backward  # type: ignore[assignment]


def _reduces() -> bool:
    return bool(PENDING)
