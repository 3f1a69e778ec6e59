"""ACC201's advice for a write in a helper that has no accelerator in scope (it receives only
the model and a path) names what the user can act on: the guarded call sites, by line, or the
accelerator to pass in; never an ``accelerator.is_main_process`` the helper cannot see."""

from __future__ import annotations

from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection

_SCRIPT = """import torch
from accelerate import Accelerator


def save_checkpoint(model, path):
    torch.save(model.state_dict(), path)


def export(state, path):
    torch.save(state, path)


def main():
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))
    for epoch in range(3):
        save_checkpoint(acc.unwrap_model(model), f"ckpt_{epoch}.pt")
    export(acc.get_state_dict(model), "final.pt")
    save_checkpoint(model, "last.pt")
"""


def _messages(code: str) -> dict[int, str]:
    result = lint_source(code.encode(), "train.py", Selection(select=["ACC201"]))
    return {finding.line: finding.message for finding in result.findings}


def test_helper_write_is_guarded_at_its_call_lines():
    message = _messages(_SCRIPT)[6]
    assert "save_checkpoint() has no accelerator to test" in message
    assert "`if acc.is_main_process:` at lines 17, 19" in message


def test_helper_whose_caller_hands_it_a_collective_gets_the_accelerator_instead():
    message = _messages(_SCRIPT)[10]
    assert message.startswith("Pass the accelerator to export() (it has none in scope")
    assert "acc.get_state_dict() (line 18) on one rank only" in message


def test_helper_whose_value_every_rank_needs_is_not_guarded_at_its_call():
    """Guarding ``rows = load_rows(...)`` would leave the other ranks without ``rows``."""
    code = _SCRIPT.replace(
        "    torch.save(model.state_dict(), path)\n",
        "    torch.save(model.state_dict(), path)\n    return path\n",
    )
    message = _messages(code)[6]
    assert message.startswith("Pass the accelerator to save_checkpoint()")
    assert "`if accelerator.is_main_process:`" in message
    assert "at line" not in message


def test_write_with_an_accelerator_in_scope_keeps_its_advice():
    code = _SCRIPT.replace(
        "from accelerate import Accelerator\n",
        "from accelerate import Accelerator\nacc = Accelerator()\n",
    ).replace("    acc = Accelerator()\n", "")
    assert "guard with `if acc.is_main_process:`" in _messages(code)[7]
