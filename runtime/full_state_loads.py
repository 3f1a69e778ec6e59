"""A whole (unsharded) state dict loaded into a model FSDP2 has sharded, or ZeRO-3 partitioned.

``accelerator.save(accelerator.get_state_dict(model), path)`` writes the model's full tensors,
and a converted script reloads them as it did before conversion:
``accelerator.unwrap_model(model).load_state_dict(torch.load(path))``. Under FSDP2 the module's
parameters are DTensor shards, and torch refuses to copy a plain tensor into one ("aten.copy_
got mixed torch.Tensor and DTensor"). Every rank holds the whole tensor it loaded, so each cuts
its own shard out of it (`distribute_tensor` with ``src_data_rank=None``: no communication, so
a load that only some ranks run cannot hang). A DTensor entry (the model's own sharded state
dict, loaded back on the same ranks) and an entry of another shape (torch's size-mismatch
error) are left to torch. Under ZeRO-3 each rank writes its own partition the same way. Under
every ZeRO stage a load (into the model or a submodule) is then copied into the optimizer's fp32
master weights, which the next step would otherwise copy back over it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, distribute_tensor


@dataclass(frozen=True)
class _Layout:
    """How one sharded parameter is laid out: recorded when the model is sharded, because at a
    later load the module may hold the parameter unsharded (a plain tensor), as FSDP2 leaves it
    between a forward and the next backward when it keeps parameters after forward."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: torch.Size
    device: torch.device


def accept_full_state_dicts(model: torch.nn.Module) -> None:
    """Let each submodule of ``model`` that holds sharded parameters take whole tensors in
    ``load_state_dict``; called once the model is sharded."""
    for module in model.modules():
        layouts = {
            name: _Layout(held.device_mesh, tuple(held.placements), held.shape, held.device)
            for name, held in itertools.chain(module._parameters.items(), module._buffers.items())
            if isinstance(held, DTensor)
        }
        if layouts:
            module.register_load_state_dict_pre_hook(
                functools.partial(_shard_whole_tensors, layouts)
            )


def _shard_whole_tensors(
    layouts: dict[str, _Layout],
    module: torch.nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    *_: Any,
) -> None:
    """Each whole tensor in ``state_dict`` for one of ``module``'s own sharded parameters
    becomes this rank's shard of it, laid out as the parameter was sharded. The layout is the
    one recorded at sharding, not the module's current parameter: FSDP2 registers its own
    pre-hook (which reshards an unsharded module) at the first forward, so it runs after this
    one, and a module still unsharded here holds plain tensors."""
    for name, layout in layouts.items():
        key = prefix + name
        value = state_dict.get(key)
        if (
            not isinstance(value, torch.Tensor)
            or isinstance(value, DTensor)
            or value.shape != layout.shape
        ):
            continue
        state_dict[key] = distribute_tensor(
            value.detach().to(layout.device),
            layout.mesh,
            layout.placements,
            src_data_rank=None,
        )


def accept_full_state_dicts_partitioned(
    model: torch.nn.Module, refresh: Callable[[], None] | None
) -> None:
    """The same for a module DeepSpeed ZeRO-3 partitions: each parameter's ``data`` is empty
    until gathered, so torch would refuse whole tensors (a size mismatch). Each rank writes its
    own partition of the whole tensor it loaded (``ds_tensor``: the flattened tensor's
    ``[rank * size, (rank + 1) * size)`` slice, as DeepSpeed cuts it), and a parameter kept
    whole between steps (a small one DeepSpeed persists) is written whole as torch does; no
    communication. When a load wrote partitions, ``refresh`` then copies them into the
    optimizer's fp32 master weights (DeepSpeed's ``refresh_fp32_params``), so the next step
    starts from them: once the load finishes on the module it was called on, the model or any
    submodule (``unwrap_model(model).encoder.load_state_dict(...)``), since DeepSpeed's next
    step copies the fp32 masters back over the partitions and would undo a load not refreshed.
    A load that wrote none leaves the fp32 weights untouched. DeepSpeed's own checkpoint
    loading writes none with its defaults (its saved module holds partitioned, empty tensors);
    with ``load_module_only=True`` or ``load_optimizer_states=False`` it loads whole tensors,
    which are written and refreshed here too: the same values it then copies itself."""
    _refresh_after_loads(model, refresh, _write_partitions)


