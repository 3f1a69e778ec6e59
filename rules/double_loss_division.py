from collections.abc import Callable, Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.flow import accumulate_context
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted, is_accelerator_call, walk
from accelify.lint.rule import (
    Example,
    Finding,
    Rule,
    accelerator_argument,
    calls,
    calls_accelerator,
)

_SETUP = (
    "from accelify import Accelerator\n"
    "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
    "for x, y in loader:\n"
    "    with accelerator.accumulate(model):\n"
)


class DoubleLossDivision(Rule):
    """With ``gradient_accumulation_steps`` set, ``accelerator.backward`` already divides the
    loss by the number of accumulation steps. Dividing it by hand as well divides it twice: the
    gradients, and so the effective learning rate, shrink by that factor again. The division
    belongs to the single-device script; after conversion it has to go (keep it in what you
    log, if the logged value should stay the same)."""

    code = "ACC303"
    name = "double-loss-division"
    message = (
        "Remove the division by the accumulation steps: accelerator.backward already divides "
        "when gradient_accumulation_steps is set"
    )
    why = "The loss is divided twice, so every update is accumulation-steps times too small."
    bad = (
        Example(
            _SETUP
            + "        loss = criterion(model(x), y) / 4\n"
            + "        accelerator.backward(loss)\n",
            5,
            16,
        ),
        Example(
            _SETUP
            + "        loss = criterion(model(x), y)\n"
            + "        loss = loss / accelerator.gradient_accumulation_steps\n"
            + "        accelerator.backward(loss)\n",
            6,
            16,
        ),
        Example(
            _SETUP
            + "        loss = criterion(model(x), y)\n"
            + "        loss /= args.grad_accum_steps\n"
            + "        accelerator.backward(loss)\n",
            6,
            9,
        ),
        Example(
            _SETUP + "        accelerator.backward(criterion(model(x), y) / accum_steps)\n",
            5,
            30,
        ),
        # divided, then backwarded under a test (BigVGAN's discriminator, frozen at first)
        Example(
            _SETUP
            + "        loss_d = criterion(d(x), y) / args.gradient_accumulation_steps\n"
            + "        if step >= freeze_step:\n"
            + "            accelerator.backward(loss_d)\n",
            5,
            18,
        ),
        # MiniMind's DPO script: the steps set on the DeepSpeed plugin, divided again by hand
        Example(
            "from accelerate import Accelerator, DeepSpeedPlugin\n"
            "plugin = DeepSpeedPlugin(gradient_accumulation_steps=args.accum, zero_stage=2)\n"
            "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    loss = loss / args.accum\n"
            "    accelerator.backward(loss)\n",
            6,
            12,
        ),
        # a helper handed the accelerator divides by the accelerator's own steps (a LoRA
        # fine-tuning script's train_one_epoch): backward divides by that same value again
        Example(
            "from accelify import Accelerator\n"
            "def train_epoch(accelerator, model, loader):\n"
            "    steps = accelerator.gradient_accumulation_steps\n"
            "    for x, y in loader:\n"
            "        with accelerator.accumulate(model):\n"
            "            loss = criterion(model(x), y) / steps\n"
            "            accelerator.backward(loss)\n",
            6,
            20,
        ),
        # a TTS fine-tuner: no steps on the Accelerator, yet its step helper divides by its own
        # count inside accumulate(): nothing accumulates and the update shrinks (or, with the
        # launcher's steps, the loss is divided twice)
        Example(
            "from accelify import Accelerator\naccelerator = Accelerator()\n\n\n"
            "def train_step(batch):\n"
            "    loss = criterion(model(batch), batch)\n"
            "    accelerator.backward(loss / cfg.grad_accum_steps)\n\n\n"
            "for batch in loader:\n"
            "    with accelerator.accumulate(model):\n"
            "        train_step(batch)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            7,
            26,
        ),
    )
    good = (
        # accumulation by hand inside accumulate(): the optimizer steps under its own % test
        "from accelify import Accelerator\naccelerator = Accelerator()\n"
        "for i, batch in enumerate(loader):\n"
        "    with accelerator.accumulate(model):\n"
        "        accelerator.backward(criterion(model(batch), batch) / accum_steps)\n"
        "        if (i + 1) % accum_steps == 0:\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n",
        _SETUP + "        loss = criterion(model(x), y)\n        accelerator.backward(loss)\n",
        # dividing by something else (a batch size, a token count) is the script's own business
        _SETUP
        + "        loss = criterion(model(x), y) / num_tokens\n"
        + "        accelerator.backward(loss)\n",
        # set again under the test before its backward: that value is what goes back
        _SETUP
        + "        loss = criterion(model(x), y) / accum_steps\n"
        + "        if warm:\n            loss = criterion(model(x), y)\n"
        + "            accelerator.backward(loss)\n",
        # no accumulation configured: the manual division is the accumulation
        "from accelify import Accelerator\naccelerator = Accelerator()\nfor x, y in loader:\n"
        "    loss = criterion(model(x), y) / accum_steps\n    accelerator.backward(loss)\n",
        # the accelerator comes from elsewhere, its steps unknown here: a script's own count may
        # be the manual accumulation of an accelerator built without any
        "from accelify import Accelerator\n"
        "def train_epoch(accelerator, model, loader, args):\n"
        "    for x, y in loader:\n"
        "        loss = criterion(model(x), y) / args.accum_steps\n"
        "        accelerator.backward(loss)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        steps = _steps_test(script)
        unset = steps is None and _builds_accelerator(script) and not _stepped_by_hand(script)
        if steps is None and not unset:
            return
        test = steps if steps is not None else (lambda code: _is_steps(code, ""))
        for call in calls(script):
            if not (calls_accelerator(script, call, ("backward",)) and call.args):
                continue
            if unset and not _inside_accumulate(script, call):
                continue
            loss = call.args[0].value
            division: cst.CSTNode | None = loss if _divides_by_steps(script, loss, test) else None
            name = dotted(loss)
            if division is None and name is not None:
                division = _division_of(script, call, name, test)
            if division is not None:
                message = _unset_message(script, division) if unset else _engine_message(script)
                yield self.finding(script, division, message=message)


def _engine_message(script: ScriptModel) -> str | None:
    """Under an Accelerator built with ``deepspeed_plugin=``, it is DeepSpeed's engine that
    divides the loss by its steps in ``backward`` (Accelerate's own division is skipped there):
    the advice is the same, the reason names who divides."""
    if not any(
        accelerator_argument(b.value, "deepspeed_plugin") is not None
        for b in script.of_kind(Kind.ACCELERATOR)
    ):
        return None
    return (
        "Remove the division by the accumulation steps: DeepSpeed's engine already divides the "
        "loss by its gradient_accumulation_steps in backward"
    )


def _unset_message(script: ScriptModel, division: cst.CSTNode) -> str:
    """The Accelerator sets no steps, yet the backward runs inside ``accumulate()`` with the
    loss divided by the script's own count (a TTS fine-tuner's ``loss / grad_accum_steps`` in
    the step helper its ``with accelerator.accumulate(model):`` calls)."""
    divisor = division.right if isinstance(division, cst.BinaryOperation) else division.value
    steps = script.module.code_for_node(divisor)  # type: ignore[arg-type]
    built = next(
        (b for b in script.of_kind(Kind.ACCELERATOR) if is_accelerator_call(b.value)), None
    )
    where = f" (line {script.line(built.value)})" if built is not None else ""
    return (
        f"Pass gradient_accumulation_steps={steps} to the Accelerator{where} and remove this "
        "division: inside accumulate() backward divides by the Accelerator's own steps, which "
        "this script never sets, so with none every batch is an optimizer step and this "
        "division only shrinks the update, and with steps from the launcher's config the loss "
        "is divided twice"
    )


def _inside_accumulate(script: ScriptModel, node: cst.CSTNode, depth: int = 0) -> bool:
    """``node`` runs inside ``with accelerator.accumulate(...)``: in the block itself, or in a
    function every call of which is inside one (a step helper the loop calls there)."""
    if any(
        isinstance(a, cst.With) and accumulate_context(a) is not None
        for a in script.ancestors(node)
    ):
        return True
    function = facts_of(script).placement.enclosing_function(node)
    if function is None or depth > 2:
        return False
    callers = facts_of(script).calls.callers(function)
    return bool(callers) and all(_inside_accumulate(script, c, depth + 1) for c in callers)


def _stepped_by_hand(script: ScriptModel) -> bool:
    """An optimizer (or a scaler) stepped under a ``%`` test (``if (step + 1) % accum ==
    0:``): the script accumulates by hand, and its division is that accumulation's."""
    schedulers = script.names_of(Kind.SCHEDULER)
    for call in calls(script):
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "step"
            and dotted(func.value) not in schedulers
        ):
            continue
        for ancestor in script.ancestors(call):
            if isinstance(ancestor, cst.If) and any(
                isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
                for n in walk(ancestor.test)
            ):
                return True
    return False


