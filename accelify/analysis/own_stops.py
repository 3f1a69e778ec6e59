"""Stops decided on a value one rank computed alone: the test of a ``break`` that reads what
this rank folded from its shard of a prepared DataLoader (`own_values`), itself or through the
counter the loop steps under a test of it (``if val_loss < best: ... bad = 0`` / ``else: bad +=
1``, then ``if bad >= patience: break``), or through an object's method that the loop hands the
value: an early-stopping object's flag or return (``stopper(val_loss)`` then ``if
stopper.early_stop: break``), or a callback held in a list on the trainer that sets an attribute
of the trainer handed to it (``for cb in self.callbacks: cb.on_epoch_end(self, logs)``, where
``EarlyStopping.on_epoch_end`` sets ``trainer.should_stop``, and ``fit()`` breaks on
``self.should_stop``), the value read from a dict the loop builds (``logs["train_loss"]``).

ACC420 reports such a stop; the conversion makes it collective (`collective_stops`), asking with
the loaders it prepares (`ShardView`), so both decide on one analysis."""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from accelify.analysis.agreed_extents import agreed_size_names
from accelify.analysis.collectives import agrees_across_ranks, read_outside_agreement
from accelify.analysis.dataflow import statements
from accelify.analysis.facts import Facts
from accelify.analysis.loss_sources import last_binding, runs_before
from accelify.analysis.objects import bound_arguments, star_forwarded
from accelify.analysis.own_values import OwnValues, ShardView, binds, may_bind, names_read
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.structure_tests import model_outputs, structure_only_names
from accelify.analysis.syntax import dotted, walk

#: How many bindings one trace follows before it gives up (and reports nothing).
_MAX_BINDINGS = 60

#: How many calls deep the calls of an early-stopping object held by the instance are looked for.
_HELPER_DEPTH = 2


@dataclass(frozen=True)
class Decided:
    """What makes a stop's test this rank's own: the test reads a value the rank folded from its
    shard of a prepared DataLoader, or a counter the loop steps under a test of one."""

    read: str  # what the stop's test reads
    origin: cst.CSTNode  # where the rank folds its shard into the value
    stepped: cst.CSTNode | None = None  # the counter's binding under ``condition``
    condition: cst.If | None = None  # the test of the rank's own value the counter is stepped under
    call: cst.Call | None = None  # the loop's call of an object's method that decides the stop
    method: cst.FunctionDef | None = None  # the method it runs: ``EarlyStopping.__call__``
    argument: cst.BaseExpression | None = None  # what the call hands it of the rank's own


