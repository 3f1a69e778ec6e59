"""Where a script calls a collective, directly or through its own functions, and on which
backends some ranks skip it: what ACC202 (a hang) and ACC206 (one rank's save) report; and
which functions synchronise the ranks, so that no advice ever runs one on a single rank. The
forward of a prepared model counts: under FSDP it gathers parameters from every rank."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.buffered_models import forward_syncs_buffers
from accelify.analysis.collectives import (
    DDP,
    EVERY_BACKEND,
    SHARDED_FORWARD,
    collective_backends,
)
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.loader_passes import pass_collective, passes_read
from accelify.analysis.objects import bound_arguments
from accelify.analysis.placement import Placement
from accelify.analysis.rank_dependence import BackendGuards
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import bound_value, dotted, has_parameter, statement_lines, walk

_PREPARED_KINDS = frozenset({Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.ACCELERATOR})


@dataclass(frozen=True)
class CollectiveUse:
    call: cst.Call  # the call some ranks may skip: the collective, or a helper that reaches one
    collective: cst.Call  # the collective itself (``call`` when called directly)
    backends: frozenset[str]  # where it is a collective
    skipped_on: frozenset[str]  # where some ranks do not reach ``call``

    @property
    def through_helper(self) -> bool:
        return self.call is not self.collective


@dataclass(frozen=True)
class LoaderPass:
    """A pass over a prepared DataLoader that starts with a collective (`loader_passes`), which
    some ranks do not make."""

    #: the pass (a loop, a comprehension, ``list(loader)``), or the call of the file's
    #: function that makes it
    node: cst.For | cst.BaseExpression
    loop: cst.For | cst.BaseExpression  # the pass itself (`loader_passes.passes_read`)
    loader: str  # the prepared DataLoader, by the name the pass or the call spells
    why: str  # what the pass does with the other ranks (`pass_collective`)
    skipped_on: frozenset[str]
    handed: bool = False  # the function iterates the loader its call hands it


class CollectiveReach:
    def __init__(
        self, model: ScriptModel, placement: Placement, flow: ObjectFlow, guards: BackendGuards
    ) -> None:
        self.model = model
        self.placement = placement
        self.guards = guards
        self.flow = flow
        self.accelerators = flow.names_of(Kind.ACCELERATOR)
        self._reached: dict[cst.FunctionDef, list[tuple[cst.Call, frozenset[str]]]] = {}
        self._synchronising: dict[tuple[cst.FunctionDef, bool], cst.Call | None] = {}
        self._calls_in: dict[cst.FunctionDef, list[cst.Call]] | None = None
        self._call_orders: list[int] | None = None

    def uses(self) -> list[CollectiveUse]:
        """Every call that is or reaches a collective, with the backends some ranks skip it on
        (empty when every rank gets there together)."""
        found = []
        for call in self.model.calls:
            for collective, backends in self._collectives_of(call):
                skipped = backends - self.guards.agreed_on(call) - self.guards.reached_by_none(call)
                if skipped and self._mirrored(call):
                    skipped = frozenset()
                found.append(CollectiveUse(call, collective, backends, skipped))
        return found

    def loader_passes(self) -> list[LoaderPass]:
        """Passes over a prepared DataLoader whose start is a collective (a shuffling loader's
        seed broadcast, dispatched batches) that some ranks skip: the loop under a rank test,
        or the call of a function of the file that iterates the loader it is handed, made
        under one (every rank that runs the function makes the pass)."""
        found: list[LoaderPass] = []
        for node, iterable in passes_read(self.model):
            function = self.placement.enclosing_function(node)
            if function is None or not has_parameter(function, iterable):
                why = pass_collective(self.model, iterable)
                if why is None:
                    continue
                skipped = self._skipped(node)
                if skipped:
                    found.append(LoaderPass(node, node, iterable, why, skipped))
                    continue
                for call, _ in self.flow.calls_of(function) if function is not None else ():
                    skipped = self._skipped(call)
                    if skipped:  # ``def probe(): for x in probe_loader``, run on one rank
                        found.append(LoaderPass(call, node, iterable, why, skipped))
                continue
            everywhere = not self._skipped(node, within=function)
            for call, implicit in self.flow.calls_of(function):
                handed = next(
                    (
                        dotted(argument.value)
                        for parameter, argument in bound_arguments(function, call, implicit)
                        if parameter == iterable
                    ),
                    None,
                )
                why = pass_collective(self.model, handed) if handed is not None else None
                if why is None:
                    continue
                reported: cst.For | cst.BaseExpression = call if everywhere else node
                skipped = self._skipped(reported)
                if skipped:
                    found.append(LoaderPass(reported, node, handed, why, skipped, handed=True))
                    if not everywhere:
                        break  # the loop's own rank test: one finding at the loop
        return found

    def _skipped(self, node: cst.CSTNode, within: cst.CSTNode | None = None) -> frozenset[str]:
        """The backends on which some ranks reach ``node`` and others do not."""
        return (
            EVERY_BACKEND
            - self.guards.agreed_on(node, within=within)
            - self.guards.reached_by_none(node, within=within)
        )

    def skipped_but_for(
        self, use: CollectiveUse, leaving: tuple[cst.CSTNode, ...]
    ) -> frozenset[str]:
        """The backends some ranks would still skip ``use.call`` on if the block-leaving ``if``
        statements of ``leaving`` above it (``if is_main and done: break``) were not there:
        empty where such a ``break`` alone keeps ranks from it, one bug that ACC210 reports at
        the ``break``, not a second one here."""
        call = use.call
        guards = self.guards
        skipped = (
            use.backends
            - guards.agreed_on(call, ignoring=leaving)
            - guards.reached_by_none(call, ignoring=leaving)
        )
        return frozenset() if skipped and self._mirrored(call) else skipped

    def _mirrored(self, call: cst.Call) -> bool:
        """``if is_main: ...; wait_for_everyone()`` with ``else: wait_for_everyone()``: the
        ranks the branch skips make the same call in the other branch. Also the main-first
        idiom written out by hand: ``if not accelerator.is_main_process: wait_for_everyone()``,
        the main process's work, then ``if accelerator.is_main_process: wait_for_everyone()``
        (each rank reaches the barrier once, in one of two ``if`` statements of one block)."""
        child: cst.CSTNode = call
        for ancestor in self.model.ancestors(call):
            if isinstance(ancestor, cst.If) and child is not ancestor.test:
                other = ancestor.orelse if child is ancestor.body else ancestor.body
                if other is not None and self._calls_same(other, call):
                    return True
                return child is ancestor.body and self._complement_beside(ancestor, call)
            child = ancestor
        return False

    def _calls_same(self, tree: cst.CSTNode, call: cst.Call) -> bool:
        called = self.model.module.code_for_node(call.func)
        return any(
            isinstance(node, cst.Call) and self.model.module.code_for_node(node.func) == called
            for node in walk(tree)
        )

    def _complement_beside(self, branch: cst.If, call: cst.Call) -> bool:
        """Another ``if`` (without ``else``) in the same block whose test is the negation of
        ``branch``'s and whose body makes the same call."""
        block = self.model.parent(branch)
        if branch.orelse is not None or not isinstance(block, cst.IndentedBlock | cst.Module):
            return False
        return any(
            isinstance(other, cst.If)
            and other is not branch
            and other.orelse is None
            and negations(self.model, branch.test, other.test)
            and self._calls_same(other.body, call)
            for other in block.body
        )

    def _collectives_of(self, call: cst.Call) -> list[tuple[cst.Call, frozenset[str]]]:
        backends = collective_backends(self.model, call, self.accelerators)
        if not backends and self.flow.forward_of_prepared(call):
            # a model with buffers: DDP's forward broadcasts them (`buffered_models`)
            buffered = forward_syncs_buffers(self.model, call)
            backends = SHARDED_FORWARD | {DDP} if buffered else SHARDED_FORWARD
        if backends:
            return [(call, backends)]
        function = self._local_function(call)
        functions = [function] if function is not None else self._own_methods(call)
        reached = [found for method in functions for found in self.reached_by(method)]
        if not reached:
            return []
        # the collective on the most backends (the backends nest: every one, the sharding
        # ones, FSDP alone), the first such in the function: an evaluation helper's forward
        # (a collective under FSDP only) comes before its ``accelerator.gather`` (on all)
        return [max(reached, key=lambda found: len(found[1]))]

    def reached_by(self, function: cst.FunctionDef) -> list[tuple[cst.Call, frozenset[str]]]:
        """Collectives every rank running ``function`` reaches (not those under a rank guard
        inside it: they are reported where they are), through its own calls too."""
        if function in self._reached:
            return self._reached[function]
        self._reached[function] = []  # a recursive call reaches nothing new
        found = []
        for call in self.model.index.calls_directly_in(function):
            if self.guards.agreed_on(call, within=function) != EVERY_BACKEND:
                continue
            found += self._collectives_of(call)
        self._reached[function] = found
        return found

    def synchronising_call(
        self, function: cst.FunctionDef, everywhere: bool = False
    ) -> cst.Call | None:
        """The first ``prepare``, ``backward`` or other collective that ``function`` runs (also
        under a condition, also through the file's functions and its class's ``self.`` methods),
        or None: such a function must run on every rank, never on one. ``everywhere``: only
        collectives on every backend (not ``save_state``, which HF's DDP runs on one rank)."""
        key = (function, everywhere)
        if key in self._synchronising:
            return self._synchronising[key]
        self._synchronising[key] = None  # a recursive call finds nothing new
        backwards = {id(call) for call in self.model.backward_calls}
        found = None
        for call in self._calls_inside(function):
            backends = collective_backends(self.model, call, self.accelerators)
            if id(call) in backwards or (
                backends and (backends == EVERY_BACKEND or not everywhere)
            ):
                found = call
                break
            local = self._local_function(call)
            callees = [local] if local is not None else self._own_methods(call)
            if any(
                callee is not function and self.synchronising_call(callee, everywhere)
                for callee in callees
            ):
                found = call
                break
        self._synchronising[key] = found
        return found

    def synchronising_in(self, node: cst.CSTNode) -> cst.Call | None:
        """A call inside ``node`` (not ``node`` itself) that is a collective or reaches one:
        ``torch.save(accelerator.get_state_dict(model), p)``, ``json.dump(evaluate(...), f)``.
        Guarding ``node`` would run it on one rank."""
        backwards = {id(call) for call in self.model.backward_calls}
        for call in self._calls_under(node):
            if id(call) in backwards or collective_backends(self.model, call, self.accelerators):
                return call
            local = self._local_function(call)
            callees = [local] if local is not None else self._own_methods(call)
            if any(self.synchronising_call(callee) is not None for callee in callees):
                return call
        return None

    def _calls_under(self, node: cst.CSTNode) -> list[cst.Call]:
        """The file's calls strictly under ``node``, in source order. The calls are collected in
        source order, so those under ``node`` are one slice of them, found by bisecting on their
        places: asked once per statement of a loop, a walk up from every call of the file
        each time was most of the cost of the loop rules on long scripts."""
        model = self.model
        at = model.orders.get(node)
        if at is None:  # not of the analysed tree
            return [c for c in model.calls if c is not node and model.inside(c, node)]
        if self._call_orders is None:
            self._call_orders = [model.order(call) for call in model.calls]
        start = bisect_right(self._call_orders, at)
        return model.calls[start : bisect_left(self._call_orders, model.walked.ends[at], start)]

    def where_the_others_wait(
        self, loop: cst.For | cst.While, after: cst.CSTNode | None = None
    ) -> cst.SimpleStatementLine | None:
        """The first statement line of ``loop`` (after ``after``, when given) outside every rank
        test that is, or reaches through the file's functions, ``backward``, a barrier or
        another collective: where the ranks that go on wait for one that left the loop (or
        skipped the rest of its iteration)."""
        start = None if after is None else self.model.order(after)
        for statement in statement_lines(loop.body):
            if self.model.under_rank_guard(statement):
                continue
            if start is not None and self.model.order(statement) <= start:
                continue
            if self.synchronising_in(statement) is not None:
                return statement
        return None

    def where_the_ranks_meet(self, loop: cst.For | cst.While) -> cst.CSTNode | None:
        """What in ``loop`` (its header or body, its inner loops too) makes the ranks meet: a
        ``backward``, a barrier or another collective (also through the file's functions), a
        model's forward (a collective under FSDP once prepared), or the iteration of a
        DataLoader (a prepared one agrees on its shuffle at each pass). None when nothing does:
        the loop is each rank's own (a retry, a search over a local list), and a rank that
        leaves it sooner, or runs it more times, leaves no other rank waiting."""
        found = self.synchronising_in(loop)
        if found is not None:
            return found
        for node in walk(loop):
            if isinstance(node, cst.Call) and self._meets(node, depth=3):
                return node
        for inner in self.model.loops:
            if (inner.node is loop or self.model.inside(inner.node, loop)) and (
                self.flow.reads_loader(inner)
            ):
                return inner.node
        return None

    def _meets(self, call: cst.Call, depth: int) -> bool:
        """``call`` is a model's forward or a ``torch.save`` (which the conversion puts after a
        barrier), or runs a function of the file that synchronises or does either (a method
        a subclass overrides, a callback's ``__call__``), ``depth`` calls deep."""
        if self.flow.is_forward(call) or self.model.call_names(call) & names.TORCH_SAVE:
            return True
        targets = self.model.call_graph.targets(call)
        if not targets and self._hands_over_a_prepared_kind(call):
            return True
        if depth == 0:
            return False
        for target in targets:
            if self.synchronising_call(target) is not None or any(
                isinstance(node, cst.Call) and self._meets(node, depth - 1)
                for node in walk(target.body)
            ):
                return True
        return False

    def _hands_over_a_prepared_kind(self, call: cst.Call) -> bool:
        """A call the file cannot follow (a function of another module, a library's) handed a
        model, an optimizer, a DataLoader or the accelerator: it may run a forward, a backward
        or a collective (``train_one_epoch(model, loader, opt)`` from ``engine.py``), so the
        ranks are taken to meet in it."""
        for arg in call.args:
            name = dotted(arg.value)
            if name is not None and self.flow.kind_of(name, call) in _PREPARED_KINDS:
                return True
        return False

    def where_the_others_wait_after(
        self, stop: cst.If, leaves: cst.Continue | cst.Return
    ) -> cst.SimpleStatementLine | None:
        """Where the ranks that do not take ``stop`` (an ``if`` ending in ``leaves``, its
        ``continue`` or ``return``) wait for one that did: the first statement line after it
        that synchronises, in the rest of its loop's iteration (``continue``) or of its
        function (``return``: also anywhere in a loop around it, whose later iterations it
        skips too); None when nothing after it synchronises."""
        if isinstance(leaves, cst.Continue):
            loop = self.model.index.enclosing_loop(stop)
            return None if loop is None else self.where_the_others_wait(loop, after=stop)
        function = self.model.index.enclosing_function(stop)
        if function is None:
            return None
        start = self.model.order(stop)
        loops = [
            a
            for a in self.model.ancestors(stop)
            if isinstance(a, (cst.For, cst.While)) and self.model.inside(a, function)
        ]
        for statement in statement_lines(function.body):
            if self.model.under_rank_guard(statement):
                continue
            if self.model.order(statement) <= start and not any(
                self.model.inside(statement, loop) for loop in loops
            ):
                continue
            if self.synchronising_in(statement) is not None:
                return statement
        return None

    def _calls_inside(self, function: cst.FunctionDef) -> list[cst.Call]:
        if self._calls_in is None:
            self._calls_in = {}
            for call in self.model.calls:
                for ancestor in self.model.ancestors(call):
                    if isinstance(ancestor, cst.FunctionDef):
                        self._calls_in.setdefault(ancestor, []).append(call)
        return self._calls_in.get(function, [])

    def _local_function(self, call: cst.Call) -> cst.FunctionDef | None:
        """The file's function a bare-name call runs: a module-level one, or one defined in a
        function around the call (``def evaluate_loss():`` inside ``main()``, as Hugging Face's
        no_trainer scripts and the many copied from them write their evaluation)."""
        if not isinstance(call.func, cst.Name):
            return None
        found = self.model.call_graph.callee(call)
        if found is not None and found[1] == 0:
            return found[0]
        return self.model.functions.get(call.func.value)

    def _own_methods(self, call: cst.Call) -> list[cst.FunctionDef]:
        """``self.evaluate(...)``: the method of the class the call is in, and the overrides
        of the file's subclasses (a ``Trainer(Base)`` whose ``evaluate`` reduces: ``Base.fit``
        runs it on a Trainer), as the call graph resolves them."""
        own = self._own_method(call)
        if own is None:
            return []
        overrides = [
            function
            for function, _ in self.model.call_graph.callees(call)
            if function.name.value == own.name.value and function is not own
        ]
        return [own, *overrides]

    def _own_method(self, call: cst.Call) -> cst.FunctionDef | None:
        """``self.train_step(...)``: the method of the class the call is in; also
        ``getattr(self, "train_step")(...)`` (a constant name), and ``self.step()`` where the
        class sets ``self.step`` to one of its methods (``setattr(self, "step",
        self.train_step)``, ``self.step = self.train_step``)."""
        name = _method_of_self(call.func)
        if name is None:
            return None
        owner = self.placement.class_of(call)
        if owner is None:
            return None
        methods = {
            statement.name.value: statement
            for statement in owner.body.body
            if isinstance(statement, cst.FunctionDef)
        }
        if name not in methods:
            name = self._aliased_method(owner, name, methods) or name
        return methods.get(name)

    def _aliased_method(
        self, owner: cst.ClassDef, name: str, methods: dict[str, cst.FunctionDef]
    ) -> str | None:
        """The method ``self.<name>`` is set to in ``owner`` (one method, wherever it is set):
        ``setattr(self, "m", self.sync)`` or ``self.m = self.sync``."""
        found: set[str] = set()
        for node in walk(owner):
            value = None
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == "setattr"
                and len(node.args) == 3
            ):
                target, key, value = (a.value for a in node.args)
                if not (
                    dotted(target) == "self"
                    and isinstance(key, cst.SimpleString)
                    and key.evaluated_value == name
                ):
                    continue
            elif isinstance(node, cst.Assign) and any(
                dotted(t.target) == f"self.{name}" for t in node.targets
            ):
                value = node.value
            if value is None:
                continue
            held = dotted(value) or ""
            if not (held.startswith("self.") and held[5:] in methods):
                return None  # set to something else too: which runs is not known here
            found.add(held[5:])
        return next(iter(found)) if len(found) == 1 else None


