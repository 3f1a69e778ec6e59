"""Small questions about libcst nodes, asked everywhere: the dotted name of an expression, the
names a target binds, a walk that skips libcst's per-attribute visitor hooks."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
import typing
import weakref
from collections.abc import Callable, Iterator

import libcst as cst

from accelify.analysis import names


def dotted(node: cst.BaseExpression) -> str | None:
    """``model`` or ``self.model`` for a Name or an attribute chain of Names."""
    kind = type(node)  # neither class has subclasses; isinstance on libcst's ABCs costs more
    if kind is cst.Name:
        return node.value
    if kind is cst.Attribute:
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def root_name(node: cst.BaseExpression) -> str | None:
    """``batch`` for ``batch["x"]``, ``batch.x``, ``batch[0].y``."""
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def strip_self_methods(node: cst.BaseExpression) -> cst.BaseExpression:
    """``Net().to(device).train()`` -> ``Net()``: calls that hand the module back."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in names.MODULE_SELF_METHODS
    ):
        node = node.func.value
    return node


class Visitor(cst.CSTVisitor):
    """A libcst visitor without ``visit_<Node>_<attribute>`` hooks: libcst looks such hooks up by
    name for every attribute of every node, which is 40% of a walk; none of ours uses them. Its
    ``visit_<Node>``/``leave_<Node>`` methods are looked up once per node type, not formatted
    and looked up at every node."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        handler = _handler(type(self), type(node), "visit_")
        return handler is None or handler(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        handler = _handler(type(self), type(original_node), "leave_")
        if handler is not None:
            handler(self, original_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def _handler(visitor: type, node_type: type, prefix: str) -> Callable[..., object] | None:
    """``visitor``'s ``visit_Call`` (or ``leave_Call``) for ``node_type``, kept on the visitor
    class itself (a class made per call is freed with its handlers)."""
    handlers = visitor.__dict__.get("_handlers")
    if handlers is None:
        handlers = {}
        type.__setattr__(visitor, "_handlers", handlers)
    key = (prefix, node_type)
    if key not in handlers:
        handlers[key] = getattr(visitor, prefix + node_type.__name__, None)
    return handlers[key]


#: Whitespace, comments and punctuation: 60% of a tree's nodes, and nothing any analysis reads.
TRIVIA = (
    cst.SimpleWhitespace,
    cst.ParenthesizedWhitespace,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Dot,
    cst.Comma,
    cst.AssignEqual,
    cst.Colon,
    cst.Semicolon,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
)
#: Fields in the order their code is written, where the dataclass declares them otherwise.
_SOURCE_ORDER = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
}
_FIELDS: dict[type, tuple[str, ...]] = {}


def visit_code(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``node.visit(visitor)`` for a read-only visitor, without the trivia and without libcst
    rebuilding every node it leaves (which is most of a walk's cost): ``on_visit`` and
    ``on_leave`` for each node in source order, children skipped when ``on_visit`` says so."""
    tree = _last_walked()
    at = tree.orders.get(node) if tree is not None else None
    if tree is not None and at is not None:
        nodes, ends = tree.nodes, tree.ends
        left: list[tuple[int, cst.CSTNode]] = []  # visited, left when their subtree ends
        index, end = at, ends[at]
        while index < end:
            while left and left[-1][0] <= index:
                visitor.on_leave(left.pop()[1])
            current = nodes[index]
            if visitor.on_visit(current):
                left.append((ends[index], current))
                index += 1
            else:
                visitor.on_leave(current)
                index = ends[index]
        while left:
            visitor.on_leave(left.pop()[1])
        return
    if visitor.on_visit(node):
        for child in children_of(node):
            visit_code(child, visitor)
    visitor.on_leave(node)