def decided_on_own_shard(
    facts: Facts, test: cst.If, loop: cst.For, view: ShardView | None = None
) -> Decided | None:
    """The stop's test reads a value this rank computed from its shard of a prepared DataLoader
    and never reduced (``if val_loss > limit: break``), or a counter the loop steps under a test
    of one: the early stop's ``if val_loss < best: best = val_loss; bad = 0`` / ``else: bad +=
    1``, then ``if bad >= patience: break``. The counter is followed through every binding the
    loop gives it (and the names those read), wherever it stands in the loop: the next epoch
    reads what the last one stepped."""
    script = facts.model
    values = OwnValues(facts, view)
    read_as_is = read_outside_agreement(script, test.test)  # not ``val_loss`` of ``reduce(...)``
    # ``'loss' not in out``: the output's structure, the same on every rank
    read_as_is -= structure_only_names(test.test, model_outputs(script, read_as_is, test))
    # ``gt.shape[-1]`` of clips cut to a length every rank agrees on (a fresh trace for each
    # name: a trace remembers what it has followed)
    read_as_is -= agreed_size_names(
        script,
        test.test,
        test,
        lambda name, _: OwnValues(facts, view).origin(name, name, {}) is not None,
    )
    pending = [
        n
        for n in [*names_read(script, test.test), *_held_members(test.test)]
        if n.split(".", 1)[0] in read_as_is and not _agreed_at(script, n, test)
    ]
    decided = _decided_by_object(facts, test.test, loop, view)  # ``if stopper.early_stop:``
    if decided is not None:
        return decided
    for binding in statements(loop.body):  # ``stop = stopper.step(val_loss)``, ``if stop:``
        bound = [name for name in pending if binds(script, binding, name)]
        decided = _decided_by_object(facts, binding, loop, view) if bound else None
        if decided is not None:
            read = f"{bound[0]}, bound at line {script.line(binding)} to {decided.read}"
            return replace(decided, read=read)
    for node in walk(test.test):
        name = dotted(node) if isinstance(node, cst.Name | cst.Attribute) else None
        if name in pending and (origin := values.origin(node, test, {})) is not None:
            return Decided(name, origin)
    seen: set[str] = set()
    while pending and len(seen) < _MAX_BINDINGS:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for binding in statements(loop.body):
            if not may_bind(script, binding, name) or agrees(script, binding):
                continue
            decided = _decided_by_object(facts, binding, loop, view)
            if decided is not None:
                read = f"{name}, bound at line {script.line(binding)} to {decided.read}"
                return replace(decided, read=read)
            for condition in conditions_around(script, binding, loop):
                origin = values.origin(condition.test, condition, {})
                if origin is not None:
                    return Decided(name, origin, binding, condition)
            pending.extend(names_read(script, binding))
    return None


def _held_members(test: cst.BaseExpression) -> list[str]:
    """The counters the test reads on an object other than the instance itself:
    ``self.state.bad`` of ``if self.state.bad >= self.patience:``, ``state.bad`` of ``if
    state.bad >= patience:`` (`names_read` gives ``self.state`` and ``state``, which the loop
    never binds, while ``self.state.bad += 1`` or ``setattr(self.state, "bad", ...)`` steps the
    counter). Followed like any name the test reads: only the loop's bindings of it count."""
    found: list[str] = []
    for node in walk(test):
        name = dotted(node) if isinstance(node, cst.Attribute) else None
        if name is None or name in found:
            continue
        if name.count(".") >= (2 if name.startswith("self.") else 1):
            found.append(name)
    return found


def _agreed_at(script: ScriptModel, name: str, test: cst.CSTNode) -> bool:
    """``name``'s last binding above the test holds what a collective made the same on every
    rank and runs whenever the test does (``total = accelerator.reduce(...)`` just before ``if
    total / n < limit:``): the bindings before it no longer decide the test."""
    binding = last_binding(script, name, test)
    return binding is not None and agrees(script, binding) and runs_before(script, binding, test)


def _unagreed(script: ScriptModel, names: list[str], at: cst.CSTNode) -> list[str]:
    """``names`` less those whose last binding above ``at`` is a collective's, run whenever
    ``at`` runs: ``return total / n`` after ``total = accelerator.reduce(...)`` returns what
    every rank agrees on, whatever ``total += loss.item()`` folded before."""
    return [n for n in names if not _agreed_at(script, n, at)]


def decided_by_object(facts: Facts, test: cst.BaseExpression, loop: cst.While) -> Decided | None:
    """A ``while`` test that asks an object of a class of this file for the decision that the
    loop's body hands it this rank's own value for: ``while not stopper.early_stop:`` with
    ``stopper(val_loss)`` in the body (ACC215: each rank makes its own number of passes)."""
    return _decided_by_object(facts, test, loop, None)


