"""`accelify.source.parse` skips libcst's node checks while libcst's parser runs (they check again
what the grammar did): the trees are libcst's own, node for node, and every node made after the
parse (the edits') is still checked."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from accelify.errors import UserError
from accelify.source import parse

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCES = sorted(FIXTURES.glob("convert/*/before.py")) + sorted(FIXTURES.glob("lint/**/*.py"))


def test_the_trees_are_libcsts_own() -> None:
    assert len(SOURCES) > 100
    for path in SOURCES:
        data = path.read_bytes()
        try:
            theirs = cst.parse_module(data)
        except cst.ParserSyntaxError:
            with pytest.raises(UserError, match="syntax error"):
                parse(data, str(path))
            continue
        ours = parse(data, str(path))
        assert ours.deep_equals(theirs), path
        assert ours.bytes == data, path


def test_nodes_made_after_a_parse_are_checked() -> None:
    parse(b"x = 1\n", "x.py")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")


def test_nodes_made_after_a_failed_parse_are_checked() -> None:
    with pytest.raises(Exception, match="syntax error"):
        parse(b"def (:\n", "x.py")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")


def test_parses_in_threads_leave_the_checks_on() -> None:
    """The switch is libcst's class's: two threads parsing at once must not leave it off (one
    thread's restore racing the other's) nor turn it off for a thread making nodes."""
    import threading

    data = (FIXTURES / "convert" / "class_trainer" / "before.py").read_bytes()
    made_while_parsing: list[BaseException | None] = []

    def parse_many() -> None:
        for _ in range(10):
            parse(data, "x.py")

    def make_a_bad_node() -> None:
        try:
            cst.Name("not a name")
            made_while_parsing.append(None)
        except cst.CSTValidationError as error:
            made_while_parsing.append(error)

    threads = [threading.Thread(target=parse_many) for _ in range(2)]
    threads.append(threading.Thread(target=make_a_bad_node))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made_while_parsing and made_while_parsing[0] is not None
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")
