from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import gradients_averaged_by_hand, without_accelerator
from accelify.analysis.facts import facts_of
from accelify.analysis.precision import accelerator_never_scales, apex_scaled_backward
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.single_device import single_device_twin
from accelify.analysis.syntax import dotted
from accelify.lint.rule import (
    HEADER,
    MULTI_BACKEND_TRAINER,
    PARITY_REFERENCE,
    Example,
    Finding,
    Rule,
    accelerator_at,
    accelerator_missing,
)

#: A teacher trained with a plain backward in ``main()``, before the distiller that makes the
#: Accelerator and prepares the student: no accelerator exists where the teacher trains.
_TEACHER_FIRST = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Distiller:\n"
    "    def __init__(self, student, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.student, self.opt = self.accelerator.prepare(student, optimizer)\n\n\n"
    "def main(teacher, student, loader):\n"
    "    topt = torch.optim.Adam(teacher.parameters())\n"
    "    for x, y in loader:\n"
    "        topt.zero_grad()\n"
    "        torch.nn.functional.cross_entropy(teacher(x), y).backward()\n"
    "        topt.step()\n"
    "    d = Distiller(student, torch.optim.Adam(student.parameters()))\n"
    "    loader = d.accelerator.prepare(loader)\n\n\n"
    "if __name__ == '__main__':\n"
    "    main(*build())\n"
)


