"""`accelify.analysis.positions.Positions` gives every node the range libcst's `PositionProvider`
gives it (a finding's line and column come from it): node for node, trivia included, over every
fixture, and for code written with the shapes that record a syntactic position differently."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import libcst as cst
import pytest
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from accelify.analysis.positions import Positions, _PositionState, faithful

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCES = sorted(FIXTURES.glob("convert/*/before.py")) + sorted(FIXTURES.glob("lint/**/*.py"))


def _same_as_libcst(module: cst.Module) -> int:
    theirs = PositionProvider()._gen(MetadataWrapper(module, unsafe_skip_copy=True))
    ours = Positions(module)
    stack: list[cst.CSTNode] = [module]
    seen = 0
    while stack:
        node = stack.pop()
        assert ours[node] == theirs[node], (node, ours[node], theirs[node])
        stack.extend(node.children)
        seen += 1
    return seen


def test_every_fixture_node_has_libcsts_position_whole_and_statement_wise() -> None:
    """Over every fixture: `Positions` gives each node (the module and trivia included) libcst's
    range, and `StatementPositions` (each top-level statement's own code generation placed by its
    text) gives each node below the module the same; most fixtures never need the whole module's
    pass. One parse and one walk of each file serve both checks."""
    assert len(SOURCES) > 100
    stayed = 0
    for path in SOURCES:
        data = path.read_bytes()
        try:
            module = cst.parse_module(data)
        except cst.ParserSyntaxError:
            continue
        try:
            code = data.decode("utf-8")
        except UnicodeDecodeError:
            assert _same_as_libcst(module) > 0, path
            continue
        if module.encoding != "utf-8":  # (a BOM or another coding: libcst read other text)
            assert _same_as_libcst(module) > 0, path
            module = cst.parse_module(code)
            theirs = None
        else:
            theirs = PositionProvider()._gen(MetadataWrapper(module, unsafe_skip_copy=True))
        _, whole_never_asked = _statement_wise_as_whole(module, code, theirs)
        stayed += whole_never_asked
    assert stayed > len(SOURCES) // 2


def test_shapes_with_hoisted_and_multiline_positions() -> None:
    code = (
        "@decorator(1)\r\n"  # CRLF lines
        "async def f(a, *, b: int = 2) -> None:\n"
        "    x = (yield)  # comment\n"
        '    s = """one\n\ttwo\r\nthree"""\n'
        "    if a: return [y for y in b if y]\n"
        "    elif b:\n"
        "        pass\n"
        "    else:\n"
        "        x: int = lambda q=1: q ** 2\n"
        "    with open(a) as h, open(b) as k: del h[0], k.x\n"
        "    return f'{a!r:>{b}}' if a else {**a, 'k': -b}\n"
        "class C(B, metaclass=M):\n"
        "\tdef g(self): return self.a[1:2, ...] @ b\n"
    )
    assert _same_as_libcst(cst.parse_module(code)) > 100


def test_a_node_of_another_tree_is_not_found() -> None:
    positions = Positions(cst.parse_module("x = 1\n"))
    with pytest.raises(KeyError):
        positions[cst.Name("x")]


def test_a_libcst_without_the_internals_falls_back_to_its_provider(monkeypatch) -> None:
    import sys

    from accelify.analysis import script_model

    module = cst.parse_module("x = 1\nif x:\n    y = [x,\n         2]\n")
    monkeypatch.setitem(sys.modules, "accelify.analysis.positions", None)  # import fails
    fallback = script_model.positions_of(module)
    monkeypatch.undo()
    assert not isinstance(fallback, Positions)
    ours = Positions(module)
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        assert fallback[node] == ours[node]
        stack.extend(node.children)


def test_the_installed_libcst_passes_the_probe() -> None:
    faithful.cache_clear()
    assert faithful()


@pytest.mark.parametrize(
    "broken",
    [
        # a hook renamed in a libcst release: the base class's no-op runs, positions go wrong
        ("record_syntactic_position", CodegenState.record_syntactic_position),
        # a hook that fails (a new signature, a moved attribute)
        ("add_indent_tokens", lambda self: self.no_such_attribute),
    ],
)
def test_internals_that_changed_fall_back_to_the_public_provider(monkeypatch, broken) -> None:
    from accelify.analysis import script_model

    name, replacement = broken
    monkeypatch.setattr(_PositionState, name, replacement)
    faithful.cache_clear()
    try:
        assert not faithful()
        module = cst.parse_module("@d\ndef f(a):\n    if a: return (a)\n")
        fallback = script_model.positions_of(module)
        assert not isinstance(fallback, Positions)
        theirs = PositionProvider()._gen(MetadataWrapper(module, unsafe_skip_copy=True))
        assert all(fallback[node] == at for node, at in theirs.items())
    finally:
        monkeypatch.undo()
        faithful.cache_clear()
    assert faithful()


def _statement_wise_as_whole(
    module: cst.Module, code: str, theirs: Mapping[cst.CSTNode, CodeRange] | None = None
) -> tuple[int, bool]:
    """Every node of ``module`` (parsed from ``code``; trivia included) gets from
    `StatementPositions` the range `Positions` of the whole module gives it; also whether no
    lookup needed the whole module's pass. ``theirs``: libcst's positions of the module, which
    `Positions` must give each node too (the module included), checked in the same walk."""
    from accelify.analysis.positions import StatementPositions

    whole = Positions(module)
    if theirs is not None:
        assert whole[module] == theirs[module], (module, whole[module], theirs[module])
    parents: dict[int, cst.CSTNode] = {}
    tops: dict[int, cst.CSTNode] = {}  # each node's top-level statement
    stack: list[cst.CSTNode] = [module]
    nodes = []
    while stack:
        node = stack.pop()
        for child in node.children:
            if theirs is not None:
                assert whole[child] == theirs[child], (child, whole[child], theirs[child])
            parents[id(child)] = node
            tops[id(child)] = child if node is module else tops[id(node)]
            nodes.append(child)
            stack.append(child)
    # a fresh table per statement: a fallback for one statement does not hide the next one's
    by_statement: dict[int, StatementPositions] = {}
    stayed = True
    for node in nodes:
        top = id(tops[id(node)])
        positions = by_statement.get(top)
        if positions is None:
            positions = by_statement[top] = StatementPositions(module, code, parents)
        assert positions[node] == whole[node], (node, positions[node], whole[node])
        stayed = stayed and positions._whole is None
    return len(nodes), stayed


@pytest.mark.parametrize(
    "code",
    [
        # the last statement without its newline, its text (with one) earlier in the file
        "main()\nx = 1\nmain()",
        # one statement's text twice: neither occurrence is guessed
        "# header\n\nx = 1\nif x:\n    x = 1\nx = 1\n",
        # a text that occurs inside a longer line above it
        "yx = 1\nx = 1\n",
        # a footer comment without the file's last newline, its text (with one) above
        "# end\nx = 1\n# end",
        # CRLF and lone CR line breaks, comments and blank lines above statements
        "import os\r\n\r\n# c\r\ndef f(a):\r\n    return (a,\r\n            a)\r\nf(1)\r\n",
        "a = 1\rb = [a,\r     2]\r",
        '"""doc\nstring"""\n\n\n@d\nclass C:\n    s = """x\n\ny"""\n    def g(self): pass\n',
    ],
)
def test_statement_wise_positions_of_shapes_that_must_not_be_guessed(code: str) -> None:
    seen, _ = _statement_wise_as_whole(cst.parse_module(code), code)
    assert seen > 0


def test_a_lint_model_finds_its_positions_statement_by_statement() -> None:
    from accelify.analysis.positions import StatementPositions
    from accelify.analysis.script_model import analyze

    code = (
        "import torch\n\n\ndef f(model):\n    return model.cuda()\n\n\nf(torch.nn.Linear(1, 1))\n"
    )
    module = cst.parse_module(code)
    model = analyze(module, code)
    call = module.body[1].body.body[0].body[0].value  # model.cuda()
    assert model.position(call).start.line == 5
    assert isinstance(model._positions, StatementPositions)
    assert model._positions._whole is None  # only the function's own code was generated
    assert model.position(module.body[1]) == Positions(module)[module.body[1]]
