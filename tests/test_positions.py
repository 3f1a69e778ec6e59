"""`accelify.analysis.positions.Positions` gives every node the range libcst's `PositionProvider`
gives it (a finding's line and column come from it): node for node, trivia included, over every
fixture, and for code written with the shapes that record a syntactic position differently."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst._nodes.internal import CodegenState
from libcst.metadata import MetadataWrapper, PositionProvider

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


def test_every_fixture_node_has_libcsts_position() -> None:
    assert len(SOURCES) > 100
    for path in SOURCES:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        assert _same_as_libcst(module) > 0, path


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
    fallback = script_model._positions_of(module)
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
        fallback = script_model._positions_of(module)
        assert not isinstance(fallback, Positions)
        theirs = PositionProvider()._gen(MetadataWrapper(module, unsafe_skip_copy=True))
        assert all(fallback[node] == at for node, at in theirs.items())
    finally:
        monkeypatch.undo()
        faithful.cache_clear()
    assert faithful()
