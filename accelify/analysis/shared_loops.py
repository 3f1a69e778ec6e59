"""One loop that trains or evaluates, by a flag its function receives: ``def run_epoch(model,
loader, ..., train=True)`` whose backward runs under ``if train:``, called with ``train=False``
for the validation loader. No gather fits such a loop (it would run in one mode only), so a
loader that only ever goes through it with training off is left unprepared: every rank then
evaluates all of it and its totals are the whole set's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import libcst as cst

from accelify.analysis.dataflow import between, bound_by
from accelify.analysis.iterated import literal_sequence, row_bindings
from accelify.analysis.loops import find_backward, iterated_expression, phase_name
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    has_parameter,
    target_names,
    walk,
)

_UNKNOWN = object()
_PRESENT = object()  # a value known not to be None (an optimizer)


@dataclass
class SharedLoopEvaluation:
    """``loader`` goes through ``loop`` only at calls that switch its training off."""

    loader: str
    loop: Loop
    function: cst.FunctionDef
    call: cst.Call  # the first such call
    #: that call hands the loader prepared in its arguments
    #: (``trainer.run_epoch(trainer.accelerator.prepare(test_loader))``): one rank's shard
    prepared_at_call: bool = False


@dataclass
class _FlagLoop:
    """A training loop over a parameter of its function whose backward runs under tests of the
    function's other parameters (``if train:``): what each call's arguments decide."""

    loop: Loop
    function: cst.FunctionDef
    defaults: dict[str, cst.BaseExpression | None]
    aliases: dict[str, cst.BaseExpression]
    tests: list[cst.BaseExpression]
    flags: set[str]


def _flag_loops(model: ScriptModel) -> Iterator[_FlagLoop]:
    for loop in model.loops:
        function = model.index.enclosing_function(loop.node) if loop.trains else None
        if function is None or loop.iterable is None:
            continue
        defaults = {p.name.value: p.default for p in all_params(function.params)}
        if loop.iterable not in defaults:
            continue  # the loop's loader is no parameter: nothing to ask of the callers
        tests = _backward_tests(model, loop)
        if not tests:
            continue
        aliases = _flag_aliases(model, function, set(defaults))
        read = {n.value for t in tests for n in walk(t) if isinstance(n, cst.Name)}
        for alias in read & set(aliases):
            read |= {n.value for n in walk(aliases[alias]) if isinstance(n, cst.Name)}
        flags = read & set(defaults)
        if flags:
            yield _FlagLoop(loop, function, defaults, aliases, tests, flags)


def shared_loop_evaluations(model: ScriptModel) -> dict[str, SharedLoopEvaluation]:
    """By the name each call hands the loader under; none that some call or loop trains on."""
    evaluated, trained = _shared_loop_calls(model)
    names = {name for name, _ in trained}
    names |= {loop.iterable for loop in model.loops if loop.trains and loop.iterable}
    return {name: found for name, found in evaluated.items() if name not in names}


def shared_loop_trained_calls(model: ScriptModel) -> set[tuple[str, cst.CSTNode]]:
    """The loaders some loop trains on, each with where it is read: handed to a shared loop at
    a call that does not switch training off (or may not), or iterated by another training
    loop. The place lets a caller follow the name back to where the loader was made."""
    return _shared_loop_calls(model)[1]


def _shared_loop_calls(
    model: ScriptModel,
) -> tuple[dict[str, SharedLoopEvaluation], set[tuple[str, cst.CSTNode]]]:
    evaluated: dict[str, SharedLoopEvaluation] = {}
    trained: set[tuple[str, cst.CSTNode]] = set()
    flag_loops = set()
    for flagged in _flag_loops(model):
        loop, function, defaults = flagged.loop, flagged.function, flagged.defaults
        aliases, tests, flags = flagged.aliases, flagged.tests, flagged.flags
        calls = model.call_graph.calls_of(function)
        if any(a.star for call, _ in calls for a in call.args):
            continue  # ``run_epoch(*args)``: what goes where is unknown
        flag_loops.add(id(loop.node))
        for call, implicit in calls:
            handed = {p: a.value for p, a in bound_arguments(function, call, implicit)}
            unrolled = _per_iteration(model, call, handed)
            for passed, phase in unrolled:
                given, prepared_at_call = _unprepared(passed.get(loop.iterable))
                loader = dotted(given)
                if loader is None:
                    continue
                values = {
                    flag: _flag_value(model, call, passed.get(flag, defaults[flag]), *phase)
                    for flag in flags
                }
                outcomes = {_evaluate(test, values, aliases) for test in tests}
                # one call over several loaders whose flag cannot be told: it may only
                # evaluate this one, so it is kept whole (never prepared on a guess)
                if outcomes == {False} or (len(unrolled) > 1 and outcomes != {True}):
                    evaluated.setdefault(
                        loader,
                        SharedLoopEvaluation(loader, loop, function, call, prepared_at_call),
                    )
                else:
                    trained.add((loader, call))
    for loop in model.loops:
        if loop.trains and loop.iterable is not None and id(loop.node) not in flag_loops:
            trained.add((loop.iterable, loop.node))
    return evaluated, trained


def _unprepared(
    value: cst.BaseExpression | None,
) -> tuple[cst.BaseExpression | None, bool]:
    """``test_loader`` of ``accelerator.prepare(test_loader)`` (any receiver), and whether it
    was so wrapped; ``value`` itself otherwise."""
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "prepare"
        and len(value.args) == 1
        and not value.args[0].star
    ):
        return value.args[0].value, True
    return value, False


def _per_iteration(
    model: ScriptModel, call: cst.Call, passed: dict[str, cst.BaseExpression]
) -> list[tuple[dict[str, cst.BaseExpression], tuple[str, str]]]:
    """The arguments of ``call`` in each pass of an enclosing ``for name, loader, opt in
    [("train", train_loader, optimizer), ("val", val_loader, None)]:`` (any shape of rows
    `row_bindings` reads) whose targets it hands on: one mapping per element, the targets
    replaced by the element's values (so each loader is seen with its own flag), with the
    pass's phase (``("name", "train")``: the one target bound to a string, which a flag
    written ``optimizer if name == "train" else None`` is decided by); just ``passed`` when no
    such loop binds what it hands."""
    read = {n.value for v in passed.values() for n in walk(v) if isinstance(n, cst.Name)}
    function = model.index.enclosing_function(call)
    for ancestor in model.ancestors(call):
        if ancestor is function:
            break
        if not isinstance(ancestor, cst.For):
            continue
        passes = row_bindings(model, ancestor.target, ancestor.iter, ancestor)
        if not read & target_names(ancestor.target).union(*(passes or [])):
            continue  # ``loader, opt = rest`` in the body: the row's own entries
        if passes is None:
            return [(passed, ("", ""))]
        return [
            (
                {
                    p: bound.get(v.value, v) if isinstance(v, cst.Name) else v
                    for p, v in passed.items()
                },
                _phase_of(bound),
            )
            for bound in passes
        ]
    return [(passed, ("", ""))]


def _phase_of(bound: dict[str, cst.BaseExpression]) -> tuple[str, str]:
    """``("name", "train")`` when one name of a pass is bound to a string, else no phase."""
    strings = [(n, v) for n, v in bound.items() if isinstance(_literal(v), str)]
    if len(strings) != 1:
        return "", ""
    name, value = strings[0]
    return name, str(_literal(value))


def _backward_tests(model: ScriptModel, loop: Loop) -> list[cst.BaseExpression]:
    """The ``if`` tests every backward of the loop runs under; none when one runs
    unconditionally (or under an ``else``, whose test is not its own)."""
    tests: list[cst.BaseExpression] = []
    for call in find_backward(loop.node.body):  # ``accelerator.backward`` too
        path = [call, *between(model, call, loop.node)]
        own = [
            parent.test
            for child, parent in pairwise(path)
            if isinstance(parent, cst.If) and child is parent.body
        ]
        if not own:
            return []
        tests.extend(own)
    return tests


def _literal(node: cst.BaseExpression | None) -> object:
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value
    if isinstance(node, cst.Integer):
        return node.evaluated_value
    return _UNKNOWN


def _evaluate(
    test: cst.BaseExpression,
    values: dict[str, object],
    aliases: dict[str, cst.BaseExpression] | None = None,
) -> bool | None:
    """The test's truth with the flags' values from one call; None when it cannot tell. A
    name in ``aliases`` (``training = optimizer is not None``) stands for its expression."""
    if isinstance(test, cst.Name) and aliases and test.value in aliases:
        return _evaluate(aliases[test.value], values)
    if isinstance(test, cst.Name) and test.value in values:
        value = values[test.value]
        return None if value is _UNKNOWN else bool(value)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _evaluate(test.expression, values, aliases)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        left = _evaluate_value(test.left, values)
        target = test.comparisons[0]
        right = _evaluate_value(target.comparator, values)
        if left is _UNKNOWN or right is _UNKNOWN:
            return None
        if isinstance(target.operator, (cst.Equal, cst.Is)):
            return left == right
        if isinstance(target.operator, (cst.NotEqual, cst.IsNot)):
            return left != right
        if isinstance(target.operator, (cst.In, cst.NotIn)) and isinstance(right, tuple):
            return (left in right) == isinstance(target.operator, cst.In)
    return None


def _flag_aliases(
    model: ScriptModel, function: cst.FunctionDef, parameters: set[str]
) -> dict[str, cst.BaseExpression]:
    """``training = optimizer is not None`` (or ``is_train = mode == "train"``): a local the
    function assigns once, from its parameters only, and never binds again."""
    counts: Counter[str] = Counter()
    found: dict[str, cst.BaseExpression] = {}
    for node in model.index.own_nodes(function):
        counts.update(bound_by(node))
        if (
            isinstance(node, cst.Assign)
            and len(assigned_targets(node)) == 1
            and isinstance(assigned_targets(node)[0], cst.Name)
        ):
            read = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
            if read and read <= parameters | {"None", "True", "False"}:
                found[assigned_targets(node)[0].value] = node.value
    return {name: value for name, value in found.items() if counts.get(name) == 1}


def _evaluate_value(node: cst.BaseExpression, values: dict[str, object]) -> object:
    if isinstance(node, cst.Name) and node.value in values:
        return values[node.value]
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        items = tuple(_literal(e.value) for e in node.elements if isinstance(e, cst.Element))
        return _UNKNOWN if _UNKNOWN in items else items
    return _literal(node)


@dataclass
class PhaseLoaders:
    """``for phase in ["train", "val"]: ... for x, y in loaders[phase]:`` whose backward runs
    under ``if phase == "train":``: the keys of ``loaders`` the loop trains on, and those it
    only evaluates (no gather fits the loop: it would run in one phase only)."""

    loaders: str
    loop: Loop
    phase: str
    trained: list[str]
    evaluated: list[str]
    #: ``loaders`` and the names callers hand in for it
    names: set[str] = field(default_factory=set)
    #: False when some call's phase cannot be told (``trained`` and ``evaluated`` then empty):
    #: none of the dict's loaders may be prepared, since any of them may be only evaluated
    decided: bool = True


def phase_loaders(model: ScriptModel) -> dict[str, PhaseLoaders]:
    """By the name of the dict of loaders; only when every phase's mode is known."""
    found: dict[str, PhaseLoaders] = {}
    for loop in model.loops:
        phase = phase_name(iterated_expression(loop)) if loop.trains else None
        if phase is None or loop.iterable is None:
            continue
        values = _phase_values(model, loop.node, phase)
        tests = _backward_tests(model, loop)
        read = {n.value for t in tests for n in walk(t) if isinstance(n, cst.Name)}
        if not values or not tests or read != {phase}:
            continue
        trained, evaluated = [], []
        for value in values:
            outcomes = {_evaluate(test, {phase: value}) for test in tests}
            if outcomes == {False}:
                evaluated.append(value)
            elif None not in outcomes:
                trained.append(value)
            else:
                break
        else:
            if trained and evaluated and loop.iterable not in found:
                assert phase is not None
                found[loop.iterable] = PhaseLoaders(
                    loop.iterable, loop, phase, trained, evaluated, {loop.iterable}
                )
    for phases in _phases_through_calls(model):
        found.setdefault(phases.loaders, phases)
    return found