def _decided_by_object(
    facts: Facts, read: cst.CSTNode, loop: cst.For | cst.While, view: ShardView | None
) -> Decided | None:
    """``read`` (a stop's test, or a binding the test reads) asks an object of a class of this
    file for the decision: the attribute a method sets (``if stopper.early_stop: break`` after
    ``stopper(val_loss)`` in the loop), or what the method returns (``if stopper.step(val_loss):
    break``). The method the loop's call runs (`call_graph`) is followed with its parameters
    bound to that call's arguments, to a test of the value the call hands it: the early-stopping
    object's ``if val_loss < self.best: ... self.counter = 0`` / ``else: self.counter += 1``,
    then ``self.early_stop = True`` (or ``return True``) once ``self.counter >= self.patience``."""
    script = facts.model
    graph = script.call_graph
    values = OwnValues(facts, view)
    for node in walk(read):
        if isinstance(node, cst.Call):
            for function, implicit in graph.callees(node):
                if graph.owner(function) is None:
                    continue
                returns: list[cst.CSTNode] = list(script.index.own_returns(function))
                found = _decided_in_method(facts, values, function, node, implicit, returns, [])
                if found is not None:
                    argument = _own_argument(facts, bound_arguments(function, node, implicit), view)
                    read_as = script.module.code_for_node(node)
                    origin, stepped, condition, method = found
                    return Decided(read_as, origin, stepped, condition, node, method, argument)
        name = dotted(node) if isinstance(node, cst.Attribute) else None
        if name is None:
            continue
        if name.startswith("self.") and name.count(".") == 1:
            # ``self.wait``: the trainer's own counter, followed by the caller; ``if
            # self.should_stop: break``, set by a callback the trainer hands itself to
            found_set = _set_on_handed_self(facts, values, name.split(".", 1)[1], loop, view)
            if found_set is not None:
                return replace(found_set, read=name)
            continue
        receiver, attribute = name.rsplit(".", 1)
        for call in _calls_on(script, receiver, loop):
            for function, implicit in graph.callees(call):
                if graph.owner(function) is None or implicit != 1:
                    continue
                member = [f"self.{attribute}"]
                found = _decided_in_method(facts, values, function, call, implicit, [], member)
                if found is not None:
                    argument = _own_argument(facts, bound_arguments(function, call, implicit), view)
                    origin, stepped, condition, method = found
                    return Decided(name, origin, stepped, condition, call, method, argument)
    return None


def _set_on_handed_self(
    facts: Facts,
    values: OwnValues,
    attribute: str,
    loop: cst.For | cst.While,
    view: ShardView | None,
) -> Decided | None:
    """``self.<attribute>`` set by a method of another object that the loop hands the instance
    itself: ``for cb in self.callbacks: cb.on_epoch_end(self, epoch, logs)`` (in the loop, or in
    a method the loop calls on ``self``, where ``self`` is still the same instance) runs
    ``EarlyStopping.on_epoch_end(self, trainer, epoch, logs)``, which sets
    ``trainer.should_stop = True`` under a test of ``logs``. The method is followed with its
    parameters bound to that call's arguments (`_decided_in_method`), the attribute read through
    the parameter the instance is bound to."""
    script = facts.model
    graph = script.call_graph
    for call in _calls_on_self_methods(script, loop):
        if not any(dotted(a.value) == "self" for a in call.args):
            continue
        for function, implicit in graph.callees(call):
            if graph.owner(function) is None:
                continue
            for forwarded in star_forwarded(script, call) or [None]:
                bound = bound_arguments(function, call, implicit, forwarded)
                handed = [parameter for parameter, a in bound if dotted(a.value) == "self"]
                for parameter in handed:
                    member = [f"{parameter}.{attribute}"]
                    found = _decided_with(
                        facts, values, function, _passed(bound), [], member, _HELPER_DEPTH
                    )
                    if found is not None:
                        argument = _own_argument(facts, bound, view)
                        origin, stepped, condition, method = found
                        return Decided(
                            f"self.{attribute}", origin, stepped, condition, call, method, argument
                        )
    return None


def _passed(bound: list[tuple[str, cst.Arg]]) -> dict[str, cst.BaseExpression]:
    return {name: argument.value for name, argument in bound}


