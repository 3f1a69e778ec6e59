"""Local names, and attributes of ``self``, bound only on some ranks and read on all of them.

``if accelerator.is_main_process: result = {...}`` followed, outside the test, by
``accelerator.log(result)``: every other rank reaches the read with ``result`` never bound and
stops with a ``NameError``. Only plain locals bound nowhere else in the function (or module)
count: a name also bound before the test, in its ``else``, by a loop or an import is bound on
every rank; a read inside another rank test (``if accelerator.is_main_process and best:``) is
made by the ranks that bound it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    children_of,
    dotted,
    is_assignment,
    keyword_value,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class RankOnlyRead:
    read: cst.Name
    bound: cst.CSTNode  # the binding statement's target, under the rank test
    guard: cst.If


def rank_only_reads(facts: Facts) -> list[RankOnlyRead]:
    model = facts.model
    tests: dict[int, bool] = {}

    def guard_of(node: cst.CSTNode, scope: cst.CSTNode) -> cst.If | None:
        return _rank_guard(facts, node, scope, tests)

    # only the scopes that assign a plain name under a rank test are read in full
    candidates: dict[int, tuple[cst.CSTNode, set[str]]] = {}
    for assign in model.assignments:
        names = {n.value for t in assigned_targets(assign) for n in _stored_names(t)}
        if not names:
            continue
        scope = facts.placement.enclosing_function(assign) or model.module
        if guard_of(assign, scope) is not None:
            candidates.setdefault(id(scope), (scope, set()))[1].update(names)
    found = []
    for scope, names in candidates.values():
        bindings, reads = _names_in(scope)
        for name in sorted(names & set(bindings)):
            every = [(target, guard_of(target, scope)) for target in bindings[name]]
            guarded = [(t, g) for t, g in every if g is not None]
            unguarded = [t for t, g in every if g is None]
            if not guarded or any(_in_orelse(model, t, g) for t, g in guarded):
                continue
            if _complementary_guards(model, [g for _, g in guarded]):
                continue
            first = min(model.order(t) for t, _ in guarded)
            for read in reads.get(name, []):
                if (
                    model.order(read) > first
                    and not _bound_before(model, read, unguarded)
                    and not facts.ranks.under_rank_guard(read)
                    and not _tested_inline(facts, read)
                    and not _tested_for_binding(model, read)
                ):
                    found.append(RankOnlyRead(read, guarded[0][0], guarded[0][1]))
                    break
    return found


@dataclass(frozen=True)
class RankOnlyAttribute:
    read: cst.Attribute  # ``self.writer`` where every rank reads it
    guard: cst.If  # the rank test the constructor binds it under
    call: cst.Call  # a call that runs the reading method on every rank
    #: ``call`` is no call of the method but the ``backward`` (or collective) the method runs
    #: itself: a method nothing in the file calls that every rank must run all the same
    synchronising: bool = False


def rank_only_attributes(facts: Facts) -> list[RankOnlyAttribute]:
    """``if accelerator.is_main_process: self.writer = SummaryWriter()`` in a constructor, and
    ``self.writer.add_scalar(...)`` in a method the file calls on every rank: the other ranks
    stop with an ``AttributeError``. Only where nothing else can have bound it: every binding of
    that attribute name in the file is ``self.<name> = ...`` in the constructor, under a rank
    test and not in its ``else``; the class has no base class but ``object`` or a torch module
    and no subclass in the file, no class-level default, and no string naming the attribute
    (``getattr``/``hasattr``); the reading method has no early ``return`` under a rank test, and
    a call of it (or of the class, for the constructor) is made outside any rank test."""
    model, graph = facts.model, facts.calls
    candidates: dict[tuple[int, str], tuple[cst.ClassDef, cst.FunctionDef, list[cst.If]]] = {}
    for assign in model.assignments:
        for target in assigned_targets(assign):
            name = _self_attribute(target)
            init = facts.placement.enclosing_function(assign)
            if name is None or init is None or init.name.value != "__init__":
                continue
            owner = graph.owner(init)
            guard = _rank_guard(facts, assign, init)
            if owner is not None and guard is not None and not _in_orelse(model, assign, guard):
                key = (id(owner), name)
                candidates.setdefault(key, (owner, init, []))[2].append(guard)
    if not candidates:
        return []
    stores, reads, strings = _attribute_uses(facts.placement.all_nodes())
    found = []
    for (_, name), (owner, init, guards) in candidates.items():
        if (
            len(stores.get(name, [])) != len(guards)
            or name in strings
            or not _plain_class(graph, owner)
            or _complementary_guards(model, guards)
            or name in _class_level_names(owner)
        ):
            continue
        first = min(model.order(g) for g in guards)
        for read in reads.get(name, []):
            method = facts.placement.enclosing_function(read)
            if method is None or graph.owner(method) is not owner:
                continue
            if method is init and model.order(read) <= first:
                continue
            if facts.ranks.under_rank_guard(read) or _tested_inline(facts, read):
                continue
            if _returns_early_on_some_ranks(facts, method, read):
                continue
            call = _called_on_every_rank(facts, method, owner)
            if call is not None:
                found.append(RankOnlyAttribute(read, guards[0], call))
                break
            runs = _synchronises_uncalled(facts, method)
            if runs is not None:
                found.append(RankOnlyAttribute(read, guards[0], runs, synchronising=True))
                break
    return found


def _self_attribute(target: cst.CSTNode) -> str | None:
    if (
        isinstance(target, cst.Attribute)
        and isinstance(target.value, cst.Name)
        and target.value.value == "self"
    ):
        return target.attr.value
    return None


@dataclass(frozen=True)
class RunlessTrackerCall:
    call: cst.Call  # ``wandb.log(...)``, which every rank runs
    start: cst.Call  # a ``wandb.init(...)`` only some ranks run


def tracker_calls_without_a_run(facts: Facts) -> list[RunlessTrackerCall]:
    """The tracker's run as rank-only state: ``wandb.init(...)`` only under ``if
    accelerator.is_main_process:`` (or in a function only called there), and ``wandb.log(...)``
    where every rank runs it. On the other ranks no run was started, and wandb's ``log`` raises
    ``wandb.Error`` (one rank dies, the others wait for it at their next collective). Not where
    some start runs on every rank (``mode="disabled"`` on the others), in an ``else`` or under
    complementary tests, nor a call under a rank test, a test of ``wandb.run``, or a ``try``.
    The same where the script starts no run itself and ``accelerator.init_trackers(...)`` of
    an Accelerator made with ``log_with="wandb"`` does (`_logs_after_init_trackers`); a script
    that starts runs both ways is left alone."""
    from accelify.analysis.repeated_effects import callers_of, run_by_every_rank

    model = facts.model
    starts = [  # wandb's own: another tracker's run is no wandb run
        c
        for c in model.calls
        if any(n.startswith("wandb.") for n in model.call_names(c) & names.TRACKER_RUN_STARTS)
    ]
    uses = [c for c in model.calls if model.call_names(c) & names.TRACKER_RUN_CALLS]
    if not uses or not model.prepare_calls:
        return []

    def every_rank(function: cst.FunctionDef) -> bool:
        return run_by_every_rank(
            model, facts.placement, facts.ranks.backend_guards, facts.synchronising_call, function
        )

    inits = [
        call
        for call in model.calls
        if isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "init_trackers"
        and _logs_with_wandb(model, call)
    ]
    if not starts:
        return _logs_after_init_trackers(facts, uses, inits, every_rank)
    if inits:
        return []  # the Accelerator starts the main process's run, the script the others'

    guards: list[cst.If] = []
    for start in starts:
        function = facts.placement.enclosing_function(start)
        if model.under_rank_guard(start):
            places = [start]
        elif function is not None and (sites := callers_of(model, facts.placement, function)):
            if every_rank(function):
                return []
            places = sites
        else:
            return []  # a run on every rank, or started where the file does not show
        for place in places:
            guard = _rank_guard(facts, place, model.module)
            if guard is not None and _in_orelse(model, place, guard):
                return []
            guards += [guard] if guard is not None else []
    if _complementary_guards(model, guards):
        return []
    return [
        RunlessTrackerCall(use, starts[0])
        for use in uses
        if _run_by_every_rank(facts, use, every_rank)
    ]


def _run_by_every_rank(facts: Facts, use: cst.Call, every_rank) -> bool:
    """``use`` runs on every rank: under no rank guard and no test of the run, reached by
    every rank in its function, and that function called by every rank."""
    model = facts.model
    if model.under_rank_guard(use) or _run_tested(model, use):
        return False
    function = facts.placement.enclosing_function(use)
    if not facts.ranks.backend_guards.entered_by_all(use, within=function):
        return False
    return function is None or every_rank(function)


def _logs_after_init_trackers(
    facts: Facts, uses: list[cst.Call], starts: list[cst.Call], every_rank
) -> list[RunlessTrackerCall]:
    """The script starts no run itself: ``accelerator.init_trackers(...)`` of an Accelerator
    made with ``log_with`` certainly naming wandb starts it, and (in Accelerate, as in
    accelify's runtime) on the main process only. A ``wandb.log(...)`` every rank runs raises
    ``wandb.Error`` on the others, as after a guarded ``wandb.init``. Only where the file
    shows the Accelerator's construction (`_logs_with_wandb`). A use in the scope of an
    ``init_trackers`` is counted only below it: above it, it fails on every rank, and a guard
    would not fix it."""
    model = facts.model
    if not starts:
        return []
    found = []
    for use in uses:
        scope = model.scope_of(use)
        started = starts
        if any(model.scope_of(start) is scope for start in starts):  # its own scope's, above it
            started = [
                start
                for start in starts
                if model.scope_of(start) is scope and model.order(start) < model.order(use)
            ]
        if started and _run_by_every_rank(facts, use, every_rank):
            found.append(RunlessTrackerCall(use, started[0]))
    return found


def _logs_with_wandb(model, init: cst.Call) -> bool:
    """``init`` (``accelerator.init_trackers(...)``) is called on an Accelerator whose every
    construction the file shows passes ``log_with`` naming wandb: ``accelerator =
    Accelerator(log_with="wandb")`` in the same function or the module, ``self.accelerator =
    ...`` in the same class, or a factory of this file returning one. Unsure (a
    ``log_with=args.report_to``, an accelerator handed in) is False."""
    receiver = dotted(init.func.value)  # type: ignore[attr-defined]
    if receiver is None:
        return False
    if receiver.startswith("self."):
        owner = model.index.enclosing_class(init)
        assigns = [
            a
            for a in model.index.assignments_to(receiver)
            if model.index.enclosing_class(a) is owner
        ]
    else:
        scope = model.scope_of(init)
        assigns = [
            a
            for a in model.index.assignments_to(receiver)
            if model.scope_of(a) is scope or isinstance(model.scope_of(a), cst.Module)
        ]
    made: list[cst.BaseExpression] = []
    for assign in assigns:
        if not is_assignment(assign) or len(assigned_targets(assign)) != 1:
            return False
        made += _accelerators_made(model, assign.value)
    return bool(made) and all(
        isinstance(call, cst.Call) and _names_wandb(model, keyword_value(call, "log_with"), call)
        for call in made
    )


def _accelerators_made(model, value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The ``Accelerator(...)`` calls ``value`` is: itself, or each return of a function of this
    file it calls (``return Accelerator(...)``, or a name bound to one and returned). Anything
    else is returned as it is, and is no accelerator with wandb."""
    if isinstance(value, cst.Call) and model.call_names(value) & names.ACCELERATORS:
        return [value]
    targets = model.call_graph.targets(value) if isinstance(value, cst.Call) else []
    if len(targets) != 1:
        return [value]
    made: list[cst.BaseExpression] = []
    for returned in model.index.own_returns(targets[0]):
        result = returned.value
        if isinstance(result, cst.Name):
            bound = [
                a
                for a in model.index.assignments_to(result.value)
                if model.scope_of(a) is targets[0]
            ]
            if len(bound) != 1 or not isinstance(bound[0], cst.Assign):
                return [value]
            result = bound[0].value
        if not (isinstance(result, cst.Call) and model.call_names(result) & names.ACCELERATORS):
            return [value]
        made.append(result)
    return made or [value]


def _names_wandb(model, value: cst.BaseExpression | None, at: cst.CSTNode) -> bool:
    """``value`` certainly names wandb among the trackers (`names_tracker`)."""
    return names_tracker(model, value, at, "wandb") is True


#: ``log_with`` values that name every tracker installed: which, the file does not say.
_ALL_TRACKERS = frozenset({"all", "loggertype.all"})


def names_tracker(
    model, value: cst.BaseExpression | None, at: cst.CSTNode, tracker: str, depth: int = 0
) -> bool | None:
    """Whether ``log_with=value`` names ``tracker`` (``"wandb"``, ``"mlflow"``): True where it
    certainly does (``"wandb"``, a list, tuple or set holding it, ``LoggerType.WANDB``, a name
    bound once in scope to one of these), False where it certainly does not (no ``log_with``,
    ``"tensorboard"``, a list of other trackers), None where the file does not say
    (``args.report_to``, ``"all"``)."""
    if value is None:
        return False if depth == 0 else None
    if depth > 2:
        return None
    if isinstance(value, cst.SimpleString):
        named = str(value.evaluated_value).lower()
        return None if named in _ALL_TRACKERS else named == tracker
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        answers = [
            names_tracker(model, e.value, at, tracker, depth + 1)
            if isinstance(e, cst.Element)
            else None  # ``*others``
            for e in value.elements
        ]
        if True in answers:
            return True
        return False if all(answer is False for answer in answers) else None
    spelling = dotted(value) or ""
    if spelling.split(".")[-2:-1] == ["LoggerType"]:  # ``LoggerType.WANDB``
        member = spelling.rsplit(".", 1)[-1].lower()
        return None if f"loggertype.{member}" in _ALL_TRACKERS else member == tracker
    if isinstance(value, cst.Name):
        scope = model.scope_of(at)
        bound = [
            a
            for a in model.index.assignments_to(value.value)
            if model.scope_of(a) is scope or isinstance(model.scope_of(a), cst.Module)
        ]
        if len(bound) == 1 and isinstance(bound[0], cst.Assign):
            return names_tracker(model, bound[0].value, bound[0], tracker, depth + 1)
    return None


def _run_tested(model, use: cst.Call) -> bool:
    """``use`` runs only where a test lets it (``if wandb.run is not None:``, ``is_main and
    wandb.log(...)``), or inside a ``try`` that catches what it raises."""
    return tested_for_run(model, use, "wandb.run", catching=True)


def tested_for_run(model, use: cst.Call, run: str, catching: bool = False) -> bool:
    """``use`` runs only where a test of the tracker's run (``run``: ``wandb.run``,
    ``mlflow.active_run``) or of the rank lets it: ``if wandb.run is not None:``, ``if
    mlflow.active_run():``, ``is_main and wandb.log(...)``; or, with ``catching``, inside a
    ``try`` that catches what it raises."""
    for ancestor in model.ancestors(use):
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)):
            test = ancestor.test
        elif isinstance(ancestor, cst.BooleanOperation):
            test = ancestor.left
        elif catching and isinstance(ancestor, cst.Try) and ancestor.handlers:
            return True
        else:
            continue
        if run in model.module.code_for_node(test) or model.reads_rank(test):
            return True
    return False


