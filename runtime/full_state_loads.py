"""A whole (unsharded) state dict loaded into a model FSDP2 has sharded, or ZeRO-3 partitioned.

``accelerator.save(accelerator.get_state_dict(model), path)`` writes the model's full tensors,
and a converted script reloads them as it did before conversion:
``accelerator.unwrap_model(model).load_state_dict(torch.load(path))``. Under FSDP2 the module's
parameters are DTensor shards, and torch refuses to copy a plain tensor into one ("aten.copy_
got mixed torch.Tensor and DTensor"). Every rank holds the whole tensor it loaded, so each cuts
its own shard out of it (`distribute_tensor` with ``src_data_rank=None``: no communication, so
a load that only some ranks run cannot hang). A DTensor entry (the model's own sharded state
dict, loaded back on the same ranks) and an entry of another shape (torch's size-mismatch
error) are left to torch. Under ZeRO-3 each rank writes its own partition the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def accept_full_state_dicts(model: torch.nn.Module) -> None:
    """Let each submodule of ``model`` that holds sharded parameters take whole tensors in
    ``load_state_dict``; called once the model is sharded."""
    for module in model.modules():
        if any(isinstance(p, DTensor) for p in module._parameters.values()):
            module.register_load_state_dict_pre_hook(_shard_whole_tensors)


def _shard_whole_tensors(
    module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """Each whole tensor in ``state_dict`` for one of ``module``'s own sharded parameters
    becomes this rank's shard of it, laid out as the parameter is."""
    for name, held in itertools.chain(module._parameters.items(), module._buffers.items()):
        key = prefix + name
        value = state_dict.get(key)
        if (
            not isinstance(held, DTensor)
            or not isinstance(value, torch.Tensor)
            or isinstance(value, DTensor)
            or value.shape != held.shape
        ):
            continue
        state_dict[key] = distribute_tensor(
            value.detach().to(held.device),
            held.device_mesh,
            held.placements,
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
    starts from them; a load that wrote none (DeepSpeed's own checkpoint loading) is left
    alone, its fp32 weights untouched."""
    written: list[bool] = []

    def write(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        if _write_partitions(module, state_dict, prefix):
            written.append(True)

    def refreshed(module: torch.nn.Module, incompatible: Any) -> None:
        if written and refresh is not None:
            refresh()
        written.clear()

    for module in model.modules():
        if any(hasattr(p, "ds_tensor") for p in module._parameters.values() if p is not None):
            module.register_load_state_dict_pre_hook(write)
    model.register_load_state_dict_post_hook(refreshed)


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
