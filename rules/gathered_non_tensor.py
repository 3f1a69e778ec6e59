from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import runtime_of
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding, runs_before
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, target_names, walk
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
#: The collective that hands a value that is no tensor to ``gather_object``, which flattens
#: every rank's value as a list: a number is no list (TypeError), a dict gives its keys.
_OBJECT_GATHER = frozenset({"gather_for_metrics"})
#: Functions whose result is a Python number.
_NUMBERS = frozenset({"float", "int", "len", "round"})
#: What makes a metric of Hugging Face's ``evaluate``: its ``compute()`` is a Python number
#: (``cer``, ``wer``) or a dict of them (``accuracy``), never a tensor.
_METRIC_LOADERS = frozenset({"evaluate.load", "datasets.load_metric"})
#: Methods of a dict that take entries out or change them in place.
_MUTATORS = frozenset({"pop", "popitem", "clear", "update", "setdefault"})
#: The dict views a loop reads a dict's values through.
_VALUE_VIEWS = frozenset({"items", "values"})

_EVAL = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
    + "for batch in loader:\n"
    + "    with torch.no_grad():\n"
    + "        preds = model(batch['x']).argmax(-1)\n"
)

_CER = (
    HEADER
    + "import evaluate\nimport torch\n"
    + "model, loader = accelerator.prepare(model, loader)\n"
    + "metric = evaluate.load('cer')\n"
    + "val_logs = {'val_loss': 0, 'val_cer': 0}\n"
    + "for batch in loader:\n"
    + "    outputs = model(**batch)\n"
    + "    val_logs['val_loss'] += outputs.loss\n"
    + "    preds = accelerator.gather_for_metrics(outputs.logits.argmax(-1))\n"
    + "    labels = accelerator.gather_for_metrics(batch['labels'])\n"
    + "    metric.add_batch(predictions=preds, references=labels)\n"
    + "val_logs['val_cer'] = metric.compute()\n"
)