def _steps_test(script: ScriptModel) -> Callable[[str], bool] | None:
    """What counts as dividing by the accumulation steps, or None when nothing does.

    Where the script builds its ``Accelerator(...)`` with the steps set, the configured value
    or any name that says it counts accumulation steps. Where the accelerator comes from
    elsewhere (a parameter, a factory, a base class), its setting is unknown here: then only
    the accelerator's own ``gradient_accumulation_steps``, read directly or through a name bound
    to it, is what ``backward`` divides by already."""
    if _builds_accelerator(script):
        steps = _configured_steps(script)
        return None if steps is None else (lambda code: _is_steps(code, steps))
    read = _read_steps(script)
    return (lambda code: code in read) if read else None


def _builds_accelerator(script: ScriptModel) -> bool:
    return any(is_accelerator_call(b.value) for b in script.of_kind(Kind.ACCELERATOR))


def _read_steps(script: ScriptModel) -> frozenset[str]:
    """``accelerator.gradient_accumulation_steps`` for each accelerator name, and the names
    assigned from it (``accumulation_steps = accelerator.gradient_accumulation_steps``)."""
    reads = {f"{name}.gradient_accumulation_steps" for name in script.names_of(Kind.ACCELERATOR)}
    aliases = {
        target_name
        for assign in script.assignments
        if dotted(assign.value) in reads
        for target in assigned_targets(assign)
        if (target_name := dotted(target)) is not None
    }
    return frozenset(reads | aliases)


