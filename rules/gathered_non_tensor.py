from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import runtime_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, target_names
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: The collectives that take tensors only: Accelerate applies them with
#: ``recursively_apply(..., error_on_other_type=True)``.
_TENSORS_ONLY = frozenset({"gather", "reduce"})
#: Methods whose result is no tensor: a NumPy array, a Python list or number.
_CONVERSIONS = frozenset({"numpy", "tolist", "item"})
#: Functions whose result is no tensor.
_CONSTRUCTORS = frozenset(
    {"float", "int", "np.array", "np.asarray", "numpy.array", "numpy.asarray", "np.stack"}
)

_EVAL = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
    + "for batch in loader:\n"
    + "    with torch.no_grad():\n"
    + "        preds = model(batch['x']).argmax(-1)\n"
)


class GatheredNonTensor(Rule):
    """``accelerator.gather(labels)`` (or ``reduce``) of a value that is no tensor: a NumPy
    array from ``.cpu().numpy()``, a list from ``.tolist()``, a number from ``.item()`` or
    ``float()``. Accelerate's ``gather`` and ``reduce`` take nested tensors only: on more than
    one process ``gather`` raises ``TypeError: Unsupported types (<class 'numpy.ndarray'>)
    passed to `_gpu_gather_one``` at the first evaluation batch, while one process returns the
    value unchanged and hides it; ``reduce`` raises the same TypeError on one process as well
    (accelify's runtime passes the value through ungathered or unreduced, beside gathered
    predictions). ``gather_for_metrics`` falls back to ``gather_object`` for such values and is
    not reported."""

    code = "ACC411"
    name = "gathered-non-tensor"
    message = (
        "Gather the tensor, not its NumPy/Python copy: accelerator.gather and reduce take "
        "tensors only and raise TypeError on more than one process (reduce on one as well)"
    )
    why = "Accelerate's gather and reduce accept nested tensors only."
    bad = (
        # a NER self-training script: the labels moved to NumPy before the gather
        Example(
            _EVAL
            + "    labels = batch['labels'].detach().cpu().numpy()\n"
            + "    preds = accelerator.gather(preds)\n"
            + "    labels = accelerator.gather(labels)\n",
            10,
            14,
        ),
        Example(
            HEADER + "total = accelerator.reduce(loss.item(), reduction='sum')\n",
            3,
            9,
        ),
        Example(
            "from accelerate import Accelerator\n\n\nclass Trainer:\n"
            + "    def __init__(self):\n        self.accelerator = Accelerator()\n\n"
            + "    def score(self, logits):\n"
            + "        probs = logits.softmax(-1).tolist()\n"
            + "        return self.accelerator.gather(probs)\n",
            10,
            16,
        ),
    )
    good = (
        _EVAL
        + "    preds, labels = accelerator.gather((preds, batch['labels']))\n"
        + "    labels = labels.cpu().numpy()\n",
        # gather_for_metrics falls back to gather_object for Python objects
        _EVAL + "    texts = accelerator.gather_for_metrics(preds.tolist())\n",
        # the name holds a tensor again by the time it is gathered
        _EVAL
        + "    labels = batch['labels'].cpu().numpy()\n"
        + "    labels = torch.from_numpy(labels).to(accelerator.device)\n"
        + "    labels = accelerator.gather(labels)\n",
        # torch.gather is an indexing op, not a collective
        HEADER + "import torch\npicked = torch.gather(logits.cpu().numpy(), 1, index)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not (
                calls_accelerator(script, call, _TENSORS_ONLY)
                and call.args
                and call.args[0].keyword is None
                and not call.args[0].star
            ):
                continue
            value = call.args[0].value
            source = _no_tensor(script, value, call)
            if source is None:
                continue
            yield self.finding(script, call, message=_message(script, call, value, source))


def _no_tensor(script: ScriptModel, value: cst.BaseExpression, at: cst.Call) -> cst.Call | None:
    """The call that made ``value`` a NumPy array or a Python value: ``value`` itself, or the
    last assignment of the name it is, above ``at`` in the same scope."""
    if _converts(script, value):
        return value  # type: ignore[return-value]
    if not isinstance(value, cst.Name):
        return None
    last = None
    scope = script.scope_of(at)
    around = {id(a) for a in script.ancestors(at)}  # ``labels = accelerator.gather(labels)``
    for node in script.index.of_type(cst.Assign):
        if not isinstance(node, cst.Assign) or script.order(node) >= script.order(at):
            continue
        if id(node) in around:
            continue
        if script.scope_of(node) is not scope:
            continue
        if any(value.value in target_names(t.target) for t in node.targets):
            last = node
    if last is None or len(last.targets) != 1 or not isinstance(last.targets[0].target, cst.Name):
        return None
    return last.value if _converts(script, last.value) else None  # type: ignore[return-value]


def _converts(script: ScriptModel, node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value in _CONVERSIONS and not node.args:
        return True
    return bool(script.call_names(node) & _CONSTRUCTORS) or dotted(func) in _CONSTRUCTORS


def _message(
    script: ScriptModel, call: cst.Call, value: cst.BaseExpression, source: cst.Call
) -> str:
    collective = call.func.attr.value  # type: ignore[attr-defined]
    accelerator = dotted(call.func.value)  # type: ignore[attr-defined]
    shown = script.module.code_for_node(value)
    made = script.module.code_for_node(source.func)
    where = "" if source is value else f" (from {made}() at line {script.line(source)})"
    if runtime_of(script) == "accelify":
        done = "ungathered" if collective == "gather" else "unreduced"
        effect = f"{accelerator}.{collective} passes it through {done}: each rank keeps its own"
    elif collective == "gather":
        effect = (
            f"{accelerator}.gather takes tensors only and raises TypeError (Unsupported types) "
            "on more than one process; one process returns it unchanged and hides it"
        )
    else:  # reduce checks the type before it looks at the number of processes
        effect = (
            f"{accelerator}.reduce takes tensors only and raises TypeError (Unsupported types), "
            "on one process as well"
        )
    other = (
        f"or use {accelerator}.gather_for_metrics(...) (it gathers Python objects too)"
        if collective == "gather"
        else f"or make it one (torch.tensor(..., device={accelerator}.device))"
    )
    return (
        f"{collective.capitalize()} the tensor, not its NumPy/Python copy: `{shown}` is no "
        f"tensor{where}, and {effect}; {collective} the tensor before converting it, {other}"
    )