def _phases_through_calls(model: ScriptModel) -> list[PhaseLoaders]:
    """``for phase in ["train", "val"]: run_epoch(model, loaders[phase], ...,
    train=phase == "train")`` where ``run_epoch``'s loop over its loader parameter runs its
    backward under ``if train:``: the phases the flag turns training on for, and those it only
    evaluates, as for a ``loaders[phase]`` loop. Only when every call of the function that
    hands it a key of that dict decides the flag, and no key is both trained and evaluated."""
    found: list[PhaseLoaders] = []
    for flagged in _flag_loops(model):
        loop, function, flags = flagged.loop, flagged.function, flagged.flags
        modes: dict[str, dict[str, bool]] = {}  # dict name -> key -> trained
        handed_dicts: set[str] = set()  # every dict a call hands a key of
        decided = True
        for call, implicit in model.call_graph.calls_of(function):
            passed = {p: a.value for p, a in bound_arguments(function, call, implicit)}
            loader = passed.get(loop.iterable)
            if not _reads_a_subscript(loader):
                continue
            handed_dicts |= _subscripted_dicts(loader)  # type: ignore[arg-type]
            decided = decided and _decide_call(model, flagged, call, passed, loader, modes)
        if not decided:
            found += [
                PhaseLoaders(owner, loop, " and ".join(sorted(flags)), [], [], {owner}, False)
                for owner in sorted(handed_dicts)
            ]
            continue
        for owner, keys in modes.items():
            trained_keys = [k for k, t in keys.items() if t]
            evaluated = [k for k, t in keys.items() if not t]
            if trained_keys and evaluated:
                found.append(
                    PhaseLoaders(
                        owner, loop, " and ".join(sorted(flags)), trained_keys, evaluated, {owner}
                    )
                )
    return found


