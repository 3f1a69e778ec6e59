"""Per-rank means summed over the ranks and shown as one mean: ``accelerator.reduce(loss)``
(``Accelerator.reduce`` sums by default, in HF Accelerate and in accelify's runtime alike;
Accelerate's ``reduce`` utility function averages) of a batch's mean loss, then printed or
logged. The sum of N means is N times their mean: on 2 processes the logged loss doubles, on
one it is right, and nothing fails.

A per-rank mean is, followed through the names it is bound to and through calls that keep its
values (``.detach()``, ``.clone()``, ``.item()``): ``x.mean()``, ``torch.mean(x)``, a quotient
by this rank's own count (``total / len(loader)``, ``/ y.size(0)``: `one_ranks_count`; not
``correct / len(loader.dataset)`` nor one by a reduced count, each rank's share of the mean),
or a model's loss (``outputs.loss``, what the file hands to ``backward``), unless it was
computed with ``reduction="sum"``.
Also a running total of per-rank means (``total_loss += loss.detach()``) summed over the ranks
and then divided by ``len()`` of a prepared DataLoader, this rank's count of batches: the sum
of N ranks' totals over one rank's count is again N times the mean.
Shown: the reduced value, or a name, a dict, a running total it goes into, reaches the
arguments of a print, a logger, a tracker's ``log`` or a progress bar, in the same function or
in a caller it is returned to, with no division by the process count on the way.

Any sum over the ranks (a summing ``reduce``, or ``accelerator.gather(total).sum()``) divided on
its way to the show by ``len()`` of a prepared DataLoader, one rank's count of batches, is N
times what one process shows, whatever it summed (batch means, per-sample sums, counts):
``accelerator.gather(total).sum() / len(val_loader)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import libcst as cst

from accelify.analysis import names
from accelify.analysis.facts import facts_of
from accelify.analysis.loops import first_enumerate_name
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.objects import bound_arguments
from accelify.analysis.process_count import process_count
from accelify.analysis.sample_counts import shows
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import argument_value, dotted, walk

#: Calls that hand back the same values: ``loss.detach().clone()``, ``loss.item()``.
_KEEPS_VALUES = frozenset({"detach", "clone", "item", "float", "double", "cpu", "contiguous"})
#: Functions whose value is a mean of what they are handed.
_MEANS = frozenset({"torch.mean", "numpy.mean", "statistics.mean", "statistics.fmean"})
#: Calls that make a tensor of the value they are handed.
_TENSOR_OF = frozenset({"torch.tensor", "torch.as_tensor", "torch.Tensor"})
#: How many names, returns and running totals the walks follow.
_DEPTH = 4


@dataclass
class SummedMean:
    """One ``accelerator.reduce`` that sums a per-rank mean, and where the sum is shown."""

    reduce: cst.Call
    #: the per-rank mean as the reduce's argument spells it
    mean: cst.BaseExpression
    #: the print, log or progress-bar call that shows the sum
    shown: cst.Call
    #: the reduce says ``reduction="sum"`` itself (else it sums by default)
    said_sum: bool = False
    #: one rank's count of batches the sum is divided by on the way (``len(val_loader)``)
    over: cst.BaseExpression | None = None
    #: a helper's parameter reduced: the call that hands it the per-rank mean
    handed: cst.Call | None = None


def summed_means(script: ScriptModel) -> list[SummedMean]:
    """Every summing ``reduce`` of a per-rank mean whose sum is shown undivided, and every sum
    over the ranks shown divided by one rank's count of batches."""
    found = []
    accelerators = facts_of(script).flow.names_of(Kind.ACCELERATOR)
    for call in script.index.attributes_named("reduce"):
        reduce = script.parent(call)
        if not (isinstance(reduce, cst.Call) and reduce.func is call and reduce.args):
            continue
        if dotted(call.value) not in accelerators or not _sums(reduce):
            continue
        argument = reduce.args[0].value
        said = argument_value(reduce, "reduction", 1) is not None
        handed = (
            None
            if per_rank_mean(script, argument, reduce, _DEPTH)
            else (_handed_means(script, argument, reduce))
        )
        if handed is not False:
            shown = _shown(script, reduce, _DEPTH, divided=True)
            if shown is not None:
                found.append(SummedMean(reduce, argument, shown[0], said, handed=handed))
                continue
        shown = _shown(script, reduce, _DEPTH, divided=False)
        if shown is not None:
            found.append(SummedMean(reduce, argument, shown[0], said, shown[1]))
    for summed, argument in _gathered_sums(script, accelerators):
        if per_rank_mean(script, argument, summed, _DEPTH):
            # ``accelerator.gather(loss).sum()``: every rank's mean added up, as a reduce's
            shown = _shown(script, summed, _DEPTH, divided=True)
            if shown is not None:
                found.append(SummedMean(summed, argument, shown[0], True))
                continue
        shown = _shown(script, summed, _DEPTH, divided=False)
        if shown is not None:
            found.append(SummedMean(summed, argument, shown[0], True, shown[1]))
    return found