def _rank_guard(
    facts: Facts, node: cst.CSTNode, scope: cst.CSTNode, tests: dict[int, bool] | None = None
) -> cst.If | None:
    """The rank test ``node`` runs under inside ``scope`` (not a nested function's or class's);
    ``tests`` keeps each ``if``'s answer for the next node asked about."""
    known = {} if tests is None else tests
    for ancestor in facts.model.ancestors(node):
        if ancestor is scope or isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        if isinstance(ancestor, cst.If):
            if id(ancestor) not in known:
                known[id(ancestor)] = facts.ranks.is_rank_test(ancestor.test)
            if known[id(ancestor)]:
                return ancestor
    return None


def _attribute_uses(
    nodes: list[cst.CSTNode],
) -> tuple[dict[str, list[cst.Attribute]], dict[str, list[cst.Attribute]], set[str]]:
    """Every ``<x>.<name>`` bound (any target, any object) and every ``self.<name>`` read, by
    name; and the text of every string (``getattr(self, "writer", None)`` names it)."""
    stores: dict[str, list[cst.Attribute]] = {}
    stored: set[int] = set()
    for node in nodes:
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = list(assigned_targets(node))
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor)):
            targets = [node.target]
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            targets = [node.asname.name]
        elif isinstance(node, cst.Del):
            targets = [node.target]
        for target in targets:
            for attribute in _stored_attributes(target):
                stored.add(id(attribute))
                stores.setdefault(attribute.attr.value, []).append(attribute)
    reads: dict[str, list[cst.Attribute]] = {}
    strings: set[str] = set()
    # a dict's key (``{"ema": self.ema.state_dict()}``) or a subscript (``data["ema"]``) names
    # an entry of a checkpoint, not the attribute
    keys = {id(n.key) for n in nodes if isinstance(n, cst.DictElement)} | {
        id(n.slice.value)
        for n in nodes
        if isinstance(n, cst.SubscriptElement) and isinstance(n.slice, cst.Index)
    }
    for node in nodes:
        if isinstance(node, cst.SimpleString) and id(node) in keys:
            continue
        if isinstance(node, cst.SimpleString):
            strings.add(node.evaluated_value if isinstance(node.evaluated_value, str) else "")
        elif (
            isinstance(node, cst.Attribute)
            and id(node) not in stored
            and _self_attribute(node) is not None
        ):
            reads.setdefault(node.attr.value, []).append(node)
    return stores, reads, strings