def children_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children`` without the trivia, read from its fields (``children`` runs a visitor)."""
    found = []
    for name in _fields_of(type(node)):
        value = getattr(node, name)
        kind = _kind_of(type(value))
        if kind is _NODE:
            found.append(value)
        elif kind is _SEQUENCE:
            found += [item for item in value if _kind_of(type(item)) is _NODE]
    return found


_NODE, _SEQUENCE, _OTHER = "node", "sequence", "other"
_KINDS: dict[type, str] = {}
_TRIVIA_TYPES = frozenset(TRIVIA)


def _kind_of(value_type: type) -> str:
    kind = _KINDS.get(value_type)
    if kind is None:
        if issubclass(value_type, cst.CSTNode):
            kind = _OTHER if value_type in _TRIVIA_TYPES else _NODE
        else:
            kind = _SEQUENCE if value_type in (list, tuple) else _OTHER
        _KINDS[value_type] = kind
    return kind


def _fields_of(node_type: type) -> tuple[str, ...]:
    """The fields of ``node_type`` that can hold a node other than trivia, in source order."""
    found = _FIELDS.get(node_type)
    if found is None:
        declared = {field.name: field.type for field in dataclasses.fields(node_type)}
        order = _SOURCE_ORDER.get(node_type) or tuple(declared)
        found = tuple(name for name in order if not _trivia_only(declared[name]))
        _FIELDS[node_type] = found
    return found


#: Bases whose every subclass is trivia (a field of such a type holds no node of interest).
_TRIVIA_BASES = (*TRIVIA, cst.BaseParenthesizableWhitespace)
_PLAIN = (str, bool, int, float, type(None), cst.MaybeSentinel)


@functools.cache
def _trivia_only(annotation: object) -> bool:
    """A field declared to hold only trivia, text or flags (``whitespace_after_func``,
    ``lpar``, ``encoding``): reading it finds nothing, so the walk skips it. Anything the
    declaration does not spell out as such (a string annotation, an unknown form) is read."""
    if isinstance(annotation, type):
        return issubclass(annotation, _TRIVIA_BASES) or issubclass(annotation, _PLAIN)
    arguments = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return all(isinstance(argument, _PLAIN) for argument in arguments)
    if origin in (typing.Union, types.UnionType, collections.abc.Sequence, list, tuple):
        return bool(arguments) and all(
            argument is Ellipsis or _trivia_only(argument) for argument in arguments
        )
    return False


def statement_lines(node: cst.CSTNode) -> Iterator[cst.SimpleStatementLine]:
    """The statement lines of ``node`` (itself, when it is one) in source order, not those of
    the functions and classes it defines: what runs when ``node`` runs."""
    if isinstance(node, cst.SimpleStatementLine):
        yield node
    elif not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        for child in children_of(node):
            yield from statement_lines(child)


def all_params(params: cst.Parameters) -> list[cst.Param]:
    """Every parameter, ``*args`` and ``**kwargs`` included."""
    star = [params.star_arg] if isinstance(params.star_arg, cst.Param) else []
    double = [params.star_kwarg] if params.star_kwarg is not None else []
    return [*params.posonly_params, *params.params, *star, *params.kwonly_params, *double]


def has_parameter(function: cst.FunctionDef, name: str) -> bool:
    return any(p.name.value == name for p in all_params(function.params))


def result_used(call: cst.Call, parent: cst.CSTNode | None) -> bool:
    """``z, log_det = flow.backward(z)``, ``samples = model.backward(z)[0]``, ``return
    model.backward(z)[0]``: a call whose value is used (not a statement of its own, nor a
    lambda's body). One named ``backward`` is then a model's own method (a normalizing flow's
    inverse pass), not autograd's ``Tensor.backward``, which returns None."""
    if isinstance(parent, cst.Expr):
        return parent.value is not call
    return not (isinstance(parent, cst.Lambda) and parent.body is call)


def self_parameter(method: cst.FunctionDef) -> str | None:
    """The name a method calls its instance, unless it is a static or class method."""
    if any(dotted(d.decorator) in ("staticmethod", "classmethod") for d in method.decorators):
        return None
    params = [*method.params.posonly_params, *method.params.params]
    return params[0].name.value if params else None


def keyword_argument(call: cst.Call, name: str) -> cst.Arg | None:
    """The ``name=`` argument of ``call``, if given."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def keyword_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
    """What ``call`` passes as ``name=``, if it does."""
    argument = keyword_argument(call, name)
    return argument.value if argument is not None else None


def argument_value(
    call: cst.Call, keyword: str, position: int | None = 0
) -> cst.BaseExpression | None:
    """What ``call`` passes as ``keyword=``, else as its positional argument at ``position``
    (``.to(device)`` or ``.to(device=device)``). Positions are counted over the plain
    positional arguments written before any ``*args``: past one, no position is known."""
    given = keyword_value(call, keyword)
    if given is not None or position is None:
        return given
    for argument in call.args:
        if argument.keyword is not None:
            continue
        if argument.star:
            return None
        if position == 0:
            return argument.value
        position -= 1
    return None


def is_accelerator_call(node: cst.CSTNode) -> typing.TypeGuard[cst.Call]:
    """``Accelerator(...)`` (``accelerate.Accelerator(...)``, ...): a call that builds an
    Accelerator itself, by the class's own name; a factory's call is not one (its arguments mean
    what the factory makes of them)."""
    if not isinstance(node, cst.Call):
        return False
    return (dotted(node.func) or "").rsplit(".", 1)[-1] == "Accelerator"


def accelerator_argument(accelerator: cst.BaseExpression, keyword: str) -> cst.Arg | None:
    """The ``keyword=`` argument of an ``Accelerator(...)`` call, if given (not of a factory's
    call: its arguments mean what the factory makes of them)."""
    if not is_accelerator_call(accelerator):
        return None
    return keyword_argument(accelerator, keyword)


def unwrapped_argument(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``model`` of ``accelerator.unwrap_model(model)`` (whatever holds the accelerator): the
    prepared model the call reads; None for any other node."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "unwrap_model"
        and node.args
    ):
        return node.args[0].value
    return None


#: a statement that binds its targets to one value: ``x = v``, ``a = b = v``, ``x: T = v`` (an
#: annotation with a value binds like a plain ``=``; ``x: T`` alone binds nothing and is not one)
Assignment = cst.Assign | cst.AnnAssign


def is_assignment(node: object) -> typing.TypeGuard[Assignment]:
    """``node`` binds its targets to one value: ``x = v`` or ``x: T = v`` (not ``x: T``)."""
    kind = type(node)  # exact types (neither has subclasses): asked of most statements
    return kind is cst.Assign or (kind is cst.AnnAssign and node.value is not None)  # type: ignore[attr-defined]


def assigned_targets(assign: Assignment) -> list[cst.BaseExpression]:
    """What ``assign`` binds its value to: each target of ``a = b = v``, the one of ``x: T = v``."""
    if type(assign) is cst.AnnAssign:
        return [assign.target]
    return [target.target for target in assign.targets]  # type: ignore[union-attr]


def target_names(target: cst.BaseExpression) -> set[str]:
    kind = type(target)
    if kind is cst.Name:
        return {target.value}  # type: ignore[attr-defined]
    if kind is cst.Tuple or kind is cst.List:
        found: set[str] = set()
        for element in target.elements:
            found |= target_names(element.value)
        return found
    return set()


def attributes_in_targets(node: cst.CSTNode) -> list[cst.Attribute]:
    """The attributes written in ``node``'s targets (``self.best, self.bad = ...``, ``+=``, an
    annotated one, a loop's or a ``with``'s target), with those a target reads on the way
    (``self.i`` of ``self.hist[self.i] = v``): a cautious answer to "what may this store into"."""
    if isinstance(node, cst.Assign):
        targets: list[cst.CSTNode] = [target.target for target in node.targets]
    elif isinstance(node, cst.AugAssign | cst.AnnAssign | cst.For):
        targets = [node.target]
    elif isinstance(node, cst.WithItem) and node.asname is not None:
        targets = [node.asname.name]
    else:
        return []
    return [part for target in targets for part in walk(target) if isinstance(part, cst.Attribute)]


def bound_value(node: cst.BaseExpression) -> cst.BaseExpression:
    """What a later test reads ``node`` by: the target of a walrus (``(is_main :=
    accelerator.is_main_process)`` is ``is_main`` for an ``if not is_main:`` below it, as if
    bound by an assignment first), else ``node`` itself."""
    while isinstance(node, cst.NamedExpr):
        node = node.target
    return node


def operands(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The expressions ``node`` reads directly, found through the syntax that wraps them: a
    comparison's right side, a collection's elements, a call's arguments and a subscript's
    indexes are not expressions themselves, and a check that looks only at expression children
    would pass over them (``acc > best and acc > loss.item()`` read as the left side alone)."""
    found: list[cst.BaseExpression] = []
    pending = children_of(node)
    while pending:
        child = pending.pop()
        if isinstance(child, cst.BaseExpression):
            found.append(child)
        else:
            pending.extend(children_of(child))
    return found


