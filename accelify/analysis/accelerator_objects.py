"""Accelerators the file did not construct itself: returned by a factory (of this module or
another one of the project), held by a class (``self.accelerator``, also in an ``nn.Module``),
or received as a parameter. A file that uses an accelerator object it got from anywhere is an
Accelerator file, and every fact about accelerators covers these names too.

From this file alone: a name assigned from a call of a local function that returns an
``Accelerator(...)`` is one; so is a name (a local, ``self.x``, a parameter) used the way only an
accelerator is used (``.prepare(``, ``.unwrap_model(``, ``.gather_for_metrics(``,
``.accumulate(``...), or named ``accelerator`` and used as one (``.is_main_process``,
``.wait_for_everyone()``). Modules (``torch.autocast``) and settings (``args.process_index``)
never are.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk

#: Members only an Accelerator has (not a PartialState, a GradientState, an FSDP or DeepSpeed
#: model, a tensor or a settings object).
ACCELERATOR_ONLY = frozenset(
    {
        "prepare",
        "prepare_model",
        "prepare_optimizer",
        "prepare_data_loader",
        "prepare_scheduler",
        "unwrap_model",
        "gather_for_metrics",
        "accumulate",
        "save_state",
        "load_state",
        "get_state_dict",
        "save_model",
        "init_trackers",
        "get_tracker",
        "end_training",
        "register_for_checkpointing",
        "register_save_state_pre_hook",
        "register_load_state_pre_hook",
        "skip_first_batches",
        "free_memory",
    }
)
#: Members an Accelerator shares with process states: evidence only for a name that says it is
#: an accelerator (``accelerator``, ``self.accelerator``, ``trainer_accelerator``).
SHARED = frozenset(
    {
        "is_main_process",
        "is_local_main_process",
        "wait_for_everyone",
        "main_process_first",
        "local_main_process_first",
        "gather",
        "reduce",
        "pad_across_processes",
        "backward",
        "device",
        "print",
        "log",
        "save",
        "autocast",
        "num_processes",
        "process_index",
        "local_process_index",
        "distributed_type",
        "state",
        "split_between_processes",
        "mixed_precision",
        "trackers",
        "no_sync",
        "use_distributed",
        "sync_gradients",
        "clip_grad_norm_",
        "clip_grad_value_",
        "gradient_accumulation_steps",
    }
)
_SETTINGS = ("args", "config", "cfg", "opt", "opts", "hparams", "FLAGS", "training_args")


def add_accelerator_objects(model: ScriptModel) -> None:
    """Bind every accelerator the file got from elsewhere (see the module docstring)."""
    evidence = _used_like_an_accelerator(model)
    factories = _local_factories(model)
    known = {(b.name, id(b.scope)) for b in model.of_kind(Kind.ACCELERATOR)}
    for assign in model.assignments:
        if len(assign.targets) != 1:
            continue
        name = dotted(assign.targets[0].target)
        if (
            name is None
            or name.count(".") > 1
            or (name.count(".") and not name.startswith("self."))
        ):
            continue
        scope = model.scope_of(assign)
        if (name, id(scope)) in known or not _may_hold_an_object(assign.value):
            continue
        from_factory = (
            isinstance(assign.value, cst.Call)
            and isinstance(assign.value.func, cst.Name)
            and assign.value.func.value in factories
        )
        if not from_factory and name not in evidence:
            continue
        statement = model.parent(assign)
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        known.add((name, id(scope)))
        model.bindings.append(
            Binding(name, Kind.ACCELERATOR, scope, statement, assign, assign.value, model)
        )
    for function in _functions(model):
        parameters = {
            p.name.value
            for p in (*function.params.params, *function.params.kwonly_params)
            if p.name.value not in ("self", "cls")
        }
        used = parameters & _used_like_an_accelerator(model, function)
        if used:
            model.accelerator_params[function] = used


def _may_hold_an_object(value: cst.BaseExpression) -> bool:
    """Not a literal, a comparison or arithmetic: something that can be an accelerator."""
    return isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.IfExp, cst.Subscript))


def _used_like_an_accelerator(
    model: ScriptModel, within: cst.FunctionDef | None = None
) -> set[str]:
    """Receivers (``x``, ``self.x``) of accelerator members, in the file or in one function."""
    nodes = walk(within) if within is not None else model.orders
    found: set[str] = set()
    for node in nodes:
        if not isinstance(node, cst.Attribute):
            continue
        member = node.attr.value
        if member not in ACCELERATOR_ONLY and member not in SHARED:
            continue
        receiver = dotted(node.value)
        if receiver is None or receiver in found or not _may_be_an_accelerator(model, receiver):
            continue
        if member in ACCELERATOR_ONLY or _named_accelerator(receiver):
            found.add(receiver)
    return found


def _may_be_an_accelerator(model: ScriptModel, receiver: str) -> bool:
    parts = receiver.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "self"):
        return False
    if len(parts) == 1 and (receiver in model.imports.bound or receiver in _SETTINGS):
        return False
    return receiver != "self"


def _named_accelerator(receiver: str) -> bool:
    last = receiver.rsplit(".", 1)[-1].lower()
    return last.endswith("accelerator") or last in ("accel", "acc")


def _functions(model: ScriptModel) -> list[cst.FunctionDef]:
    return [node for node in model.orders if isinstance(node, cst.FunctionDef)]


def _local_factories(model: ScriptModel) -> set[str]:
    """Module-level functions that return an ``Accelerator(...)`` (directly or through a name
    bound to one)."""
    found = set()
    for name, function in model.functions.items():
        bound = {b.name for b in model.of_kind(Kind.ACCELERATOR) if b.scope is function}
        for node in walk(function.body):
            if not isinstance(node, cst.Return) or node.value is None:
                continue
            value = node.value
            if (isinstance(value, cst.Call) and model.call_names(value) & names.ACCELERATORS) or (
                dotted(value) in bound
            ):
                found.add(name)
                break
    return found