def _stored_attributes(target: cst.CSTNode) -> list[cst.Attribute]:
    if isinstance(target, cst.Attribute):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [a for e in target.elements for a in _stored_attributes(e.value)]
    if isinstance(target, cst.StarredElement):
        return _stored_attributes(target.value)
    return []


#: Base classes whose instances get no attribute the file cannot see.
_PLAIN_BASES = {"object", "Module", "nn.Module", "torch.nn.Module"}


def _plain_class(graph, owner: cst.ClassDef) -> bool:
    bases = [dotted(base.value) for base in owner.bases]
    return (
        not owner.keywords
        and not owner.decorators
        and all(base in _PLAIN_BASES for base in bases)
        and not graph.subclasses(owner)
    )


def _class_level_names(owner: cst.ClassDef) -> set[str]:
    names: set[str] = set()
    body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    names.update(n.value for t in assigned_targets(small) for n in _stored_names(t))
                elif isinstance(small, cst.AnnAssign):
                    names.update(n.value for n in _stored_names(small.target))
        elif isinstance(statement, cst.FunctionDef):
            names.add(statement.name.value)  # a property of that name
    return names


def _returns_early_on_some_ranks(facts: Facts, method: cst.FunctionDef, read: cst.CSTNode) -> bool:
    """``if not self.accelerator.is_main_process: return`` before the read."""
    read_at = facts.model.order(read)
    for node in walk(method):
        if (
            isinstance(node, cst.If)
            and facts.model.order(node) < read_at
            and facts.ranks.is_rank_test(node.test)
            and any(isinstance(n, (cst.Return, cst.Raise)) for n in walk(node))
        ):
            return True
    return False


