"""Where things are in the script: which statement of a scope holds a node, what encloses it,
where new code may go. Conversion steps and rules ask these; nothing here edits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Binding, Kind, Scope, ScriptModel
from accelify.analysis.syntax import (
    dotted,
    has_parameter,
    is_docstring,
    is_main_guard,
    keyword_value,
    strip_self_methods,
    target_names,
    walk,
)


class Placement:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model

    # --- traversal -------------------------------------------------------------------------------
    def all_nodes(self) -> list[cst.CSTNode]:
        """Every node in source order: the analysis's one walk recorded them."""
        return self.model.walked.nodes

    def attributes(self) -> Iterator[cst.Attribute]:
        return iter(self.model.index.of_type(cst.Attribute))  # type: ignore[arg-type]

    def withs(self) -> Iterator[cst.With]:
        return iter(self.model.index.of_type(cst.With))  # type: ignore[arg-type]

    def expression_statements(self) -> Iterator[tuple[cst.SimpleStatementLine, cst.Call]]:
        for node in self.model.index.of_type(cst.SimpleStatementLine):
            if (
                isinstance(node, cst.SimpleStatementLine)
                and len(node.body) == 1
                and isinstance(node.body[0], cst.Expr)
                and isinstance(node.body[0].value, cst.Call)
            ):
                yield node, node.body[0].value

    def callers(self, function: cst.FunctionDef) -> list[cst.Call]:
        """Calls of a module-level function by its plain name."""
        return list(self.model.index.calls_named(function.name.value))

    # --- scopes and statements -------------------------------------------------------------------
    def prepare_scope(self) -> Scope | None:
        """The scope that owns training: the constructor of the class whose methods train, when
        it holds a model and an optimizer (made there or handed in); else where the first
        optimizer (else model) is created."""
        trainer = self.trainer_constructor()
        if trainer is not None:
            return trainer
        for kind in (Kind.OPTIMIZER, Kind.MODEL):
            bindings = [b for b in self.model.of_kind(kind) if not b.received]
            owned = [b for b in bindings if not self._made_for_the_caller(b)]
            reached = [b for b in owned or bindings if not self.never_called(b.scope)]
            if owned or bindings:
                return self._outermost_training_scope(reached or owned or bindings)
        if self.model.backward_calls:
            return self.model.scope_of(self.model.backward_calls[0])
        return None

    def never_called(self, scope: Scope) -> bool:
        """A top-level function nothing in the file names (nor the project's other modules
        hand arguments to): an old ``make_trainer(cfg)`` left beside the ``main()`` that builds
        the objects that run. Prepared there, main's objects would never be."""
        if (
            not isinstance(scope, cst.FunctionDef)
            or self.model.parent(scope) is not self.model.module
        ):
            return False
        if scope in self.model.given_parameters:
            return False
        name = scope.name
        return not any(n is not name for n in self.model.index.names_spelled(name.value))

    def _outermost_training_scope(self, bindings: list[Binding]) -> Scope:
        """The first binding's scope, unless another function that trains with its own
        optimizer calls that one (SimCLR's ``main()`` pretrains its encoder through
        ``pretrain(encoder, loader, optimizer)``, then calls ``linear_probe()``, defined above
        it, which builds and trains a probe): ``main()`` assembles training and the probe's
        function is one of the others it calls, whatever order the file defines them in."""
        first = bindings[0].scope
        if not isinstance(first, cst.FunctionDef) or self.is_method(first):
            return first
        if not self._trains_its_own_model(bindings[0], first):
            return first
        for binding in bindings[1:]:
            scope = binding.scope
            if (
                isinstance(scope, cst.FunctionDef)
                and scope is not first
                and not self.is_method(scope)
                and self._calls(scope, first)
                and self._trains_with(scope, binding.name)
            ):
                return scope
        return first

    def _trains_its_own_model(self, optimizer: Binding, function: cst.FunctionDef) -> bool:
        """``function`` builds ``optimizer`` over models it makes itself and returns none of
        its objects: a probe or a second stage, not a factory (whose caller gets what it
        prepares) nor a warm-up of a model it is handed."""
        owners = parameter_owners(optimizer)
        if not owners or any(has_parameter(function, owner) for owner in owners):
            return False
        made = {optimizer.name, *owners}
        return not any(
            name in made
            for returned in self.model.index.own_returns(function)
            if returned.value is not None
            for node in walk(returned.value)
            if isinstance(node, cst.Name)
            for name in [node.value]
        )

    def _calls(self, caller: cst.FunctionDef, function: cst.FunctionDef) -> bool:
        graph = self.model.call_graph
        return any(
            function is callee
            for call in walk(caller.body)
            if isinstance(call, cst.Call)
            for callee, _ in graph.callees(call)
        )

    def _trains_with(self, scope: cst.FunctionDef, optimizer: str) -> bool:
        """A backward runs in ``scope``, or in a function of this file it hands ``optimizer``."""
        if self._has_backward(scope):
            return True
        graph = self.model.call_graph
        return any(
            isinstance(call, cst.Call)
            and any(dotted(arg.value) == optimizer for arg in call.args)
            and any(self._has_backward(callee) for callee, _ in graph.callees(call))
            for call in walk(scope.body)
        )

    def _has_backward(self, function: cst.FunctionDef) -> bool:
        return any(self.inside(call, function) for call in self.model.backward_calls)

    def _made_for_the_caller(self, optimizer: Binding) -> bool:
        """An optimizer a factory of this file builds over the model it is handed and returns
        (``build_optimizer(model, lr, ..., optimizer_type)`` choosing the class in an
        ``if``/``elif``): it belongs to the caller, where the model is and the returned
        optimizer is bound, and that is where training is assembled, not in the factory."""
        function = optimizer.scope
        if optimizer.kind is not Kind.OPTIMIZER or not isinstance(function, cst.FunctionDef):
            return False
        if self.is_method(function) or not self.model.index.calls_named(function.name.value):
            return False
        returns = self.model.index.own_returns(function)
        if not returns or any(dotted(r.value) != optimizer.name for r in returns if r.value):
            return False
        owners = parameter_owners(optimizer)
        if not owners:  # ``def build_optimizer(cfg, params): opt = SGD(params, ...)``
            handed = _parameters_handed(optimizer)
            return handed is not None and has_parameter(function, handed)
        return all(has_parameter(function, owner) for owner in owners)

    def trainer_constructor(self) -> cst.FunctionDef | None:
        """``Trainer.__init__`` when every ``.backward()`` is in methods of ``Trainer`` (not a
        model class) and its constructor stores a model and an optimizer, whoever made them:
        the class assembles what it trains with, so the accelerator lives on its instance."""
        owners = {self.class_of(call) for call in self.model.backward_calls}
        if len(owners) > 1 and None not in owners:
            # Two trainer classes in one file (``SingleTaskTrainer`` and ``MultiTaskTrainer``):
            # the one the file builds is the one that trains.
            built = {o for o in owners if o and self.model.index.calls_named(o.name.value)}
            owners = built if len(built) == 1 else owners
        if len(owners) != 1:
            return None
        (owner,) = owners
        if owner is None or owner.name.value in self.model.module_classes:
            return None
        body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
        init = next(
            (m for m in body if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"),
            None,
        )
        if init is None:
            return None
        held = {b.kind for b in self.model.bindings if b.scope is init}
        return init if {Kind.MODEL, Kind.OPTIMIZER} <= held else None

    def is_method(self, scope: Scope) -> bool:
        parent = self.model.parent(scope)
        return parent is not None and isinstance(self.model.parent(parent), cst.ClassDef)

    def body_of(self, scope: cst.CSTNode) -> list[cst.CSTNode]:
        """A scope's statements in order. A module's ``if __name__ == "__main__":`` block counts
        as the module's own statements: code placed for it (the Accelerator, a prepare call)
        goes inside the block, where the script's statements are."""
        if isinstance(scope, cst.Module):
            statements: list[cst.CSTNode] = []
            for line in scope.body:
                if is_main_guard(line) and isinstance(line.body, cst.IndentedBlock):
                    statements.extend(line.body.body)
                else:
                    statements.append(line)
            return statements
        body = scope.body  # type: ignore[attr-defined]
        return list(body.body) if isinstance(body, cst.IndentedBlock) else [body]

    def top_statement(self, node: cst.CSTNode, scope: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of ``scope``'s own body that holds ``node``."""
        body = self.body_of(scope)
        if node in body:
            return node
        for ancestor in self.model.ancestors(node):
            if ancestor in body:
                return ancestor
        return None

    def index(self, top: cst.CSTNode, scope: Scope) -> int:
        return self.body_of(scope).index(top)

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return self.model.index.enclosing_function(node)

    def running_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function whose call runs ``node``: the closest one that holds it in its body. A
        default value, a decorator or an annotation (``def __init__(self, noise=torch.randn(32,
        4))``) runs once, when the ``def`` statement runs (at class or module definition), in
        the code around that ``def``, not on each call."""
        child: cst.CSTNode = node
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef) and child is ancestor.body:
                return ancestor
            child = ancestor
        return None

    def runs_inside(self, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
        """``node`` runs during a call of ``function`` (`running_function`, outwards)."""
        current = self.running_function(node)
        while current is not None:
            if current is function:
                return True
            current = self.running_function(current)
        return False

    def top_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        found = None
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                found = ancestor
        return found

    def class_of(self, node: cst.CSTNode) -> cst.ClassDef | None:
        return self.model.index.enclosing_class(node)

    def returns_name(self, scope: Scope, name: str) -> bool:
        """``scope`` is a function that returns ``name`` (alone or in a tuple): a factory."""
        if not isinstance(scope, cst.FunctionDef):
            return False
        for node in walk(scope.body):
            if isinstance(node, cst.Return) and node.value is not None:
                value = node.value
                parts = value.elements if isinstance(value, cst.Tuple) else [value]
                values = [p.value if isinstance(p, cst.Element) else p for p in parts]
                if any(dotted(v) == name for v in values):
                    return self.enclosing_function(node) is scope
        return False

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return self.model.inside(node, container)

    def in_loop_body(self, node: cst.CSTNode, loop: cst.For | cst.While) -> bool:
        """``node`` runs on each iteration of ``loop``: in its body, not in its ``else:`` (which
        runs once, when the loop ends) nor in the iterable it reads."""
        child: cst.CSTNode = node
        for ancestor in self.model.ancestors(node):
            if ancestor is loop:
                return child is loop.body
            child = ancestor
        return False

    def exclusive(self, one: cst.CSTNode, other: cst.CSTNode) -> bool:
        """``one`` and ``other`` sit in different arms of one ``if``/``elif``/``else`` chain
        that no loop in their function runs again: a single pass runs at most one of them
        (``model = accelerator.prepare(model)`` under ``if args.fsdp:`` and ``model, opt =
        accelerator.prepare(model, opt)`` under its ``else``)."""
        arms: dict[int, cst.CSTNode] = {}
        child: cst.CSTNode = one
        for ancestor in self.model.ancestors(one):
            if isinstance(ancestor, cst.If) and child is not ancestor.test:
                arms[id(ancestor)] = child
            child = ancestor
        child = other
        for ancestor in self.model.ancestors(other):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            arm = arms.get(id(ancestor))
            if arm is not None and child is not ancestor.test:
                return arm is not child and not self._in_a_loop(ancestor)
            child = ancestor
        return False

    def _in_a_loop(self, node: cst.CSTNode) -> bool:
        """A loop around ``node`` in its function (or module): it may run again."""
        return self.model.index.enclosing_loop(node) is not None

    def first_free_index(self, home: cst.CSTNode, before: int | None = None) -> int:
        """The first statement new code may precede: after a docstring, and in a module after
        the imports. With ``before``, only the imports above that index count: a script that
        imports again further down (``import torch.nn as nn`` after a print) still gets its
        new code before the statement at ``before``, which needs it."""
        body = self.body_of(home)
        floor = 0
        for index, line in enumerate(body):
            if before is not None and index >= before:
                break
            if index == 0 and is_docstring(line):
                floor = 1
            if (
                isinstance(home, cst.Module)
                and isinstance(line, cst.SimpleStatementLine)
                and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)
            ):
                floor = index + 1
        return floor

    # --- moving a constant up --------------------------------------------------------------------
    def hoistable(
        self, body: list[cst.CSTNode], anchor: cst.CSTNode, name: str
    ) -> cst.SimpleStatementLine | None:
        """``accum = 2`` written after ``anchor``, when moving it up changes nothing else: a plain
        assignment of ``name`` alone, no call in its value, nothing it reads assigned in
        between, and ``name`` neither read nor set in between."""
        start = body.index(anchor)
        for index in range(start, len(body)):
            line = body[index]
            assigns = [n for n in walk(line) if isinstance(n, cst.AssignTarget)]
            if not any(name in _assigned(a.target) for a in assigns):
                continue
            if not (
                isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1
                and isinstance(line.body[0], cst.Assign)
                and [dotted(t.target) for t in line.body[0].targets] == [name]
            ):
                return None
            value = line.body[0].value
            reads = {n.value for n in walk(value) if isinstance(n, cst.Name)}
            if any(isinstance(n, (cst.Call, cst.Await, cst.Yield)) for n in walk(value)):
                return None
            between = [n for statement in body[start:index] for n in walk(statement)]
            touched = {n.value for n in between if isinstance(n, cst.Name)} | {
                dotted(n) for n in between if isinstance(n, cst.Attribute)
            }
            set_between = {
                name
                for n in between
                if isinstance(n, cst.AssignTarget)
                for name in target_names(n.target)
            }
            if name in touched or reads & set_between:
                return None
            return line
        return None

    def assigned_after(
        self, anchor: cst.CSTNode, home: cst.CSTNode, codes: Iterable[str]
    ) -> list[tuple[str, int]]:
        """Names read by ``codes`` that ``home`` assigns at or after ``anchor``; an attribute
        of the instance too (``gradient_accumulation_steps=self.accum_steps`` before
        ``self.accum_steps = accum_steps`` would raise AttributeError)."""
        wanted = _read_by(codes)
        body = self.body_of(home)
        late = []
        for line in body[body.index(anchor) :]:
            for node in walk(line):
                if isinstance(node, cst.AssignTarget):
                    for name in _assigned(node.target) & wanted:
                        late.append((name, self.model.line(node)))
        return late

    def bound_per_iteration(
        self, home: cst.CSTNode, codes: Iterable[str]
    ) -> list[tuple[str, cst.For]]:
        """Names read by ``codes`` that a ``for`` loop of ``home`` binds anew per iteration, as
        its target (``lr`` of ``for lr in [0.01, 0.1]:``) or anywhere in its body (``lr, amp =
        cfg`` of ``for cfg in runs:``), with that loop: a value per iteration, which nothing
        made once before the loop can read, and nothing made once per process can follow from
        one iteration to the next. A parameter of ``home`` counts where a call of it sits in
        such a loop and passes it a name bound there (``Trainer(lr, amp)`` in ``for lr, amp in
        runs:``, whose ``__init__`` reads ``amp``): one object, and so one setting, per run."""
        wanted = _read_by(codes, attributes=False)
        found = []
        for line in self.body_of(home):
            for node in walk(line):
                if isinstance(node, cst.For) and self.model.scope_of(node) is home:
                    found += [(name, node) for name in sorted(self._bound_in(node) & wanted)]
        if isinstance(home, cst.FunctionDef):
            found += self._passed_per_iteration(home, wanted)
        return found

    def _passed_per_iteration(
        self, function: cst.FunctionDef, wanted: set[str]
    ) -> list[tuple[str, cst.For]]:
        """Calls of ``function`` inside a ``for`` loop that pass one of the ``wanted``
        parameters a name that loop binds per iteration."""
        parameters = {p.name.value for p in function.params.params} & wanted
        if not parameters:
            return []
        implicit = 1 if self.class_of(function) is not None else 0  # ``self``
        found = []
        for call in self.model.call_graph.callers(function):
            passed = {
                node.value
                for parameter, argument in bound_arguments(function, call, implicit)
                if parameter in parameters
                for node in walk(argument.value)
                if isinstance(node, cst.Name)
            }
            for loop in self.model.ancestors(call):
                if isinstance(loop, cst.For) and not self.model.inside(call, loop.iter):
                    found += [(name, loop) for name in sorted(self._bound_in(loop) & passed)]
        return found

    def _bound_in(self, loop: cst.For) -> set[str]:
        """The names ``loop`` binds per iteration: its target, and what its body assigns in
        the loop's own scope (not in a function defined there)."""
        scope = self.model.scope_of(loop)
        bound = _assigned(loop.target)
        for node in walk(loop.body):
            if self.model.scope_of(node) is not scope:
                continue
            if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For)):
                bound |= target_names(node.target)
            elif isinstance(node, cst.AsName):
                bound |= target_names(node.name)
        return bound