def _handed_means(
    script: ScriptModel, argument: cst.BaseExpression, at: cst.CSTNode
) -> cst.Call | Literal[False]:
    """``argument`` is a parameter of the helper around ``at`` (``def all_reduce(value):
    return accelerator.reduce(value)``) and every call of that helper in the file hands it a
    per-rank mean (``all_reduce(loss.detach())``): the first such call; else False."""
    function = facts_of(script).placement.enclosing_function(at)
    if function is None or not isinstance(argument, cst.Name):
        return False
    if argument.value not in {p.name.value for p in function.params.params}:
        return False
    if last_binding(script, argument.value, at) is not None:
        return False  # rebound inside the helper before the reduce
    sites = script.call_graph.calls_of(function)
    if not sites:
        return False
    for site, implicit in sites:
        handed = dict(bound_arguments(function, site, implicit)).get(argument.value)
        if handed is None or not per_rank_mean(script, handed.value, site, _DEPTH - 1):
            return False
    return sites[0][0]


def _gathered_sums(
    script: ScriptModel, accelerators: set[str]
) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """``accelerator.gather(total).sum()`` (or of ``gather_for_metrics``, or
    ``torch.sum(accelerator.gather(total))``), with what was gathered: a sum over the ranks."""
    found = []
    for member in ("gather", "gather_for_metrics"):
        for call in script.index.attributes_named(member):
            gather = script.parent(call)
            if not (isinstance(gather, cst.Call) and gather.func is call and gather.args):
                continue
            if dotted(call.value) not in accelerators:
                continue
            summed = script.parent(gather)
            if isinstance(summed, cst.Attribute) and summed.value is gather:
                summed = script.parent(summed) if summed.attr.value == "sum" else None
                if isinstance(summed, cst.Call) and not summed.args:
                    found.append((summed, gather.args[0].value))
            elif (
                isinstance(summed, cst.Arg)
                and isinstance((outer := script.parent(summed)), cst.Call)
                and script.call_names(outer) & {"torch.sum"}
                and len(outer.args) == 1
            ):
                found.append((outer, gather.args[0].value))
    return found


def _sums(reduce: cst.Call) -> bool:
    """``Accelerator.reduce``'s reduction is ``"sum"``: its default, or said so."""
    reduction = argument_value(reduce, "reduction", 1)
    return reduction is None or (
        isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "sum"
    )


