"""A loss call's reduction is read where the loss was built: the same object whether it is a
local, an instance attribute, a parameter, a module global or a factory's return value."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from accelify.analysis.loss_reduction import is_ctc_loss, sums_its_batch
from accelify.analysis.script_model import analyze

HEADER = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\n"


def _summed(code: str, called: str = "criterion") -> bool:
    model = analyze(cst.parse_module(HEADER + textwrap.dedent(code)))
    calls = [c for c in model.calls if model.module.code_for_node(c.func) == called]
    assert calls, f"no call of {called}"
    return sums_its_batch(model, calls[-1])


@pytest.mark.parametrize(
    ("code", "called", "expected"),
    [
        pytest.param(
            """
            def evaluate(out, y):
                criterion = nn.CrossEntropyLoss(reduction="sum")
                return criterion(out, y)
            """,
            "criterion",
            True,
            id="local",
        ),
        pytest.param(
            """
            def evaluate(out, y):
                criterion = nn.CrossEntropyLoss()
                return criterion(out, y)
            """,
            "criterion",
            False,
            id="local-default",
        ),
        pytest.param(
            """
            class Trainer:
                def __init__(self, device):
                    self.criterion = nn.MSELoss(reduction="sum").to(device)

                def evaluate(self, out, y):
                    return self.criterion(out, y)
            """,
            "self.criterion",
            True,
            id="attribute-moved",
        ),
        pytest.param(
            """
            def make_loss(smoothing):
                if smoothing:
                    return nn.CrossEntropyLoss(reduction="sum", label_smoothing=smoothing)
                return nn.CrossEntropyLoss(reduction="sum")

            def evaluate(out, y, loss_fn):
                return loss_fn(out, y)

            def main(out, y):
                evaluate(out, y, make_loss(0.1))
            """,
            "loss_fn",
            True,
            id="parameter-from-factory",
        ),
        pytest.param(
            """
            def make_loss(summed):
                if summed:
                    return nn.CrossEntropyLoss(reduction="sum")
                return nn.CrossEntropyLoss()

            def evaluate(out, y):
                loss_fn = make_loss(True)
                return loss_fn(out, y)
            """,
            "loss_fn",
            False,
            id="factory-either-way",
        ),
        pytest.param(
            """
            def evaluate(out, y, loss_fn):
                return loss_fn(out, y)
            """,
            "loss_fn",
            False,
            id="parameter-no-caller",
        ),
        pytest.param(
            """
            CRITERION = nn.L1Loss(reduction="sum")

            def evaluate(out, y):
                return CRITERION(out, y)
            """,
            "CRITERION",
            True,
            id="module-global",
        ),
        pytest.param(
            """
            def evaluate(out, y):
                return F.cross_entropy(out, y, reduction="sum")
            """,
            "F.cross_entropy",
            True,
            id="at-the-call",
        ),
    ],
)
def test_the_reduction_is_read_where_the_loss_was_built(code: str, called: str, expected: bool):
    assert _summed(code, called) is expected


def _ctc(code: str, called: str) -> bool:
    model = analyze(cst.parse_module(HEADER + textwrap.dedent(code)))
    calls = [c for c in model.calls if model.module.code_for_node(c.func) == called]
    assert calls, f"no call of {called}"
    return is_ctc_loss(model, calls[-1])


@pytest.mark.parametrize(
    ("code", "called", "expected"),
    [
        pytest.param(
            """
            def validate(log_probs, targets, input_lens, target_lens):
                return F.ctc_loss(log_probs, targets, input_lens, target_lens)
            """,
            "F.ctc_loss",
            True,
            id="functional",
        ),
        pytest.param(
            """
            class Trainer:
                def __init__(self):
                    self.ctc = nn.CTCLoss(blank=0, zero_infinity=True)

                def validate(self, log_probs, targets, input_lens, target_lens):
                    return self.ctc(log_probs, targets, input_lens, target_lens)
            """,
            "self.ctc",
            True,
            id="instance-attribute",
        ),
        pytest.param(
            """
            def make_loss():
                return nn.CTCLoss(blank=0)

            def validate(log_probs, targets, input_lens, target_lens):
                loss_fn = make_loss()
                return loss_fn(log_probs, targets, input_lens, target_lens)
            """,
            "loss_fn",
            True,
            id="factory",
        ),
        pytest.param(
            """
            def validate(out, y):
                criterion = nn.CrossEntropyLoss()
                return criterion(out, y)
            """,
            "criterion",
            False,
            id="not-ctc",
        ),
    ],
)
def test_a_ctc_loss_is_known_where_it_was_built(code: str, called: str, expected: bool) -> None:
    assert _ctc(code, called) is expected