def _read_by(codes: Iterable[str], attributes: bool = True) -> set[str]:
    """The names and instance attributes (``self.accum_steps``) the expressions ``codes``
    read, but torch and the constants. ``attributes=False``: not the names of attributes
    either (``amp`` of ``cfg.amp`` is no variable)."""
    wanted = set()
    for code in codes:
        expression = cst.parse_expression(code)
        members = set()
        for node in walk(expression):
            spelling = dotted(node) if isinstance(node, cst.Attribute) else None
            if spelling is not None and spelling.startswith("self."):
                wanted.add(spelling)
            if isinstance(node, cst.Attribute) and not attributes:
                members.add(id(node.attr))
        wanted |= {
            node.value
            for node in walk(expression)
            if isinstance(node, cst.Name)
            and id(node) not in members
            and node.value not in ("torch", "True", "False", "None")
        }
    return wanted


def _assigned(target: cst.BaseExpression) -> set[str]:
    """The names an assignment target binds, an attribute (``self.accum_steps``) by its
    spelling."""
    spelling = dotted(target) if isinstance(target, cst.Attribute) else None
    return target_names(target) | ({spelling} if spelling else set())


def _parameters_handed(optimizer: Binding) -> str | None:
    """The plain name an optimizer is built over (``params`` of ``SGD(params, lr=...)``, or of
    ``params=``): where that name is the factory's parameter, the caller's argument
    (``model.parameters()``) says which model it trains, and the caller assembles training."""
    core = strip_self_methods(optimizer.value)
    if not isinstance(core, cst.Call):
        return None
    given = keyword_value(core, "params")
    if given is None and core.args and core.args[0].keyword is None and not core.args[0].star:
        given = core.args[0].value
    return given.value if isinstance(given, cst.Name) else None
