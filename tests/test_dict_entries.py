"""`flow.dict_entries`: the one reading of a dict the conversion hands on (review7b a1/f5/d5)."""

import libcst as cst
import pytest

from accelify.analysis.flow import dict_entries
from accelify.analysis.script_model import analyze


def _entries(expression: str) -> dict[str, str] | None:
    model = analyze(cst.parse_module(f"x = {expression}\n"))
    value = model.module.body[0].body[0].value  # type: ignore[attr-defined]
    held = dict_entries(model, value)
    return None if held is None else {k: model.module.code_for_node(v) for k, v in held.items()}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('{"model": m, "loader": dl}', {"model": "m", "loader": "dl"}),
        ("dict(model=m, loader=dl)", {"model": "m", "loader": "dl"}),
        ("dict(base, model=m)", {"model": "m"}),
        ('{**base, "model": m}', {"model": "m"}),
        ('{"model": m, **base}', {}),  # the splat may replace it
        ('{"model": m, key: dl}', {}),  # so may a computed key
        ('{"model": m, 1: 2}', {"model": "m"}),  # a number replaces no string key
        ("make(m)", None),
        ("[m]", None),
    ],
)
def test_dict_entries(expression: str, expected: dict[str, str] | None) -> None:
    assert _entries(expression) == expected
