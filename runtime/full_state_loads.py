"""A whole (unsharded) state dict loaded into a model FSDP2 has sharded.

``accelerator.save(accelerator.get_state_dict(model), path)`` writes the model's full tensors,
and a converted script reloads them as it did before conversion:
``accelerator.unwrap_model(model).load_state_dict(torch.load(path))``. Under FSDP2 the module's
parameters are DTensor shards, and torch refuses to copy a plain tensor into one ("aten.copy_
got mixed torch.Tensor and DTensor"). Every rank holds the whole tensor it loaded, so each cuts
its own shard out of it (`distribute_tensor` with ``src_data_rank=None``: no communication, so
a load that only some ranks run cannot hang). A DTensor entry (the model's own sharded state
dict, loaded back on the same ranks) and an entry of another shape (torch's size-mismatch
error) are left to torch.
"""

from __future__ import annotations

import itertools
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
