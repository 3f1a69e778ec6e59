"""`accelerator.save` refuses an object that holds one rank's part of a sharded tensor.

``accelerator.save`` writes from the main process alone. Under FSDP a model's own
``state_dict()`` (and an optimizer's, whose moments follow the parameters) holds DTensor shards,
and under DeepSpeed ZeRO-3 a module's parameters are partitioned: saved so, the file holds the
main process's part only, and a script that loads it back trains or tests on rank 0's rows
everywhere (silently: the shapes still fit). Hugging Face Accelerate writes such a file as it
is; here the save fails on every rank that calls it, naming what to call instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

#: How deep into nested dicts, lists and tuples a saved object is searched.
_MAX_DEPTH = 6

FIX = (
    "save a model's weights with accelerator.save(accelerator.get_state_dict(model), path), "
    "called on every rank (it gathers the whole tensors for the main process to write), and "
    "an optimizer's state with accelerator.get_state_dict(optimizer) the same way (the "
    "prepared optimizer's load_state_dict takes it back); or, to resume training, use "
    "accelerator.save_state(directory) and accelerator.load_state(directory) on every rank"
)


def refuse_one_ranks_part(obj: Any, partitioned: Callable[[torch.Tensor], bool]) -> None:
    """Raise when ``obj`` holds a tensor that is one rank's part of a larger one: a DTensor
    sharded (or a partial sum) over a mesh dimension of more than one rank, or one
    ``partitioned`` says the engine split."""
    for where, tensor in _tensors(obj, "", 0):
        what = _part_of(tensor, partitioned)
        if what is not None:
            raise RuntimeError(
                f"accelerator.save: {_named(where)} is {what}; written by the main process "
                f"alone, the file would hold that rank's part only. Instead, {FIX}"
            )


def _named(where: str) -> str:
    """``['model']['fc.weight']`` (an entry), ``fc.weight`` (a module's own), or nothing."""
    if not where:
        return "the object"
    return f"the entry {where}" if where.startswith("[") else f"the module's {where}"


def _part_of(tensor: torch.Tensor, partitioned: Callable[[torch.Tensor], bool]) -> str | None:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        mesh = tensor.device_mesh
        # a placement over a mesh dimension of one rank leaves the tensor whole on that dimension
        split = [
            (placement, mesh.size(dim))
            for dim, placement in enumerate(tensor.placements)
            if (placement.is_shard() or placement.is_partial()) and mesh.size(dim) > 1
        ]
        if not split:
            return None
        local = tuple(tensor.to_local().shape)
        if any(placement.is_shard() for placement, _ in split):
            ranks = math.prod(size for placement, size in split if placement.is_shard())
            return (
                f"a shard of a tensor split across {ranks} ranks (FSDP): shape {local} of "
                f"{tuple(tensor.shape)}"
            )
        ranks = math.prod(size for _, size in split)
        return (
            f"one rank's partial sum of a tensor summed across {ranks} ranks: its values are "
            "not the tensor's"
        )
    if partitioned(tensor):
        return "this rank's partition of a tensor DeepSpeed ZeRO splits across the ranks"
    return None


def _tensors(obj: Any, where: str, depth: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of ``obj`` with where each is (``['model']['fc.weight']``): in dicts,
    lists, tuples, and a module's parameters and buffers (``torch.save(model, path)``)."""
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _tensors(value, f"{where}[{key!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _tensors(value, f"{where}[{index}]", depth + 1)
    elif isinstance(obj, torch.nn.Module):
        for name, value in (*obj.named_parameters(), *obj.named_buffers()):
            yield f"{where}.{name}" if where else name, value
