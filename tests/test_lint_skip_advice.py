"""ACC417's advice: iterate what ``skip_first_batches`` returns for the resumed epoch only.
Rebinding the loader itself to Accelerate's skipping loader skips those batches in every
later epoch too, so the advice names a separate loader for the resumed epoch."""

from __future__ import annotations

from test_lint_rules import lint

_SCRIPT = (
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "accelerator.load_state(args.resume)\n"
    "for epoch in range(3):\n"
    "    if epoch == 0:\n"
    "        accelerator.skip_first_batches(loader, resume_step)\n"
    "    for batch in loader:\n"
    "        pass\n"
)


def test_advice_keeps_the_loader_for_the_later_epochs():
    [finding] = [f for f in lint(_SCRIPT, "ACC417").findings if f.code == "ACC417"]
    assert "`active = accelerator.skip_first_batches(loader, resume_step)`" in finding.message
    assert "`active = loader` in the others" in finding.message
    assert "`loader = " not in finding.message