def _calls_on_self_methods(script: ScriptModel, loop: cst.For | cst.While) -> list[cst.Call]:
    """The calls in ``loop`` and in the methods it calls on ``self`` (two calls deep), where
    ``self`` is the same instance as the loop's."""
    found: list[cst.Call] = []
    blocks: list[cst.CSTNode] = [loop.body]
    visited: set[int] = set()
    for depth in range(_HELPER_DEPTH + 1):
        deeper: list[cst.CSTNode] = []
        for block in blocks:
            for node in walk(block):
                if not isinstance(node, cst.Call):
                    continue
                found.append(node)
                func = node.func
                if depth == _HELPER_DEPTH or not (
                    isinstance(func, cst.Attribute) and dotted(func.value) == "self"
                ):
                    continue
                for function, implicit in script.call_graph.callees(node):
                    if implicit == 1 and id(function) not in visited:
                        visited.add(id(function))
                        deeper.append(function.body)
        blocks = deeper
    return found


#: Where a method decides: the origin of the rank's own value, the statement it decides, the
#: ``if`` that tests it (None for a value set itself), and the method that holds them.
_InMethod = tuple[cst.CSTNode, cst.CSTNode, cst.If | None, cst.FunctionDef]


def _own_argument(
    facts: Facts, bound: list[tuple[str, cst.Arg]], view: ShardView | None
) -> cst.BaseExpression | None:
    """The argument a call binds (``bound``) that holds a value of this rank's own
    (``val_loss``)."""
    for _, argument in bound:
        if OwnValues(facts, view).origin(argument.value, argument, {}) is not None:
            return argument.value
    return None


def _calls_on(script: ScriptModel, receiver: str, loop: cst.For | cst.While) -> list[cst.Call]:
    """The calls in ``loop`` of ``receiver`` itself (``stopper(val_loss)``) or of one of its
    methods (``stopper.step(val_loss)``); for an attribute of the instance (``self.stopper``),
    also those in the methods the loop calls (``self.validate()`` that hands it the loss), two
    calls deep."""
    found: list[cst.Call] = []
    blocks: list[cst.CSTNode] = [loop.body]
    visited: set[int] = set()
    for depth in range(_HELPER_DEPTH + 1):
        deeper: list[cst.CSTNode] = []
        for block in blocks:
            for node in walk(block):
                if not isinstance(node, cst.Call):
                    continue
                func = node.func
                if dotted(func) == receiver or (
                    isinstance(func, cst.Attribute) and dotted(func.value) == receiver
                ):
                    found.append(node)
                elif receiver.startswith("self.") and depth < _HELPER_DEPTH:
                    for function, _ in script.call_graph.callees(node):
                        if id(function) not in visited:
                            visited.add(id(function))
                            deeper.append(function.body)
        blocks = deeper
    return found


def _decided_in_method(
    facts: Facts,
    values: OwnValues,
    function: cst.FunctionDef,
    call: cst.Call,
    implicit: int,
    sources: list[cst.CSTNode],
    members: list[str],
) -> _InMethod | None:
    """A value of this rank's own, handed to ``function`` by ``call`` (its parameters bound to
    the call's arguments), that decides ``sources`` (its returns) or the bindings of ``members``
    (``self.early_stop``): tested by an ``if`` around one of them, or around a binding of a name
    one of them or one of those tests reads (``self.counter``), or returned or set itself
    (``return metric > self.limit``). A method that hands the value on to another method of its
    class (``__call__`` that runs ``self._check(val_loss)``) is followed into it, its returns
    deciding where the caller returns what it returns. Where the rank folds it from its shard,
    the statement it decides, and the ``if`` that tests it (None for a value set itself)."""
    passed = {name: argument.value for name, argument in bound_arguments(function, call, implicit)}
    return _decided_with(facts, values, function, passed, sources, members, _HELPER_DEPTH)