def per_rank_mean(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> bool:
    """``value`` at ``at`` is a mean over this rank's values (see the module docstring)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        member = value.func.attr.value
        if member == "mean" and not value.args:
            return True
        if member not in _KEEPS_VALUES:
            break
        value = value.func.value
    if isinstance(value, cst.Call):
        if script.call_names(value) & _MEANS and len(value.args) == 1:
            return True
        if script.call_names(value) & _TENSOR_OF and value.args:
            return per_rank_mean(script, value.args[0].value, at, depth)
        target = script.call_graph.callee(value)
        if target is not None and depth > 0:  # ``loss = training_step(model, batch)``
            returns = [r for r in script.index.own_returns(target[0]) if r.value is not None]
            return bool(returns) and all(
                per_rank_mean(script, r.value, r, depth - 1)  # type: ignore[arg-type]
                for r in returns
            )
        return _loss_call(script, value)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
        return one_ranks_count(script, value.right, at, depth)
    if isinstance(value, cst.Attribute) and value.attr.value == "loss":
        return True  # ``outputs.loss``: the mean over the batch a transformers model returns
    name = dotted(value)
    if name is None or depth <= 0:
        return False
    binding = last_binding(script, name, at)
    if isinstance(binding, cst.Assign) and len(binding.targets) == 1:
        return per_rank_mean(script, binding.value, binding, depth - 1)
    if isinstance(binding, cst.AugAssign) and isinstance(binding.operator, cst.DivideAssign):
        return one_ranks_count(script, binding.value, binding, depth - 1)
    return False


def one_ranks_count(
    script: ScriptModel, divisor: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> bool:
    """``divisor`` at ``at`` counts this rank's own items, so a quotient by it is a per-rank
    mean: ``len()`` of a prepared (or any) DataLoader, of a batch or of a list this rank fills,
    ``x.size(0)``/``x.shape[0]``/``x.numel()``, a batch size, a loop's ``step + 1``, a counter
    the file increments (``n += y.size(0)``), or a name bound to one. Not one: ``len(X.dataset)``
    or another whole-data count, a reduced or gathered count (``accelerator.reduce(count)``),
    the process count, a number: a quotient by those is no mean a sum over ranks inflates."""
    if isinstance(divisor, cst.BinaryOperation):  # ``step + 1``, ``len(loader) * epochs``
        if isinstance(divisor.operator, (cst.Add, cst.Multiply)):
            sides = (divisor.left, divisor.right)
            counts = [s for s in sides if not isinstance(s, (cst.Integer, cst.Float))]
            return bool(counts) and all(one_ranks_count(script, s, at, depth) for s in counts)
        return False
    if isinstance(divisor, cst.Call):
        func = divisor.func
        if dotted(func) in ("len", "float", "int", "max") and divisor.args:
            inner = divisor.args[0].value
            if dotted(func) != "len":  # ``max(n, 1)``, ``float(n)``
                return one_ranks_count(script, inner, at, depth)
            return _one_ranks_collection(script, inner, at)
        if isinstance(func, cst.Attribute) and func.attr.value in ("size", "numel", "item"):
            return func.attr.value != "item" or one_ranks_count(script, func.value, at, depth)
        return False
    if isinstance(divisor, cst.Subscript):  # ``x.shape[0]``
        return isinstance(divisor.value, cst.Attribute) and divisor.value.attr.value == "shape"
    name = dotted(divisor)
    if name is None or process_count(script, divisor, at):
        return False
    if "batch_size" in name.rsplit(".", 1)[-1] or _enumerate_index(script, name):
        return True
    binding = last_binding(script, name, at)
    if isinstance(binding, cst.AugAssign):
        return isinstance(binding.operator, cst.AddAssign)  # a counter this rank keeps
    if isinstance(binding, cst.Assign) and depth > 0:
        if any(  # ``count = 0`` then ``count += y.numel()`` in the loop below it
            isinstance(b, cst.AugAssign) and isinstance(b.operator, cst.AddAssign)
            for b in script.index.own_bindings(
                facts_of(script).placement.enclosing_function(at)
            ).get(name, ())
        ) and isinstance(binding.value, (cst.Integer, cst.Float)):
            return True
        return one_ranks_count(script, binding.value, binding, depth - 1)
    return False


def _enumerate_index(script: ScriptModel, name: str) -> bool:
    """``step`` of ``for step, batch in enumerate(loader)``: this rank's count of batches."""
    return any(
        isinstance(loop.node.iter, cst.Call)
        and dotted(loop.node.iter.func) == "enumerate"
        and name in first_enumerate_name(loop.node.target)
        for loop in script.loops
    )


def _one_ranks_collection(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """What ``len()`` of ``value`` counts is this rank's: a DataLoader (prepared, one rank's
    shard; or not, the batches every rank runs), a loop's batch, a list the file appends to."""
    name = dotted(value)
    if name is None or name.endswith(".dataset"):
        return False
    if name in script.prepared_names:
        return True
    if facts_of(script).flow.kind_of(name, at) is Kind.DATALOADER:
        return True
    if any(name in loop.batch_names for loop in script.loops):
        return True
    return any(
        dotted(a.value) == name and isinstance(script.parent(a), cst.Call)
        for a in script.index.attributes_named("append")
    )


def _loss_call(script: ScriptModel, call: cst.Call) -> bool:
    """``F.cross_entropy(logits, y)``, ``criterion(out, y)`` with a loss module: a mean unless
    it says ``reduction="sum"`` (or ``"none"``)."""
    reduction = argument_value(call, "reduction", None)
    if reduction is not None:
        return isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "mean"
    qualified = script.call_names(call)
    if any(n.startswith("torch.nn.functional.") and n.endswith("_loss") for n in qualified):
        return True
    if qualified & {"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss"}:
        return True
    criterion = dotted(call.func)
    if criterion is None:
        return False
    binding = last_binding(script, criterion, call)
    made = binding.value if isinstance(binding, cst.Assign) else None
    if made is None:
        for assign in script.index.assignments_to(criterion):
            made = assign.value
    return (
        isinstance(made, cst.Call)
        and any(
            n.startswith(names.NN_PREFIX) and n.endswith("Loss") for n in script.call_names(made)
        )
        and _mean_reduction(argument_value(made, "reduction", None))
    )


def _mean_reduction(reduction: cst.BaseExpression | None) -> bool:
    """A loss module's ``reduction``: left out (the mean) or ``"mean"`` spelled out."""
    return reduction is None or (
        isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "mean"
    )


#: A show call, and the count of one rank's batches divided into the value on the way to it
#: (None where the value was N times a mean already).
_Shown = tuple[cst.Call, cst.BaseExpression | None]


def _shown(
    script: ScriptModel, node: cst.CSTNode, depth: int, divided: bool | cst.BaseExpression
) -> _Shown | None:
    """The show call ``node``'s value reaches undivided by the process count (see the module
    docstring), or None. ``divided``: the value is already N times a mean (True), or the count
    of one rank's batches it was divided by on the way, which makes a sum over the ranks one."""
    child = node
    for ancestor in script.ancestors(node):
        if (
            isinstance(ancestor, cst.BinaryOperation)
            and isinstance(ancestor.operator, cst.Divide)
            and ancestor.left is child
        ):
            if _over_processes(script, ancestor.right, ancestor, _DEPTH):
                return None  # divided back into a mean
            if not divided and _one_ranks_batches(script, ancestor.right):
                divided = ancestor.right
        if (
            isinstance(ancestor, cst.Call)
            and ancestor.func is not child
            and shows_value(script, ancestor)
        ):
            if divided is False:
                return None
            return ancestor, None if divided is True else divided
        if isinstance(ancestor, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            return _shown_through(script, ancestor, depth, divided)
        if isinstance(ancestor, cst.Return):
            return _returned_and_shown(script, ancestor, depth, divided)
        if isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return None
        child = ancestor
    return None


def _over_processes(
    script: ScriptModel, divisor: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> bool:
    """``divisor`` counts the processes, alone or as a factor: ``accelerator.num_processes``,
    ``(n_batches * accelerator.num_processes)``, a name bound to such a product."""
    if process_count(script, divisor, at):
        return True
    if isinstance(divisor, cst.BinaryOperation) and isinstance(divisor.operator, cst.Multiply):
        return _over_processes(script, divisor.left, at, depth) or _over_processes(
            script, divisor.right, at, depth
        )
    name = dotted(divisor)
    if name is None or depth <= 0:
        return False
    binding = last_binding(script, name, at)
    return (
        isinstance(binding, cst.Assign)
        and len(binding.targets) == 1
        and _over_processes(script, binding.value, binding, depth - 1)
    )


def _one_ranks_batches(script: ScriptModel, divisor: cst.BaseExpression, depth: int = 0) -> bool:
    """``len(eval_loader)`` of a prepared DataLoader (``len(self.val_loader)`` of a trainer's, a
    name bound to one), or a counter of its batches (`_batch_counter`): the batches of this
    rank's shard (``step + 1`` of the loader's ``enumerate``). Also through what keeps it one
    rank's count: ``max(n, 1)``, ``.item()``, and the largest or smallest of the ranks' counts
    (``accelerator.gather_for_metrics(torch.tensor(len(loader))).max().item()``, as an MLP
    trainer's evaluation divides by)."""
    inner = _count_kept(divisor)
    if inner is not None and depth < 6:
        return _one_ranks_batches(script, inner, depth + 1)
    if (  # ``step + 1`` after ``for step, batch in enumerate(loader)``
        isinstance(divisor, cst.BinaryOperation)
        and isinstance(divisor.operator, cst.Add)
        and isinstance(divisor.right, cst.Integer)
        and divisor.right.value == "1"
    ):
        divisor = divisor.left
    name = dotted(divisor)
    if name is not None:
        if _batch_counter(script, name, divisor) or _batch_index(script, name):
            return True
        binding = last_binding(script, name, divisor)
        if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
            return False
        divisor = binding.value
    if depth < 6 and _count_kept(divisor) is not None:
        return _one_ranks_batches(script, divisor, depth + 1)
    if not (
        isinstance(divisor, cst.Call) and dotted(divisor.func) == "len" and len(divisor.args) == 1
    ):
        return False
    measured = dotted(divisor.args[0].value)
    if measured in script.prepared_names:
        return True
    # ``len(loader)`` of a parameter the callers hand a prepared DataLoader
    # (``evaluate(accelerator, model, val_loader, loss_fn)``)
    facts = facts_of(script)
    function = facts.placement.enclosing_function(divisor)
    return (
        function is not None
        and measured is not None
        and facts.flow.parameter_prepared(function, measured) is True
    )


#: Collectives whose ``.max()``/``.min()`` is one of the ranks' own values.
_GATHERS = ("gather", "gather_for_metrics", "all_gather")


def _count_kept(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """What ``value`` keeps as it is, for a count: ``n`` of ``max(n, 1)``, ``x.item()``,
    ``torch.tensor(n, ...)``, and ``accelerator.gather(x).max()`` (one rank's ``x``, the
    largest); None for anything else."""
    if not isinstance(value, cst.Call):
        return None
    func = value.func
    name = dotted(func) or ""
    positional = [a.value for a in value.args if a.keyword is None and not a.star]
    if name in ("max", "min") and len(positional) == 2:
        small = [p for p in positional if isinstance(p, cst.Integer)]
        others = [p for p in positional if not isinstance(p, cst.Integer)]
        return others[0] if len(small) == 1 and len(others) == 1 else None
    if name in ("torch.tensor", "torch.as_tensor") and positional:
        return positional[0]
    if isinstance(func, cst.Attribute) and not value.args:
        receiver = func.value
        if func.attr.value == "item":
            return receiver
        if (
            func.attr.value in ("max", "min")
            and isinstance(receiver, cst.Call)
            and isinstance(receiver.func, cst.Attribute)
            and receiver.func.attr.value in _GATHERS
            and len(receiver.args) == 1
        ):
            return receiver.args[0].value
    return None


def _batch_index(script: ScriptModel, name: str) -> bool:
    """``step`` of ``for step, batch in enumerate(loader)`` over a prepared DataLoader, and of
    no other loop: ``step + 1`` after it counts this rank's batches."""
    loops = [
        loop
        for loop in script.loops
        if isinstance(loop.node.iter, cst.Call)
        and dotted(loop.node.iter.func) == "enumerate"
        and name in first_enumerate_name(loop.node.target)
    ]
    flow = facts_of(script).flow
    return bool(loops) and all(flow.over_prepared_loader(loop) for loop in loops)


def _batch_counter(script: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``n_batches``, set to 0 and raised by ``n_batches += 1`` in a loop over a prepared
    DataLoader (`_prepared_loop_around`: also inside ``accumulate()`` or under a test of the
    step), and bound nowhere else in the function around ``at``: one rank's count of batches,
    as ``len()`` of its loader is."""
    function = facts_of(script).placement.enclosing_function(at)
    bindings = list(script.index.own_bindings(function).get(name, ()))
    counts = [b for b in bindings if isinstance(b, cst.AugAssign)]
    if not counts:
        return False
    for binding in bindings:
        if isinstance(binding, cst.AugAssign):
            if not (
                isinstance(binding.operator, cst.AddAssign)
                and isinstance(binding.value, cst.Integer)
                and binding.value.value == "1"
            ):
                return False
        elif not (isinstance(binding, cst.Assign) and _zero_for(binding, name)):
            return False
    return all(_prepared_loop_around(script, count) is not None for count in counts)


def _prepared_loop_around(script: ScriptModel, node: cst.CSTNode) -> Loop | None:
    """The innermost loop around ``node`` in its function, where that loop reads a prepared
    DataLoader (also through ``tqdm``/``enumerate``, or a helper's parameter its callers fill
    with one); inside ``with accelerator.accumulate(model):`` or a test of the step
    (``if accelerator.sync_gradients:``) too: a count this rank keeps of its own batches or
    steps."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, (cst.For, cst.While)):
            loop = next((loop for loop in script.loops if loop.node is ancestor), None)
            if loop is not None and facts_of(script).flow.over_prepared_loader(loop):
                return loop
            return None
    return None


def _zero_for(assign: cst.Assign, name: str) -> bool:
    """``assign`` sets ``name`` to 0: ``n = 0``, or ``total, n = 0.0, 0``."""
    for target in assign.targets:
        value = assign.value
        if isinstance(target.target, cst.Tuple) and isinstance(value, cst.Tuple):
            pairs = zip(target.target.elements, value.elements, strict=False)
            for element, bound in pairs:
                if dotted(element.value) == name:
                    return isinstance(bound.value, cst.Integer) and bound.value.value == "0"
        elif dotted(target.target) == name:
            return isinstance(value, cst.Integer) and value.value == "0"
    return False


def shows_value(script: ScriptModel, call: cst.Call) -> bool:
    """A print, a logger's, a tracker's (``accelerator.log``) or a progress bar's call, or
    ``accelerator.print``."""
    func = call.func
    return shows(script, call) or (isinstance(func, cst.Attribute) and func.attr.value == "print")


def _shown_through(
    script: ScriptModel,
    statement: cst.Assign | cst.AugAssign | cst.AnnAssign,
    depth: int,
    divided: bool | cst.BaseExpression,
) -> _Shown | None:
    """The show a name bound (or a running total added to) by ``statement`` reaches."""
    if depth <= 0:
        return None
    if isinstance(statement, cst.Assign):
        if len(statement.targets) != 1:
            return None
        target = statement.targets[0].target
    else:
        target = statement.target
    if isinstance(target, cst.Subscript) and isinstance(statement, cst.Assign):
        target = target.value  # ``logs["loss"] = value``: the dict holds it from here on
    name = dotted(target)
    if name is None:
        return None
    if _divided_by_processes(script, name, statement):
        return None
    for read in _reads_after(script, name, statement):
        shown = _shown(script, read, depth - 1, divided)
        if shown is not None:
            return shown
    return None


def _reads_after(script: ScriptModel, name: str, statement: cst.CSTNode) -> list[cst.CSTNode]:
    """Reads of ``name`` (a plain name, or ``self.x`` anywhere in the class) after
    ``statement``: in its function, and for a running total in a loop, anywhere in it."""
    placement = facts_of(script).placement
    function = placement.enclosing_function(statement)
    if "." in name:
        if not name.startswith("self.") or name.count(".") != 1:
            return []
        owner = script.index.enclosing_class(statement)
        return [
            a
            for a in script.index.attributes_named(name.split(".", 1)[1])
            if dotted(a) == name
            and a is not _target_of(statement)
            and script.index.enclosing_class(a) is owner
        ]
    here = script.order(statement)
    return [
        read
        for read in script.index.names_spelled(name)
        if placement.enclosing_function(read) is function
        and read is not _target_of(statement)
        and (script.order(read) > here or isinstance(statement, cst.AugAssign))
        and not _is_target(script, read)
    ]


def _target_of(statement: cst.CSTNode) -> cst.CSTNode | None:
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        return statement.targets[0].target
    return getattr(statement, "target", None)


def _is_target(script: ScriptModel, node: cst.CSTNode) -> bool:
    parent = script.parent(node)
    return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and (
        getattr(parent, "target", None) is node
    )


def _divided_by_processes(script: ScriptModel, name: str, statement: cst.CSTNode) -> bool:
    """``name /= accelerator.num_processes`` or ``name / world_size`` in the same function."""
    function = facts_of(script).placement.enclosing_function(statement)
    body = function if function is not None else script.module
    for node in walk(body):
        if (
            isinstance(node, cst.AugAssign)
            and isinstance(node.operator, cst.DivideAssign)
            and dotted(node.target) == name
            and process_count(script, node.value, node)
        ):
            return True
        if (
            isinstance(node, cst.BinaryOperation)
            and isinstance(node.operator, cst.Divide)
            and dotted(node.left) == name
            and process_count(script, node.right, node)
        ):
            return True
    return False


def _returned_and_shown(
    script: ScriptModel, returned: cst.Return, depth: int, divided: bool | cst.BaseExpression
) -> _Shown | None:
    """``return total_loss`` from an evaluation helper, shown by the caller."""
    function = facts_of(script).placement.enclosing_function(returned)
    if function is None or depth <= 0:
        return None
    for site, _ in script.call_graph.calls_of(function):
        shown = _shown(script, site, depth - 1, divided)
        if shown is not None:
            return shown
    return None
