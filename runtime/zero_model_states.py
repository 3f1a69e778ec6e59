"""A DeepSpeed engine's model state, whole, for the processes that save it.

``accelerator.get_state_dict(model)`` under DeepSpeed gives the user's module's keys with whole
tensors: the fp32 master weights where DeepSpeed keeps them apart from the module's (bf16 or
fp16 runs: every ZeRO stage, and stage 0's ``FP16_Optimizer``/``FP16_UnfusedOptimizer``), else
the module's own tensors (fp32 runs, buffers, frozen parameters), gathered under ZeRO-3.

One tensor at a time: each parameter's fp32 master is assembled by DeepSpeed's
``safe_get_full_fp32_param`` (a collective at ZeRO 1-3: each rank adds its fragment), a ZeRO-3
parameter is gathered alone (``GatheredParameters``) and let go of before the next one, and
only the ranks that ``keep`` the state copy each to the CPU; the others drop it as it comes.
So a rank holds at most one whole tensor beyond its own partition (the main process: plus the
copies it keeps), where gathering every parameter at once held the whole model on every rank,
and a DeepSpeed checkpoint written to read the masters back (``zero_to_fp32``) wrote every
rank's optimizer state to disk, failed at stage 0 (no ZeRO files), and read from a folder only
the first node has on a multi-node run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def whole_model_state(engine: Any, keep: bool) -> dict[str, Any]:
    """``engine.module``'s state dict, whole, on the CPU for a rank that ``keep``s it (``{}``
    on the others); a collective: every rank calls it, in the same order. A tensor held under
    two keys (tied weights) is copied once and kept under both, as torch's own state dict
    shares it."""
    import deepspeed

    master = _masters(engine)
    copies: dict[int, Any] = {}
    state: dict[str, Any] = {}
    for key, value in engine.module.state_dict(keep_vars=True).items():
        if id(value) not in copies:
            if not isinstance(value, torch.Tensor):
                copies[id(value)] = value  # a module's extra state
            elif (whole := master(value)) is not None:
                copies[id(value)] = _kept(whole, keep)
            else:
                with deepspeed.zero.GatheredParameters([value], modifier_rank=None):  # ZeRO-3 only
                    copies[id(value)] = _kept(value, keep)
        if keep:
            state[key] = copies[id(value)]
    return state


def _kept(tensor: torch.Tensor, keep: bool) -> torch.Tensor | None:
    return tensor.detach().to("cpu", copy=True) if keep else None


def _masters(engine: Any) -> Callable[[torch.Tensor], torch.Tensor | None]:
    """Each tensor's fp32 master weight, or None where the module's own tensor is the weight
    (an fp32 run, a buffer, a parameter DeepSpeed does not step)."""
    if not (engine.bfloat16_enabled() or engine.fp16_enabled()):
        return lambda tensor: None
    wrapper = engine.optimizer
    if engine.zero_optimization_stage() == 0 and hasattr(wrapper, "fp16_groups"):
        whole = _stage_0_masters(wrapper)
        return lambda tensor: whole.get(id(tensor))
    from deepspeed.utils import safe_get_full_fp32_param

    return lambda tensor: (
        safe_get_full_fp32_param(tensor) if isinstance(tensor, torch.nn.Parameter) else None
    )


def _stage_0_masters(wrapper: Any) -> dict[int, torch.Tensor]:
    """ZeRO stage 0's wrappers keep each group's fp32 masters whole on every rank:
    ``FP16_UnfusedOptimizer`` one per parameter (``fp32_groups``), ``FP16_Optimizer`` one flat
    tensor per group (``fp32_groups_flat``), laid out as the group's parameters."""
    from torch._utils import _unflatten_dense_tensors

    groups = wrapper.fp16_groups
    if hasattr(wrapper, "fp32_groups"):
        masters = wrapper.fp32_groups
    else:
        masters = [
            _unflatten_dense_tensors(flat, group)
            for flat, group in zip(wrapper.fp32_groups_flat, groups, strict=True)
        ]
    return {
        id(param): master
        for group, fp32 in zip(groups, masters, strict=True)
        for param, master in zip(group, fp32, strict=True)
    }
