from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls


class ManualAmp(Rule):
    """A hand-made ``GradScaler`` or ``autocast("cuda")`` beside an Accelerator: the loss is
    scaled twice (or by a scaler the Accelerator never unscales before clipping), and a
    ``"cuda"`` autocast does nothing on a CPU rank. Mixed precision belongs to the Accelerator."""

    code = "ACC305"
    name = "manual-amp"
    message = "Use Accelerator(mixed_precision=...) and accelerator.autocast() instead"
    why = "Two scalers scale the loss twice; a CUDA autocast is off on CPU ranks."
    bad = (
        Example(HEADER + "import torch\nscaler = torch.cuda.amp.GradScaler()\n", 4, 10),
        Example(
            HEADER
            + "import torch\nwith torch.autocast('cuda', dtype=torch.float16):\n    y = f(x)\n",
            4,
            6,
        ),
    )
    good = (HEADER + "with accelerator.autocast():\n    y = f(x)\n",)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            qualified = script.call_names(call)
            cuda_autocast = qualified & names.AUTOCASTS and _targets_cuda(script, call)
            if qualified & names.GRAD_SCALERS or cuda_autocast:
                yield self.finding(script, call)


def _targets_cuda(script: ScriptModel, call: cst.Call) -> bool:
    if "torch.cuda.amp.autocast" in script.call_names(call):
        return True
    for argument in call.args:
        keyword = argument.keyword.value if argument.keyword else "device_type"
        value = argument.value
        if keyword == "device_type" and isinstance(value, cst.SimpleString):
            return str(value.evaluated_value) == "cuda"
    return False