def _synchronises_uncalled(facts: Facts, method: cst.FunctionDef) -> cst.Call | None:
    """A method nothing in the file calls (a trainer's ``train()``, called by the project's
    entry script) that runs ``backward`` or a collective every backend needs outside any rank
    test of its own: every rank must run it, or the run hangs there. The call that says so."""
    if method.name.value == "__init__" or facts.calls.callers(method):
        return None
    if facts.calls.references(method):
        return None  # handed on (a hook, a callback): who calls it is not in sight
    call = facts.synchronising_call(method, everywhere=True)
    if call is None or facts.ranks.under_rank_guard(call):
        return None
    return call


def _called_on_every_rank(
    facts: Facts, method: cst.FunctionDef, owner: cst.ClassDef
) -> cst.Call | None:
    """A call of ``method`` (of the class, for the constructor) outside any rank test, in a
    function that is not itself called only under one."""
    graph = facts.calls
    if method.name.value == "__init__":
        calls = [c for c in facts.model.calls if dotted(c.func) == owner.name.value]
    else:
        calls = graph.callers(method)
    for call in calls:
        if facts.ranks.under_rank_guard(call):
            continue
        caller = facts.placement.enclosing_function(call)
        outer = graph.callers(caller) if caller is not None else []
        if outer and all(facts.ranks.under_rank_guard(c) for c in outer):
            continue
        return call
    return None


