"""The number of processes as scripts spell it, and values already averaged over the ranks:
what a division by the process count means depends on both (ACC309: a loss divided before its
backward; ACC414: a mean divided a second time)."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import argument_value, dotted

#: Names and attributes that hold the number of processes.
PROCESS_COUNTS = frozenset({"num_processes", "world_size", "WORLD_SIZE", "n_processes"})


def process_count(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``accelerator.num_processes``, ``state.num_processes``, ``world_size``,
    ``dist.get_world_size()``, ``int(os.environ["WORLD_SIZE"])``, or a name bound to one."""
    if isinstance(value, cst.Call):
        names = script.call_names(value) | {dotted(value.func) or ""}
        if any(name.rsplit(".", 1)[-1] == "get_world_size" for name in names):
            return True
        if dotted(value.func) in ("int", "float") and value.args:
            inner = value.args[0].value
            return process_count(script, inner, at) or "WORLD_SIZE" in script.module.code_for_node(
                inner
            )
        return False
    name = dotted(value)
    if name is None:
        return False
    if name.rsplit(".", 1)[-1] in PROCESS_COUNTS:
        return True
    return _bound_to(script, value, at, process_count)


def mean_reduce(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.reduce(loss, "mean")``, or ``reduce(loss)`` of Accelerate's utilities
    (whose default is the mean): averaged over ranks with no gradient through it."""
    func = call.func
    if not (isinstance(func, (cst.Attribute, cst.Name)) and _last_part(func) == "reduce"):
        return False
    receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
    accelerators = facts_of(script).flow.names_of(Kind.ACCELERATOR)
    if receiver not in accelerators and "accelerate.utils.reduce" not in script.call_names(call):
        return False
    reduction = argument_value(call, "reduction", 1)
    if reduction is None:  # Accelerator.reduce sums by default; the utility function averages
        return receiver not in accelerators
    return isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "mean"


def _last_part(func: cst.BaseExpression) -> str:
    return (dotted(func) or "").rsplit(".", 1)[-1]


#: Calls that keep a tensor's values: ``gather(x).float().mean()`` is the gather's mean.
_KEEPS_VALUES = frozenset({"float", "double", "cpu", "detach", "numpy", "clone", "contiguous"})
_MEANS = frozenset({"torch.mean", "numpy.mean", "statistics.mean"})


def averaged_over_ranks(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``value`` is already a mean over the ranks: a mean ``reduce``, the mean of a gathered
    tensor (``accelerator.gather(loss).mean()``, ``torch.mean(...)`` or ``np.mean(...)`` of
    one), its ``.item()``, or a name last bound to one of these above ``at``."""
    if isinstance(value, cst.Call):
        func = value.func
        if mean_reduce(script, value):
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in ("item", *_KEEPS_VALUES):
            return averaged_over_ranks(script, func.value, at)
        if isinstance(func, cst.Attribute) and func.attr.value == "mean" and _over_samples(value):
            return _gathered(script, func.value, at)
        if script.call_names(value) & _MEANS and value.args and _over_samples(value, 1):
            return _gathered(script, value.args[0].value, at)
        return False
    return _bound_to(script, value, at, averaged_over_ranks)


def _over_samples(call: cst.Call, skip: int = 0) -> bool:
    """A mean over every value, or over the first axis (the one the gather joins)."""
    axis = argument_value(call, "dim", skip) or argument_value(call, "axis", skip)
    return axis is None or (isinstance(axis, cst.Integer) and axis.value == "0")


def _gathered(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """What ``accelerator.gather``/``gather_for_metrics`` returned, directly, through calls
    that keep its values (``.float()``, ``.cpu().numpy()``) or a name bound to it above ``at``."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _KEEPS_VALUES
    ):
        value = value.func.value
    if isinstance(value, cst.Call):
        func = value.func
        if not (
            isinstance(func, cst.Attribute) and func.attr.value in ("gather", "gather_for_metrics")
        ):
            return False
        accelerators = facts_of(script).flow.names_of(Kind.ACCELERATOR)
        return dotted(func.value) in accelerators
    return _bound_to(script, value, at, _gathered)


def _bound_to(
    script: ScriptModel,
    value: cst.BaseExpression,
    at: cst.CSTNode,
    test: Callable[[ScriptModel, cst.BaseExpression, cst.CSTNode], bool],
) -> bool:
    """``value`` is a plain name whose last binding above ``at`` is one assignment of a value
    that passes ``test`` there (``loss = accelerator.gather(l)``, then ``loss.mean()``)."""
    name = dotted(value)
    if name is None or "." in name:
        return False
    binding = last_binding(script, name, at)
    return (
        isinstance(binding, cst.Assign)
        and len(binding.targets) == 1
        and test(script, binding.value, binding)
    )


def several_processes(script: ScriptModel, test: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``test`` holds whenever more than one process runs: ``accelerator.num_processes > 1``,
    ``world_size != 1``, ``(n := state.num_processes) >= 2``, ``accelerator.distributed_type !=
    DistributedType.NO``, ``accelerator.use_distributed``, or an ``or`` with one of these. A
    barrier under it is skipped only by a run of one process, where it has nobody to wait for
    (ACC212). ``args.local_rank != -1`` is not one: under ``torchrun`` the flag stays -1."""
    if isinstance(test, cst.BooleanOperation):
        if isinstance(test.operator, cst.Or):
            return several_processes(script, test.left, at) or several_processes(
                script, test.right, at
            )
        return False
    if isinstance(test, cst.Attribute):
        return test.attr.value == "use_distributed"
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    left, comparison = test.left, test.comparisons[0]
    right, operator = comparison.comparator, comparison.operator
    if isinstance(left, cst.NamedExpr):
        left = left.value
    if (dotted(left) or "").endswith("distributed_type"):
        return isinstance(operator, (cst.NotEqual, cst.IsNot)) and (dotted(right) or "").endswith(
            "DistributedType.NO"
        )
    if not (isinstance(right, cst.Integer) and process_count(script, left, at)):
        return False
    bound = right.evaluated_value
    return (isinstance(operator, (cst.GreaterThan, cst.NotEqual)) and bound == 1) or (
        isinstance(operator, cst.GreaterThanEqual) and bound == 2
    )
