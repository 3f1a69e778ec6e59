from collections.abc import Iterator
from pathlib import Path

import libcst as cst

from accelify.analysis.accumulation import accumulation_unhandled
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.lint.rule import (
    Example,
    Finding,
    Rule,
    accelerator_argument,
    accelerator_name,
    in_file_words,
    optimizer_models,
)

_IMPORT = "from accelify import Accelerator\n"


#: A trainer whose backward() steps the optimizer when the accumulation boundary is reached.
_TRAINER = (
    _IMPORT + "\n\nclass Trainer:\n"
    "    def __init__(self, cfg):\n"
    "        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.steps)\n\n"
    "    def backward(self, loss):\n"
    "        self.accelerator.backward(loss)\n"
    "        if self.accelerator.sync_gradients:\n"
    "            self.optimizer.step()\n"
    "            self.optimizer.zero_grad()\n"
)


class AccumulationSettings(Rule):
    """``gradient_accumulation_steps`` set on the Accelerator but no ``accelerator.accumulate()``
    and no accumulation by hand: ``backward`` divides every loss by the steps while the optimizer
    still steps every batch, so the learning rate is silently divided. (``accumulate()`` with no
    steps in the script is not reported: the steps can come from the launcher, the config or a
    DeepSpeed JSON.) Not reported: a script without the accelerator's backward (inference,
    pseudo-labelling, or ``loss.backward()`` only, which divides nothing), an
    Accelerator a factory returns (its callers accumulate), and accumulation by hand (``no_sync``,
    an optimizer step under ``% k``, the loss multiplied back by the steps)."""

    code = "ACC304"
    name = "accumulation-settings"
    message = (
        "Wrap the step in accelerator.accumulate(model): gradient_accumulation_steps is set, so "
        "every loss is divided while the optimizer still steps every batch"
    )
    why = "Steps set without accumulate() shrink every update."
    bad = (
        Example(
            _IMPORT + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
            "accelerator.backward(loss)\noptimizer.step()\n",
            2,
            15,
        ),
        # the trainer's own loop calls its backward(): nothing in the file accumulates, so
        # sync_gradients never turns off and the optimizer steps every batch
        Example(
            _TRAINER
            + "\n    def fit(self, loader):\n"
            + "        for batch in loader:\n"
            + "            self.backward(self.model(batch).loss)\n",
            6,
            28,
        ),
    )
    good = (
        # a base trainer's backward() waits on sync_gradients; its subclasses' loops, in other
        # modules, accumulate (a 3D-scene pre-training's BaseTrainer)
        _TRAINER,
        # parler-tts: accumulation by hand, no_sync chosen per micro-batch into a variable
        _IMPORT
        + "import contextlib\n"
        + "accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "for samples in steps:\n"
        + "    for i, batch in enumerate(samples):\n"
        + "        last = i == len(samples) - 1\n"
        + "        ctx = contextlib.nullcontext if last else model.no_sync\n"
        + "        with ctx():\n"
        + "            accelerator.backward(train_step(batch))\n"
        + "    optimizer.step()\n",
        # LLaMA-Factory's DeepSpeed engine: its callers (another module) drive the boundary
        _IMPORT
        + "class DeepSpeedEngine:\n"
        + "    def __init__(self, plugin, micro_batches):\n"
        + "        self.accelerator = Accelerator(\n"
        + "            deepspeed_plugin=plugin, gradient_accumulation_steps=micro_batches\n"
        + "        )\n\n"
        + "    def prepare(self, model, optimizer):\n"
        + "        return self.accelerator.prepare(model, optimizer)\n\n"
        + "    def backward(self, loss):\n"
        + "        self.accelerator.backward(loss)\n",
        # an inference script passing the setting as boilerplate: no backward, nothing shrinks
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=args.accumulation_steps)\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "for batch in loader:\n    labels.append(model(batch).argmax(-1))\n",
        # a GAN trainer (TiPGAN) that calls loss.backward(): nothing divides its losses
        # (ACC301 reports the backward; its fix brings accumulate() into question, not this)
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=cfg.steps)\n"
        + "for batch in loader:\n"
        + "    loss_d = disc_loss(batch)\n"
        + "    loss_d.backward()\n"
        + "    optimizer_d.step()\n",
        # a factory: the training scripts that call it wrap their steps in accumulate()
        _IMPORT
        + "def prepare_accelerator(args):\n"
        + "    accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "    return accelerator\n\n\n"
        + "def train_step(accelerator, loss):\n    accelerator.backward(loss)\n",
        # a trainer's accelerator: accumulate() on self.accelerator counts
        _IMPORT
        + "class Trainer:\n"
        + "    def __init__(self, args):\n"
        + "        self.accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n\n"
        + "    def step(self, model, loss):\n"
        + "        with self.accelerator.accumulate(model):\n"
        + "            self.accelerator.backward(loss)\n",
        # accumulation by hand: the division is multiplied back, the step waits on a flag
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "for step, batch in enumerate(loader):\n"
        + "    loss = model(batch) / args.steps\n"
        + "    accelerator.backward(loss * args.steps)\n"
        + "    optimizer.step()\n",
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "for step, batch in enumerate(loader):\n"
        + "    accelerator.backward(model(batch))\n"
        + "    do_step = (step + 1) % args.steps == 0\n"
        + "    if do_step:\n        optimizer.step()\n",
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        + "with accelerator.accumulate(model):\n    accelerator.backward(loss)\n",
        _IMPORT + "accelerator = Accelerator(gradient_accumulation_steps=1)\n"
        "accelerator.backward(loss)\n",
        _IMPORT + "accelerator = Accelerator()\nwith accelerator.accumulate(model):\n    pass\n",
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "for step, batch in enumerate(loader):\n"
        + "    with accelerator.no_sync(model):\n        accelerator.backward(loss)\n"
        + "    if (step + 1) % args.steps == 0:\n        optimizer.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        placement = facts_of(script).placement
        for binding in script.of_kind(Kind.ACCELERATOR):
            argument = accelerator_argument(binding.value, "gradient_accumulation_steps")
            if argument is None or _is_one(argument.value):
                continue
            if placement.returns_name(binding.scope, binding.name):
                # a factory: its callers decide how to accumulate; reported when every
                # caller the project shows trains with it and none accumulates
                unhandled = _callers_unhandled(script, binding.scope, argument.value)
                if unhandled:
                    factory = binding.scope.name.value  # type: ignore[union-attr]
                    message = (
                        f"{_message(self, script, binding)} (this Accelerator is what "
                        f"{factory}() returns to {', '.join(unhandled)}, which calls its "
                        "backward and never accumulate())"
                    )
                    yield self.finding(script, binding.value, message=message)
                continue
            if accumulation_unhandled(script, argument.value):
                yield self.finding(script, binding.value, message=_message(self, script, binding))