def _decide_call(
    model: ScriptModel,
    flagged: _FlagLoop,
    call: cst.Call,
    passed: dict[str, cst.BaseExpression],
    loader: cst.BaseExpression,
    modes: dict[str, dict[str, bool]],
) -> bool:
    """Records in ``modes`` whether each key ``call`` hands (one per phase) is trained; False
    when a phase's key or flag cannot be told, or a key is both trained and evaluated."""
    handed = _keys_handed(model, call, loader)
    if handed is None:
        return False
    for owner, phase, value, key in handed:
        values = {
            flag: _flag_value(model, call, passed.get(flag, flagged.defaults[flag]), phase, value)
            for flag in flagged.flags
        }
        outcomes = {_evaluate(test, values, flagged.aliases) for test in flagged.tests}
        if None in outcomes or len(outcomes) != 1:
            return False
        trained = outcomes == {True}
        if modes.setdefault(owner, {}).setdefault(key, trained) != trained:
            return False  # one key both trained and evaluated
    return True


def _subscripted_dicts(loader: cst.BaseExpression) -> set[str]:
    """The containers ``loader`` reads an entry of (``loaders`` in ``loaders[phase]``)."""
    return {
        owner
        for node in walk(loader)
        if isinstance(node, cst.Subscript) and (owner := dotted(node.value)) is not None
    }