class WalkedTree:
    """A tree's nodes in `walk`'s order (the analysis's one walk records them), with where each
    node's subtree ends: ``walk`` of any of its nodes is then a slice of one list, not a second
    walk of the subtree (rules and analyses walk functions and statements thousands of times
    per file). The slice holds the node's subtree whichever tree holds the node: nodes are
    immutable, and a node another tree shares is the same subtree there."""

    __slots__ = ("__weakref__", "ends", "nodes", "orders")

    def __init__(self, orders: dict[cst.CSTNode, int]) -> None:
        #: each node's index in `nodes`
        self.orders = orders
        self.nodes: list[cst.CSTNode] = []
        #: by index: the index just past the node's subtree
        self.ends: list[int] = []

    def subtree(self, node: cst.CSTNode) -> list[cst.CSTNode] | None:
        """`walk` of ``node`` as a list, None when ``node`` is not in this tree."""
        at = self.orders.get(node)
        return None if at is None else self.nodes[at : self.ends[at]]


#: The tree the analysis walked last (`remember_walk`): lint analyses one file at a time, and
#: its rules walk that file's nodes. Not kept alive from here.
_last_walked: Callable[[], WalkedTree | None] = lambda: None  # noqa: E731


def remember_walk(tree: WalkedTree) -> None:
    """``walk`` answers from ``tree`` from now on, for its nodes (complete: every ``end`` set)."""
    global _last_walked
    _last_walked = weakref.ref(tree)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and everything under it but whitespace, comments and punctuation, in source
    order."""
    tree = _last_walked()
    if tree is not None:
        found = tree.subtree(node)
        if found is not None:
            return iter(found)
    return _walk(node)


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(children_of(current)))


def is_generator_function(function: cst.FunctionDef) -> bool:
    """A ``def`` whose own body yields (``def cycle(dl): while True: for b in dl: yield b``):
    calling it runs none of that body, it only makes the generator; a ``yield`` of a nested
    ``def``, ``lambda`` or ``class`` belongs to that one."""
    return holds_own(function.body, cst.Yield)


def holds_own(node: cst.CSTNode, kind: type[cst.CSTNode]) -> bool:
    """A ``kind`` node in ``node`` outside the functions, lambdas and classes it defines (a
    ``yield`` or ``return`` of a nested ``def`` belongs to that one)."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, kind):
            return True
        if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        stack.extend(children_of(current))
    return False