class GatheredNonTensor(Rule):
    """``accelerator.gather(labels)`` (or ``reduce``) of a value that is no tensor: a NumPy
    array from ``.cpu().numpy()``, a list from ``.tolist()``, a number from ``.item()`` or
    ``float()``. Accelerate's ``gather`` and ``reduce`` take nested tensors only: on more than
    one process ``gather`` raises ``TypeError: Unsupported types (<class 'numpy.ndarray'>)
    passed to `_gpu_gather_one``` at the first evaluation batch, while one process returns the
    value unchanged and hides it; ``reduce`` raises the same TypeError on one process as well
    (accelify's runtime passes the value through ungathered or unreduced, beside gathered
    predictions). ``gather_for_metrics`` falls back to ``gather_object`` for such values, which
    serves lists (``preds.tolist()``) but not a Python number: Accelerate's ``gather_object``
    flattens every rank's value as a list, so on more than one process a float (``loss.item()``,
    ``float(...)``, ``len(...)``, an ``evaluate`` metric's ``compute()``) raises ``TypeError:
    'float' object is not iterable`` and a dict of them comes back as its keys (accelify's
    runtime returns one value per rank: ``.sum()`` of that list raises AttributeError, ``sum()``
    counts the value N times). Reported at such a gather, also where the number is a name's last
    value or an entry of a dict whose values a loop gathers (``{k: gather_for_metrics(v) for k,
    v in logs.items()}`` after ``logs["cer"] = metric.compute()``)."""

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
        # a wav2vec2 fine-tune (lintreal45): the CER computed from gathered predictions, then
        # gathered again with the losses and summed
        Example(
            _CER
            + "val_logs = {\n"
            + "    k: accelerator.gather_for_metrics(v).sum() for k, v in val_logs.items()\n"
            + "}\n",
            16,
            8,
        ),
        Example(  # a trainer's loss, a Python float by the time it is gathered
            "from accelerate import Accelerator\n\n\nclass Trainer:\n"
            + "    def __init__(self):\n        self.accelerator = Accelerator()\n\n"
            + "    def evaluate(self, loader):\n"
            + "        for batch in loader:\n"
            + "            loss = self.model(**batch).loss.item()\n"
            + "            self.losses.append(self.accelerator.gather_for_metrics(loss))\n",
            11,
            32,
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
        # the CER of gathered predictions is the whole set's: only the losses are gathered
        _CER
        + "val_logs = {k: accelerator.gather_for_metrics(v).sum() for k, v in val_logs.items()"
        + " if k != 'val_cer'}\n",
        # a per-rank number made a tensor before the gather, as the message advises
        _CER.replace("metric.compute()", "metric.compute()\nval_cer = val_logs['val_cer']")
        + "cer = accelerator.gather_for_metrics(torch.tensor(val_cer, device=accelerator.device))"
        + ".mean()\n",
        # the entry changed to a tensor before the loop gathers it
        _CER
        + "val_logs['val_cer'] = torch.tensor(val_logs['val_cer'], device=accelerator.device)\n"
        + "val_logs = {k: accelerator.gather_for_metrics(v).sum() for k, v in val_logs.items()}\n",
        # torch.gather is an indexing op, not a collective
        HEADER + "import torch\npicked = torch.gather(logits.cpu().numpy(), 1, index)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not (call.args and call.args[0].keyword is None and not call.args[0].star):
                continue
            value = call.args[0].value
            if calls_accelerator(script, call, _OBJECT_GATHER):
                number = _number_source(script, value, call)
                if number is not None:
                    message = _number_message(script, call, value, number)
                    yield self.finding(script, call, message=message)
                continue
            if not calls_accelerator(script, call, _TENSORS_ONLY):
                continue
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


def _number_source(script: ScriptModel, value: cst.BaseExpression, at: cst.Call) -> cst.Call | None:
    """The call that made ``value`` a Python number (or an ``evaluate`` metric's result) by
    the time ``at`` gathers it: ``value`` itself, the name's last binding above ``at`` that
    runs whenever ``at`` does, or, for the values of a dict read in a loop
    (``for k, v in logs.items()``), an entry stored with such a call (``logs["cer"] =
    metric.compute()``) before the loop."""
    if _makes_number(script, value):
        return value  # type: ignore[return-value]
    if not isinstance(value, cst.Name):
        return None
    looped = _dict_looped_for(script, value.value, at)
    if looped is not None:
        return _number_entry(script, looped, at)
    binding = last_binding(script, value.value, at)
    if (
        isinstance(binding, cst.Assign)
        and len(binding.targets) == 1
        and isinstance(binding.targets[0].target, cst.Name)
        and _makes_number(script, binding.value)
        and runs_before(script, binding, at)
    ):
        return binding.value  # type: ignore[return-value]
    return None


def _dict_looped_for(script: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """The dict whose values the loop around ``at`` binds to ``name``: ``logs`` of ``for k,
    name in logs.items()`` or ``for name in logs.values()`` (a comprehension's too)."""
    for ancestor in script.ancestors(at):
        loops: list[cst.For | cst.CompFor] = []
        if isinstance(ancestor, cst.For):
            loops = [ancestor]
        elif isinstance(ancestor, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            loop: cst.CompFor | None = ancestor.for_in
            while loop is not None:
                loops.append(loop)
                loop = loop.inner_for_in
        for loop in loops:
            if name not in target_names(loop.target):
                continue
            if _filtered(loop):
                return None  # ``if k != "cer"``: which entries reach the gather is not known
            viewed = loop.iter
            if not (
                isinstance(viewed, cst.Call)
                and not viewed.args
                and isinstance(viewed.func, cst.Attribute)
                and viewed.func.attr.value in _VALUE_VIEWS
                and isinstance(viewed.func.value, cst.Name)
            ):
                return None
            view = viewed.func.attr.value
            target = loop.target
            if view == "items" and not (
                isinstance(target, cst.Tuple)
                and len(target.elements) == 2
                and isinstance(target.elements[1].value, cst.Name)
                and target.elements[1].value.value == name
            ):
                return None
            if view == "values" and not isinstance(target, cst.Name):
                return None
            return viewed.func.value.value
    return None


def _number_entry(script: ScriptModel, table: str, at: cst.Call) -> cst.Call | None:
    """A call that made a number, stored in ``table["key"]`` as that key's last store above
    ``at`` in the same function, run whenever ``at`` is."""
    function = facts_of(script).placement.enclosing_function(at)
    scope = function if function is not None else script.module
    here = script.order(at)
    last: dict[str, cst.Assign | cst.AugAssign] = {}
    for node in walk(scope):
        if not isinstance(node, (cst.Assign, cst.AugAssign)) or script.order(node) >= here:
            continue
        if facts_of(script).placement.enclosing_function(node) is not function:
            continue
        targets = (
            [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        )
        for target in targets:
            key = _literal_key(target, table)
            if key is not None:
                last[key] = node
    rebound = last_binding(script, table, at)
    for node in last.values():
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and _makes_number(script, node.value)
            and runs_before(script, node, at)
            and (rebound is None or script.order(rebound) < script.order(node))
            and not _changed_between(script, table, scope, node, at)
        ):
            return node.value  # type: ignore[return-value]
    return None


def _filtered(loop: cst.For | cst.CompFor) -> bool:
    """The loop may leave some entries out: a comprehension's ``if``, or an ``if`` or
    ``continue`` in a ``for`` body."""
    if isinstance(loop, cst.CompFor):
        return bool(loop.ifs)
    return any(isinstance(node, (cst.If, cst.Continue)) for node in walk(loop.body))


def _changed_between(
    script: ScriptModel, table: str, scope: cst.CSTNode, store: cst.CSTNode, at: cst.CSTNode
) -> bool:
    """``table.pop("cer")``, ``del table["cer"]`` and the like between ``store`` and ``at``."""
    start, end = script.order(store), script.order(at)
    for node in walk(scope):
        if not start < script.order(node) < end:
            continue
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and dotted(node.func.value) == table
            and node.func.attr.value in _MUTATORS
        ):
            return True
        if isinstance(node, cst.Del):
            return True
    return False


def _literal_key(target: cst.BaseExpression, table: str) -> str | None:
    """``"cer"`` of ``table["cer"]``."""
    if not (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and target.value.value == table
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, cst.SimpleString)
    ):
        return None
    key = target.slice[0].slice.value.evaluated_value
    return key if isinstance(key, str) else None


def _makes_number(script: ScriptModel, node: cst.BaseExpression) -> bool:
    """``loss.item()``, ``float(...)``, ``len(...)``, or ``metric.compute()`` of a metric made
    by ``evaluate.load``: a Python value that is no list of the rank's rows."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute):
        if func.attr.value == "item" and not node.args:
            return True
        if func.attr.value == "compute":  # ``compute(predictions=..., references=...)`` too
            return _evaluate_metric(script, func.value, node)
    return bool(script.call_names(node) & _NUMBERS) or dotted(func) in _NUMBERS


def _evaluate_metric(script: ScriptModel, receiver: cst.BaseExpression, at: cst.Call) -> bool:
    """``receiver`` is a name (or ``self.`` attribute) every binding of which, in the function
    of ``at`` (in the file, for an attribute), is ``evaluate.load(...)``."""
    name = dotted(receiver)
    if name is None:
        return False
    placement = facts_of(script).placement
    function = placement.enclosing_function(at)
    values = []
    for node in script.index.of_type(cst.Assign):
        if not isinstance(node, cst.Assign):
            continue
        if not any(dotted(t.target) == name for t in node.targets):
            continue
        if "." not in name and placement.enclosing_function(node) is not function:
            continue
        values.append(node.value)
    return bool(values) and all(
        isinstance(v, cst.Call) and bool(script.call_names(v) & _METRIC_LOADERS) for v in values
    )


def _number_message(
    script: ScriptModel, call: cst.Call, value: cst.BaseExpression, source: cst.Call
) -> str:
    accelerator = dotted(call.func.value)  # type: ignore[attr-defined]
    shown = script.module.code_for_node(value)
    made = script.module.code_for_node(source)
    where = (
        f"`{shown}` is"
        if source is value
        else f"`{shown}` holds {made} (line {script.line(source)}), which is"
    )
    if runtime_of(script) == "accelify":
        effect = (
            f"{accelerator}.gather_for_metrics hands it to gather_object, which on N processes "
            "returns a list of each rank's value: .sum() of it raises AttributeError, and sum() "
            "counts the value N times"
        )
    else:
        effect = (
            f"{accelerator}.gather_for_metrics hands it to gather_object, which on more than one "
            "process raises TypeError for a number ('float' object is not iterable) and returns "
            "a dict's keys, not its values"
        )
    return (
        f"Gather tensors, not Python numbers: {where} no tensor, and {effect}; one process "
        "returns it unchanged and hides it. A metric computed from gathered predictions covers "
        f"every rank already: use it ungathered; else gather torch.tensor(value, "
        f"device={accelerator}.device) and take the mean of the result"
    )
