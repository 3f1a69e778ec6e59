"""Lookups that the analysis repeats thousands of times per file, each built once on first use.

"Which function encloses this node", "which assignments bind ``self.model``", "which calls name
``train``" and "what does this function's own body hold" were each answered by walking the
tree or scanning every assignment or call again at every question: on a file with a few
thousand calls that was most of lint's time. The answers never change once the analysis's walk
has recorded the parents, so each is computed once per `ScriptModel` and kept (nothing is built
before a rule or a step asks).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import (
    Assignment,
    assigned_targets,
    children_of,
    dotted,
    target_names,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.script_model import Scope, ScriptModel

_SCOPES = (cst.FunctionDef, cst.Module)
#: What `Index.enclosing_loop` looks up to: a loop, or the function or class it may not cross.
_LOOPS_AND_SCOPES = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)
_UNKNOWN = object()  # `Index.nearest` has no answer for the node yet
#: Where a function's own body stops: the bodies of functions and classes defined inside it.
#: (Compared by exact type: libcst's node classes are abstract base classes, whose isinstance
#: runs a Python-level check for every miss; these three have no subclasses.)
_NESTED = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
#: Statements that bind a name (or ``self.x``) to a value.
Binding = cst.Assign | cst.AugAssign | cst.AnnAssign


#: By the kind `Index.of_type` is asked for, whether each node type is one, kept for the
#: process: each file asks it of every node type of the file for each kind, and a miss against
#: libcst's abstract classes runs ABCMeta's Python-level check.
_SUBCLASS: dict[type | tuple[type, ...], dict[type, bool]] = {}


class Index:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        #: by the kinds asked for, then by the id of a node of the tree (`ScriptModel.parents`)
        self._nearest: dict[type | tuple[type, ...], dict[int, cst.CSTNode | None]] = {}
        self._own: dict[cst.FunctionDef | cst.Module, list[cst.CSTNode]] = {}
        self._of_type: dict[type | tuple[type, ...], list[cst.CSTNode]] = {}
        #: by ``kinds`` of `nearest`, whether a node type is one (ABC checks are slow)
        self._is_kind: dict[type | tuple[type, ...], dict[type, bool]] = {}
        self._own_of_type: dict[tuple[cst.FunctionDef, type], list[cst.CSTNode]] = {}
        self._bindings: dict[cst.FunctionDef | None, dict[str | None, list[Binding]]] = {}
        self._assigned_under: dict[cst.FunctionDef, dict[str, list[cst.BaseExpression]]] = {}

    # --- what encloses a node --------------------------------------------------------------------
    def nearest(self, node: cst.CSTNode, kinds: type | tuple[type, ...]) -> cst.CSTNode | None:
        """The closest ancestor of ``node`` (not ``node`` itself) of one of ``kinds``. The answer
        is kept for every node on the way up, so a question about a neighbour costs a step."""
        memo = self._nearest.get(kinds)
        if memo is None:
            memo = self._nearest[kinds] = {}
            self._is_kind[kinds] = {}
        found = memo.get(id(node), _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
        is_kind = self._is_kind[kinds]
        parents = self.model.parents
        path = []
        current = node
        result = None
        while True:
            parent = parents.get(id(current))
            if parent is None:
                # a node outside the walk is not remembered: its parent may be recorded later
                if current is not self.model.module:
                    return None
                break
            path.append(id(current))
            hit = is_kind.get(type(parent))
            if hit is None:
                hit = is_kind[type(parent)] = isinstance(parent, kinds)
            if hit:
                result = parent
                break
            found = memo.get(id(parent), _UNKNOWN)
            if found is not _UNKNOWN:
                result = found  # type: ignore[assignment]
                break
            current = parent
        for step in path:
            memo[step] = result
        return result

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The function (or the module) ``node`` lives in."""
        found = self.nearest(node, _SCOPES)
        return found if found is not None else self.model.module  # type: ignore[return-value]

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        return self.nearest(node, cst.FunctionDef)  # type: ignore[return-value]

    def enclosing_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        """The closest class around ``node``, at any depth (through its methods)."""
        return self.nearest(node, cst.ClassDef)  # type: ignore[return-value]

    def enclosing_class_name(self, node: cst.CSTNode) -> str | None:
        owner = self.enclosing_class(node)
        return owner.name.value if owner is not None else None

    # --- nodes by type ------------------------------------------------------------------------
    @cached_property
    def _by_exact_type(self) -> dict[type, list[cst.CSTNode]]:
        """The analysis's walk sorted once by each node's own type, in source order."""
        found: dict[type, list[cst.CSTNode]] = {}
        for node in self.model.orders:
            bucket = found.get(type(node))
            if bucket is None:
                bucket = found[type(node)] = []
            bucket.append(node)
        return found

    def of_type(self, kind: type | tuple[type, ...]) -> list[cst.CSTNode]:
        """Every node of type ``kind`` (or of one of the types ``kind`` names) in source order
        (from the analysis's walk)."""
        found = self._of_type.get(kind)
        if found is None:
            is_kind = _SUBCLASS.get(kind)
            if is_kind is None:
                is_kind = _SUBCLASS[kind] = {}
            buckets = []
            for node_type, bucket in self._by_exact_type.items():
                hit = is_kind.get(node_type)
                if hit is None:
                    hit = is_kind[node_type] = issubclass(node_type, kind)
                if hit:
                    buckets.append(bucket)
            if len(buckets) == 1:
                found = list(buckets[0])
            else:
                order = self.model.orders
                found = sorted((n for b in buckets for n in b), key=order.__getitem__)
            self._of_type[kind] = found
        return found

    @cached_property
    def _names_by_value(self) -> dict[str, list[cst.Name]]:
        found: dict[str, list[cst.Name]] = {}
        for node in self.of_type(cst.Name):
            found.setdefault(node.value, []).append(node)  # type: ignore[attr-defined, arg-type]
        return found

    def names_spelled(self, value: str) -> list[cst.Name]:
        """Every ``Name`` node that spells ``value``, in source order."""
        return self._names_by_value.get(value, [])

    @cached_property
    def _attributes_by_member(self) -> dict[str, list[cst.Attribute]]:
        found: dict[str, list[cst.Attribute]] = {}
        for node in self.of_type(cst.Attribute):
            found.setdefault(node.attr.value, []).append(node)  # type: ignore[attr-defined, arg-type]
        return found

    def attributes_named(self, member: str) -> list[cst.Attribute]:
        """Every ``<value>.member`` node (any receiver), in source order."""
        return self._attributes_by_member.get(member, [])

    # --- assignments and calls by name -----------------------------------------------------------
    @cached_property
    def _assignments_by_target(self) -> dict[str, list[Assignment]]:
        found: dict[str, list[Assignment]] = {}
        for assign in self.model.assignments:
            for name in dict.fromkeys(dotted(t) for t in assigned_targets(assign)):
                if name is not None:
                    found.setdefault(name, []).append(assign)
        return found

    @cached_property
    def _names_bound(self) -> dict[str, list[tuple[cst.CSTNode, cst.BaseExpression]]]:
        found: dict[str, list[tuple[cst.CSTNode, cst.BaseExpression]]] = {}
        for assign in self.model.assignments:
            names = set()
            for target in assigned_targets(assign):
                names |= target_names(target)
            for name in names:
                found.setdefault(name, []).append((assign, assign.value))  # type: ignore[arg-type]
        for node in self.of_type(cst.AugAssign):
            for name in target_names(node.target):  # type: ignore[attr-defined]
                found.setdefault(name, []).append((node, node.value))  # type: ignore[attr-defined]
        for with_node in self.of_type(cst.With):
            for item in with_node.items:  # type: ignore[attr-defined]
                if item.asname is not None:
                    for name in target_names(item.asname.name):
                        found.setdefault(name, []).append((with_node, item.item))
        return found

    def values_bound_to(self, name: str) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        """What the plain name ``name`` is bound to anywhere in the file, with the statement
        that binds it: assignments (also unpacking, and annotated: ``name: int = 0``'s ``0``) in
        source order, then augmented ones (``name += step``'s ``step``), then ``with X as
        name``."""
        return self._names_bound.get(name, [])

    @cached_property
    def _names_set_otherwise(self) -> dict[str, list[tuple[cst.CSTNode, cst.CSTNode]]]:
        found: dict[str, list[tuple[cst.CSTNode, cst.CSTNode]]] = {}
        for node in self.of_type((cst.NamedExpr, cst.For, cst.CompFor, cst.Param)):
            target: cst.CSTNode
            value: cst.CSTNode
            if isinstance(node, cst.NamedExpr):
                target, value = node.target, node.value
            elif isinstance(node, cst.Param):
                target, value = node.name, node  # what a caller passes: unknown here
            else:
                target, value = node.target, node.iter  # type: ignore[attr-defined]
            for name in target_names(target):  # type: ignore[arg-type]
                found.setdefault(name, []).append((node, value))
        return found

    def names_set(self) -> set[str]:
        """Every plain name the file sets (`values_set_to`)."""
        return self._names_bound.keys() | self._names_set_otherwise.keys()

    def values_set_to(self, name: str) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """Every way the file sets the plain name ``name``, with the node that sets it:
        `values_bound_to`'s, then walruses (``(name := value)``), loop targets (the loop's
        iterable: ``for name in range(n)``, comprehensions too) and parameters (the parameter
        itself: what the callers pass)."""
        return [*self.values_bound_to(name), *self._names_set_otherwise.get(name, [])]

    def enclosing_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The innermost ``for`` or ``while`` around ``node`` in its own function (or module,
        or class body): a loop around a ``def`` runs the function again, not its statements."""
        found = self.nearest(node, _LOOPS_AND_SCOPES)
        return found if isinstance(found, (cst.For, cst.While)) else None

    def assignments_to(self, name: str) -> list[Assignment]:
        """Every ``name = ...`` of the file (``self.model = ...`` for ``self.model``; ``name: T =
        ...`` too), in source order; an assignment to several targets once."""
        return self._assignments_by_target.get(name, [])

    def unpacked_assignments_to(self, name: str) -> list[Assignment]:
        """Every assignment that binds ``name`` as an element of a tuple or list of targets
        (``self.model, self.optimizer = model, optimizer``), which `assignments_to` leaves out,
        in source order."""
        return self._unpacked_by_target.get(name, [])

    @cached_property
    def _unpacked_by_target(self) -> dict[str, list[Assignment]]:
        found: dict[str, list[Assignment]] = {}
        for assign in self.model.assignments:
            for target in assigned_targets(assign):
                if isinstance(target, (cst.Tuple, cst.List)):
                    for element in target.elements:
                        name = dotted(element.value)
                        if name is not None:
                            found.setdefault(name, []).append(assign)
        return found

    def assignments_in_class(self, name: str, at: cst.CSTNode) -> list[Assignment]:
        """The ``self.x = ...`` of ``name`` made in the class around ``at`` (its methods'
        instance attribute); none where ``at`` is in no class."""
        owner = self.enclosing_class(at)
        if owner is None:
            return []
        return [a for a in self.assignments_to(name) if self.enclosing_class(a) is owner]

    @cached_property
    def _calls_by_name(self) -> dict[str, list[cst.Call]]:
        found: dict[str, list[cst.Call]] = {}
        for call in self.model.calls:
            if isinstance(call.func, cst.Name):
                found.setdefault(call.func.value, []).append(call)
        return found

    def calls_named(self, name: str) -> list[cst.Call]:
        """Calls of a plain name (``train(...)``), in source order."""
        return self._calls_by_name.get(name, [])

    @cached_property
    def _calls_by_function(self) -> dict[cst.FunctionDef | None, list[cst.Call]]:
        found: dict[cst.FunctionDef | None, list[cst.Call]] = {}
        for call in self.model.calls:
            found.setdefault(self.enclosing_function(call), []).append(call)
        return found

    def calls_directly_in(self, function: cst.FunctionDef | None) -> list[cst.Call]:
        """The calls whose closest enclosing function is ``function`` (None: the module's own
        code and class bodies), in source order."""
        return self._calls_by_function.get(function, [])

    # --- classes and their methods ---------------------------------------------------------------
    @cached_property
    def _methods(self) -> dict[str, dict[str, cst.FunctionDef]]:
        found = {}
        for name, definition in self.model.classes.items():
            body = definition.body.body if isinstance(definition.body, cst.IndentedBlock) else ()
            found[name] = {
                line.name.value: line for line in body if isinstance(line, cst.FunctionDef)
            }
        return found

    def methods_of(self, class_name: str) -> dict[str, cst.FunctionDef]:
        """The methods written in the body of the module-level class ``class_name``."""
        return self._methods.get(class_name, {})

    @cached_property
    def _model_classes_by_method(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for name in sorted(self.model.module_classes):
            for method in self.methods_of(name):
                found.setdefault(method, []).append(name)
        return found

    def model_classes_with(self, method: str) -> list[str]:
        """The model classes (``nn.Module`` subclasses) of the file that define ``method``."""
        return self._model_classes_by_method.get(method, [])

    # --- a function's own body -------------------------------------------------------------------
    def own_nodes(self, function: cst.FunctionDef | cst.Module) -> list[cst.CSTNode]:
        """``function``'s body in source order, not the bodies of functions, classes or lambdas
        defined inside it (their headers are included); the module's own code for the module."""
        found = self._own.get(function)
        if found is None:
            tops = list(function.body) if isinstance(function, cst.Module) else [function.body]
            found = self._own[function] = self._own_under(tops)
        return found

    def _own_under(self, tops: list[cst.CSTNode]) -> list[cst.CSTNode]:
        """``tops`` and what is under them in source order, but not under a nested function,
        class or lambda (the nested node itself is included)."""
        walked = self.model.walked
        found: list[cst.CSTNode] = []
        for top in tops:
            at = walked.orders.get(top)
            if at is None:  # not of the analysed tree: walked here
                stack: list[cst.CSTNode] = [top]
                while stack:
                    node = stack.pop()
                    found.append(node)
                    if type(node) not in _NESTED:
                        stack.extend(reversed(children_of(node)))
                continue
            nodes, ends = walked.nodes, walked.ends
            index, end = at, ends[at]
            while index < end:
                node = nodes[index]
                found.append(node)
                index = ends[index] if type(node) in _NESTED else index + 1
        return found

    @cached_property
    def module_own_nodes(self) -> list[cst.CSTNode]:
        """The module's own code in source order, as `own_nodes` has a function's: the headers
        of its functions, classes and lambdas, not their bodies."""
        return self._own_under(list(self.model.module.body))

    def _own_typed(self, function: cst.FunctionDef, kind: type) -> list[cst.CSTNode]:
        """The nodes of exact type ``kind`` in ``function``'s own body, in source order."""
        key = (function, kind)
        found = self._own_of_type.get(key)
        if found is None:
            found = [node for node in self.own_nodes(function) if type(node) is kind]
            self._own_of_type[key] = found
        return found

    def own_assignments(self, function: cst.FunctionDef) -> list[Assignment]:
        """``x = v`` and ``x: T = v`` of ``function``'s own body, in source order."""
        plain = self._own_typed(function, cst.Assign)
        annotated = [a for a in self._own_typed(function, cst.AnnAssign) if a.value is not None]  # type: ignore[attr-defined]
        if not annotated:
            return list(plain)  # type: ignore[arg-type]
        order = self.model.orders
        return sorted((*plain, *annotated), key=order.__getitem__)  # type: ignore[arg-type]

    def own_returns(self, function: cst.FunctionDef) -> list[cst.Return]:
        """``return <value>`` statements of ``function`` itself (a bare ``return`` is left out)."""
        returns = self._own_typed(function, cst.Return)
        return [node for node in returns if node.value is not None]  # type: ignore[attr-defined]

    def own_bindings(self, function: cst.FunctionDef | None) -> dict[str | None, list[Binding]]:
        """The ``x = ...``, ``x op= ...`` and ``x: T = ...`` statements of ``function``'s own
        body (of the module's own code for None), by the dotted name each binds (an element of
        an unpacked target too; None for a target that is no dotted name, ``x[0] = ...``), in
        source order: "the last binding of ``x`` above here" without scanning the body."""
        found = self._bindings.get(function)
        if found is None:
            found = {}
            nodes = self.own_nodes(function) if function is not None else self.module_own_nodes
            for node in nodes:
                kind = type(node)
                if kind is cst.Assign:
                    bound: dict[str | None, None] = {}
                    for target in node.targets:  # type: ignore[attr-defined]
                        _bound_names(target.target, bound)
                elif kind is cst.AugAssign or kind is cst.AnnAssign:
                    bound = {dotted(node.target): None}  # type: ignore[attr-defined]
                else:
                    continue
                for name in bound:
                    found.setdefault(name, []).append(node)  # type: ignore[arg-type]
            self._bindings[function] = found
        return found

    def assigned_under(self, function: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
        """What each plain name is assigned (``name = value``, one of several targets) anywhere
        under ``function``'s body, nested functions included, in source order."""
        found = self._assigned_under.get(function)
        if found is None:
            found = {}
            for node in walk(function.body):
                if type(node) is cst.AnnAssign and node.value is not None:  # type: ignore[attr-defined]
                    targets = [node.target]  # type: ignore[attr-defined]
                elif type(node) is cst.Assign:
                    targets = [t.target for t in node.targets]  # type: ignore[attr-defined]
                else:
                    continue
                named = {t.value: None for t in targets if type(t) is cst.Name}
                for name in named:
                    found.setdefault(name, []).append(node.value)  # type: ignore[attr-defined]
            self._assigned_under[function] = found
        return found


def _bound_names(target: cst.BaseExpression, into: dict[str | None, None]) -> None:
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _bound_names(element.value, into)
    else:
        into[dotted(target)] = None