def _bound_before(model, read: cst.Name, unguarded: list[cst.Name]) -> bool:
    """An assignment every rank runs binds the name before ``read``. Not one whose own value
    makes the read (``model, eval_set = accelerator.prepare(model, eval_set)`` after ``if
    is_main: eval_set = ...``: the other ranks fail on the right-hand side); one that shares a
    loop with the read may have bound it on an earlier pass."""
    read_at = model.order(read)
    read_loops = {id(a) for a in model.ancestors(read) if isinstance(a, (cst.For, cst.While))}
    for target in unguarded:
        statement = next(
            (a for a in model.ancestors(target) if isinstance(a, (cst.Assign, cst.AnnAssign))),
            None,
        )
        if any(
            isinstance(a, (cst.For, cst.While)) and id(a) in read_loops
            for a in model.ancestors(target)
        ):
            return True
        if model.order(target) < read_at and not (
            statement is not None and any(a is statement for a in model.ancestors(read))
        ):
            return True
    return False


def _complementary_guards(model, guards: list[cst.If]) -> bool:
    """``if is_main: x = f()`` ... ``if not is_main: x = f()``: between them the two tests let
    every rank through, so every rank binds the name (the main process first, the others after
    a barrier, as a download-once idiom does)."""
    tests = {model.module.code_for_node(g.test) for g in guards}
    return any(_negation(model, g.test) in tests for g in guards)