def _method_of_self(func: cst.BaseExpression) -> str | None:
    """``m`` of ``self.m`` and of ``getattr(self, "m")`` (a default after the name too)."""
    if isinstance(func, cst.Attribute):
        return func.attr.value if dotted(func.value) == "self" else None
    if (
        isinstance(func, cst.Call)
        and dotted(func.func) == "getattr"
        and len(func.args) in (2, 3)
        and all(a.keyword is None and not a.star for a in func.args)
        and dotted(func.args[0].value) == "self"
        and isinstance(func.args[1].value, cst.SimpleString)
    ):
        name = func.args[1].value.evaluated_value
        return name if isinstance(name, str) and name.isidentifier() else None
    return None


_NEGATED = ((cst.Equal, cst.NotEqual), (cst.Is, cst.IsNot), (cst.In, cst.NotIn))


def negations(model: ScriptModel, first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    """``not x`` and ``x``; ``a == b`` and ``a != b`` (``is``/``is not``, ``in``/``not in``). A
    walrus reads as its target: ``if (is_main := accelerator.is_main_process):`` and ``if not
    is_main:`` are one test and its negation."""
    first, second = bound_value(first), bound_value(second)
    for one, other in ((first, second), (second, first)):
        inner = _under_not(one)
        if inner is not None and spelled(model, inner) == spelled(model, other):
            return True
    if not (isinstance(first, cst.Comparison) and isinstance(second, cst.Comparison)):
        return False
    if len(first.comparisons) != 1 or len(second.comparisons) != 1:
        return False
    left, right = first.comparisons[0], second.comparisons[0]
    if spelled(model, first.left) != spelled(model, second.left) or spelled(
        model, left.comparator
    ) != spelled(model, right.comparator):
        return False
    kinds = {type(left.operator), type(right.operator)}
    return any(kinds == set(pair) for pair in _NEGATED)


def spelled(model: ScriptModel, test: cst.BaseExpression) -> str:
    """A test's code without its parentheses, a walrus read as its target."""
    return model.module.code_for_node(bound_value(test)).strip("() ")


def _under_not(test: cst.BaseExpression) -> cst.BaseExpression | None:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return None