def _decided_with(
    facts: Facts,
    values: OwnValues,
    function: cst.FunctionDef,
    passed: dict[str, cst.BaseExpression],
    sources: list[cst.CSTNode],
    members: list[str],
    depth: int,
) -> _InMethod | None:
    """`_decided_in_method` with ``function``'s parameters bound to ``passed``."""
    script = facts.model
    returns = [s for s in sources if isinstance(s, cst.Return)]
    own = [
        small
        for small in statements(function.body)
        if facts.placement.enclosing_function(small) is function
    ]
    pending = list(members)
    checked: set[int] = set()
    seen: set[str] = set()
    while (sources or pending) and len(checked) < _MAX_BINDINGS:
        if not sources:
            name = pending.pop()
            if name not in seen:
                seen.add(name)
                sources = [s for s in own if may_bind(script, s, name) and not agrees(script, s)]
            continue
        source = sources.pop()
        if id(source) in checked:
            continue
        checked.add(id(source))
        origin = values.origin(source, source, passed)
        if origin is not None:
            return origin, source, None, function
        for condition in conditions_around(script, source, function):
            origin = values.origin(condition.test, condition, passed)
            if origin is not None:
                return origin, source, condition, function
            pending.extend(_unagreed(script, names_read(script, condition.test), condition))
        read = getattr(source, "value", None) or source
        pending.extend(_unagreed(script, names_read(script, read), source))
    if depth == 0:
        return None
    return _decided_by_own_method(facts, values, function, passed, returns, members, depth)


def _decided_by_own_method(
    facts: Facts,
    values: OwnValues,
    function: cst.FunctionDef,
    passed: dict[str, cst.BaseExpression],
    returns: list[cst.Return],
    members: list[str],
    depth: int,
) -> _InMethod | None:
    """The decision made by another method of ``function``'s class that ``function`` calls on
    ``self`` (``self._check(val_loss)``), its parameters bound to what that call hands it (a
    parameter of ``function`` standing for what ``passed`` binds it to): the bindings of the
    same ``members``, and its returns where ``function`` returns what that call returns."""
    script = facts.model
    graph = script.call_graph
    owner = graph.owner(function)
    for call in script.index.calls_directly_in(function):
        if not (isinstance(call.func, cst.Attribute) and dotted(call.func.value) == "self"):
            continue
        for method, implicit in graph.callees(call):
            if method is function or graph.owner(method) is not owner or implicit != 1:
                continue
            handed = {
                name: _substituted(argument.value, passed)
                for name, argument in bound_arguments(method, call, implicit)
            }
            returned = [r for r in returns if r.value is not None and _holds(script, r.value, call)]
            sources: list[cst.CSTNode] = list(script.index.own_returns(method)) if returned else []
            found = _decided_with(facts, values, method, handed, sources, members, depth - 1)
            if found is not None:
                return found
    return None


def _substituted(
    value: cst.BaseExpression, passed: dict[str, cst.BaseExpression]
) -> cst.BaseExpression:
    """``value`` as the caller handed it: a parameter read whole is what ``passed`` binds it
    to."""
    name = value.value if isinstance(value, cst.Name) else None
    return passed.get(name, value) if name is not None else value


def _holds(script: ScriptModel, value: cst.CSTNode, call: cst.Call) -> bool:
    return value is call or any(node is call for node in walk(value))


def conditions_around(script: ScriptModel, node: cst.CSTNode, loop: cst.CSTNode) -> list[cst.If]:
    """The ``if`` statements between ``loop`` and ``node`` whose branches (either one) hold
    ``node``, innermost first."""
    found: list[cst.If] = []
    child: cst.CSTNode = node
    for ancestor in script.ancestors(node):
        if ancestor is loop:
            break
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            found.append(ancestor)
        child = ancestor
    return found


def agrees(script: ScriptModel, value: cst.CSTNode) -> bool:
    """``value`` holds what a collective made the same on every rank (``accelerator.reduce``,
    ``gather``, ``check_trigger``)."""
    return any(
        isinstance(node, cst.Call)
        and (
            agrees_across_ranks(script, node)
            or (isinstance(node.func, cst.Attribute) and node.func.attr.value == "check_trigger")
        )
        for node in walk(value)
    )
