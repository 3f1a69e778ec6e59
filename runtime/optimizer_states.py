"""An optimizer's whole state, as one process holds it, under the engines that shard it.

A script that checkpoints ``{"model": ..., "optimizer": optimizer.state_dict(), "epoch": e}``
and resumes with ``optimizer.load_state_dict(ckpt["optimizer"])`` keeps one format on every
engine: torch's own (``{"state": {0: {"step": ..., "exp_avg": ...}}, "param_groups": [...]}``,
parameters numbered in the optimizer's order, every tensor whole). Under FSDP2 each state tensor
is a DTensor shard of the parameter's, and under DeepSpeed ZeRO the state is kept per flat
partition of each parameter group, so ``optimizer.state_dict()`` there is one rank's part.

``accelerator.get_state_dict(optimizer)`` (Hugging Face Accelerate's name, which takes a model
there) gathers the whole state: under FSDP each shard is gathered (``full_tensor``), under ZeRO
each parameter's state is assembled by DeepSpeed's ``safe_get_full_optimizer_state``; a
collective there, so every rank calls it, and only the main process keeps the whole state (on
the CPU; each node's local main process with ``save_on_each_node``, where each writes it; the
other ranks get ``{}``), as the model's ``get_state_dict`` and torch's
``get_optimizer_state_dict`` with ``full_state_dict`` and ``cpu_offload`` do: a copy per rank
would be the ranks' count times two fp32 copies of the model in host memory. It is made for
``accelerator.save``, which writes from the main process. ``optimizer.load_state_dict(whole)``
on the prepared optimizer takes that format under every engine: each rank keeps its own shard
(``distribute_tensor`` with ``src_data_rank=None``, no communication) or writes its own
partition (``safe_set_full_optimizer_state``, local), the load replacing the state as torch's
does (`ZeroOptimizerStates`). A state of the engine's own format (a DTensor shard, loaded back
on the same ranks) is left to torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def whole_from_shards(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every DTensor gathered whole onto the CPU (a collective
    per tensor, in the state's own order, the same on every rank: each steps alike). Only a
    rank that ``keep``s it (the main process) holds the gathered tensors, one at a time on the
    device; the others drop each as it comes and get ``{}``."""
    state = optimizer.state_dict()
    whole: dict[Any, dict[str, Any]] = {}
    for number, entries in state["state"].items():
        whole[number] = {
            key: gathered(value, keep) if isinstance(value, DTensor) else value
            for key, value in entries.items()
        }
    return {"state": whole, "param_groups": state["param_groups"]} if keep else {}


def gathered(value: DTensor, keep: bool) -> torch.Tensor | None:
    """``value`` whole (a collective), on the CPU for a rank that ``keep``s it, else None. A
    shard FSDP offloads to the CPU on a GPU mesh goes to the mesh's device first, as torch's
    own full state dict moves it (the mesh's collectives do not take CPU tensors there)."""
    if value.device.type != value.device_mesh.device_type:
        value = value.to(value.device_mesh.device_type)
    full = value.detach().full_tensor()  # a parameter (keep_vars): no autograd record
    return full.cpu() if keep else None


