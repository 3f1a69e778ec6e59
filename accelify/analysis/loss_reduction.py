"""Whether a loss call averages over its batch or sums it, read where the loss was built.

``criterion(out, y)`` is one batch's mean only if ``criterion`` was constructed with the
default reduction: ``nn.CrossEntropyLoss(reduction="sum")`` bound to ``criterion`` (in the same
function, on the instance in ``__init__``, handed in as a parameter, returned by a factory of
the file) makes the same call a batch's total. The evaluation analysis asks this before it
calls a sum of such values "a sum of batch means": a total over samples, gathered, is the whole
set's total, and needs no review line.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted

#: How many bindings, returns and call sites one lookup follows before it gives up.
_MAX_STEPS = 50
#: Methods that hand back the loss module they are called on.
_MOVES = frozenset({"to", "cuda", "cpu", "float", "half", "double", "eval", "train"})


def reduction_of(call: cst.Call) -> str | None:
    """The ``reduction=`` a loss call or construction spells as a string, else None."""
    for argument in call.args:
        if (
            argument.keyword is not None
            and argument.keyword.value == "reduction"
            and isinstance(argument.value, cst.SimpleString)
        ):
            value = argument.value.evaluated_value
            return value if isinstance(value, str) else None
    return None


def sums_its_batch(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` computes a batch's total, not its mean: it says ``reduction="sum"`` (or
    ``"none"``) itself, or every construction the called object can come from says so (and
    none is unknown). A loss whose construction cannot be found is taken as averaging, the
    default of torch's losses."""
    own = reduction_of(call)
    if own is not None:
        return own != "mean"
    made = list(_constructions(script, call.func, call, [0]))
    if not made or any(m is None for m in made):
        return False
    reductions = {reduction_of(m) for m in made if m is not None}
    return None not in reductions and "mean" not in reductions


def made_as_a_loss(script: ScriptModel, call: cst.Call) -> bool:
    """``crit(out, yb)`` where every construction of ``crit`` found is one of torch's loss
    modules (``crit = nn.CrossEntropyLoss()``): a loss whatever the name it is kept under, so
    the evaluation analysis reads it as one batch's mean as it reads ``criterion(out, y)``."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _MOVES:
        return False
    made = list(_constructions(script, call.func, call, [0]))
    return bool(made) and all(
        m is not None and any(_a_loss_module(name) for name in script.call_names(m)) for m in made
    )


def _a_loss_module(qualified: str) -> bool:
    """``torch.nn.CrossEntropyLoss``, ``torch.nn.modules.loss.MSELoss``."""
    return qualified.startswith("torch.nn.") and qualified.endswith("Loss")


def _constructions(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, steps: list[int]
) -> Iterator[cst.Call | None]:
    """The calls that built the object ``value`` holds at ``at`` (None for one not found):
    through the last binding above ``at``, an instance attribute the class assigns, a
    parameter's arguments at every call site, a module global, and a factory's returns."""
    steps[0] += 1
    if steps[0] > _MAX_STEPS:
        yield None
        return
    if isinstance(value, cst.IfExp):
        yield from _constructions(script, value.body, at, steps)
        yield from _constructions(script, value.orelse, at, steps)
        return
    if isinstance(value, cst.Call):
        yield from _made_by(script, value, steps)
        return
    name = dotted(value)
    if name is None:
        yield None
        return
    # imported here: loss_sources reads the facts, which the evaluation analysis helps build
    from accelify.analysis.loss_sources import last_binding

    binding = last_binding(script, name, at)
    if isinstance(binding, (cst.Assign, cst.AnnAssign)) and binding.value is not None:
        yield from _constructions(script, binding.value, binding, steps)
        return
    if binding is not None:
        yield None
        return
    yield from _elsewhere(script, name, at, steps)


def _elsewhere(
    script: ScriptModel, name: str, at: cst.CSTNode, steps: list[int]
) -> Iterator[cst.Call | None]:
    """``name`` not bound above ``at`` in its own function: an attribute the class assigns
    (``self.criterion``), a parameter (what every call passes), or a module global."""
    index = script.index
    if name.startswith("self.") and name.count(".") == 1:
        assigned = index.assignments_in_class(name, at)
        if not assigned:
            yield None
        for assign in assigned:
            yield from _assigned_value(script, assign, steps)
        return
    if "." in name:
        yield None
        return
    function = index.enclosing_function(at)
    if function is not None and any(
        p.name.value == name for p in (*function.params.params, *function.params.kwonly_params)
    ):
        calls = script.call_graph.calls_of(function)
        if not calls:
            yield None
        for call, implicit in calls:
            passed = dict(bound_arguments(function, call, implicit)).get(name)
            if passed is None:
                yield None
            else:
                yield from _constructions(script, passed.value, call, steps)
        return
    globals_ = [a for a in index.assignments_to(name) if index.enclosing_function(a) is None]
    if not globals_:
        yield None
    for assign in globals_:
        yield from _assigned_value(script, assign, steps)


def _assigned_value(
    script: ScriptModel, assign: cst.CSTNode, steps: list[int]
) -> Iterator[cst.Call | None]:
    value = getattr(assign, "value", None)
    if not isinstance(assign, (cst.Assign, cst.AnnAssign)) or value is None:
        yield None
        return
    if isinstance(assign, cst.Assign) and any(
        isinstance(t.target, (cst.Tuple, cst.List)) for t in assign.targets
    ):
        yield None  # ``crit, opt = build()``: which element is unknown here
        return
    yield from _constructions(script, value, assign, steps)


def _made_by(script: ScriptModel, call: cst.Call, steps: list[int]) -> Iterator[cst.Call | None]:
    """A factory of the file (``make_criterion()``): what each of its returns builds. Anything
    else (``nn.CrossEntropyLoss(...)``, ``partial(F.cross_entropy, reduction="sum")``, a loss
    class of the file) is the construction itself."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _MOVES:
        yield from _constructions(script, func.value, call, steps)  # ``Loss(...).to(device)``
        return
    target = script.call_graph.callee(call)
    if target is None or target[0].name.value == "__init__":
        yield call
        return
    returns = script.index.own_returns(target[0])
    if not returns:
        yield None
    for returned in returns:
        if returned.value is None:
            yield None
        else:
            yield from _constructions(script, returned.value, returned, steps)


#: The functional spellings of torch's CTC loss.
_CTC_FUNCTIONS = frozenset({"ctc_loss"})


def is_ctc_loss(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` computes a CTC loss: ``F.ctc_loss(...)``, or a call of an object some
    construction of which is ``nn.CTCLoss(...)`` (bound in the function, on the instance, handed
    in, returned by a factory). CTC reads its log-probabilities as [time, batch, classes] and its
    targets as the batch's labels joined end to end, neither of them one row per sample."""
    name = dotted(call.func)
    if name is not None and name.rsplit(".", 1)[-1] in _CTC_FUNCTIONS:
        return True
    return any(
        made is not None and (dotted(made.func) or "").rsplit(".", 1)[-1] == "CTCLoss"
        for made in _constructions(script, call.func, call, [0])
    )
