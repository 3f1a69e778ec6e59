"""Which conditions every rank agrees on. A collective (a barrier, a gather, a ``break`` out of
a loop the others keep running) under a condition the ranks may disagree on hangs the run.

A condition is rank-uniform when it reads only counters (names set to integer literals and
stepped by them, ``range``/``enumerate`` indices), constants and settings (``args.x``,
``config.x``); anything computed from this rank's data, a call, or an attribute of an object the
run mutates may differ between ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.collectives import DDP, DEEPSPEED, EVERY_BACKEND, FSDP, ZERO3
from accelify.analysis.loops import enumerates
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, operands, root_name, target_names, unpacked_pairs

SETTINGS_ROOTS = ("args", "config", "cfg", "opt", "opts", "hparams", "FLAGS")


#: The node types `RankDependence._find_counters` reads a counter's binding from
_COUNTER_NODES = frozenset({cst.AugAssign, cst.Assign, cst.NamedExpr, cst.For})


class RankDependence:
    def __init__(self, model: ScriptModel, placement: Placement) -> None:
        self.model = model
        self.placement = placement
        self._counters: set[str] | None = None
        self.backend_guards = BackendGuards(model, placement)

    def under_rank_guard(self, node: cst.CSTNode) -> bool:
        return self.model.under_rank_guard(node)

    def handler_around(self, node: cst.CSTNode) -> cst.ExceptHandler | None:
        """The ``except`` block of ``node``'s own function that holds it: a block the rank that
        raised enters alone, so a barrier or a collective there waits for ranks that never
        come."""
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.ExceptHandler):
                return ancestor
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return None
        return None

    def is_rank_test(self, test: cst.BaseExpression) -> bool:
        """``accelerator.is_main_process``, ``rank == 0``, a name set from one: true on some
        ranks only, on every backend."""
        return not self.backend_guards.truth(test).agree

    def per_process_stops(self) -> Iterator[tuple[cst.If, cst.Break | cst.Continue | cst.Return]]:
        """``if <value this rank computed>: ...; break`` (``continue`` inside a loop, ``return``
        inside a function): this rank alone leaves the loop, skips the rest of its iteration or
        of the function, and the others may wait for it in a collective there."""
        for node, stop in self.stops():
            if not self.uniform(node.test):
                yield node, stop

    def stops(self) -> Iterator[tuple[cst.If, cst.Break | cst.Continue | cst.Return]]:
        """Every ``if ...: ...; break`` (``continue`` in a loop, ``return`` in a function), with
        no ``else``, whatever it tests: `per_process_stops` keeps those whose test the ranks may
        disagree on by its spelling; `own_stops` follows the others' attributes (``if
        self.should_stop: break``) to what set them."""
        for node in self.model.index.of_type(cst.If):
            if node.orelse is not None:
                continue
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
            stop = _stop_of(body[-1]) if body else None
            if stop is None:
                continue
            if isinstance(stop, cst.Return):
                if self.model.index.enclosing_function(node) is None:
                    continue
            elif self.model.index.enclosing_loop(node) is None:
                continue
            yield node, stop

    def divergent_branch(
        self, node: cst.CSTNode, within: cst.CSTNode | None = None
    ) -> cst.If | None:
        """The outermost ``if``/``elif`` around ``node`` (inside ``within``) whose condition the
        ranks may disagree on, or None when every rank reaches ``node`` together. A rank guard
        (``if accelerator.is_main_process``) counts: the other ranks never get there."""
        found = None
        for ancestor in self.model.ancestors(node):
            if within is not None and ancestor is within:
                break
            if (
                isinstance(ancestor, cst.If)
                and not self.model.inside(node, ancestor.test)  # its test: every rank runs it
                and not self.uniform(ancestor.test)
            ):
                found = ancestor
        return found

    def barrier_places(self, save: cst.CSTNode) -> list[cst.CSTNode]:
        """Where a barrier before a save goes so that every rank reaches it: before the save, or
        before the outermost branch around it whose condition the ranks may disagree on
        (``if acc > best:`` on a per-rank metric), also at the call sites of a helper that
        saves, or of a method of the class that saves (``if loss < best_loss:
        self.save(epoch_dir)``): inside it the barrier would be reached by some ranks only."""
        function = self.placement.enclosing_function(save)
        branch = self.divergent_branch(save, within=function)
        if branch is not None:
            return [self._top_of_chain(branch)]
        if function is None:
            return [save]
        owner = self.model.parent(function)  # a function of the module
        if not isinstance(owner, cst.Module):
            owner = self.model.parent(owner)  # a method: its class, past the class's body
        if not isinstance(owner, (cst.Module, cst.ClassDef)):
            return [save]
        places = []
        calls = (
            self.model.call_graph.callers(function)
            if isinstance(owner, cst.ClassDef)
            else self.placement.callers(function)
        )
        for call in calls:
            if isinstance(owner, cst.ClassDef) and self.placement.class_of(call) is not owner:
                continue  # ``self.accelerator`` is the class's: a barrier outside it has none
            outer = self.divergent_branch(call, self.placement.enclosing_function(call))
            if outer is not None:
                places.append(self._top_of_chain(outer))
        return places or [save]

    def _top_of_chain(self, branch: cst.If) -> cst.CSTNode:
        """An ``elif`` is not a statement of its own: the barrier goes before its first ``if``."""
        while isinstance(self.model.parent(branch), cst.If):
            branch = self.model.parent(branch)  # type: ignore[assignment]
        return branch

    def counters(self) -> set[str]:
        """Names only set to integer literals or stepped by them, under tests every rank
        answers alike: equal on every rank."""
        if self._counters is None:
            self._counters, steps = self._find_counters()
            # ``else: bad += 1`` under a test of this rank's own loss counts per rank: drop
            # such names until what is left is stepped under agreed tests only
            while dropped := {
                name
                for name, step in steps
                if name in self._counters and not self._stepped_alike(step)
            }:
                self._counters -= dropped
        return self._counters

    def _stepped_alike(self, step: cst.CSTNode) -> bool:
        child, parent = step, self.model.parent(step)
        while parent is not None and not isinstance(
            parent, (cst.FunctionDef, cst.Lambda, cst.Module)
        ):
            # (a ``while``'s count is ACC215's question: ``while not done`` on a flag made
            # from a counter runs alike, and ``done`` is no counter itself)
            tested = isinstance(parent, cst.If) and child is not parent.test
            if tested and not self.uniform(parent.test):
                return False
            child, parent = parent, self.model.parent(parent)
        return True

    def _find_counters(self) -> tuple[set[str], list[tuple[str, cst.CSTNode]]]:
        assigned: dict[str, bool] = {}
        steps: list[tuple[str, cst.CSTNode]] = []
        for node in self.placement.all_nodes():
            if type(node) not in _COUNTER_NODES:
                continue  # (the four below have no subclass: one test of the exact type)
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                uniform = isinstance(node.value, cst.Integer)
                assigned[node.target.value] = assigned.get(node.target.value, True) and uniform
                steps.append((node.target.value, node))
            elif isinstance(node, cst.Assign):
                for target in node.targets:
                    # ``step, done = 0, False``: each name with the value at its place
                    pairs = unpacked_pairs(target.target, node.value) or [
                        (target.target, node.value)
                    ]
                    for bound, value in pairs:
                        for name in target_names(bound):
                            uniform = isinstance(value, cst.Integer) or integer_step(name, value)
                            assigned[name] = assigned.get(name, True) and uniform
                            steps.append((name, node))
            elif isinstance(node, cst.NamedExpr):
                for name in target_names(node.target):
                    assigned[name] = False  # ``(n := len(batch))``: whatever it holds
            elif isinstance(node, cst.For):
                iterable = node.iter
                is_range = isinstance(iterable, cst.Call) and dotted(iterable.func) == "range"
                counted = enumerates(iterable)  # also ``tqdm(enumerate(loader))``
                for name in target_names(node.target):
                    if is_range or (counted and _is_first_target(node.target, name)):
                        assigned.setdefault(name, True)
                    else:
                        assigned[name] = False
        return {name for name, uniform in assigned.items() if uniform}, steps

    def uniform(
        self,
        test: cst.BaseExpression,
        agreed: Container[str] = frozenset(),
        agreed_call: Callable[[cst.Call], bool] | None = None,
    ) -> bool:
        """Only counters, constants and settings: every rank agrees. A caller that knows more
        values every rank holds alike (the metrics of a gathered evaluation: `agreed_values`)
        names them in ``agreed`` and judges calls with ``agreed_call``; then an attribute of an
        agreed value is agreed, and a lambda or a comprehension is not followed."""
        follows = agreed_call is not None
        if isinstance(test, cst.Call):
            if _setting_spelled(test):
                return True
            return agreed_call is not None and agreed_call(test)
        if follows and isinstance(test, (cst.Lambda, cst.GeneratorExp, cst.ListComp, cst.DictComp)):
            return False
        counters = self.counters()
        if isinstance(test, cst.Attribute):
            root = root_name(test)
            return (
                root in (*SETTINGS_ROOTS, "self")
                or root in counters
                or (follows and self.uniform(test.value, agreed, agreed_call))
            )
        if isinstance(test, cst.Name):
            return (
                test.value in agreed
                or test.value in counters
                or test.value in ("True", "False", "None", "__name__")
                or test.value.isupper()
            )
        return all(self.uniform(operand, agreed, agreed_call) for operand in operands(test))


#: String methods whose result is the same wherever the string and the arguments are.
_STRING_METHODS = frozenset({"lower", "upper", "casefold", "strip", "startswith", "endswith"})


def integer_step(name: str, value: cst.BaseExpression) -> bool:
    """``step = step + 1`` (``1 + step``, ``step - 1``): the spelled-out ``step += 1``, which
    moves the count by the same amount on every rank."""
    if not (
        isinstance(value, cst.BinaryOperation)
        and isinstance(value.operator, (cst.Add, cst.Subtract))
    ):
        return False
    left, right = value.left, value.right
    if isinstance(left, cst.Name) and left.value == name:
        return isinstance(right, cst.Integer)
    return (
        isinstance(value.operator, cst.Add)
        and isinstance(left, cst.Integer)
        and isinstance(right, cst.Name)
        and right.value == name
    )


def _setting_spelled(call: cst.Call) -> bool:
    """``args.mode.lower()``, ``cfg.name.startswith("resnet")``: a setting's string spelled
    another way, with constant arguments, is the same on every rank."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in _STRING_METHODS
        and root_name(func.value) in SETTINGS_ROOTS
        and all(isinstance(arg.value, cst.SimpleString) and not arg.keyword for arg in call.args)
    )