def shard_whole_state(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> dict[str, Any]:
    """``state_dict`` with each whole tensor of a sharded parameter's state cut to this rank's
    shard, laid out as the parameter is (no communication). Parameters are matched to the
    saved numbers in order, group by group, as ``torch.optim.Optimizer.load_state_dict`` does;
    a tensor that is already a DTensor, or whose shape is not the parameter's, is left as is."""
    numbers = [number for group in state_dict.get("param_groups", ()) for number in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    by_number = dict(zip(numbers, params, strict=False))
    sharded: dict[Any, Any] = {}
    for number, entries in state_dict.get("state", {}).items():
        param = by_number.get(number)
        if not isinstance(param, DTensor) or not isinstance(entries, dict):
            sharded[number] = entries
            continue
        sharded[number] = {key: _shard_like(value, param) for key, value in entries.items()}
    return {**state_dict, "state": sharded}


def _shard_like(value: Any, param: DTensor) -> Any:
    if (
        not isinstance(value, torch.Tensor)
        or isinstance(value, DTensor)
        or value.shape != param.shape
    ):
        return value
    return distribute_tensor(
        value.detach().to(param.to_local().device),
        param.device_mesh,
        param.placements,
        src_data_rank=None,
    )


class ZeroOptimizerStates:
    """The whole state of a torch optimizer that DeepSpeed ZeRO (stage 1 to 3) steps, and its
    load.

    ``groups``: the user optimizer's parameters, group by group, recorded before
    ``deepspeed.initialize`` replaced its groups by flat fp32 partitions; they are the engine
    module's own parameters, through which DeepSpeed finds each one's fragment of the state.
    ``zero``: the engine's ZeRO optimizer; its ``optimizer`` is the torch optimizer it steps
    (whose groups hold the flat partitions). Per-element state (``exp_avg``) is assembled per
    parameter; a scalar entry (``step``) is kept per flat partition, the same for every
    parameter of a run where each steps every time. DeepSpeed makes the state at the first
    step: a load before it makes the flat state first (zeros), then writes into it.

    A load replaces the state, as torch's does: a group whose parameters the loaded state
    holds no entries for (a state saved before the first step) starts afresh at the next step,
    its old moments dropped. What one flat state per partition cannot hold (entries for some
    parameters of a group only, or scalars that differ between them) is refused."""

    def __init__(self, groups: Sequence[Sequence[torch.nn.Parameter]], zero: Any) -> None:
        self.groups = [list(group) for group in groups]
        self.zero = zero

    @property
    def inner(self) -> Any:
        return self.zero.optimizer

    def _flats_by_group(self) -> list[list[torch.Tensor]]:
        """The flat fp32 partitions each user group's state is kept under: ZeRO-3 keeps them
        itself, one per sub-group (its inner groups hold them only while it steps), ZeRO-1/2
        one per group, in the inner groups."""
        partitions = getattr(self.zero, "fp32_partitioned_groups_flat", None)
        if partitions is None:
            return [list(group["params"]) for group in self._inner_groups()]
        flats: list[list[torch.Tensor]] = [[] for _ in self.groups]
        for sub_group, flat in enumerate(partitions):
            if flat is not None:
                flats[self.zero.sub_group_to_group_id[sub_group]].append(flat)
        return flats

    def _state_of(self, flats: Sequence[torch.Tensor]) -> dict[str, Any]:
        """The state DeepSpeed keeps for a group's partitions (``{}`` before its first step)."""
        return next((self.inner.state[flat] for flat in flats if self.inner.state.get(flat)), {})

    def _inner_groups(self) -> list[dict[str, Any]]:
        """The inner groups, one per user group (DeepSpeed keeps one flat partition per group);
        any other count would pair a group's settings with another's."""
        inner = self.inner.param_groups
        if len(inner) != len(self.groups):
            raise ValueError(
                f"DeepSpeed's optimizer holds {len(inner)} parameter groups where the prepared "
                f"optimizer had {len(self.groups)}: its settings cannot be told apart; save and "
                "load the whole training state with accelerator.save_state(folder) and "
                "accelerator.load_state(folder) instead"
            )
        return inner

    def _settings(self) -> list[dict[str, Any]]:
        """Each user group's settings (``lr`` as a scheduler left it), from the inner groups."""
        return [{k: v for k, v in g.items() if k != "params"} for g in self._inner_groups()]

    def state_dict(self, keep: bool = True) -> dict[str, Any]:
        """The one-process format; a collective (every rank, the same order). Only a rank that
        ``keep``s it (the main process) holds the assembled tensors; the others drop each one
        as it comes and get ``{}``. Each group's entries are those of its own flat state (a
        group without one, before its first step, has none)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        state: dict[int, dict[str, Any]] = {}
        param_groups = []
        number = 0
        for group, settings, flats in zip(
            self.groups, self._settings(), self._flats_by_group(), strict=True
        ):
            template = self._state_of(flats)
            numbers = []
            for param in group:
                entries = {}
                for key, value in template.items():
                    if not _elementwise(value):
                        entries[key] = _copied(value)
                    elif (full := safe_get_full_optimizer_state(param, key)) is not None:
                        entries[key] = full.detach().cpu().clone() if keep else None
                    else:  # a frozen parameter DeepSpeed leaves out: no state, as torch keeps
                        entries = {}
                        break
                if entries:
                    state[number] = entries
                numbers.append(number)
                number += 1
            param_groups.append({**settings, "params": numbers})
        return {"state": state, "param_groups": param_groups} if keep else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Replace the state with ``state_dict``'s (every rank, no communication): the groups'
        settings into the inner groups (a state without per-parameter entries, SGD without
        momentum, still sets ``lr``); then, group by group, a group the state holds entries
        for gets this rank's partition of each parameter's whole state and the scalar entries
        in its flat state (made first where DeepSpeed has none yet), and a group it holds none
        for has its flat state dropped, to start afresh at the next step as torch's optimizer
        does after such a load (the old moments were kept before). Anything that does not
        load raises before anything is changed: groups that do not match (torch's
        ``ValueError``), or what one flat state per group cannot hold (`_planned`)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(s["params"]) != len(g) for s, g in zip(saved_groups, self.groups, strict=True)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group"
            )
        plans = [
            _planned(index, group, saved["params"], state_dict.get("state", {}))
            for index, (group, saved) in enumerate(zip(self.groups, saved_groups, strict=True))
        ]
        for group, settings in zip(self._inner_groups(), saved_groups, strict=True):
            group.update({k: v for k, v in settings.items() if k != "params"})
        flats_by_group = self._flats_by_group()
        dropped = made = False
        for plan, flats in zip(plans, flats_by_group, strict=True):
            if plan is None:
                dropped |= any(self.inner.state.pop(flat, None) is not None for flat in flats)
            else:
                made |= self._make_flat_states(flats, plan[0][1])
        if made and hasattr(self.zero, "_hp_optimizer_states_linked"):
            # ZeRO-1/2 link each parameter's fragment of the state after their first step
            self.zero._hp_optimizer_states_linked = False
            self.zero._lazy_init_hp_params_optimizer_state()
        for plan, flats in zip(plans, flats_by_group, strict=True):
            if plan is not None:
                self._write(plan, flats)
        if dropped and hasattr(self.zero, "_hp_optimizer_states_linked"):
            self.zero._hp_optimizer_states_linked = False  # linked again after the next step

    def _write(
        self, plan: list[tuple[torch.nn.Parameter, dict[str, Any]]], flats: list[torch.Tensor]
    ) -> None:
        """One group's loaded entries: each parameter's partition, then the scalars."""
        from deepspeed.utils import safe_set_full_optimizer_state

        for param, entries in plan:
            for key, value in entries.items():
                if not _elementwise(value):
                    continue
                if hasattr(param, "ds_id"):
                    self._set_partition(param, value, key)
                else:
                    safe_set_full_optimizer_state(param, value.detach().float(), key)
        scalars = {k: v for k, v in plan[0][1].items() if not _elementwise(v)}
        for flat in flats:
            state = self.inner.state[flat]
            for key, value in scalars.items():
                state[key] = _copied(value, like=state.get(key))

    def _set_partition(self, param: torch.nn.Parameter, value: torch.Tensor, key: str) -> None:
        """ZeRO-3: this rank's partition of ``param``'s state ``key`` from the whole ``value``.
        DeepSpeed's own ``safe_set_full_optimizer_state`` cuts the partition out of the
        unpadded tensor and fails on the last rank where the ranks do not divide the
        parameter's size ("start (2) + length (2) exceeds dimension size (3)"); the
        partitions are padded to one size, so the whole tensor is padded the same way here."""
        fragment, _ = self.zero._get_fp32_opt_state_partition(
            param, release_swap_buffers=False, optim_state_key=key
        )
        rank = self.zero._get_param_partition_rank(param)
        size = fragment.numel()
        whole = value.detach().float().flatten()
        whole = torch.nn.functional.pad(whole, (0, max(0, size * (rank + 1) - whole.numel())))
        with torch.no_grad():
            fragment.copy_(whole.narrow(0, size * rank, size))

    def _make_flat_states(self, flats: Sequence[torch.Tensor], template: dict[str, Any]) -> bool:
        """The state of each of ``flats`` DeepSpeed has none for yet, made as its first step
        would make it (zeros per element, the saved scalars); whether any was made."""
        missing = [flat for flat in flats if not self.inner.state.get(flat)]
        for flat in missing:
            self.inner.state[flat] = {
                key: torch.zeros_like(flat) if _elementwise(value) else _copied(value)
                for key, value in template.items()
            }
        return bool(missing)


def _planned(
    index: int,
    group: Sequence[torch.nn.Parameter],
    numbers: Sequence[Any],
    saved: dict[Any, Any],
) -> list[tuple[torch.nn.Parameter, dict[str, Any]]] | None:
    """What a load writes into one group: each parameter DeepSpeed steps with its loaded
    entries, or None where the state holds entries for none of them (the group starts
    afresh). A parameter DeepSpeed leaves out (frozen at ``prepare``) has no state to write.
    DeepSpeed keeps one state per flat partition of a group, so entries for some of its
    parameters only (torch would start the others afresh: a state saved while some had no
    gradient yet) and scalars that differ between them (Adam's ``step``) cannot be loaded
    as they are: refused, naming what to use."""
    stepped = [
        (param, saved.get(number) or {})
        for number, param in zip(numbers, group, strict=True)
        if param.requires_grad
    ]
    held = [(param, entries) for param, entries in stepped if entries]
    if not held:
        return None
    if len(held) < len(stepped):
        raise RuntimeError(
            f"the optimizer state loaded holds entries for {len(held)} of the {len(stepped)} "
            f"parameters of group {index}: DeepSpeed ZeRO keeps one state per group's flat "
            "partition, so the others cannot start afresh as torch would start them. Load a "
            "state with entries for all of a group's parameters or for none, or save and load "
            "the whole training state with accelerator.save_state(folder) and "
            "accelerator.load_state(folder)"
        )
    first = held[0][1]
    for _, entries in held[1:]:
        for key, value in entries.items():
            if not _elementwise(value) and not _same(value, first.get(key)):
                raise RuntimeError(
                    f"the optimizer state loaded holds different {key!r} values for the "
                    f"parameters of group {index} ({_shown(first.get(key))} and "
                    f"{_shown(value)}): DeepSpeed ZeRO keeps one per group's flat partition. "
                    "Save and load the whole training state with "
                    "accelerator.save_state(folder) and accelerator.load_state(folder)"
                )
    return held


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a.detach().cpu(), b.detach().cpu())
    return bool(a == b)


def _shown(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


class UnassembledStates:
    """The optimizer's state under a DeepSpeed wrapper that keeps it in its own layout, with no
    per-parameter fragments to assemble it from (``FP16_Optimizer`` or ``FP16_UnfusedOptimizer``,
    ZeRO stage 0 with fp16 or bf16):
    neither gathered nor loaded in torch's format, which would hand back DeepSpeed's own format
    under torch's name, or fail deep in DeepSpeed. Raises, on every rank alike (no hang), with
    what to use instead."""

    def __init__(self, wrapper: str) -> None:
        self.wrapper = wrapper

    def _refusal(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"with --backend deepspeed at ZeRO stage 0, DeepSpeed's {self.wrapper} keeps the "
            f"optimizer's state in its own layout: {what} in torch's one-process format is not "
            "supported there; save and load the whole training state with "
            "accelerator.save_state(folder) and accelerator.load_state(folder) on every rank, "
            "or run with --zero-stage 1 or higher"
        )

    def state_dict(self, keep: bool = True) -> dict[str, Any]:
        raise self._refusal("accelerator.get_state_dict(optimizer)")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise self._refusal(
            "a load of the optimizer's whole state (optimizer.load_state_dict after prepare, "
            "or a state loaded into the optimizer before prepare)"
        )


def is_whole_state(state_dict: Any) -> bool:
    """torch's own format (``state`` and ``param_groups`` only), not an engine's."""
    return isinstance(state_dict, dict) and set(state_dict) == {"state", "param_groups"}


def _elementwise(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _copied(value: Any, like: Any = None) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    target = like.device if isinstance(like, torch.Tensor) else value.device
    return value.detach().clone().to(target)