def _reads_a_subscript(loader: cst.BaseExpression | None) -> bool:
    """The loader handed in is ``loaders[...]``, or chosen by a conditional expression of which
    a branch is one (``loaders[phase] if phase == "train" else loaders["val"]``)."""
    if isinstance(loader, cst.IfExp):
        return _reads_a_subscript(loader.body) or _reads_a_subscript(loader.orelse)
    return isinstance(loader, cst.Subscript)


def _keys_handed(
    model: ScriptModel, call: cst.Call, loader: cst.BaseExpression
) -> list[tuple[str, str, str, str]] | None:
    """Per value of the phase the call runs in: the dict, the phase's name, its value and the
    key of the loader handed (``loaders[phase]``, ``loaders["val"]``, or the branch of a
    conditional expression the phase's value picks); None when any of them cannot be told, so
    that a loader evaluated through an expression no one reads is never taken as trained."""
    phases = {
        node.value
        for node in walk(loader)
        if isinstance(node, cst.Name) and _phase_values(model, call, node.value)
    }
    if len(phases) > 1:
        return None
    phase = next(iter(phases), "")
    handed: list[tuple[str, str, str, str]] = []
    for value in (_phase_values(model, call, phase) or []) if phase else [""]:
        chosen = _branch_for(loader, phase, value)
        if not isinstance(chosen, cst.Subscript) or len(chosen.slice) != 1:
            return None
        index, owner = chosen.slice[0].slice, dotted(chosen.value)
        if owner is None or not isinstance(index, cst.Index):
            return None
        read = index.value
        key = value if isinstance(read, cst.Name) and read.value == phase else _literal(read)
        if not isinstance(key, str) or not key:
            return None
        handed.append((owner, phase, value, key))
    return handed