def _is_first_target(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        first = target.elements[0].value
        return isinstance(first, cst.Name) and first.value == name
    return False


def _stop_of(line: cst.CSTNode) -> cst.Break | cst.Continue | cst.Return | None:
    """The ``break``, ``continue`` or ``return`` that ``line`` is, alone on its line."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        small = line.body[0]
        if isinstance(small, (cst.Break, cst.Continue, cst.Return)):
            return small
    return None


@dataclass(frozen=True)
class _Truth:
    """Per backend: where every rank computes the same value, where it is True on every rank,
    where False on every rank."""

    agree: frozenset[str]
    true: frozenset[str]
    false: frozenset[str]


_UNKNOWN_UNIFORM = _Truth(EVERY_BACKEND, frozenset(), frozenset())
_PER_RANK = _Truth(frozenset(), frozenset(), frozenset())

_BACKEND_MEMBERS = {
    "DEEPSPEED": frozenset({DEEPSPEED, ZERO3}),
    "FSDP": frozenset({FSDP}),
    "MULTI_GPU": frozenset({DDP}),
    "MULTI_CPU": frozenset({DDP}),
    "MULTI_XPU": frozenset({DDP}),
    "MULTI_NPU": frozenset({DDP}),
    "MULTI_MLU": frozenset({DDP}),
}


class BackendGuards:
    """Which ranks enter a branch, per backend. ``if accelerator.is_main_process or
    accelerator.distributed_type == DistributedType.DEEPSPEED:`` is entered by every rank under
    DeepSpeed and by one rank elsewhere: a ``save_state`` there (a collective under DeepSpeed)
    is called by every rank exactly where it must be."""

    def __init__(self, model: ScriptModel, placement: Placement) -> None:
        self.model = model
        self.placement = placement
        self._assigned: dict[str, list[cst.BaseExpression]] | None = None
        self._truths: dict[tuple[cst.BaseExpression, int], _Truth] = {}

    def agreed_on(
        self,
        node: cst.CSTNode,
        within: cst.CSTNode | None = None,
        ignoring: tuple[cst.CSTNode, ...] = (),
    ) -> frozenset[str]:
        """The backends on which every rank reaches ``node`` or none does (as far as the
        ``if`` statements around it, inside ``within``, go; a block-leaving ``if`` of
        ``ignoring`` above it left out, see `_tests_around`)."""
        agreed = EVERY_BACKEND
        for truth, _ in self._branches_around(node, within, ignoring):
            agreed &= truth.agree
        return agreed

    def reached_by_none(
        self,
        node: cst.CSTNode,
        within: cst.CSTNode | None = None,
        ignoring: tuple[cst.CSTNode, ...] = (),
    ) -> frozenset[str]:
        """The backends on which no rank reaches ``node``: ``elif accelerator.is_main_process:``
        after ``if is_fsdp:`` is never entered under FSDP, so a collective there cannot leave
        FSDP's ranks waiting."""
        conditions = list(self._tests_around(node, within, ignoring))
        unreached: frozenset[str] = frozenset()
        for test, in_body in conditions:
            truth = self.truth(test)
            unreached |= truth.false if in_body else truth.true
        for backend in EVERY_BACKEND - unreached:
            if not self._satisfiable(conditions, backend):
                unreached |= {backend}
        return unreached

    def _satisfiable(self, conditions: list[tuple[cst.BaseExpression, bool]], backend: str) -> bool:
        """Whether the tests around a node can all hold on ``backend``, whatever the other
        names hold: ``if not is_fsdp_lora and is_main:`` (``is_fsdp_lora = is_lora and
        distributed_type == FSDP``) then ``if is_lora:`` cannot under FSDP. Names set once are
        read through their value; anything else is a free atom (at most 8 of them)."""
        atoms: dict[str, None] = {}
        for test, _ in conditions:
            self._atoms(test, atoms, 0)
        if len(atoms) > 8:
            return True
        keys = list(atoms)
        for bits in range(1 << len(keys)):
            values = {key: bool(bits >> i & 1) for i, key in enumerate(keys)}
            if all(
                self._holds(test, backend, values, 0) is in_body for test, in_body in conditions
            ):
                return True
        return False

    def _inlined(self, test: cst.BaseExpression, depth: int) -> cst.BaseExpression | None:
        if isinstance(test, cst.Name) and depth < 3:
            values = self._assignments().get(test.value, [])
            if len(values) == 1:
                return values[0]
        return None

    def _atoms(self, test: cst.BaseExpression, atoms: dict[str, None], depth: int) -> None:
        if isinstance(test, cst.BooleanOperation):
            self._atoms(test.left, atoms, depth)
            self._atoms(test.right, atoms, depth)
        elif isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            self._atoms(test.expression, atoms, depth)
        elif _backend_test(test) is None:
            value = self._inlined(test, depth)
            if value is not None:
                self._atoms(value, atoms, depth + 1)
            else:
                atoms[self.model.module.code_for_node(test)] = None

    def _holds(
        self, test: cst.BaseExpression, backend: str, values: dict[str, bool], depth: int
    ) -> bool:
        if isinstance(test, cst.BooleanOperation):
            left = self._holds(test.left, backend, values, depth)
            right = self._holds(test.right, backend, values, depth)
            return (left or right) if isinstance(test.operator, cst.Or) else (left and right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return not self._holds(test.expression, backend, values, depth)
        backends = _backend_test(test)
        if backends is not None:
            return backend in backends
        value = self._inlined(test, depth)
        if value is not None:
            return self._holds(value, backend, values, depth + 1)
        return values[self.model.module.code_for_node(test)]

    def entered_by_all(
        self, node: cst.CSTNode, within: cst.CSTNode | None = None
    ) -> frozenset[str]:
        """The backends on which, whenever ``node`` runs, every rank runs it (a write there is
        N writes of one file)."""
        entered = EVERY_BACKEND
        for truth, in_body in self._branches_around(node, within):
            entered &= truth.agree - (truth.false if in_body else truth.true)
        return entered

    def _branches_around(
        self, node: cst.CSTNode, within: cst.CSTNode | None, ignoring: tuple[cst.CSTNode, ...] = ()
    ) -> Iterator[tuple[_Truth, bool]]:
        """The truth of each test around ``node`` (see `_tests_around`)."""
        for test, in_body in self._tests_around(node, within, ignoring):
            yield self.truth(test), in_body

    def _tests_around(
        self, node: cst.CSTNode, within: cst.CSTNode | None, ignoring: tuple[cst.CSTNode, ...] = ()
    ) -> Iterator[tuple[cst.BaseExpression, bool]]:
        """The test of each ``if`` around ``node`` (inside ``within``), and whether ``node`` is
        in its body (else in its ``else``/``elif``); a rank decorator of a function around it
        counts as an ``if`` around its body. A block-leaving ``if`` above ``node`` (``if
        is_main and done: break``) counts as an ``if`` around it unless it is one of
        ``ignoring``: ACC210 asks whether that ``break`` alone keeps ranks from ``node``."""
        child: cst.CSTNode = node
        for ancestor in self.model.ancestors(node):
            # by exact type: asked for every ancestor of every node a rule looks at, and an
            # isinstance miss on libcst's classes (ABCs) runs Python code; none has subclasses
            kind = type(ancestor)
            if kind is cst.FunctionDef and child is ancestor.body:
                # ``@accelerator.on_main_process``: the body runs under its rank test on every
                # call, so it counts also where ``within`` is the function itself
                decorated = self.model.rank_decorator_test(ancestor)
                if decorated is not None:
                    yield decorated, True
            if ancestor is within:
                return
            if kind is cst.If and child is not ancestor.test:
                yield ancestor.test, child is ancestor.body
            if kind is cst.IndentedBlock or kind is cst.Module:
                # ``if not accelerator.is_main_process: return`` above: what follows in the
                # block runs where that test is false
                for statement in ancestor.body:
                    if statement is child:
                        break
                    if _leaves_block(statement) and not any(statement is i for i in ignoring):
                        yield statement.test, False  # type: ignore[attr-defined]
            child = ancestor

    def truth(self, test: cst.BaseExpression, depth: int = 0) -> _Truth:
        """Asked for every ``if`` around every node a rule looks at: each answer is kept (it
        reads the test's code)."""
        key = (test, depth)
        found = self._truths.get(key)
        if found is None:
            found = self._truths[key] = self._truth(test, depth)
        return found

    def _truth(self, test: cst.BaseExpression, depth: int) -> _Truth:
        if isinstance(test, cst.BooleanOperation):
            left, right = self.truth(test.left, depth), self.truth(test.right, depth)
            if isinstance(test.operator, cst.Or):
                true = left.true | right.true
                false = left.false & right.false
                return _Truth(true | false | (left.agree & right.agree), true, false)
            true = left.true & right.true
            false = left.false | right.false
            return _Truth(true | false | (left.agree & right.agree), true, false)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.truth(test.expression, depth)
            return _Truth(inner.agree, inner.false, inner.true)
        single = _single_process_test(test)
        if single is not None:
            # ``if world_size <= 1:`` is entered by a run of one process only: there no write
            # is repeated and no collective waits; its ``else`` is every rank of a larger run
            return (
                _Truth(EVERY_BACKEND, frozenset(), EVERY_BACKEND)
                if single
                else _Truth(EVERY_BACKEND, EVERY_BACKEND, frozenset())
            )
        backends = _backend_test(test)
        if backends is not None:
            return _Truth(EVERY_BACKEND, backends, EVERY_BACKEND - backends)
        if isinstance(test, cst.Name) and depth < 3:
            values = self._assignments().get(test.value, [])
            if len(values) == 1:
                return self.truth(values[0], depth + 1)
        return _PER_RANK if self.model.reads_rank(test) else _UNKNOWN_UNIFORM

    def _assignments(self) -> dict[str, list[cst.BaseExpression]]:
        if self._assigned is None:
            self._assigned = {}
            for node in self.placement.all_nodes():
                if isinstance(node, cst.Assign) and len(node.targets) == 1:
                    target = node.targets[0].target
                    if isinstance(target, cst.Name):
                        self._assigned.setdefault(target.value, []).append(node.value)
        return self._assigned


def _leaves_block(statement: cst.CSTNode) -> bool:
    """An ``if`` without ``else`` whose body ends in ``return``, ``continue`` or ``break``. Not
    ``raise``: a rank that raises fails the job, and the launcher (torchrun, ``accelerate
    launch``) stops the other ranks with it, so what follows is not some ranks' alone (a
    consistency check ``if len(samples) != expected: raise`` before a ``reduce`` is no hang)."""
    if type(statement) is not cst.If or statement.orelse is not None:  # type: ignore[attr-defined]
        return False
    body = statement.body
    last = body.body[-1] if body.body else None
    if isinstance(body, cst.IndentedBlock):
        if not isinstance(last, cst.SimpleStatementLine):
            return False
        last = last.body[-1]
    return isinstance(last, (cst.Return, cst.Continue, cst.Break))


def _backend_test(test: cst.BaseExpression) -> frozenset[str] | None:
    """``distributed_type == DistributedType.DEEPSPEED`` (``!=``, ``in (...)``),
    ``state.deepspeed_plugin is not None``, ``is_deepspeed_zero3_enabled()``: where it holds."""
    if isinstance(test, cst.Call) and (dotted(test.func) or "").endswith("zero3_enabled"):
        return frozenset({ZERO3})
    plugin = _plugin_backends(test)
    if plugin is not None:
        return plugin
    flag = _backend_flag(test)
    if flag is not None:
        return flag
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    comparison = test.comparisons[0]
    left, right = dotted(test.left) or "", comparison.comparator
    if isinstance(comparison.operator, (cst.Is, cst.IsNot)) and dotted(right) == "None":
        plugin = _plugin_backends(test.left)
        if plugin is None:
            return None
        return plugin if isinstance(comparison.operator, cst.IsNot) else EVERY_BACKEND - plugin
    if not left.endswith("distributed_type"):
        return None
    members = (
        [e.value for e in right.elements] if isinstance(right, (cst.Tuple, cst.List)) else [right]
    )
    named_backends = frozenset().union(
        *(_BACKEND_MEMBERS.get((dotted(m) or "").rsplit(".", 1)[-1], frozenset()) for m in members)
    )
    if isinstance(comparison.operator, (cst.Equal, cst.In)):
        return named_backends
    if isinstance(comparison.operator, (cst.NotEqual, cst.NotIn)):
        return EVERY_BACKEND - named_backends
    return None


_PROCESS_COUNTS = ("world_size", "num_processes")


def _single_process_test(test: cst.BaseExpression) -> bool | None:
    """``world_size <= 1`` / ``num_processes == 1`` (True: one process), ``world_size > 1`` /
    ``num_processes != 1`` (False: several); None for any other test."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    count = (dotted(test.left) or "").rsplit(".", 1)[-1]
    comparison = test.comparisons[0]
    bound = comparison.comparator
    if count not in _PROCESS_COUNTS or not isinstance(bound, cst.Integer):
        return None
    value = bound.evaluated_value
    operator = comparison.operator
    if (isinstance(operator, (cst.LessThanEqual, cst.Equal)) and value == 1) or (
        isinstance(operator, cst.LessThan) and value == 2
    ):
        return True
    if (isinstance(operator, (cst.GreaterThan, cst.NotEqual)) and value == 1) or (
        isinstance(operator, cst.GreaterThanEqual) and value == 2
    ):
        return False
    return None


def _backend_flag(node: cst.BaseExpression) -> frozenset[str] | None:
    """The script's own switch for an engine, a setting's attribute (``args.use_deepspeed``,
    ``config.fsdp_enable``, ``self.config.use_deepspeed_optimizer``): set, the run is on that
    engine. A setting, not a
    call: ``is_deepspeed_available()`` says the package is installed, not that it runs."""
    if not isinstance(node, cst.Attribute):
        return None  # a local (``is_fsdp_lora``) is read through what it was set to
    name = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    if "deepspeed" in name:
        return frozenset({DEEPSPEED, ZERO3})
    if "fsdp" in name:
        return frozenset({FSDP})
    return None


def _plugin_backends(node: cst.BaseExpression) -> frozenset[str] | None:
    """``state.fsdp_plugin``, also spelled ``getattr(accelerator.state, "fsdp_plugin", None)``."""
    name = dotted(node) or ""
    if isinstance(node, cst.Call) and dotted(node.func) == "getattr" and len(node.args) >= 2:
        attribute = node.args[1].value
        if isinstance(attribute, cst.SimpleString) and isinstance(attribute.evaluated_value, str):
            name = attribute.evaluated_value
    if name.endswith("deepspeed_plugin"):
        return frozenset({DEEPSPEED, ZERO3})
    if name.endswith("fsdp_plugin"):
        return frozenset({FSDP})
    return None