def if_chain(node: cst.If) -> tuple[list[cst.BaseExpression], list[cst.BaseSuite], bool]:
    """An ``if``/``elif``/``else`` chain as its tests, its blocks (the ``else`` block last) and
    whether it ends in an ``else``."""
    tests, blocks = [node.test], [node.body]
    rest = node.orelse
    while isinstance(rest, cst.If):
        tests.append(rest.test)
        blocks.append(rest.body)
        rest = rest.orelse
    if rest is not None:
        blocks.append(rest.body)
    return tests, blocks, rest is not None


def is_main_guard(node: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` with no ``else``: when the file runs as a script its
    block runs once, unconditionally, as if written at the module's top level."""
    if not isinstance(node, cst.If) or node.orelse is not None:
        return False
    test = node.test
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = {_main_side(test.left), _main_side(target.comparator)}
    return sides == {"name", "main"}


def _main_side(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name) and node.value == "__name__":
        return "name"
    if isinstance(node, cst.SimpleString) and node.evaluated_value == "__main__":
        return "main"
    return None


def is_docstring(line: cst.CSTNode) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Expr)
        and isinstance(line.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def is_print_alone(line: cst.CSTNode) -> bool:
    """``line`` is a ``print(...)`` call and nothing else: a statement a conversion may move or
    put a collective before, knowing it only shows something."""
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Expr)
        and isinstance(line.body[0].value, cst.Call)
        and dotted(line.body[0].value.func) == "print"
    )


def rebound_targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """What ``node`` binds anew, each element of an unpacking on its own (``self.a, self.b =
    ...`` gives both): the targets of an assignment of any kind, a ``for``, a ``with ... as``
    and a ``del``; none for another node."""
    if isinstance(node, cst.Assign):
        spelled: list[cst.BaseExpression] = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.Del)):
        spelled = [node.target]
    elif isinstance(node, cst.With):
        spelled = [item.asname.name for item in node.items if item.asname is not None]
    else:
        return []
    found: list[cst.BaseExpression] = []
    while spelled:
        target = spelled.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            spelled.extend(element.value for element in target.elements)
        else:
            found.append(target)
    return found


def unpacked_pairs(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]] | None:
    """``(self.model, model)`` and ``(self.loader, loader)`` of ``self.model, self.loader =
    model, loader``: each target with the value written at its position, when both sides are
    tuples or lists of the same length with nothing starred; else None."""
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(
        value, (cst.Tuple, cst.List)
    ):
        return None
    if len(target.elements) != len(value.elements) or any(
        isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)
    ):
        return None
    return [(t.value, v.value) for t, v in zip(target.elements, value.elements, strict=True)]


def top_level_functions(module: cst.Module, name: str) -> list[cst.FunctionDef]:
    """Every ``def name`` written directly in ``module``'s body, in source order (a function
    defined again later is listed twice): a helper module's function another module calls."""
    return [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]


def value_assigned_to(assign: cst.CSTNode, spelling: str) -> cst.BaseExpression | None:
    """What ``assign`` binds the target spelt ``spelling`` to: the whole value of ``self.model
    = model``, the element at its place of ``self.model, self.optimizer = model, optimizer``.
    None where it binds no such target, or its place in the value is not written out."""
    if not is_assignment(assign):
        return None
    for target in assigned_targets(assign):
        if dotted(target) == spelling:
            return assign.value
        for element, value in unpacked_pairs(target, assign.value) or ():
            if dotted(element) == spelling:
                return value
    return None


#: Where an element sits in a (nested) tuple: ``(1, 0)`` is the first of the second.
Path = tuple[int, ...]


def tuple_leaves(
    node: cst.BaseExpression, nests: tuple[type[cst.BaseExpression], ...] = (cst.Tuple,)
) -> list[tuple[Path, cst.BaseExpression]] | None:
    """Each element of a tuple written out (of ``nests``), nested ones followed, with where it
    sits: ``(model, opt), (train_dl, val_dl)`` has four; anything else is one element at
    ``()``. None when a starred element makes the positions uncertain."""
    if not isinstance(node, nests):
        return [((), node)]
    found: list[tuple[Path, cst.BaseExpression]] = []
    for index, element in enumerate(node.elements):  # type: ignore[attr-defined]
        if not isinstance(element, cst.Element):
            return None
        inner = tuple_leaves(element.value, nests)
        if inner is None:
            return None
        found += [((index, *path), leaf) for path, leaf in inner]
    return found


def element_at(
    value: cst.BaseExpression | None,
    path: Path,
    nests: tuple[type[cst.BaseExpression], ...] = (cst.Tuple,),
) -> cst.BaseExpression | None:
    """The element of a tuple written out (of ``nests``; nested ones followed) at ``path``;
    None when the value is no tuple of that shape."""
    for index in path:
        if not isinstance(value, nests) or len(value.elements) <= index:  # type: ignore[attr-defined]
            return None
        elements = value.elements  # type: ignore[attr-defined]
        if any(isinstance(e, cst.StarredElement) for e in elements):
            return None
        value = elements[index].value
    return value


def unpacked_names(
    target: cst.BaseExpression, value: cst.BaseExpression | None
) -> list[tuple[str, cst.BaseExpression | None]]:
    """Each plain name ``target = value`` binds (``a, (b, c) = ...`` unpacked), with the
    element of ``value`` written at its position (a tuple or list written out); None where it
    is not written out (``a, b = pair()``) or a starred element makes positions uncertain."""
    nests = (cst.Tuple, cst.List)
    leaves = tuple_leaves(target, nests)
    if leaves is None:
        return [(name, None) for name in sorted(target_names(target))]
    return [
        (leaf.value, element_at(value, path, nests) if path else value)
        for path, leaf in leaves
        if isinstance(leaf, cst.Name)
    ]


#: Each binary operator's augmented assignment (``+`` and ``+=``).
_AUGMENTED: dict[type[cst.BaseBinaryOp], type[cst.BaseAugOp]] = {
    cst.Add: cst.AddAssign,
    cst.Subtract: cst.SubtractAssign,
    cst.Multiply: cst.MultiplyAssign,
    cst.Divide: cst.DivideAssign,
    cst.FloorDivide: cst.FloorDivideAssign,
    cst.Modulo: cst.ModuloAssign,
}


def updated_with(
    node: cst.CSTNode, name: str, operator: type[cst.BaseBinaryOp]
) -> tuple[cst.BaseExpression | None, cst.BaseExpression] | None:
    """The operands when ``node`` assigns ``name`` the result of ``operator``: ``name += 1``
    gives ``(None, 1)`` (the left is ``name`` itself), ``name = loss / steps`` gives ``(loss,
    steps)``; None for any other statement."""
    if (
        isinstance(node, cst.AugAssign)
        and dotted(node.target) == name
        and isinstance(node.operator, _AUGMENTED[operator])
    ):
        return None, node.value
    if (
        isinstance(node, cst.Assign)
        and len(node.targets) == 1
        and dotted(node.targets[0].target) == name
        and isinstance(node.value, cst.BinaryOperation)
        and isinstance(node.value.operator, operator)
    ):
        return node.value.left, node.value.right
    return None