def _branch_for(loader: cst.BaseExpression, phase: str, value: str) -> cst.BaseExpression | None:
    """What ``loader`` is in the phase ``value``: the branch of each conditional expression its
    test picks with the phase set; None when a test cannot be told."""
    while isinstance(loader, cst.IfExp):
        truth = _evaluate(loader.test, {phase: value}) if phase else None
        if truth is None:
            return None
        loader = loader.body if truth else loader.orelse
    return loader


def _flag_value(
    model: ScriptModel, call: cst.Call, node: cst.BaseExpression | None, phase: str, value: str
) -> object:
    """A flag's value at a call for one phase: a literal, an optimizer (not None), a test of
    the phase (``phase == "train"``), or the branch of a conditional expression the phase picks
    (``optimizer if phase == "train" else None``), also through a local the call's function
    binds once to one (``opt = ...; run_epoch(model, loaders[phase], opt)``)."""
    if node is None:
        return _UNKNOWN
    if _known_value(model, node) is not _UNKNOWN:  # ``optimizer``, not what it was built by
        return _known_value(model, node)
    node = _bound_once(model, call, node) or node
    if phase:
        chosen = _branch_for(node, phase, value)
        if chosen is None:
            return _UNKNOWN
        node = chosen
    known = _known_value(model, node)
    if known is not _UNKNOWN or not phase:
        return known
    truth = _evaluate(node, {phase: value})
    return _UNKNOWN if truth is None else truth


def _known_value(model: ScriptModel, node: cst.BaseExpression) -> object:
    """A literal's value; `_PRESENT` for a name or attribute that holds an optimizer (an
    ``optimizer=None`` parameter handed one is not None)."""
    literal = _literal(node)
    if literal is not _UNKNOWN:
        return literal
    name = dotted(node)
    if name is not None and any(b.name == name for b in model.of_kind(Kind.OPTIMIZER)):
        return _PRESENT
    return _UNKNOWN


def _bound_once(
    model: ScriptModel, call: cst.Call, node: cst.BaseExpression
) -> cst.BaseExpression | None:
    """The value of the local ``node`` names, when the call's function binds it once, by an
    assignment before the call (``opt = self.optimizer if phase == "train" else None``)."""
    if not isinstance(node, cst.Name):
        return None
    function = model.index.enclosing_function(call)
    if function is None or has_parameter(function, node.value):
        return None
    binds = [n for n in model.index.own_nodes(function) if node.value in bound_by(n)]
    if len(binds) != 1 or not isinstance(binds[0], cst.Assign):
        return None
    assign = binds[0]
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
        return None
    if model.order(assign) > model.order(call):
        return None
    return assign.value


def _phase_values(model: ScriptModel, loop: cst.For, phase: str | None) -> list[str] | None:
    """The string literals of the enclosing ``for phase in ["train", "val"]:``."""
    for ancestor in model.ancestors(loop):
        if (
            isinstance(ancestor, cst.For)
            and isinstance(ancestor.target, cst.Name)
            and ancestor.target.value == phase
        ):
            phases = literal_sequence(model, ancestor.iter, ancestor)
            if phases is None:
                return None
            values = [_literal(e.value) for e in phases.elements]
            return values if all(isinstance(v, str) for v in values) else None  # type: ignore[return-value]
    return None