def refresh_masters_after_loads(model: torch.nn.Module, refresh: Callable[[], None] | None) -> None:
    """Under DeepSpeed ZeRO-1 and 2 the optimizer keeps its own fp32 master copy of this rank's
    partition and copies it over the model's parameters at every step: a
    ``load_state_dict`` into the model (or a submodule) that is not copied into the masters is
    undone by the next step, silently. After a load that held a value for one of the model's
    parameters, ``refresh`` (the optimizer's ``refresh_fp32_params``: a local copy, no
    communication) takes the loaded values into the masters. DeepSpeed's own checkpoint loading
    loads the module through here too (refreshed: the values it loaded), and then, by default,
    its optimizer state, which puts the saved masters back."""
    if refresh is not None:
        _refresh_after_loads(model, refresh, _holds_parameters)


def _holds_parameters(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str) -> bool:
    """Whether ``state_dict`` holds a tensor for one of ``module``'s own parameters."""
    return any(
        isinstance(state_dict.get(prefix + name), torch.Tensor)
        for name, held in module._parameters.items()
        if held is not None
    )


def _refresh_after_loads(
    model: torch.nn.Module,
    refresh: Callable[[], None] | None,
    write: Callable[[torch.nn.Module, dict[str, Any], str], bool],
) -> None:
    """Hook every module of ``model``: ``write`` for each module a load enters (whether it
    changed a parameter), ``refresh`` once the load finishes if any did."""
    loads = _Loads(refresh, write)
    for module in model.modules():
        module.register_load_state_dict_pre_hook(loads.write)
        module.register_load_state_dict_post_hook(loads.finish)


class _Loads:
    """Which ``load_state_dict`` call is running, on which module it started, and whether it
    changed parameters. One call's hooks all get the same ``missing_keys`` list (a new one per
    call), so a call that raised midway leaves no state a later call would take for its own."""

    def __init__(
        self,
        refresh: Callable[[], None] | None,
        writes: Callable[[torch.nn.Module, dict[str, Any], str], bool],
    ) -> None:
        self.refresh = refresh
        self.writes = writes
        self.started: torch.nn.Module | None = None
        self.missing_keys: list[str] | None = None
        self.written = False

    def write(
        self,
        module: torch.nn.Module,
        state_dict: dict[str, Any],
        prefix: str,
        metadata: Any,
        strict: bool,
        missing_keys: list[str],
        *_: Any,
    ) -> None:
        """Pre-hook: the first module a call enters is where it started; note whether the load
        changes ``module``'s own parameters."""
        if missing_keys is not self.missing_keys:
            self.started, self.missing_keys, self.written = module, missing_keys, False
        if self.writes(module, state_dict, prefix):
            self.written = True

    def finish(self, module: torch.nn.Module, incompatible: Any) -> None:
        """Post-hook: when the call finishes on the module it started on, refresh the fp32
        master weights if it wrote partitions, and forget the call."""
        if module is not self.started or incompatible.missing_keys is not self.missing_keys:
            return
        if self.written and self.refresh is not None:
            self.refresh()
        self.started, self.missing_keys, self.written = None, None, False


def _write_partitions(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str) -> bool:
    """Whether any partition of ``module``'s own parameters was written from ``state_dict``."""
    wrote = False
    for name, held in module._parameters.items():
        key = prefix + name
        value = state_dict.get(key)
        partition = getattr(held, "ds_tensor", None)
        if (
            partition is None
            or not isinstance(value, torch.Tensor)
            or isinstance(value, DTensor)
            or tuple(value.shape) != tuple(held.ds_shape)  # type: ignore[union-attr]
        ):
            continue
        rank = torch.distributed.get_rank(group=getattr(held, "ds_process_group", None))
        size = partition.numel()
        mine = value.detach().reshape(-1)[rank * size : (rank + 1) * size]
        with torch.no_grad():
            partition.narrow(0, 0, mine.numel()).copy_(mine)
        wrote = True
        if held.numel() == 0:  # type: ignore[union-attr]
            state_dict[key] = held.data  # type: ignore[union-attr]  # nothing left to copy
    return wrote
