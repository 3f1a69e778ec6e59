from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.edits.plan import Plan, expression
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name, calls


class HardCodedCuda(Rule):
    """``torch.device("cuda")``, ``"cuda:0"`` or a bare ``.cuda()`` names one GPU for every rank:
    all ranks pile onto GPU 0 and the others sit idle (or run out of memory)."""

    code = "ACC102"
    name = "hard-coded-cuda"
    message = "Use accelerator.device instead of a hard-coded CUDA device"
    why = "Each rank has its own GPU; only accelerator.device knows which."
    bad = (
        Example(
            HEADER + 'import torch\ndevice = torch.device("cuda")\n',
            4,
            10,
            HEADER + "import torch\ndevice = accelerator.device\n",
        ),
        Example(
            HEADER + 'mask = torch.ones(4, device="cuda:0")\n',
            3,
            29,
            HEADER + "mask = torch.ones(4, device=accelerator.device)\n",
        ),
    )
    good = (HEADER + "device = accelerator.device\n", HEADER + 'cpu = torch.device("cpu")\n')

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        acc = accelerator_name(script)
        for call in calls(script):
            if (
                "torch.device" in script.call_names(call)
                and call.args
                and _cuda(call.args[0].value)
            ):
                plan = Plan()
                plan.replacements[call] = lambda _: expression(f"{acc}.device")
                yield self.finding(script, call, plan)
                continue
            for argument in call.args:
                keyword = argument.keyword.value if argument.keyword else None
                if keyword == "device" and _cuda(argument.value):
                    plan = Plan()
                    plan.replacements[argument.value] = lambda _: expression(f"{acc}.device")
                    yield self.finding(script, argument.value, plan)


def _cuda(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value).startswith("cuda")
