from collections.abc import Iterator

from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.facts import facts_of
from accelify.analysis.precision import apex_scaled_backward
from accelify.analysis.script_model import ScriptModel
from accelify.edits import rewrites
from accelify.edits.plan import Plan
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at


class LossBackward(Rule):
    """``loss.backward()`` bypasses the Accelerator: no division for gradient accumulation, no
    fp16 loss scaling, and DeepSpeed's engine never sees the backward pass.

    A model that trains itself (its own method runs the backward and steps an optimizer the
    model holds, which ``prepare`` never sees) keeps ``loss.backward()``: the Accelerator's
    scaling and division would reach an optimizer that never undoes them. So do the branch that
    runs without an accelerator (``else`` of ``if self.accelerator is not None:``) and apex's
    ``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``."""

    code = "ACC301"
    name = "loss-backward"
    message = "Call accelerator.backward(loss) instead of loss.backward()"
    why = (
        "With gradient accumulation the gradients come out k times too large, with fp16 they "
        "underflow unscaled, and under DeepSpeed the engine never runs its backward."
    )
    bad = (
        Example(
            HEADER + "loss = model(x).sum()\nloss.backward()\n",
            4,
            1,
            HEADER + "loss = model(x).sum()\naccelerator.backward(loss)\n",
        ),
        Example(
            HEADER + "(out - y).pow(2).mean().backward(retain_graph=True)\n",
            3,
            1,
            HEADER + "accelerator.backward((out - y).pow(2).mean(), retain_graph=True)\n",
        ),
    )
    good = (
        HEADER + "accelerator.backward(loss)\n",
        HEADER
        + "import torch\n"
        + "class Layer(torch.nn.Linear):\n"
        + "    def fit(self, x, accelerator):\n"
        + "        self.opt.zero_grad()\n"
        + "        self(x).pow(2).mean().backward()\n"
        + "        for param in self.parameters():\n"
        + '            param.grad = accelerator.reduce(param.grad, "mean")\n'
        + "        self.opt.step()\n"
        + "layer = Layer(4, 4)\n",
        # torchdistill: a training box that runs with or without an accelerator
        "class Box:\n"
        + "    def __init__(self, accelerator=None):\n"
        + "        self.accelerator = accelerator\n"
        + "    def post_forward(self, loss):\n"
        + "        if self.accelerator is not None:\n"
        + "            self.accelerator.backward(loss)\n"
        + "        else:\n"
        + "            loss.backward()\n",
        # trl's online trainers: HF Trainer's apex branch
        "from apex import amp\n"
        + "class OnlineTrainer:\n"
        + "    def training_step(self, loss):\n"
        + "        if self.use_apex:\n"
        + "            with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
        + "                scaled_loss.backward()\n"
        + "        else:\n"
        + "            self.accelerator.backward(loss)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        for call in script.backward_calls:
            if facts.trains_itself(call):
                continue  # the model's own optimizer: nothing would undo the scaling
            if without_accelerator(script, call) or apex_scaled_backward(script, call):
                continue  # the path without an accelerator, or apex's own scaled backward
            acc = accelerator_at(script, call)
            if acc is None:
                yield self.finding(script, call)
                continue
            # The script still uses its scaler (if any): the scaling stays.
            fix = Plan.of(rewrites.backward(call, acc, keep_scaling=True))
            yield self.finding(script, call, fix)