def _callers_unhandled(
    script: ScriptModel, factory: cst.CSTNode, steps: cst.BaseExpression
) -> list[str]:
    """Where the project's other modules call ``factory`` (``train.py:12``), when there is
    such a call, the file itself calls it nowhere, and every calling module trains with the
    Accelerator without accumulating (`accumulation_unhandled` of that module); else none.
    A linted caller answered that when it was linted (`HandedCall.unaccumulated`): only the
    others (an import cycle) are analysed here."""
    project = script.project
    if project is None or not isinstance(factory, cst.FunctionDef):
        return []
    if script.call_graph.calls_of(factory):
        return []
    this = str(project.path.resolve())
    handed = [
        call for call in project.handed if call.module == this and call.member == factory.name.value
    ]
    sites = [(call.unaccumulated, call.where(project.path)) for call in handed]
    answered = frozenset(Path(call.caller).resolve() for call in handed)
    sites += [
        (accumulation_unhandled(caller, steps), where)
        for caller, _, where in project.callers_of(factory, skip=answered)
    ]
    if not sites or not all(unhandled for unhandled, _ in sites):
        return []
    return [where for _, where in sites]


def _message(rule: Rule, script: ScriptModel, binding: Binding) -> str:
    """The message in the file's words: ``self.accelerator.accumulate(self.model)`` in a
    trainer whose one prepared model trains under its optimizer (a DPO trainer's)."""
    message = in_file_words(rule.message, accelerator_name(script, binding.value))
    trained = {m for models in optimizer_models(script).values() for m in models}
    trained = {  # what prepare returned for them, under whatever name it was bound
        output
        for call in script.prepare_calls
        if len(call.outputs) == len(call.inputs)  # not ``prepared = prepare(a, b)``: a tuple
        for given, output in zip(call.inputs, call.outputs, strict=True)
        if given in trained and output
    } | (trained & script.prepared_names)
    if len(trained) == 1:
        message = message.replace("accumulate(model)", f"accumulate({trained.pop()})")
    return message


def _is_one(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 1
