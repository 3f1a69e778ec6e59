"""Every node's line and column, as libcst's `PositionProvider` gives them, at a third of its cost.

libcst computes positions by generating the file's code with a state that records where each
node starts and ends. Its state opens a generator-based context manager for every node that
records a syntactic position, builds two `CodePosition` objects per node, splits every token
with a regular expression and keys its table by the nodes (a Python ``__hash__`` per node). A
lint pays that pass for each file with a finding. `positions` runs the same code generation
with a state that records the same numbers cheaply (plain tuples, keyed by ``id``) and makes a
`CodeRange` only for the nodes asked about: the same answer for every node (a test holds every
fixture to it).

The state is a subclass of libcst's private ``CodegenState`` and its hooks: no public API gives
positions at this cost (libcst's public `PositionProvider` is ~5x it, and the same private
hooks). So the process checks it once before trusting it (`faithful`): on a probe written with
every shape that records a position differently it must give libcst's own answer node for node;
a libcst release that moves or changes those internals makes lint use the public provider
(slower, never wrong, never a crash).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodeRange
from libcst.metadata.position_provider import CodePosition

#: libcst's own (position_provider.NEWLINE_RE): what ends a line inside a token
_NEWLINE = re.compile(r"\r\n?|\n")

_Point = tuple[int, int]


class _Syntactic:
    """``record_syntactic_position``'s context, as libcst's `PositionProvidingCodegenState`
    writes it (the node's range from entry to exit, or from ``start_node``'s start to
    ``end_node``'s end), without a generator per node."""

    __slots__ = ("end_node", "node", "start", "start_node", "state")

    def __init__(
        self,
        state: _PositionState,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> bool:
        state = self.state
        computed = state.computed
        start = computed[id(self.start_node)][0] if self.start_node is not None else self.start
        end = (
            computed[id(self.end_node)][1]
            if self.end_node is not None
            else (state.line, state.column)
        )
        computed[id(self.node)] = (start, end)
        return False


class _PositionState(CodegenState):
    """libcst's `PositionProvidingCodegenState`, its numbers kept as tuples by node id."""

    __slots__ = ("_stack", "column", "computed", "line")

    def __init__(self, module: cst.Module) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.line = 1  # one-indexed
        self.column = 0  # zero-indexed
        self.computed: dict[int, tuple[_Point, _Point]] = {}
        self._stack: list[_Point] = []

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            segments = _NEWLINE.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        key = id(node)
        if key not in self.computed:  # a syntactic position already recorded stays
            self.computed[key] = (start, (self.line, self.column))

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> Any:
        return _Syntactic(self, node, start_node, end_node)


class Positions(Mapping[cst.CSTNode, CodeRange]):
    """The positions of a module's nodes (`PositionProvider`'s), a `CodeRange` made on demand.
    The module must stay alive as long as this (its nodes' ids are the keys)."""

    def __init__(self, module: cst.Module) -> None:
        state = _PositionState(module)
        module._codegen(state)
        self._module = module  # keeps the nodes, so no id is reused while the table lives
        self._computed = state.computed
        self._ranges: dict[int, CodeRange] = {}

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        found = self._ranges.get(key)
        if found is None:
            numbers = self._computed.get(key)
            if numbers is None:
                raise KeyError(node)
            (start_line, start_column), (end_line, end_column) = numbers
            found = CodeRange(
                CodePosition(start_line, start_column), CodePosition(end_line, end_column)
            )
            self._ranges[key] = found
        return found

    def __iter__(self) -> Iterator[cst.CSTNode]:
        raise TypeError("positions are looked up by node, not listed")

    def __len__(self) -> int:
        return len(self._computed)


class StatementPositions(Mapping[cst.CSTNode, CodeRange]):
    """`Positions`, generated one top-level statement at a time: a finding needs the lines of
    the statement it is in, not a code generation of the whole file (half a parse of it, paid
    by every file with a finding). A top-level statement starts a line, at column 0, and its
    code generated alone is the text the module's code holds for it; where that text occurs
    once in ``source`` (the text the module was parsed from), it occurs there, and the lines
    before it are counted in ``source``. Anything else (a statement whose text occurs twice, the
    file's last statement without its newline, a node outside the statements, such as the
    module or its header's comments, or one the analysis's walk did not record in
    ``parents``) is looked up in `Positions` of the whole module, made once: the same numbers.
    The module must stay alive as long as this (its nodes' ids are the keys)."""

    def __init__(self, module: cst.Module, source: str, parents: Mapping[int, cst.CSTNode]) -> None:
        self._module, self._source, self._parents = module, source, parents
        self._computed: dict[int, tuple[_Point, _Point]] = {}
        self._tried: dict[int, bool] = {}  # by the statement's id: its lines were found
        self._ranges: dict[int, CodeRange] = {}
        self._whole: Positions | None = None
        #: without the file's last newline, the last statement's own code has one more line
        #: break than the file: never looked up in the text
        self._unfound = module.body[-1] if module.body and not module.has_trailing_newline else None
        self._statements = {id(statement) for statement in module.body}

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        found = self._ranges.get(key)
        if found is not None:
            return found
        if self._whole is None:
            statement = self._statement_of(node)
            if statement is not None and self._generated(statement):
                numbers = self._computed.get(key)
                if numbers is not None:
                    found = self._ranges[key] = _code_range(numbers)
                    return found
            self._whole = Positions(self._module)
        return self._whole[node]

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The top-level statement that holds ``node`` (or is it); None for any other node."""
        module, parents = self._module, self._parents
        current = node
        while True:
            parent = parents.get(id(current))
            if parent is None:
                return None
            if parent is module:  # (the header's and footer's comments are not statements)
                return current if id(current) in self._statements else None
            current = parent

    def _generated(self, statement: cst.CSTNode) -> bool:
        """The positions of ``statement``'s nodes, from its code generated alone and placed at
        the line its text starts on in ``source``; False where that line is not certain."""
        key = id(statement)
        done = self._tried.get(key)
        if done is not None:
            return done
        self._tried[key] = False
        if statement is self._unfound:
            return False
        state = _PositionState(self._module)
        statement._codegen(state)
        text = "".join(state.tokens)
        source = self._source
        at = source.find(text)
        if at < 0 or source.find(text, at + 1) >= 0:
            return False  # (a text that occurs twice, overlapping or not: which is it?)
        # the line breaks before it, as libcst counts them (``\r\n``, ``\r``, ``\n``): the text
        # before a statement ends with a whole line break
        above = source.count("\n", 0, at) + source.count("\r", 0, at) - source.count("\r\n", 0, at)
        computed = self._computed
        for node_id, ((start_line, start_column), (end_line, end_column)) in state.computed.items():
            computed[node_id] = ((start_line + above, start_column), (end_line + above, end_column))
        self._tried[key] = True
        return True

    def __iter__(self) -> Iterator[cst.CSTNode]:
        raise TypeError("positions are looked up by node, not listed")

    def __len__(self) -> int:
        if self._whole is None:
            self._whole = Positions(self._module)
        return len(self._whole)


def _code_range(numbers: tuple[_Point, _Point]) -> CodeRange:
    (start_line, start_column), (end_line, end_column) = numbers
    return CodeRange(CodePosition(start_line, start_column), CodePosition(end_line, end_column))


#: Code with the shapes whose position libcst records apart from its code generation's order
#: (a decorated ``async def`` and its parameters, statements on one line, ``elif``/``else``,
#: parentheses, a multi-line string, an f-string, CRLF and tab indentation): small, as each
#: process that asks for positions parses it and computes its positions both ways.
_PROBE = (
    "@decorator(1)\r\n"
    "async def f(a, *, b: int = 2) -> None:\n"
    '    s = (yield """one\n\ttwo\r\nthree""")  # comment\n'
    "    if a: return [y for y in b if y]\n"
    "    elif b: del s[0], a.x\n"
    "    else:\n"
    "        x: int = lambda q=1: f'{q!r:>{b}}'\n"
    "class C(B, metaclass=M):\n"
    "\tdef g(self): return self.a[1:2, ...] @ b\n"
)


@functools.cache
def faithful() -> bool:
    """`Positions` gives what libcst's public `PositionProvider` gives, node for node, on
    `_PROBE` with the installed libcst: checked once per process, the first time a file's
    positions are asked (3-10 ms by load). False where a libcst release changed the internals
    it relies on (a missing name, a new signature, a hook no longer called)."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    module = cst.parse_module(_PROBE)
    try:
        ours = Positions(module)
        theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        return len(ours) == len(theirs) and all(ours[n] == at for n, at in theirs.items())
    except Exception:  # any failure of libcst's internals: use its public API
        return False
