"""The small syntax questions several analyses share (analysis/syntax.py): each is asked in one
place, so each answer is pinned here once."""

from __future__ import annotations

import libcst as cst
import pytest

from accelify.analysis.syntax import (
    accelerator_argument,
    argument_value,
    is_accelerator_call,
    keyword_value,
    unpacked_names,
    updated_with,
)


def _statement(code: str) -> cst.BaseSmallStatement:
    return cst.parse_statement(code).body[0]  # type: ignore[union-attr,return-value]


def _expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def _code(node: cst.CSTNode | None) -> str | None:
    return None if node is None else cst.Module([]).code_for_node(node)


def _bound(code: str) -> list[tuple[str, str | None]]:
    assign = _statement(code)
    assert isinstance(assign, cst.Assign)
    return [
        (name, _code(value))
        for name, value in unpacked_names(assign.targets[0].target, assign.value)
    ]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("acc = correct / total", [("acc", "correct / total")]),
        ("a, b = x, y", [("a", "x"), ("b", "y")]),
        ("[a, b] = [x, y]", [("a", "x"), ("b", "y")]),
        ("(a, b), c = (x, y), z", [("a", "x"), ("b", "y"), ("c", "z")]),
        # the value does not write its elements out: each name is bound to what is not followed
        ("a, b = pair()", [("a", None), ("b", None)]),
        ("(a, b), c = pair(), z", [("a", None), ("b", None), ("c", "z")]),
        # a starred element on either side makes the positions uncertain
        ("a, *b = x, y", [("a", None), ("b", None)]),
        ("a, b = *xs, y", [("a", None), ("b", None)]),
        # attributes and subscripts are no plain names
        ("self.a, b = x, y", [("b", "y")]),
    ],
)
def test_each_plain_name_an_assignment_unpacks_is_paired_with_the_element_at_its_position(
    code: str, expected: list[tuple[str, str | None]]
) -> None:
    assert _bound(code) == expected


@pytest.mark.parametrize(
    ("code", "name", "operator", "expected"),
    [
        ("loss /= steps", "loss", cst.Divide, (None, "steps")),
        ("loss = criterion(out, y) / steps", "loss", cst.Divide, ("criterion(out, y)", "steps")),
        ("step += 1", "step", cst.Add, (None, "1")),
        ("step = 1 + step", "step", cst.Add, ("1", "step")),
        ("step -= 1", "step", cst.Add, None),
        ("step = step * 2", "step", cst.Add, None),
        ("other += 1", "step", cst.Add, None),
        ("step = other = step + 1", "step", cst.Add, None),
    ],
)
def test_an_assignment_that_updates_a_name_with_an_operator_gives_its_operands(
    code: str,
    name: str,
    operator: type[cst.BaseBinaryOp],
    expected: tuple[str | None, str] | None,
) -> None:
    found = updated_with(_statement(code), name, operator)
    assert (None if found is None else (_code(found[0]), _code(found[1]))) == expected


def test_an_accelerator_call_is_told_by_the_class_name_and_only_its_own_keywords_are_read() -> None:
    built = _expression("accelerate.Accelerator(gradient_accumulation_steps=4, cpu=True)")
    factory = _expression("make_accelerator(gradient_accumulation_steps=4)")
    assert is_accelerator_call(built) and is_accelerator_call(_expression("Accelerator()"))
    assert not is_accelerator_call(factory) and not is_accelerator_call(_expression("Accelerator"))
    argument = accelerator_argument(built, "gradient_accumulation_steps")
    assert argument is not None and _code(argument.value) == "4"
    assert accelerator_argument(built, "mixed_precision") is None
    assert accelerator_argument(factory, "gradient_accumulation_steps") is None
    assert _code(keyword_value(factory, "gradient_accumulation_steps")) == "4"  # type: ignore[arg-type]
    assert keyword_value(factory, "cpu") is None


@pytest.mark.parametrize(
    ("code", "keyword", "position", "expected"),
    [
        ("x.to(device)", "device", 0, "device"),
        ("x.to(device=gpu, non_blocking=True)", "device", 0, "gpu"),
        ("x.to(non_blocking=True, device=gpu)", "device", 0, "gpu"),
        ("x.to(dtype=torch.half)", "device", 0, None),
        ("x.to()", "device", 0, None),
        ("open(path, 'w')", "mode", 1, "'w'"),
        ("open(path)", "mode", 1, None),
        ("open(path, mode='a')", "mode", 1, "'a'"),
        # past a ``*args`` no position is known, and ``**kwargs`` is no positional argument
        ("x.to(*moves)", "device", 0, None),
        ("open(path, *rest)", "mode", 1, None),
        ("x.to(**moves)", "device", 0, None),
        ("dist.broadcast(t, 0, *rest, group=g)", "group", 2, "g"),
        # no position: the keyword alone
        ("torch.autocast('cuda', torch.bfloat16)", "enabled", None, None),
        ("torch.autocast('cuda', enabled=flag)", "enabled", None, "flag"),
    ],
)
def test_an_argument_is_read_by_its_keyword_else_at_its_position(
    code: str, keyword: str, position: int | None, expected: str | None
) -> None:
    call = _expression(code)
    assert isinstance(call, cst.Call)
    assert _code(argument_value(call, keyword, position)) == expected
