from collections.abc import Iterator

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted, is_assignment, target_names
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n\n\n"
    "class Experiment:\n"
    "    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
    "    def restore_best(self, path):\n"
    "{body}"
    "        return self.model\n"
)


class LoadStateResult(Rule):
    """``accelerator.load_state(path)`` restores the prepared objects in place and returns
    ``None`` (Hugging Face Accelerate and accelify's runtime alike). Binding its result
    (``self.model = self.accelerator.load_state(best_model_path)``, as a forecasting
    experiment restores its best checkpoint) replaces the model with ``None``: the next
    forward, ``state_dict()`` or ``parameters()`` raises ``TypeError``/``AttributeError``, on one
    process and on every backend. Reported at the call; the fix is to call it as a statement
    and keep using the objects that were prepared."""

    code = "ACC505"
    name = "load-state-result"
    message = (
        "Call load_state as a statement: it restores the prepared objects in place and returns "
        "None, so this binds None and the next use of it fails"
    )
    why = "load_state returns None; the objects it restores are the ones prepare returned."
    bad = (
        Example(
            _TRAINER.format(body="        self.model = self.accelerator.load_state(path)\n"),
            11,
            22,
        ),
        Example(
            HEADER + "model = accelerator.prepare(model)\nmodel = accelerator.load_state('c')\n",
            4,
            9,
        ),
    )
    good = (
        _TRAINER.format(body="        self.accelerator.load_state(path)\n"),
        # an object of another class with a load_state method of its own
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "model = accelerator.prepare(model)\n"
        "state = store.load_state('c')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not calls_accelerator(script, call, ("load_state",)):
                continue
            parent = script.parent(call)
            if not is_assignment(parent) or parent.value is not call:
                continue
            bound = sorted(
                name
                for target in assigned_targets(parent)
                for name in (target_names(target) or {dotted(target) or ""})
            )
            if not bound or any(name in ("", "_") for name in bound):
                continue
            accelerator = dotted(call.func.value)  # type: ignore[attr-defined]
            verb = "is" if len(bound) == 1 else "are"
            yield self.finding(
                script,
                call,
                message=(
                    f"Call {accelerator}.load_state(...) as a statement: it restores the prepared "
                    f"objects in place and returns None, so {', '.join(bound)} {verb} set to "
                    "None here and the next use fails (TypeError or AttributeError); keep using "
                    "the objects prepare returned"
                ),
            )