def _configured_steps(script: ScriptModel) -> str | None:
    """The code of ``gradient_accumulation_steps=...`` when it is set (and not to 1)."""
    for binding in script.of_kind(Kind.ACCELERATOR):
        argument = accelerator_argument(binding.value, "gradient_accumulation_steps")
        if argument is not None:
            code = script.module.code_for_node(argument.value)
            return None if code == "1" else code
    for name in script.names_of(Kind.ACCELERATOR):
        if f"{name}.gradient_accumulation_steps =" in script.source:
            return f"{name}.gradient_accumulation_steps"
    return _plugin_steps(script)


#: Plugins that set the Accelerator's accumulation steps, and the keyword that does.
_STEP_PLUGINS = {
    "DeepSpeedPlugin": "gradient_accumulation_steps",
    "GradientAccumulationPlugin": "num_steps",
}


def _plugin_steps(script: ScriptModel) -> str | None:
    """``DeepSpeedPlugin(gradient_accumulation_steps=n)`` or ``GradientAccumulationPlugin(
    num_steps=n)``: the Accelerator built with it accumulates n steps (DeepSpeed's engine then
    divides the loss itself in ``backward``)."""
    for call in script.calls:
        keyword = _STEP_PLUGINS.get((dotted(call.func) or "").rsplit(".", 1)[-1])
        argument = next(
            (a for a in call.args if a.keyword is not None and a.keyword.value == keyword), None
        )
        if keyword is not None and argument is not None:
            code = script.module.code_for_node(argument.value)
            if code != "1":
                return code
    return None


def _divides_by_steps(
    script: ScriptModel, node: cst.BaseExpression, steps: Callable[[str], bool]
) -> bool:
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Divide)
        and steps(script.module.code_for_node(node.right))
    )


def _is_steps(code: str, steps: str) -> bool:
    """The configured value itself, or a name that says it counts accumulation steps."""
    lowered = code.lower()
    return code == steps or "accum" in lowered or "gradient_accumulation" in lowered


def _division_of(
    script: ScriptModel, backward: cst.Call, loss: str, steps: Callable[[str], bool]
) -> cst.CSTNode | None:
    """``loss = ... / steps`` or ``loss /= steps``: the last binding of ``loss`` before
    ``backward``, in its block or, when that block does not set it, in the blocks around it up
    to the loop's or function's body (BigVGAN divides, then backwards under ``if step >=
    freeze_step:``)."""
    backward_at = script.order(backward)
    for block in _enclosing_blocks(script, backward):
        last: tuple[cst.CSTNode, bool] | None = None  # the binding, and whether it divides
        for statement in block.body:
            if script.order(statement) >= backward_at or not isinstance(
                statement, cst.SimpleStatementLine
            ):
                continue
            for small in statement.body:
                if isinstance(small, cst.AugAssign) and dotted(small.target) == loss:
                    last = (
                        small,
                        isinstance(small.operator, cst.DivideAssign)
                        and steps(script.module.code_for_node(small.value)),
                    )
                elif isinstance(small, cst.Assign) and any(
                    dotted(target) == loss for target in assigned_targets(small)
                ):
                    last = small.value, _divides_by_steps(script, small.value, steps)
        if last is not None:
            return last[0] if last[1] else None
    return None


def _enclosing_blocks(script: ScriptModel, node: cst.CSTNode) -> Iterator[cst.IndentedBlock]:
    """The indented blocks around ``node``, innermost first, up to the body of its loop or
    function."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.IndentedBlock):
            yield ancestor
            if isinstance(script.parent(ancestor), (cst.For, cst.While, cst.FunctionDef)):
                return
        elif isinstance(ancestor, (cst.Module, cst.ClassDef, cst.FunctionDef)):
            return
