from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, root_name
from accelify.edits.plan import Plan
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, prepared

_PREPARED = HEADER + "model, loader = accelerator.prepare(model, loader)\n"


class ManualDeviceMove(Rule):
    """A ``.to(device)``/``.cuda()`` of a prepared model or of a batch from a prepared DataLoader.
    Prepare already placed them; a hard-coded ``.cuda()`` sends every rank's copy to GPU 0."""

    code = "ACC101"
    name = "manual-device-move"
    message = "Remove this device move: prepare() already placed the model and the batches"
    why = "`.cuda()` means GPU 0 on every rank; prepared objects are already on each rank's device."
    bad = (
        Example(
            _PREPARED + "for x, y in loader:\n    x = x.cuda()\n    loss = model(x)\n",
            5,
            9,
            _PREPARED + "for x, y in loader:\n    loss = model(x)\n",
        ),
        Example(_PREPARED + "model.to(device)\n", 4, 1, _PREPARED),
        Example(
            _PREPARED + "for x, y in loader:\n    loss = model(x.to(device))\n",
            5,
            18,
            _PREPARED + "for x, y in loader:\n    loss = model(x)\n",
        ),
    )
    good = (
        _PREPARED + "for x, y in loader:\n    y_hat = model(x)\n",
        _PREPARED + "for batch in loader:\n    batch.to(accelerator.device)\n",
        HEADER + "mask = torch.ones(3).to(accelerator.device)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if _placement_disabled(script):
            return  # Accelerator(device_placement=False): moving batches is the script's job
        accelerators = script.names_of(Kind.ACCELERATOR)
        for call in calls(script):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda"):
                continue
            if func.attr.value == "to" and not _device_argument(call):
                continue
            if func.attr.value == "to" and _is_accelerator_device(call, accelerators):
                continue  # a no-op: already on accelerator.device
            target = dotted(func.value)
            names = prepared(script, call)
            if target in names or root_name(func.value) in _batch_names(script, call, names):
                yield self.finding(script, call, _removal(script, call))


def _placement_disabled(script: ScriptModel) -> bool:
    return any(
        isinstance(b.value, cst.Call)
        and any(
            a.keyword is not None
            and a.keyword.value == "device_placement"
            and dotted(a.value) == "False"
            for a in b.value.args
        )
        for b in script.of_kind(Kind.ACCELERATOR)
    )


def _is_accelerator_device(call: cst.Call, accelerators: set[str]) -> bool:
    target = dotted(call.args[0].value) or ""
    return target.endswith(".device") and target.rsplit(".", 1)[0] in accelerators


def _removal(script: ScriptModel, call: cst.Call) -> Plan:
    """Drop the move; a statement left doing nothing (``x = x``, ``model``) goes entirely."""
    plan = Plan()
    parent = script.parent(call)
    line = script.parent(parent) if parent is not None else None
    receiver = call.func.value  # type: ignore[union-attr]
    if (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and (
            isinstance(parent, cst.Expr)
            or (
                isinstance(parent, cst.Assign)
                and len(parent.targets) == 1
                and dotted(parent.targets[0].target) == dotted(receiver)
            )
        )
    ):
        plan.removals.add(line)
    else:
        plan.replacements[call] = lambda updated: updated.func.value
    return plan


def _device_argument(call: cst.Call) -> bool:
    if not call.args:
        return False
    first = call.args[0].value
    text = dotted(first) or ""
    if isinstance(first, cst.SimpleString):
        return str(first.evaluated_value).split(":")[0] in ("cuda", "cpu")
    return text.split(".")[-1] in ("device", "local_rank", "rank")


def _batch_names(script: ScriptModel, node: cst.CSTNode, loaders: set[str]) -> set[str]:
    found: set[str] = set()
    for loop in script.loops:
        if loop.iterable in loaders and any(a is loop.node for a in script.ancestors(node)):
            found |= loop.batch_names
    return found