class LossBackward(Rule):
    """``loss.backward()`` bypasses the Accelerator: no division for gradient accumulation, no
    fp16 loss scaling, and DeepSpeed's engine never sees the backward pass.

    A model that trains itself (its own method runs the backward and steps an optimizer the
    model holds, which ``prepare`` never sees) keeps ``loss.backward()``: the Accelerator's
    scaling and division would reach an optimizer that never undoes them. So do the branch that
    runs without an accelerator (``else`` of ``if self.accelerator is not None:``), apex's
    ``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``, and a module
    function no accelerator reaches: one nothing in the file calls or hands on (the file's
    single-device twin, ``train_one_epoch(model, loader, optimizer, device)`` beside
    ``train_one_epoch_acc(..., accelerator)``), or one whose callers hand it nothing ``prepare``
    returned and that trains a model of its own (a single-device baseline the script compares
    the distributed run with): the advice would name an accelerator it has not got, and scaling
    that backward would change the baseline. Called with what ``prepare`` returned, or reading
    it from the module, it is reported. A file that prepares nothing and averages its gradients
    with ``all_reduce`` itself (DDP written by hand) keeps its backward too.

    ``scaler.scale(loss).backward()`` of a hand-made GradScaler is fixed to
    ``accelerator.backward(scaler.scale(loss))`` only where every Accelerator the file makes is
    given ``mixed_precision="no"``, ``"bf16"`` or none: elsewhere the Accelerator may scale an
    fp16 loss itself (its argument says so, or is decided at run time), the two scalings would
    multiply, and the scaler's step unscales only its own; the finding then says to drop the
    GradScaler."""

    code = "ACC301"
    name = "loss-backward"
    message = "Call accelerator.backward(loss) instead of loss.backward()"
    why = (
        "With gradient accumulation the gradients come out k times too large, with fp16 they "
        "underflow unscaled, and under DeepSpeed the engine never runs its backward."
    )
    bad = (
        # a GradScaler kept beside an Accelerator that may run fp16 (a fine-tuning pipeline
        # class): reported without a fix, wrapping scaler.scale(loss) would scale it twice
        Example(
            "import torch\nfrom accelerate import Accelerator\n"
            "accelerator = Accelerator(mixed_precision=args.precision)\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "loss = model(x).sum()\nscaler.scale(loss).backward()\nscaler.step(optimizer)\n",
            8,
            1,
        ),
        # a flag picks the backward, but the objects are prepared whatever it says: its plain
        # arm runs on the prepared model too
        Example(
            "from accelerate import Accelerator\n"
            "accelerator = Accelerator()\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "loss = model(x).sum()\n"
            "if args.accelerate:\n"
            "    accelerator.backward(loss)\n"
            "else:\n"
            "    loss.backward()\n",
            8,
            5,
        ),
        # an Accelerator that never scales: the script's own scaling stays, once
        Example(
            "import torch\nfrom accelerate import Accelerator\n"
            'accelerator = Accelerator(mixed_precision="no")\n'
            "scaler = torch.cuda.amp.GradScaler()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "loss = model(x).sum()\nscaler.scale(loss).backward()\nscaler.step(optimizer)\n",
            8,
            1,
            "import torch\nfrom accelerate import Accelerator\n"
            'accelerator = Accelerator(mixed_precision="no")\n'
            "scaler = torch.cuda.amp.GradScaler()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "loss = model(x).sum()\naccelerator.backward(scaler.scale(loss))\n"
            "scaler.step(optimizer)\n",
        ),
        # a trainer class with no accelerator of its own, made here with prepared objects
        Example(
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "class BasicTrainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.model, self.optimizer = model, optimizer\n\n"
            "    def train(self, loader):\n"
            "        for batch in loader:\n"
            "            loss = self.model(**batch).loss\n"
            "            loss.backward()\n"
            "            self.optimizer.step()\n\n\n"
            "accelerator = Accelerator()\n"
            "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "BasicTrainer(model, optimizer).train(loader)\n",
            12,
            13,
        ),
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
        # a teacher trained before the trainer that makes the Accelerator: none exists at
        # this line, and the advice says what to add rather than name one it cannot reach
        Example(_TEACHER_FIRST, 15, 9),
        Example(  # a helper no accelerator reaches, called with what prepare returned
            "from accelify import Accelerator\n"
            + "def fit(net, batches, opt):\n"
            + "    for x, y in batches:\n"
            + "        (net(x) - y).pow(2).mean().backward()\n"
            + "        opt.step()\n"
            + "def main():\n"
            + "    accelerator = Accelerator()\n"
            + "    model, optimizer, loader = accelerator.prepare(net, opt, data)\n"
            + "    fit(model, loader, optimizer)\n",
            4,
            9,
        ),
        Example(  # the same helper also run by a baseline with no accelerator: the advice
            # names the call that has one and tells the baseline's apart
            "from accelify import Accelerator\n"
            + "def fit(net, batches, opt):\n"
            + "    for x, y in batches:\n"
            + "        (net(x) - y).pow(2).mean().backward()\n"
            + "def baseline():\n"
            + "    fit(net, data, opt)\n"
            + "def main():\n"
            + "    accelerator = Accelerator()\n"
            + "    model, optimizer, loader = accelerator.prepare(net, opt, data)\n"
            + "    fit(model, loader, optimizer)\n",
            4,
            9,
        ),
    )
    good = (
        PARITY_REFERENCE,
        MULTI_BACKEND_TRAINER,
        HEADER + "accelerator.backward(loss)\n",
        # an RL trainer's GRPO update: nothing prepared, gradients averaged by hand; the
        # Accelerator is there for its device, gather and reduce
        HEADER
        + "import torch.distributed as dist\n"
        + "loss.backward()\n"
        + "for p in actor.parameters():\n"
        + "    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)\n"
        + "optimizer.step()\n",
        # a course's two trainers in one file: the single-device one has no accelerator, and
        # nothing in the file makes one of it (the accelerated one is checked as usual)
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class BasicTrainer:\n"
        + "    def train(self, loader):\n"
        + "        for batch in loader:\n"
        + "            loss = self.model(**batch).loss\n"
        + "            loss.backward()\n"
        + "            self.optimizer.step()\n\n\n"
        + "class AcceleratedTrainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
        + "    def train(self, loader):\n"
        + "        for batch in loader:\n"
        + "            self.accelerator.backward(self.model(**batch).loss)\n"
        + "            self.optimizer.step()\n",
        # the same single-device trainer holding objects of the file's classes that have no
        # accelerator (a meter it makes, a config it is handed): still one device on its own
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Meter:\n"
        + "    def __init__(self):\n"
        + "        self.total = 0.0\n\n\n"
        + "class Config:\n"
        + "    lr = 0.1\n\n\n"
        + "class BasicTrainer:\n"
        + "    def __init__(self, config: Config):\n"
        + "        self.meter = Meter()\n\n"
        + "    def train(self, loader):\n"
        + "        for batch in loader:\n"
        + "            loss = self.model(**batch).loss\n"
        + "            loss.backward()\n"
        + "            self.optimizer.step()\n\n\n"
        + "class AcceleratedTrainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.meter = Meter()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n",
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
        # a plain PyTorch trainer whose settings name the accumulation steps
        # (``self.args.accumulate``, a number read, not an accelerator's method called)
        "import torch\n\n\n"
        + "class Trainer:\n"
        + "    def __init__(self, model, optimizer, loader, args):\n"
        + "        self.args = args\n"
        + "        self.model, self.optimizer, self.loader = model, optimizer, loader\n\n"
        + "    def train(self):\n"
        + "        for step, batch in enumerate(self.loader):\n"
        + "            loss = self.model(**batch).loss / self.args.accumulate\n"
        + "            loss.backward()\n"
        + "            if (step + 1) % self.args.accumulate == 0:\n"
        + "                self.optimizer.step()\n"
        + "                self.optimizer.zero_grad()\n",
        # torchdistill: a training box that runs with or without an accelerator
        "class Box:\n"
        + "    def __init__(self, accelerator=None):\n"
        + "        self.accelerator = accelerator\n"
        + "    def post_forward(self, loss):\n"
        + "        if self.accelerator is not None:\n"
        + "            self.accelerator.backward(loss)\n"
        + "        else:\n"
        + "            loss.backward()\n",
        # a shopee-competition helper module: the single-device twin of the accelerator loop,
        # which nothing in the file calls (the training script imports the other one)
        "def train_one_epoch(model, loader, optimizer, device):\n"
        + "    for x, y in loader:\n"
        + "        optimizer.zero_grad()\n"
        + "        loss = (model(x.to(device)) - y.to(device)).pow(2).mean()\n"
        + "        loss.backward()\n"
        + "        optimizer.step()\n"
        + "def train_one_epoch_acc(model, loader, optimizer, accelerator):\n"
        + "    for x, y in loader:\n"
        + "        optimizer.zero_grad()\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n",
        # a Pokemon offline-RL trainer's DeepSpeed branch: the engine's own backward
        "import deepspeed\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
        + "    def setup(self, use_deepspeed):\n"
        + "        if use_deepspeed:\n"
        + "            self.model, self.optimizer, _, _ = deepspeed.initialize(\n"
        + "                model=self.model, optimizer=self.optimizer, config=ds_config)\n"
        + "        else:\n"
        + "            self.accelerator = Accelerator()\n"
        + "            self.model, self.optimizer = self.accelerator.prepare(\n"
        + "                self.model, self.optimizer)\n\n"
        + "    def step(self, batch):\n"
        + "        loss = self.model(**batch).loss\n"
        + "        if hasattr(self, 'accelerator'):\n"
        + "            self.accelerator.backward(loss)\n"
        + "        else:\n"
        + "            self.model.backward(loss)\n"
        + "            self.model.step()\n",
        # a time-series imputation experiment: everything is prepared under one flag, and the
        # other arm of that flag is its plain single-device path
        "class Experiment:\n"
        + "    def train(self, loader):\n"
        + "        if self.args.accelerate:\n"
        + "            self.model, self.optim, loader = self.accelerator.prepare(\n"
        + "                self.model, self.optim, loader)\n"
        + "        for x, y in loader:\n"
        + "            loss = (self.model(x) - y).pow(2).mean()\n"
        + "            if self.args.accelerate:\n"
        + "                self.accelerator.backward(loss)\n"
        + "            else:\n"
        + "                loss.backward()\n"
        + "            self.optim.step()\n",
        # trl's online trainers: HF Trainer's apex branch
        "from apex import amp\n"
        + "class OnlineTrainer:\n"
        + "    def training_step(self, loss):\n"
        + "        if self.use_apex:\n"
        + "            with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
        + "                scaled_loss.backward()\n"
        + "        else:\n"
        + "            self.accelerator.backward(loss)\n",
        # Accelerate's test_script: a single-device baseline trained beside the prepared run,
        # called with sizes only; its loss.backward() must stay unscaled
        "from accelerate import Accelerator\n"
        + "def mock_training(length, batch_size):\n"
        + "    model = RegressionModel()\n"
        + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "    for batch in make_loader(length, batch_size):\n"
        + "        model.zero_grad()\n"
        + "        loss = mse_loss(model(batch['x']), batch['y'])\n"
        + "        loss.backward()\n"
        + "        optimizer.step()\n"
        + "    return model\n"
        + "def training_check():\n"
        + "    old_model = mock_training(64, 16)\n"
        + "    accelerator = Accelerator()\n"
        + "    model = RegressionModel()\n"
        + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "    model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "    for batch in make_loader(64, 16):\n"
        + "        accelerator.backward(mse_loss(model(batch['x']), batch['y']))\n"
        + "        optimizer.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        if gradients_averaged_by_hand(script):
            return
        for call in script.backward_calls:
            if _engine_backward(script, call):
                continue  # DeepSpeed's ``model_engine.backward(loss)``: no tensor's backward
            if facts.trains_itself(call):
                continue  # the model's own optimizer: nothing would undo the scaling
            if without_accelerator(script, call) or apex_scaled_backward(script, call):
                continue  # the path without an accelerator, or apex's own scaled backward
            acc = accelerator_at(script, call)
            if acc is None:
                if not single_device_twin(facts, call):
                    # no accelerator reaches this line: the advice says what to add first
                    message = self.message + accelerator_missing(script, call)
                    yield self.finding(script, call, message=message)
                continue
            if _scaled_by_hand(script, call) and not accelerator_never_scales(script):
                # kept inside accelerator.backward, the GradScaler's scaling would come on top
                # of the Accelerator's own for fp16, and the scaler's step unscales only its own;
                # the advice drops the GradScaler, which ACC504 reports where it is made
                yield self.finding(
                    script,
                    call,
                    covers=_scaler_constructions(script, call),
                    message=(
                        f"Call {acc}.backward(loss) on the unscaled loss and drop the GradScaler "
                        f"(its scale, step and update): {acc}.backward scales an fp16 loss itself "
                        f"(mixed_precision='fp16', here or in the launch config), so "
                        f"{acc}.backward(scaler.scale(loss)) would scale it twice, and under "
                        "DeepSpeed this backward never reaches the engine"
                    ),
                )
                continue
            # The script still uses its scaler (if any): the scaling stays.
            from accelify.edits import rewrites  # a fix's edits: imported for a fix only
            from accelify.edits.plan import Plan

            fix = Plan.of(rewrites.backward(call, acc, keep_scaling=True))
            yield self.finding(script, call, fix)


def _engine_backward(script: ScriptModel, call: cst.Call) -> bool:
    """``self.model.backward(loss)``: a model's own ``backward`` handed the loss (DeepSpeed's
    engine, in a trainer that runs on DeepSpeed, DDP or Accelerate), not ``loss.backward()``;
    a tensor's backward takes the gradient positionally, never from a model."""
    receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
    if receiver is None or not any(arg.keyword is None for arg in call.args):
        return False
    return receiver in script.names_of(Kind.MODEL, Kind.WRAPPER)


def _scaled_by_hand(script: ScriptModel, call: cst.Call) -> bool:
    """``scaler.scale(loss).backward()`` of a ``GradScaler`` the file makes (or a name that says
    it is one)."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    if not (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "scale"
    ):
        return False
    owner = dotted(receiver.func.value) or ""
    scalers = {binding.name for binding in script.of_kind(Kind.SCALER)}
    return owner in scalers or owner.lower().endswith("scaler")


def _scaler_constructions(script: ScriptModel, call: cst.Call) -> list[tuple[int, int, str]]:
    """Where the GradScaler of ``scaler.scale(loss).backward()`` is made (``scaler =
    torch.cuda.amp.GradScaler()``), as ACC504 reports it: this finding's advice drops it."""
    scale = call.func.value  # type: ignore[union-attr]
    owner = dotted(scale.func.value) or ""  # type: ignore[union-attr]
    found = []
    for assign in script.index.assignments_to(owner):
        value = assign.value
        if isinstance(value, cst.Call) and script.call_names(value) & names.GRAD_SCALERS:
            start = script.position(value).start
            found.append((start.line, start.column + 1, "ACC504"))
    return found
