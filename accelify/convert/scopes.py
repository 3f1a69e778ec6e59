"""Where things are in the script: statements of a scope, what helpers receive, what runs where.

The planner's questions about placement (which statement of ``main()`` holds a node, is a node
after ``prepare``, under ``if rank == 0:``, which helper parameters receive a DataLoader) are
answered here, from the same `ScriptModel`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst

from accelify.analysis.script_model import (
    Kind,
    Loop,
    Scope,
    ScriptModel,
    Visitor,
    dotted,
    root_name,
    target_names,
)
from accelify.convert.plan import Plan, with_keyword


class Scopes:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self._nodes: list[cst.CSTNode] | None = None
        self.params = self._parameters_from_call_sites()
        self.prepare_anchor: cst.CSTNode | None = None

    # --- traversal -------------------------------------------------------------------------------
    def all_nodes(self) -> list[cst.CSTNode]:
        if self._nodes is None:
            collected: list[cst.CSTNode] = []

            class Everything(Visitor):
                def on_visit(self, node: cst.CSTNode) -> bool:
                    collected.append(node)
                    return True

            self.model.module.visit(Everything())
            self._nodes = collected
        return self._nodes

    def walk(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(current.children))

    def calls(self) -> Iterator[cst.Call]:
        return iter(self.model.calls)

    def attributes(self) -> Iterator[cst.Attribute]:
        return (n for n in self.all_nodes() if isinstance(n, cst.Attribute))

    def withs(self) -> Iterator[cst.With]:
        return (n for n in self.all_nodes() if isinstance(n, cst.With))

    def expression_statements(self) -> Iterator[tuple[cst.SimpleStatementLine, cst.Call]]:
        for node in self.all_nodes():
            if (
                isinstance(node, cst.SimpleStatementLine)
                and len(node.body) == 1
                and isinstance(node.body[0], cst.Expr)
                and isinstance(node.body[0].value, cst.Call)
            ):
                yield node, node.body[0].value

    def names_in(self, node: cst.CSTNode) -> Iterator[cst.Name]:
        return (n for n in self.walk(node) if isinstance(n, cst.Name))

    # --- scopes and statements -------------------------------------------------------------------
    def prepare_scope(self) -> Scope | None:
        for kind in (Kind.OPTIMIZER, Kind.MODEL):
            bindings = self.model.of_kind(kind)
            if bindings:
                return bindings[0].scope
        if self.model.backward_calls:
            return self.model.scope_of(self.model.backward_calls[0])
        return None

    def is_method(self, scope: Scope) -> bool:
        parent = self.model.parent(scope)
        grandparent = self.model.parent(parent) if parent is not None else None
        return isinstance(grandparent, cst.ClassDef)

    def body_of(self, scope: Scope) -> list[cst.CSTNode]:
        if isinstance(scope, cst.Module):
            return list(scope.body)
        body = scope.body
        return list(body.body) if isinstance(body, cst.IndentedBlock) else [body]

    def top_statement(self, node: cst.CSTNode, scope: Scope) -> cst.CSTNode | None:
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
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return None

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return node is container or any(a is container for a in self.model.ancestors(node))

    # --- what helper parameters receive ----------------------------------------------------------
    def _parameters_from_call_sites(self) -> dict[cst.FunctionDef, dict[str, Kind]]:
        """``train(args, model, device, train_loader, ...)``: ``train``'s ``model`` is a model."""
        kinds_by_name: dict[str, Kind] = {}
        for binding in self.model.bindings:
            kinds_by_name.setdefault(binding.name, binding.kind)
        result: dict[cst.FunctionDef, dict[str, Kind]] = {}
        for node in self.all_nodes():
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
                continue
            function = self.model.functions.get(node.func.value)
            if function is None:
                continue
            positional = [p.name.value for p in function.params.params]
            for index, argument in enumerate(node.args):
                kind = kinds_by_name.get(dotted(argument.value) or "")
                if kind is None or argument.star:
                    continue
                if argument.keyword is not None:
                    parameter = argument.keyword.value
                elif index < len(positional):
                    parameter = positional[index]
                else:
                    continue
                result.setdefault(function, {})[parameter] = kind
        return result

    def param_names(self, kind: Kind) -> set[str]:
        return {name for params in self.params.values() for name, k in params.items() if k is kind}

    def kind_of(self, name: str | None, at: cst.CSTNode) -> Kind | None:
        """What ``name`` holds where ``at`` is: the scope's own bindings, module globals,
        ``self.x`` of the same class, a helper's parameters, or an enclosing function's names.
        A name bound several ways (``model = DataParallel(net)``) counts as a model first."""
        if name is None:
            return None
        scope = self.model.scope_of(at)
        found = {
            binding.kind
            for binding in self.model.bindings
            if binding.name == name and self._visible(binding.scope, scope, name, at)
        }
        function = self.enclosing_function(at)
        while function is not None and not found:
            kind = self.params.get(function, {}).get(name)
            if kind is not None:
                found.add(kind)
            function = self.enclosing_function(function)
        return min(found, key=list(Kind).index) if found else None

    def _visible(self, bound_in: Scope, scope: Scope, name: str, at: cst.CSTNode) -> bool:
        if bound_in is scope or isinstance(bound_in, cst.Module) or self.inside(at, bound_in):
            return True
        if name.startswith("self."):
            return self._class_of(bound_in) is not None and self._class_of(
                bound_in
            ) is self._class_of(scope)
        return False

    def _class_of(self, scope: Scope) -> cst.ClassDef | None:
        for ancestor in self.model.ancestors(scope):
            if isinstance(ancestor, cst.ClassDef):
                return ancestor
        return None

    def is_model_name(self, name: str | None, at: cst.CSTNode) -> bool:
        return self.kind_of(name, at) is Kind.MODEL

    def model_names_in_scope(self, scope: Scope) -> list[str]:
        found = [b.name for b in self.model.of_kind(Kind.MODEL) if b.scope is scope]
        if isinstance(scope, cst.FunctionDef):
            found += [n for n, k in self.params.get(scope, {}).items() if k is Kind.MODEL]
        return list(dict.fromkeys(found))

    def reads_loader(self, loop: Loop) -> bool:
        return self.kind_of(loop.iterable, loop.node) is Kind.DATALOADER

    def derived_batch_names(self, loop: Loop) -> set[str]:
        """Names unpacked or indexed out of the batch at the top of the loop body."""
        batch = set(loop.batch_names)
        derived: set[str] = set()
        for line in loop.node.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                continue
            for small in line.body:
                if isinstance(small, cst.Assign) and root_name(small.value) in batch | derived:
                    for target in small.targets:
                        derived |= target_names(target.target)
        return derived

    # --- placement questions ---------------------------------------------------------------------
    def after_prepare(self, node: cst.CSTNode) -> bool:
        anchor = self.prepare_anchor
        if anchor is None:
            return False
        scope = self.model.scope_of(anchor)
        if self.inside(node, scope) and self.model.scope_of(node) is scope:
            return self.model.line(node) > self.model.line(anchor)
        return True

    def under_rank_guard(self, node: cst.CSTNode) -> bool:
        return self.model.under_rank_guard(node)

    def per_epoch_schedulers(self, scope: Scope, prepared: set[str]) -> set[str]:
        schedulers = {b.name for b in self.model.of_kind(Kind.SCHEDULER) if b.name in prepared}
        per_step: set[str] = set()
        stepped: set[str] = set()
        batch_loops = [
            loop.node for loop in self.model.loops if loop.trains or self.reads_loader(loop)
        ]
        for call in self.calls():
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"):
                continue
            owner = dotted(call.func.value)
            if self.kind_of(owner, call) is not Kind.SCHEDULER:
                continue
            outer_name = owner if owner in schedulers else self._outer_name(owner, call)
            stepped.add(outer_name or "")
            if any(self.inside(call, loop) for loop in batch_loops):
                per_step.add(outer_name or "")
        return {name for name in schedulers if name in stepped and name not in per_step}

    def _outer_name(self, parameter: str | None, at: cst.CSTNode) -> str | None:
        function = self.enclosing_function(at)
        if function is None or parameter is None:
            return parameter
        for node in self.calls():
            if isinstance(node.func, cst.Name) and node.func.value == function.name.value:
                positional = [p.name.value for p in function.params.params]
                for index, argument in enumerate(node.args):
                    name = (
                        argument.keyword.value
                        if argument.keyword
                        else (positional[index] if index < len(positional) else None)
                    )
                    if name == parameter:
                        return dotted(argument.value)
        return parameter

    def per_process_breaks(self) -> Iterator[tuple[cst.If, cst.SimpleStatementLine]]:
        """``if <value this rank computed>: break`` inside a loop: other ranks would hang."""
        counters = self._counters()
        for node in self.all_nodes():
            if not isinstance(node, cst.If) or node.orelse is not None:
                continue
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
            if not body or not _is_break(body[-1]):
                continue
            if not any(isinstance(a, (cst.For, cst.While)) for a in self.model.ancestors(node)):
                continue
            if self._rank_uniform(node.test, counters):
                continue
            yield node, body[-1]  # type: ignore[misc]

    def _counters(self) -> set[str]:
        """Names only set to integer literals or incremented by them: equal on every rank."""
        assigned: dict[str, bool] = {}
        for node in self.all_nodes():
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                uniform = isinstance(node.value, cst.Integer)
                assigned[node.target.value] = assigned.get(node.target.value, True) and uniform
            elif isinstance(node, cst.Assign):
                for target in node.targets:
                    for name in target_names(target.target):
                        uniform = isinstance(node.value, cst.Integer)
                        assigned[name] = assigned.get(name, True) and uniform
            elif isinstance(node, cst.For):
                iterable = node.iter
                is_range = isinstance(iterable, cst.Call) and dotted(iterable.func) in (
                    "range",
                    "enumerate",
                )
                for name in target_names(node.target):
                    if is_range and (
                        dotted(iterable.func) == "range" or _is_first_target(node.target, name)
                    ):  # type: ignore[union-attr]
                        assigned.setdefault(name, True)
                    else:
                        assigned[name] = False
        return {name for name, uniform in assigned.items() if uniform}

    def _rank_uniform(self, test: cst.BaseExpression, counters: set[str]) -> bool:
        """Only counters, constants and settings (``args.x``, ``config.x``): every rank agrees."""
        if isinstance(test, cst.Call):
            return False
        if isinstance(test, cst.Attribute):
            root = root_name(test)
            return root in ("args", "config", "cfg", "opt", "opts", "self") or root in counters
        if isinstance(test, cst.Name):
            return (
                test.value in counters
                or test.value in ("True", "False", "None")
                or test.value.isupper()
            )
        if isinstance(test, cst.Subscript):
            return self._rank_uniform(test.value, counters)
        children = [c for c in test.children if isinstance(c, cst.BaseExpression)]
        return all(self._rank_uniform(child, counters) for child in children)

    # --- the accelerator's home and its threading ------------------------------------------------
    def accelerator_home(self, prepare_scope: Scope, needs: list[cst.CSTNode], acc: str) -> Scope:
        if acc.startswith("self."):
            return prepare_scope
        if any(isinstance(self.model.scope_of(n), cst.Module) for n in needs):
            return self.model.module
        return prepare_scope

    def thread(
        self, home: Scope, needs: list[cst.CSTNode], acc: str, plan: Plan
    ) -> list[cst.CSTNode]:
        """Give each helper that needs the accelerator a parameter, and its callers the argument."""
        if isinstance(home, cst.Module):
            return []
        if acc.startswith("self."):
            owner = self.model.parent(self.model.parent(home))
            for need in needs:
                if not self.inside(need, owner):  # type: ignore[arg-type]
                    plan.review(
                        self.model.line(need),
                        f"needs {acc} outside its class: pass the accelerator in",
                    )
            return []
        call_sites: list[cst.CSTNode] = []
        pending = [n for n in needs]
        done: set[cst.FunctionDef] = set()
        while pending:
            need = pending.pop()
            function = self._top_function(need)
            if (
                function is None
                or function is home
                or self.inside(function, home)
                or function in done
            ):
                continue
            if self.inside(home, function):
                continue
            done.add(function)
            plan.new_parameters[function] = acc
            plan.change(
                self.model.line(function),
                f"{function.name.value}() takes the accelerator as a parameter",
            )
            callers = [
                c
                for c in self.calls()
                if isinstance(c.func, cst.Name) and c.func.value == function.name.value
            ]
            if not callers:
                plan.review(
                    self.model.line(function),
                    f"{function.name.value}() now takes `accelerator`; "
                    "its callers elsewhere must pass it",
                )
            for call in callers:
                previous = plan.replacements.get(call)
                plan.replacements[call] = _with_accelerator_argument(acc, previous)
                call_sites.append(call)
                pending.append(call)
        return call_sites

    def _top_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        found = None
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                found = ancestor
        return found

    def first_need(
        self, home: Scope, needs: list[cst.CSTNode], call_sites: list[cst.CSTNode]
    ) -> cst.CSTNode | None:
        body = self.body_of(home)
        indices = []
        for node in [*needs, *call_sites]:
            if isinstance(home, cst.Module) and not isinstance(
                self.model.scope_of(node), cst.Module
            ):
                continue
            top = self.top_statement(node, home)
            if top is not None:
                indices.append(body.index(top))
        if not indices:
            return None
        first = min(indices)
        floor = self._first_free_index(home)
        return body[max(first, floor)] if max(first, floor) < len(body) else body[-1]

    def _first_free_index(self, home: Scope) -> int:
        body = self.body_of(home)
        floor = 0
        for index, line in enumerate(body):
            if index == 0 and is_docstring(line):
                floor = 1
            if (
                isinstance(home, cst.Module)
                and isinstance(line, cst.SimpleStatementLine)
                and any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)
            ):
                floor = index + 1
        return floor

    def hoistable(
        self, body: list[cst.CSTNode], anchor: cst.CSTNode, name: str
    ) -> cst.SimpleStatementLine | None:
        """``accum = 2`` written after the place the Accelerator is created, when moving it up
        changes nothing else: a plain assignment of ``name`` alone, no call in its value, nothing
        it reads assigned in between, and ``name`` neither read nor set in between."""
        start = body.index(anchor)
        for index in range(start, len(body)):
            line = body[index]
            assigns = [n for n in self.walk(line) if isinstance(n, cst.AssignTarget)]
            if not any(name in target_names(a.target) for a in assigns):
                continue
            if not (
                isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1
                and isinstance(line.body[0], cst.Assign)
                and [dotted(t.target) for t in line.body[0].targets] == [name]
            ):
                return None
            value = line.body[0].value
            reads = {n.value for n in self.walk(value) if isinstance(n, cst.Name)}
            if any(isinstance(n, (cst.Call, cst.Await, cst.Yield)) for n in self.walk(value)):
                return None
            between = [n for statement in body[start:index] for n in self.walk(statement)]
            touched = {n.value for n in between if isinstance(n, cst.Name)}
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
        self, anchor: cst.CSTNode, home: Scope, codes: Iterable[str]
    ) -> list[tuple[str, int]]:
        wanted = set()
        for code in codes:
            for node in self.walk(cst.parse_expression(code)):
                if isinstance(node, cst.Name) and node.value not in (
                    "torch",
                    "True",
                    "False",
                    "None",
                ):
                    wanted.add(node.value)
        body = self.body_of(home)
        start = body.index(anchor)
        late = []
        for line in body[start:]:
            for node in self.walk(line):
                if isinstance(node, cst.AssignTarget):
                    for name in target_names(node.target) & wanted:
                        late.append((name, self.model.line(node)))
        return late


def _with_accelerator_argument(acc: str, previous):
    def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
        if previous is not None:
            updated = previous(updated)
        assert isinstance(updated, cst.Call)
        if any(a.keyword and a.keyword.value == acc for a in updated.args):
            return updated
        return updated.with_changes(args=with_keyword(updated.args, acc, cst.Name(acc)))

    return rewrite


def _is_first_target(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        first = target.elements[0].value
        return isinstance(first, cst.Name) and first.value == name
    return False


def _is_break(line: cst.CSTNode) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Break)
    )


def is_docstring(line: cst.CSTNode) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Expr)
        and isinstance(line.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
