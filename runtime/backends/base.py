"""What the Accelerator asks of an engine; everything engine-specific stays behind this.

The defaults are what plain data parallelism needs; DDP, FSDP and DeepSpeed override what they
do differently. One process with no launcher uses the same backend object, which then wraps
nothing.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accelify.runtime.gradient_state import GradientState
from accelify.runtime.state import ProcessState, exit_groups


@dataclass(frozen=True)
class BackendInputs:
    """What the Accelerator hands the engine it builds; each engine takes the parts it uses."""

    state: ProcessState
    mixed_precision: str
    options: Any  # the engine's options (`accelify.runtime.options`), None for DDP
    gradient_state: GradientState
    ddp_kwargs: dict[str, Any]  # the script's DistributedDataParallelKwargs (DDP only)


class Backend:
    name = ""
    #: Every collective the engine's backward makes is launched inside the autograd pass (DDP's
    #: gradient hooks): `Accelerator.backward` tracks them through the context torch copies
    #: there (`pending_work.IN_BACKWARD`) rather than a stash of its own. False where the
    #: engine also communicates around the pass (DeepSpeed reduces after it) or may.
    collectives_in_autograd = False
    #: The engine divides the loss by its own accumulation steps (the Accelerator must not).
    scales_loss_for_accumulation = False
    #: The engine scales fp16 losses itself (the Accelerator keeps no GradScaler).
    scales_fp16 = False

    def __init__(self, state: ProcessState, mixed_precision: str = "no") -> None:
        self.state = state
        self.mixed_precision = mixed_precision

    @classmethod
    def create(cls, inputs: BackendInputs) -> Backend:
        """Build from what the Accelerator has; each engine takes the parts it uses."""
        return cls(inputs.state, inputs.mixed_precision)

    @classmethod
    def at_exit(cls) -> None:
        """At exit, once the process groups are destroyed and while the interpreter is still
        whole: let go of every reference that still holds one (`let_go_of_groups`). An engine
        whose C++ objects own a group lets go of them first, then calls this."""
        let_go_of_groups(exit_groups(), cls.group_holders())

    @classmethod
    def group_holders(cls) -> Sequence[Any]:
        """Objects of the engine's that keep a group as an attribute, let go of first: when
        they were the only holders, the search of the whole heap is skipped."""
        return ()

    def casts_model(self) -> bool:
        """The engine runs the model in the mixed-precision dtype itself (so no autocast)."""
        return False

    def wrap_model(self, model: torch.nn.Module, companions: Sequence[Any]) -> torch.nn.Module:
        """Place the model on the device and wrap it; ``companions`` are the other objects of
        the same ``prepare`` call (an engine that needs the optimizer finds it there)."""
        return model.to(self.state.device)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer to step: the user's, or one rebuilt on the engine's parameters."""
        return optimizer

    def steps_locally(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer.step()`` (the optimizer `bind_optimizer` returned) never makes a
        collective, so that the prepared optimizer's step need not track pending work
        (`accelify.runtime.pending_work`: a tracked block costs every op inside it). Not known
        here: an engine's step may communicate (DeepSpeed gathers the new partitions)."""
        return False

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever `wrap_model` returned."""
        compiled = getattr(model, "_orig_mod", None)
        return compiled if isinstance(compiled, torch.nn.Module) else model

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient reduction for the backward passes inside."""
        return contextlib.nullcontext()

    def sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Reduce the gradients in the backward passes inside, even under `no_sync` (for a
        backward of a forward that ran under it)."""
        return contextlib.nullcontext()

    def joinable(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` can join uneven inputs (`torch.distributed.algorithms.Join`)."""
        return False

    def backward(self, loss: torch.Tensor, sync: bool, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def reduces_in_backward(self, models: Sequence[torch.nn.Module], sync: bool) -> bool:
        """Whether a backward now reduces gradients across ranks, so that every rank must
        reach it (`accelify.runtime.collective_record` records it as a collective then)."""
        return False

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        """Clip over every rank's gradients; returns the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def partition_test(self) -> Callable[[torch.Tensor], bool]:
        """What tells, as things stand now, whether a tensor is this rank's part of one the
        engine split across the ranks without a DTensor to say so (DeepSpeed's partitions);
        asked once per save."""
        return lambda tensor: False

    def model_state_dict(self, model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
        """A full, unwrapped state dict (keys as in the user's module); a collective for the
        sharding engines, and then only the ranks that ``keep`` it get the tensors (the
        others ``{}``): the main process, or each node's local main process where the
        project configuration sets ``save_on_each_node``. Every rank holds the whole model
        here, and gets it."""
        return self.unwrap_model(model).state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
        """The whole state of ``optimizer`` (the one `bind_optimizer` returned) in torch's
        one-process format (`accelify.runtime.optimizer_states`); a collective for the engines
        that shard it, and then only the ranks that ``keep`` it get it (the others ``{}``), as
        with `model_state_dict`."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
    ) -> None:
        """Load into ``optimizer`` a state of torch's one-process format (each rank keeping its
        own part, no communication) or of the engine's own."""
        optimizer.load_state_dict(state_dict)

    # --- checkpoints -------------------------------------------------------------------------
    #: The engine writes models and optimizers into checkpoints itself (sharded, every rank).
    owns_checkpoints = False

    def save_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        raise NotImplementedError

    def load_checkpoint(
        self, models: Sequence[Any], optimizers: Sequence[Any], directory: Path
    ) -> None:
        raise NotImplementedError


def let_go_of_groups(groups: Sequence[dist.ProcessGroup], known: Sequence[Any] = ()) -> None:
    """Set to None every reference Python code still holds to one of ``groups`` (destroyed at
    exit, so none can be used again; ``groups`` itself is left alone), wherever it is kept, so
    that the exit guard frees each group while the interpreter is still whole
    (`accelify.runtime.state._ExitGuard`).

    A destroyed group something still holds is freed during interpreter finalization, with its
    gloo worker threads still running: one still dropping the tensors of a collective the
    runtime does not track (a script's own ``dist.new_group`` kept in a global, ZeRO-3's and
    FSDP's parameter gathers, a full state dict) asks for the GIL there, and the rank dies of
    SIGABRT ("terminate called without an active exception") after its script ended. Engines
    keep groups everywhere: DeepSpeed in module globals, its engine and optimizers, each ZeRO-3
    parameter (``ds_process_group``), the closures of its hooks and the defaults of its
    functions; FSDP in its mesh infos and every `DeviceMesh` (``_pg_registry``), which
    DTensor's caches (module globals) keep; a script in its own globals and objects.

    The groups are found by identity, not by where an engine is known to keep them: one pass of
    `gc.get_referrers` over every object gc tracks (in C) yields each one that holds a group: a
    dict (module globals, an object's attributes, a registry; a group as a key is removed), a
    list, a set, a closure cell, an object with slots or inline attributes, a class. A dict or
    a tuple that holds nothing gc tracks is not tracked itself (`_untracked_holders`): only
    when a group is still referred to after the first pass are those looked for. A tuple
    cannot change: its own holders (a function's defaults, an attribute) get a copy without
    the groups. Objects in cycles a finished training left are among gc's objects and let go
    like the rest. References held by C++ objects (a DDP reducer) are the engine's to drop.

    The holders the engine knows (``known``: DDP's wrappers) let go first; when nothing else
    refers to a group then (a DDP run's usual end), the heap is not searched. Else the objects
    the rank's entry froze (`accelify.runtime.rank_entry`: torch's, as it was imported), which
    `gc.get_referrers` does not see, are unfrozen first: a module's globals are among them.
    """
    if not groups:
        return
    wanted = {id(group) for group in groups}
    for holder in known:
        with contextlib.suppress(Exception):
            _drop_attributes(holder, _is_one_of(wanted), lambda value: None)
    if not _still_referred_to(groups):
        return
    if gc.get_freeze_count():
        gc.unfreeze()
    tuples = _drop_everywhere(gc.get_referrers(*groups), wanted, id(groups))
    if _still_referred_to(groups):
        tuples += _drop_everywhere(_untracked_holders(wanted), wanted, id(groups))
    if not tuples:
        return
    # a tuple's holders get a copy without the groups (one level: a tuple in a tuple stays)
    replacement = {
        id(old): tuple(None if id(value) in wanted else value for value in old) for old in tuples
    }
    holders = gc.get_referrers(*tuples)
    for holder in holders:
        if holder is tuples or type(holder) is tuple:
            continue
        if isinstance(holder, types.FunctionType):
            if id(holder.__defaults__) in replacement:
                holder.__defaults__ = replacement[id(holder.__defaults__)]
            continue
        with contextlib.suppress(Exception):
            _drop_from(
                holder,
                lambda value: type(value) is tuple and id(value) in replacement,
                lambda value: replacement[id(value)],
            )


def _drop_everywhere(holders: list[Any], wanted: set[int], own: int) -> list[tuple[Any, ...]]:
    """Set to None each group (by id, in ``wanted``) the ``holders`` hold; returns the tuples
    among them, which cannot change. ``own``: the id of the caller's list of groups."""
    tuples: list[tuple[Any, ...]] = []
    is_group = _is_one_of(wanted)
    for holder in holders:
        if id(holder) == own:
            continue
        if type(holder) is tuple:
            tuples.append(holder)
            continue
        with contextlib.suppress(Exception):  # one that cannot change keeps its reference
            _drop_from(holder, is_group, lambda value: None)
    return tuples


def _is_one_of(wanted: set[int]) -> Callable[[object], bool]:
    """Whether a value is one of the groups (by id, in ``wanted``)."""
    return lambda value: id(value) in wanted and isinstance(value, dist.ProcessGroup)


def _still_referred_to(groups: Sequence[dist.ProcessGroup]) -> bool:
    """Whether anything but ``groups`` still refers to one of them: each is counted against an
    object held the same way (here, and in one list), so nothing depends on how the
    interpreter counts its own references."""
    probe = object()
    counts = [sys.getrefcount(value) for value in [probe, *groups]]
    return any(count > counts[0] for count in counts[1:])


def _untracked_holders(wanted: set[int]) -> list[Any]:
    """The dicts and tuples that hold one of the ``wanted`` objects (by id) and that gc does
    not track, so `gc.get_referrers` cannot see them: CPython stops tracking a dict or a tuple
    that holds only objects gc does not track, and a group is one (``{"name": group}``, as
    `DeviceMesh` keeps them in ``_pg_registry``; ``(group,)``, a function's defaults). Each is
    held by a tracked object other than a tuple (a tuple of such tuples is not looked into), so
    it is among the referents of gc's objects; they are sorted out in C (`map`,
    `itertools.compress`), and only the untracked containers are looked into here."""
    holders = [obj for obj in gc.get_objects() if type(obj) is not tuple]
    referents = gc.get_referents(*holders)
    del holders
    containers = list(
        itertools.compress(referents, map(_CONTAINERS.__contains__, map(type, referents)))
    )
    del referents
    untracked = {
        id(container): container
        for container in itertools.compress(
            containers, map(operator.not_, map(gc.is_tracked, containers))
        )
    }
    return [
        holder
        for holder in untracked.values()
        if not wanted.isdisjoint(map(id, holder))
        or (type(holder) is dict and not wanted.isdisjoint(map(id, holder.values())))
    ]


#: The containers CPython may leave untracked by gc
_CONTAINERS = frozenset((dict, tuple))


def _drop_from(holder: Any, found: Any, instead: Any) -> None:
    """Replace, in ``holder``, each value ``found`` says yes to by ``instead(value)``."""
    kind = type(holder)
    if isinstance(holder, dict):
        for key, value in list(holder.items()):
            if found(key):
                del holder[key]
            elif found(value):
                holder[key] = instead(value)
    elif isinstance(holder, list):
        for index, value in enumerate(holder):
            if found(value):
                holder[index] = instead(value)
    elif isinstance(holder, set):
        for value in [value for value in holder if found(value)]:
            holder.discard(value)
    elif kind is types.CellType:
        with contextlib.suppress(ValueError):  # an empty cell
            if found(holder.cell_contents):
                holder.cell_contents = instead(holder.cell_contents)
    elif isinstance(holder, type):
        for name, value in list(vars(holder).items()):
            if found(value):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(holder, name, instead(value))
    elif kind is not types.FrameType:
        _drop_attributes(holder, found, instead)


def _drop_attributes(holder: Any, found: Any, instead: Any) -> None:
    """An object that holds the value itself: in its attributes kept inline (no dict made yet)
    or in its slots."""
    try:
        attributes = object.__getattribute__(holder, "__dict__")
    except (AttributeError, TypeError):
        attributes = None
    if type(attributes) is dict:
        for name, value in list(attributes.items()):
            if found(value):
                attributes[name] = instead(value)
    for kind in type(holder).__mro__:
        slots = kind.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            try:
                value = object.__getattribute__(holder, name)
            except (AttributeError, TypeError):
                continue
            if found(value):
                with contextlib.suppress(AttributeError, TypeError):
                    object.__setattr__(holder, name, instead(value))
