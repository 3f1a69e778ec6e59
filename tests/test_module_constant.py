"""`evaluation.module_constant`: a top-level ``NAME = <literal>`` is read through only when it is
the name's one binding in the file (a batch size ``DataLoader(..., batch_size=BATCH)`` reads)."""

from __future__ import annotations

import libcst as cst
import pytest

from accelify.analysis.evaluation import module_constant


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("BATCH = 64\n", "64", id="bound-once-at-the-top"),
        pytest.param("BATCH = 64\nBATCH = 1\n", None, id="bound-twice"),
        pytest.param("BATCH = 64\ndef f():\n    global BATCH\n", None, id="made-global"),
        pytest.param("BATCH = 64\nfor BATCH in (1, 2):\n    pass\n", None, id="a-loop-target"),
        pytest.param("BATCH = 64\nBATCH += 1\n", None, id="augmented"),
        pytest.param("def f():\n    BATCH = 64\n", None, id="a-local-only"),
        pytest.param("BATCH = size()\n", None, id="not-a-literal"),
    ],
)
def test_a_module_constant_is_its_one_top_level_literal(source: str, expected: str | None):
    value = module_constant(cst.parse_module(source), "BATCH")
    assert (value.value if isinstance(value, cst.Integer) else value) == expected