def _negation(model, test: cst.BaseExpression) -> str | None:
    """The code of ``test``'s plain negation: ``x`` for ``not x``, ``a != b`` for ``a == b``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return model.module.code_for_node(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        opposite = {cst.Equal: " != ", cst.NotEqual: " == "}.get(type(comparison.operator))
        if opposite is not None:
            code = model.module.code_for_node
            return code(test.left) + opposite + code(comparison.comparator)
    return None


def _tested_inline(facts: Facts, read: cst.Name) -> bool:
    """``result if accelerator.is_main_process else None``, ``is_main and result``: the read
    happens on the ranks the test lets through."""
    for ancestor in facts.model.ancestors(read):
        if isinstance(ancestor, cst.BaseSmallStatement | cst.BaseCompoundStatement):
            return False
        if isinstance(ancestor, cst.IfExp) and facts.ranks.is_rank_test(ancestor.test):
            return True
        if isinstance(ancestor, cst.BooleanOperation) and facts.ranks.is_rank_test(ancestor.left):
            return True
    return False


#: What a read of a name that may be unbound is caught by.
_UNBOUND_ERRORS = frozenset({"NameError", "UnboundLocalError", "Exception", "BaseException"})


def _tested_for_binding(model, read: cst.Name) -> bool:
    """``total if "total" in locals() else 0``, ``if "total" in locals(): log(total)``,
    ``try: log(total) except NameError: ...``: the read is made only where the name is bound
    (a reinforcement-learning trainer's evaluation returns its main-process mean so), so no rank
    stops with a NameError."""
    child: cst.CSTNode = read
    for ancestor in model.ancestors(read):
        if isinstance(ancestor, cst.IfExp | cst.If) and child is ancestor.body:
            if _tests_binding(ancestor.test, read.value):
                return True
        elif isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right:
            if isinstance(ancestor.operator, cst.And) and _tests_binding(ancestor.left, read.value):
                return True
        elif isinstance(ancestor, cst.Try) and child is ancestor.body:
            if any(_catches_unbound(handler) for handler in ancestor.handlers):
                return True
        elif isinstance(ancestor, cst.FunctionDef | cst.Lambda | cst.ClassDef):
            return False
        child = ancestor
    return False


def _tests_binding(test: cst.BaseExpression, name: str) -> bool:
    """``"name" in locals()`` (or ``vars()``, ``dir()``, ``globals()``)."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    comparison = test.comparisons[0]
    scope = comparison.comparator
    return (
        isinstance(comparison.operator, cst.In)
        and isinstance(test.left, cst.SimpleString)
        and test.left.evaluated_value == name
        and isinstance(scope, cst.Call)
        and not scope.args
        and dotted(scope.func) in ("locals", "vars", "dir", "globals")
    )


def _catches_unbound(handler: cst.ExceptHandler) -> bool:
    """A bare ``except:`` or one naming ``NameError`` (``UnboundLocalError``, ``Exception``)."""
    if handler.type is None:
        return True
    caught = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    return any(
        dotted(element.value if isinstance(element, cst.Element) else element) in _UNBOUND_ERRORS
        for element in caught
    )


def _in_orelse(model, node: cst.CSTNode, guard: cst.If | None) -> bool:
    return (
        guard is not None
        and guard.orelse is not None
        and any(a is guard.orelse for a in model.ancestors(node))
    )


def _names_in(scope: cst.CSTNode) -> tuple[dict[str, list[cst.Name]], dict[str, list[cst.Name]]]:
    """The scope's own bindings and reads of plain names (nested functions, classes, lambdas
    and comprehensions are scopes of their own and left out). A name bound any other way than
    by assignment (a loop, ``with``, ``except``, an import, a parameter, ``global``) is marked
    bound everywhere with an empty list entry that disqualifies it."""
    bound: dict[str, list[cst.Name]] = {}
    everywhere: set[str] = set()
    reads: dict[str, list[cst.Name]] = {}
    stored: set[int] = set()

    def visit(node: cst.CSTNode) -> None:
        for child in children_of(node):
            if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                everywhere.add(child.name.value)
                continue
            if isinstance(child, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp)):
                continue
            if isinstance(child, cst.GeneratorExp):
                continue
            if isinstance(child, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                targets = (
                    list(assigned_targets(child))
                    if isinstance(child, cst.Assign)
                    else [child.target]
                )
                for target in targets:
                    for name in _stored_names(target):
                        stored.add(id(name))
                        if isinstance(child, cst.AugAssign):
                            everywhere.add(name.value)
                        bound.setdefault(name.value, []).append(name)
            elif isinstance(child, (cst.For, cst.CompFor)):
                for name in _stored_names(child.target):
                    stored.add(id(name))
                    everywhere.add(name.value)
            elif isinstance(child, cst.WithItem) and child.asname is not None:
                for name in _stored_names(child.asname.name):
                    stored.add(id(name))
                    everywhere.add(name.value)
            elif isinstance(child, cst.ExceptHandler) and child.name is not None:
                everywhere.add(dotted_name(child.name.name))
            elif isinstance(child, (cst.Import, cst.ImportFrom)):
                everywhere.update(_imported(child))
                continue
            elif isinstance(child, (cst.Attribute, cst.Arg)):
                visit_value(child.value)
                continue
            elif isinstance(child, (cst.Global, cst.Nonlocal)):
                everywhere.update(n.name.value for n in child.names)
            elif isinstance(child, cst.NamedExpr):
                everywhere.update(n.value for n in _stored_names(child.target))
            elif isinstance(child, cst.Name) and id(child) not in stored:
                reads.setdefault(child.value, []).append(child)
            visit(child)

    def visit_value(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            if id(node) not in stored:
                reads.setdefault(node.value, []).append(node)
            return
        if isinstance(node, cst.Attribute):  # ``f(self.model)``: ``model`` is no name read
            visit_value(node.value)
            return
        visit(node)

    if isinstance(scope, cst.FunctionDef):
        params = scope.params
        everywhere.update(p.name.value for p in all_params(params))
        visit(scope.body)
    else:
        visit(scope)
    for name in everywhere:
        bound.pop(name, None)
    return bound, reads


def _stored_names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _stored_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _stored_names(target.value)
    return []  # ``self.x``, ``d[k]``: not a local


def dotted_name(node: cst.CSTNode) -> str:
    return node.value if isinstance(node, cst.Name) else ""


def _imported(node: cst.Import | cst.ImportFrom) -> set[str]:
    if isinstance(node.names, cst.ImportStar):
        return set()
    names = set()
    for alias in node.names:
        if alias.asname is not None:
            names.add(dotted_name(alias.asname.name))
        else:
            first = alias.name
            while isinstance(first, cst.Attribute):
                first = first.value
            names.add(dotted_name(first))
    return names
