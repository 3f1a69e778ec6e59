from collections.abc import Callable, Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.names import OPTIMIZER_NAMES
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, is_main_guard, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

_TOGGLE = (
    "import torch\n"
    + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for x, y in loader:\n"
    + "    loss = (model(x) - y).pow(2).mean()\n"
    + "    if args.use_accelerate:\n"
    + "        accelerator.backward(loss)\n"
    + "    else:\n"
    + "        loss.backward()\n"
    + "{step}"
)


_TRAINER = (
    "import torch\n"
    + "from accelify import Accelerator\n\n\n"
    + "class Trainer:\n"
    + "    def __init__(self, args, model, loader):\n"
    + "        self.args = args\n"
    + "        self.accelerator = Accelerator()\n"
    + "        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
    + "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    + "            model, optimizer, loader\n"
    + "        )\n\n"
    + "    def step_optimizer(self):\n"
    + "        self.optimizer.step()\n"
    + "        self.optimizer.zero_grad()\n\n"
    + "    def train(self):\n"
    + "        for x, y in self.loader:\n"
    + "            loss = (self.model(x) - y).pow(2).mean()\n"
    + "            if self.args.use_accelerate:\n"
    + "                self.accelerator.backward(loss)\n"
    + "            else:\n"
    + "                loss.backward()\n"
    + "{step}"
)


#: A method of ``_TRAINER`` that steps the optimizer and that nothing in the file runs.
_LEFTOVER = "    def legacy_update(self):\n        self.optimizer.step()\n\n"
_RUN_AS_SCRIPT = "\n\nif __name__ == '__main__':\n    Trainer(args, model, loader).train()\n"


class OptimizerNeverStepped(Rule):
    """A prepared optimizer whose every ``step()`` sits where the loop's
    ``accelerator.backward`` never runs: the other arm of the ``if`` that picks the backward
    (``if args.use_accelerate: accelerator.backward(loss)`` / ``else: loss.backward();
    optimizer.step()``), or under the negated test (``if not use_accelerate:``). A script kept
    runnable both ways by a flag steps only on the plain path: on the Accelerate path the
    gradients pile up and the model never trains, with no error. Only where the two tests are
    the same expression (one arm of one ``if``, or ``x`` against ``not x``), that test is known
    to be the same on every pass (made of constants and settings: ``args.x``, ``config.x``, a
    name bound once to such a value outside any loop; not ``step % accumulation != 0``, a
    hand-written accumulation whose backward-only arm skips the step on purpose, nor a
    parameter of the step function around it, nor ``self.micro_step``; not a test of the rank,
    ACC307's), and no prepared optimizer is stepped on the backward's side (a two-stage run
    whose arms each step their own optimizer trains on both). Any call handed the optimizer
    (``scaler.step(optimizer)``, a helper's ``train_step(model, optimizer)``) counts as a step;
    a file with no step of the optimizer at all is left alone. A trainer class is read the
    same: the optimizer ``prepare`` returns into ``self.optimizer`` in ``__init__`` (also a
    constructor's parameter named as one and kept after ``prepare``), a step or a backward in
    a method of the file followed to its every call (``self.step_optimizer()`` called only in
    the plain arm); a method also handed elsewhere (a hook) is not followed, nor taken as
    dead when a base class may call it (a base the file does not define). One finding per
    parting ``if``, at its first backward (or the call of its method under the test)."""

    code = "ACC312"
    name = "optimizer-never-stepped"
    message = (
        "Step the optimizer where accelerator.backward runs: its only step is in the other "
        "branch, so on this path the gradients pile up and the model never trains"
    )
    why = "An optimizer stepped only on the branch without accelerator.backward never trains."
    bad = (
        Example(
            HEADER
            + _TOGGLE.format(step="        optimizer.step()\n        optimizer.zero_grad()\n"),
            9,
            9,
        ),
        # the step under the negated flag below the backward's `if`
        Example(
            HEADER
            + "import torch\n"
            + "optimizer = torch.optim.AdamW(model.parameters())\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "use_accelerate = not args.plain_torch\n"
            + "for x, y in loader:\n"
            + "    loss = (model(x) - y).pow(2).mean()\n"
            + "    if use_accelerate:\n"
            + "        accelerator.backward(loss)\n"
            + "    if not use_accelerate:\n"
            + "        loss.backward()\n"
            + "        optimizer.step()\n",
            10,
            9,
        ),
        # two backwards in the arm that never steps: one finding, at the first
        Example(
            HEADER
            + _TOGGLE.format(step="        optimizer.step()\n").replace(
                "        accelerator.backward(loss)\n",
                "        accelerator.backward(loss)\n        accelerator.backward(aux(x))\n",
            ),
            9,
            9,
        ),
        # a trainer: the optimizer prepared in ``__init__`` into ``self.optimizer``, stepped
        # only by a method the plain arm calls
        Example(_TRAINER.format(step="                self.step_optimizer()\n"), 22, 17),
        # ... beside a leftover method that steps and that nothing in the script runs: no way
        # the optimizer steps on the Accelerate path
        Example(
            _TRAINER.format(step="                self.step_optimizer()\n").replace(
                "    def train(self):\n", _LEFTOVER + "    def train(self):\n"
            )
            + _RUN_AS_SCRIPT,
            25,
            17,
        ),
        # the same stepped in place, the backward in a method the accelerate arm calls, the
        # optimizer a constructor's parameter kept as ``self.optimizer`` after ``prepare``
        Example(
            "from accelify import Accelerator\n\n\n"
            + "class Trainer:\n"
            + "    def __init__(self, args, model, optimizer, loader):\n"
            + "        self.args = args\n"
            + "        self.accelerator = Accelerator()\n"
            + "        model, optimizer, loader = self.accelerator.prepare(\n"
            + "            model, optimizer, loader\n"
            + "        )\n"
            + "        self.model, self.optimizer, self.loader = model, optimizer, loader\n\n"
            + "    def backward_pass(self, loss):\n"
            + "        self.accelerator.backward(loss)\n\n"
            + "    def train(self):\n"
            + "        for x, y in self.loader:\n"
            + "            loss = (self.model(x) - y).pow(2).mean()\n"
            + "            if self.args.use_accelerate:\n"
            + "                self.backward_pass(loss)\n"
            + "            else:\n"
            + "                loss.backward()\n"
            + "                self.optimizer.step()\n",
            20,
            17,
        ),
    )
    good = (
        # the same leftover method in a module another may import: its methods may be called
        # from there, so its step counts
        _TRAINER.format(step="                self.step_optimizer()\n").replace(
            "    def train(self):\n", _LEFTOVER + "    def train(self):\n"
        ),
        # the leftover a hook of a base class the file does not define (a library's
        # ``BaseTrainer.fit()`` may call it): not dead
        "from mylib import BaseTrainer\n"
        + _TRAINER.format(step="                self.step_optimizer()\n")
        .replace("class Trainer:", "class Trainer(BaseTrainer):")
        .replace("    def train(self):\n", _LEFTOVER + "    def train(self):\n")
        + _RUN_AS_SCRIPT,
        # ... or of the file's own base class, whose ``fit()`` calls ``self.legacy_update()``
        "class Base:\n    def fit(self):\n        self.train()\n        self.legacy_update()\n\n\n"
        + _TRAINER.format(step="                self.step_optimizer()\n")
        .replace("class Trainer:", "class Trainer(Base):")
        .replace("    def train(self):\n", _LEFTOVER + "    def train(self):\n")
        + _RUN_AS_SCRIPT,
        # stepped after the if/else, on both paths
        HEADER + _TOGGLE.format(step="    optimizer.step()\n    optimizer.zero_grad()\n"),
        # stepped in both arms
        HEADER
        + _TOGGLE.format(step="        optimizer.step()\n").replace(
            "        accelerator.backward(loss)\n",
            "        accelerator.backward(loss)\n        optimizer.step()\n",
        ),
        # a hand-written accumulation: the backward-only arm skips the step on purpose
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    if step % accumulation != 0:\n"
        + "        with accelerator.no_sync(model):\n"
        + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "    else:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n",
        # the other arm steps through the scaler it hands the optimizer to
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    if args.fp32:\n"
        + "        accelerator.backward(loss)\n"
        + "        optimizer.step()\n"
        + "    else:\n"
        + "        accelerator.backward(scaler.scale(loss))\n"
        + "        scaler.step(optimizer)\n",
        # each stage steps its own optimizer: the backward's arm steps one (a two-stage run,
        # a GAN's generator pretraining)
        HEADER
        + "import torch\n"
        + "head_opt = torch.optim.AdamW(model.head.parameters())\n"
        + "enc_opt = torch.optim.AdamW(model.encoder.parameters())\n"
        + "model, head_opt, enc_opt = accelerator.prepare(model, head_opt, enc_opt)\n"
        + "for x, y in loader:\n"
        + "    if args.stage == 1:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        head_opt.step()\n"
        + "    else:\n"
        + "        accelerator.backward((model(x) - y).abs().mean())\n"
        + "        enc_opt.step()\n",
        # a hand-written accumulation in a step function called per batch: its test reads a
        # parameter, not a setting of the run
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "accum_steps = 4\n\n\n"
        + "def train_step(step, x, y):\n"
        + "    loss = (model(x) - y).pow(2).mean() / accum_steps\n"
        + "    if (step + 1) % accum_steps != 0:\n"
        + "        with accelerator.no_sync(model):\n"
        + "            accelerator.backward(loss)\n"
        + "    else:\n"
        + "        accelerator.backward(loss)\n"
        + "        optimizer.step()\n\n\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    train_step(step, x, y)\n",
        # the same with a counter the loop keeps: set again on every pass
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "micro_step = 0\n\n\n"
        + "def train_step(x, y):\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    if micro_step % args.accum_steps != 0:\n"
        + "        accelerator.backward(loss)\n"
        + "    else:\n"
        + "        accelerator.backward(loss)\n"
        + "        optimizer.step()\n\n\n"
        + "for x, y in loader:\n"
        + "    train_step(x, y)\n"
        + "    micro_step += 1\n",
        # a settings-like name that a loop sets: one run tries both ways
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for config in [{'accumulate': True}, {'accumulate': False}]:\n"
        + "    for x, y in loader:\n"
        + "        loss = (model(x) - y).pow(2).mean()\n"
        + "        if config['accumulate']:\n"
        + "            accelerator.backward(loss)\n"
        + "        else:\n"
        + "            accelerator.backward(loss)\n"
        + "            optimizer.step()\n",
        # a trainer whose step method runs after the if/else, on both paths
        _TRAINER.format(step="            self.step_optimizer()\n"),
        # ... or in both arms
        _TRAINER.replace(
            "self.accelerator.backward(loss)\n",
            "self.accelerator.backward(loss)\n                self.step_optimizer()\n",
        ).format(step="                self.step_optimizer()\n"),
        # ... or is also handed to a hook the file does not show: not followed
        _TRAINER.format(step="                self.step_optimizer()\n")
        + "        hooks.register(on_step=self.step_optimizer)\n",
        # one update method (backward, then step) that each arm calls with its own loss
        _TRAINER.replace(
            "    def step_optimizer(self):\n",
            "    def step_optimizer(self, loss):\n        self.accelerator.backward(loss)\n",
        )
        .replace(
            "                self.accelerator.backward(loss)\n",
            "                self.step_optimizer(loss)\n",
        )
        .format(step="                self.step_optimizer(loss.abs())\n")
        .replace("                loss.backward()\n", ""),
        # stepped through a helper the file does not show: not followed
        HEADER + _TOGGLE.format(step="") + "    trainer_step(optimizer)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        optimizers = _prepared_optimizers(script)
        if not optimizers:
            return
        # ``optimizer.step()``, and every call handed the optimizer (``scaler.step(optimizer)``,
        # a helper's ``train_step(model, optimizer)``), each a step the file may not show
        steps: dict[str, list[cst.Call]] = {}
        dead = _DeadMethods(script)
        for call in script.calls:
            if dead.holds(call):
                continue  # a method nobody runs: its step is no way the optimizer steps
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "step" and not call.args:
                owner = dotted(func.value)
                if owner in optimizers:
                    steps.setdefault(owner, []).append(call)
            for argument in call.args:
                if dotted(argument.value) in optimizers and not _prepare(call):
                    steps.setdefault(dotted(argument.value), []).append(call)  # type: ignore[arg-type]
        accelerators = script.names_of(Kind.ACCELERATOR)
        reported: set[int] = set()  # the parting ``if``s reported: one finding each
        for call in script.calls:
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value == "backward"
                and dotted(func.value) in accelerators
            ):
                continue
            backward_chains = _chains(script, call, dead)
            parted = {
                optimizer: [
                    _parted(script, backward_chains, _chains(script, step, dead))
                    for step in steps[optimizer]
                ]
                for optimizer in sorted(optimizers & steps.keys())
            }
            # a prepared optimizer stepped on the backward's side (each arm of a fixed ``if``
            # steps its own: a two-stage run, a GAN's pretraining arm) trains on this path
            if not parted or any(not all(tests) for tests in parted.values()):
                continue
            optimizer, tests = next(iter(parted.items()))
            test, through, at = tests[0]  # type: ignore[misc]
            if id(test) in reported:
                continue
            reported.add(id(test))
            message = _message(script, call, optimizer, steps[optimizer], test, through)
            others = _other_tests(tests, test)  # type: ignore[arg-type]
            if others:
                message = _several_tests(script, message, optimizer, test, others)
            if at is not call:  # at the call of the backward's helper in the arm the test picks
                message = message.replace(
                    " runs: ", f" runs (line {script.line(call)}, through this call): ", 1
                )
            yield self.finding(script, at, message=message)


def _prepared_optimizers(script: ScriptModel) -> set[str]:
    """The names that hold an optimizer ``prepare`` returned: its outputs for an optimizer
    handed in (``self.optimizer`` of ``self.model, self.optimizer = self.accelerator.prepare(
    model, optimizer)`` where the local ``optimizer`` is the one built; a constructor's
    parameter its callers or annotation say is one, or named as one where nothing says what it
    is), and the names they are kept under after (``self.optimizer = optimizer``)."""
    from accelify.analysis.facts import facts_of

    known = script.names_of(Kind.OPTIMIZER)
    flow = facts_of(script).flow
    found: set[str] = set()
    for prepare in script.prepare_calls:
        if len(prepare.inputs) != len(prepare.outputs):  # ``prepared = prepare(a, b)``
            pairs = [(output, output) for output in prepare.outputs]
        else:
            pairs = list(zip(prepare.inputs, prepare.outputs, strict=True))
        for given, output in pairs:
            if output and (
                output in known or given in known or _named_optimizer(flow, given, prepare.call)
            ):
                found.add(output)
    # kept under another name: ``self.optimizer = optimizer`` after the ``prepare``, or a
    # constructor's ``self.optimizer = optimizer`` of what its callers hand it
    kept = [
        pair
        for assign in script.assignments
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1
        for pair in _kept_pairs(assign.targets[0].target, assign.value)
    ]
    kept += [
        (binding.name, source)
        for binding in script.bindings
        if binding.received
        for source in binding.sources
    ]
    for _ in range(3):
        grown = {target for target, source in kept if source in found and target} - found
        if not grown:
            break
        found |= grown  # type: ignore[arg-type]
    return found


def _kept_pairs(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[str | None, str | None]]:
    """``(kept, source)`` for each name an assignment binds to another's object: ``self.opt =
    opt``, and element by element ``self.model, self.opt = model, opt``."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return []
        return [
            pair
            for kept, source in zip(target.elements, value.elements, strict=True)
            for pair in _kept_pairs(kept.value, source.value)
        ]
    return [(dotted(target), dotted(value))]


def _named_optimizer(flow: ObjectFlow, name: str, at: cst.CSTNode) -> bool:
    """``optimizer`` handed to ``prepare`` where the file says nothing of what it is (a
    trainer's constructor parameter no call of the file passes): named as an optimizer, and not
    known to be anything else."""
    if not name or flow.kind_of(name, at) not in (None, Kind.OPTIMIZER):
        return False
    if flow.kind_of(name, at) is Kind.OPTIMIZER:
        return True
    last = name.rsplit(".", 1)[-1].lower()
    return last in OPTIMIZER_NAMES or (last.endswith("optimizer") and "sched" not in last)


#: How deep a step or a backward is followed up through the calls of its helper.
_CALL_DEPTH = 3
#: Call paths kept per place before giving up on following it (a helper called everywhere).
_MAX_CHAINS = 16


class _DeadMethods:
    """Methods nobody runs, in a script: a class's method (no dunder) that nothing in the file
    calls, references or may call through an instance it cannot see, that runs no
    ``backward``, ``prepare`` or collective (those are a trainer's entry points, run from
    outside: ``train()``), of a class the file itself makes an instance of, in a file that
    runs as a program (``if __name__ == "__main__":``). A step there is no way the optimizer
    steps (a leftover ``legacy_update()``), nor is a call there a way a helper runs. A module
    without that block may be imported, its methods called from elsewhere: none is dead."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script
        self.runs_as_program = any(is_main_guard(s) for s in script.module.body)
        self._known: dict[int, bool] = {}

    def holds(self, node: cst.CSTNode) -> bool:
        """``node`` sits in a dead method (directly: a function defined inside one too)."""
        if not self.runs_as_program:
            return False
        function = self.script.index.enclosing_function(node)
        return function is not None and self.dead(function)

    def dead(self, function: cst.FunctionDef) -> bool:
        known = self._known.get(id(function))
        if known is None:
            known = self._known[id(function)] = self._dead(function)
        return known

    def _dead(self, function: cst.FunctionDef) -> bool:
        script, graph = self.script, self.script.call_graph
        name = function.name.value
        owner = graph.owner(function)
        if owner is None or (name.startswith("__") and name.endswith("__")):
            return False
        if graph.callers(function) or graph.references(function):
            return False
        if graph.uncertain_callers(function):
            return False
        if facts_of(script).synchronising_call(function) is not None:
            return False  # an entry point run from outside (a trainer's ``train()``)
        if _may_run_from_base(script, owner, name):
            return False  # a hook: ``BaseTrainer.fit()`` calls ``self.optimizer_step()``
        if script.project is not None and script.project.callers_of(function, owner.name.value):
            return False  # another module of the project calls it (``trainer.legacy_update()``)
        return owner.name.value in _constructed(script)


def _may_run_from_base(script: ScriptModel, owner: cst.ClassDef, name: str, depth: int = 0) -> bool:
    """A base class of ``owner`` may call its method ``name``: a base the file does not
    define (``BaseTrainer`` of a library, whose ``fit()`` runs the hook ``optimizer_step()``),
    or one of the file's own classes that calls ``self.name`` (itself or through its bases)."""
    graph = script.call_graph
    if depth > 20:
        return True
    for base in owner.bases:
        if dotted(base.value) == "object":
            continue
        if dotted(base.value) not in graph.classes or graph.classes[dotted(base.value)] is owner:
            return True
    for base in graph.bases(owner):
        if any(_self_calls(method, name) for method in graph.methods(base).values()):
            return True
        if _may_run_from_base(script, base, name, depth + 1):
            return True
    return False


def _self_calls(method: cst.FunctionDef, name: str) -> bool:
    """``method`` calls or names ``self.name`` (a hook its subclasses define)."""
    return any(
        isinstance(node, cst.Attribute)
        and node.attr.value == name
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
        for node in walk(method)
    )


def _constructed(script: ScriptModel) -> set[str]:
    """The names of the classes the file makes an instance of (``Trainer(...)``)."""
    return {
        call.func.value
        for call in script.calls
        if isinstance(call.func, cst.Name) and call.func.value in script.call_graph.classes
    }


def _chains(
    script: ScriptModel, node: cst.CSTNode, dead: _DeadMethods, depth: int = 0
) -> list[tuple[cst.CSTNode, ...]]:
    """The ways ``node`` runs: ``(node,)`` where it sits, then, when its function is a helper
    of the file whose every caller the file shows (``self.step_optimizer()`` called only in
    the plain arm; nothing hands it elsewhere), ``node`` followed by each call site's own ways.
    A helper nothing in the file calls, or handed to someone who will, ends the path; a call
    in a method nobody runs (`_DeadMethods`) is no way."""
    function = script.index.enclosing_function(node)
    if function is None or depth >= _CALL_DEPTH:
        return [(node,)]
    graph = script.call_graph
    callers = [call for call in graph.callers(function) if not dead.holds(call)]
    if not callers or graph.references(function) or graph.uncertain_callers(function):
        return [(node,)]
    found: list[tuple[cst.CSTNode, ...]] = []
    for call in callers:
        if script.inside(call, function):
            return [(node,)]  # recursion: no path known
        for chain in _chains(script, call, dead, depth + 1):
            found.append((node, *chain))
        if len(found) > _MAX_CHAINS:
            return [(node,)]
    return found


def _parted(
    script: ScriptModel,
    backwards: list[tuple[cst.CSTNode, ...]],
    steps: list[tuple[cst.CSTNode, ...]],
) -> tuple[cst.If, cst.CSTNode, cst.CSTNode] | None:
    """The ``if`` that keeps a step from the backward on every pair of the ways each runs
    (`_chains`), with the places on the step's and the backward's way it holds (the call
    itself, or the call of its helper); None where some way runs both."""
    found = None
    for backward in backwards:
        for step in steps:
            parting = _parting_test(script, backward, step)
            if parting is None:
                return None
            found = found or parting
    return found


def _prepare(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare"


#: Roots of the run's settings (``args.use_accelerate``, a trainer's ``self.config.fp32``).
_SETTINGS = ("args", "config", "cfg", "opt", "opts", "hparams", "FLAGS", "training_args")
_CONVERSIONS = ("int", "float", "bool", "str")
_CONSTANTS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString)


def _fixed_for_the_run(
    script: ScriptModel, test: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
) -> bool:
    """``test`` is known to hold the same value on every pass of the code around ``at``: it is
    made of constants and of the run's settings (``args.stage == 1``; a name bound only to such
    a value, outside any loop: ``use_accelerate = args.use_accelerate``, ``pretrain_generator =
    True``; ``int(...)``, ``bool(...)`` of such values). Anything else counts as changing: a
    loop's counter (``step % accumulation != 0``, a hand-written accumulation whose
    backward-only arm skips the step on purpose), a parameter of the function around ``at``
    (``def train_step(step, ...)``, called per batch), an attribute of ``self``
    (``self.micro_step``), any other call's result, the rank (which parts ranks, not runs:
    ACC307's)."""
    if depth > 4 or script.reads_rank(test):
        return False
    if isinstance(test, _CONSTANTS):
        return True
    if isinstance(test, (cst.Name, cst.Attribute, cst.Subscript)):
        return _setting(script, test, at, depth)
    parts: list[cst.BaseExpression]
    if isinstance(test, cst.Comparison):
        parts = [test.left, *(c.comparator for c in test.comparisons)]
    elif isinstance(test, (cst.BooleanOperation, cst.BinaryOperation)):
        parts = [test.left, test.right]
    elif isinstance(test, cst.UnaryOperation):
        parts = [test.expression]
    elif isinstance(test, (cst.Tuple, cst.List)):
        parts = [e.value for e in test.elements]
    elif (
        isinstance(test, cst.Call)
        and isinstance(test.func, cst.Name)
        and test.func.value in _CONVERSIONS
        and all(a.keyword is None and a.star == "" for a in test.args)
    ):
        parts = [a.value for a in test.args]  # ``int(os_flag)``, ``bool(args.fp16)``
    else:
        return False  # a call's result, a lambda, a comprehension...
    return all(_fixed_for_the_run(script, part, at, depth) for part in parts)


def _setting(
    script: ScriptModel,
    value: cst.Name | cst.Attribute | cst.Subscript,
    at: cst.CSTNode,
    depth: int,
) -> bool:
    """``value`` reads a setting of the run or a constant (see `_fixed_for_the_run`)."""
    while isinstance(value, cst.Subscript):  # ``args["stage"]``, ``cfg.stages[0]``
        if not all(
            isinstance(e.slice, cst.Index) and _fixed_for_the_run(script, e.slice.value, at, depth)
            for e in value.slice
        ):
            return False
        value = value.value  # type: ignore[assignment]
    name = dotted(value)
    if name is None:
        return False
    parts = name.split(".")
    if parts[0] in _SETTINGS or (
        parts[0] in ("self", "cls") and parts[1:2] and parts[1] in _SETTINGS
    ):
        return not _set_per_pass(script, parts[0], at)
    if parts[0] in ("True", "False", "None"):
        return len(parts) == 1
    if parts[0] in ("self", "cls"):
        return False  # ``self.micro_step``: a member any method may change
    return _bound_to_settings(script, parts[0], at, depth)


def _set_per_pass(script: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``name`` is set again inside a loop around ``at`` or is a loop's target (``for opt in
    optimizers:``, ``for config in sweep:``): a settings-like name that is not the run's."""
    loops = [a for a in script.ancestors(at) if isinstance(a, (cst.For, cst.While))]
    return any(
        isinstance(statement, (cst.For, cst.CompFor))
        or any(script.inside(statement, loop) for loop in loops)
        for statement, _ in script.index.values_set_to(name)
        if not isinstance(statement, cst.Param)
    )


def _bound_to_settings(script: ScriptModel, name: str, at: cst.CSTNode, depth: int) -> bool:
    """Every binding of ``name`` that ``at`` may read (in its own function or the module) is a
    plain assignment of a fixed value, none inside a loop; not a parameter of a function around
    ``at``. A name the file never binds is no evidence."""
    function = script.index.enclosing_function(at)
    scopes = {id(function), id(None)}
    found = False
    for statement, value in script.index.values_set_to(name):
        owner = script.index.enclosing_function(statement)
        if isinstance(statement, cst.Param):
            if any(owner is f for f in script.ancestors(at)):
                return False  # ``def train_step(step, ...)``: what each call passes
            continue
        if id(owner) not in scopes:
            continue  # another function's own local
        if not isinstance(statement, (cst.Assign, cst.AnnAssign)):
            return False  # a loop target, ``+=``, a walrus, ``with ... as``
        if script.index.enclosing_loop(statement) is not None:
            return False  # set again on some passes (a warm-up phase switched off)
        if not isinstance(value, cst.BaseExpression) or not _fixed_for_the_run(
            script, value, at, depth + 1
        ):
            return False
        found = True
    return found


def _parting_test(
    script: ScriptModel, backward: tuple[cst.CSTNode, ...], step: tuple[cst.CSTNode, ...]
) -> tuple[cst.If, cst.CSTNode, cst.CSTNode] | None:
    """The ``if`` that keeps a step from every run of a backward, each given as the way it runs
    (`_chains`: the call itself, then the calls of the helpers it sits in), where its test is
    the same on every pass (`_fixed_for_the_run`): one ``if`` whose two arms hold one each, or
    an ``if`` around the step whose test negates that of an ``if`` around the backward (or is
    the one the backward's negates), wherever the two sit: a test fixed for the run takes the
    same arm everywhere. With it, the places on the step's and the backward's way that the
    ``if``s hold. None where no such ``if`` parts them."""
    code = script.module.code_for_node
    around_step = _ifs_around(script, step)
    around_backward = _ifs_around(script, backward)
    for branch, step_at in around_step:
        if branch.orelse is None:
            continue
        for other, backward_at in around_backward:
            if other is branch and script.inside(step_at, branch.body) != script.inside(
                backward_at, branch.body
            ):
                fixed = _fixed_for_the_run(script, branch.test, step_at)
                return (branch, step_at, backward_at) if fixed else None
    for branch, step_at in around_step:
        for other, backward_at in around_backward:
            if other is branch:
                continue
            if _negates(code, branch.test, other.test) or _negates(code, other.test, branch.test):
                fixed = _fixed_for_the_run(script, branch.test, step_at)
                return (branch, step_at, backward_at) if fixed else None
    return None


def _ifs_around(
    script: ScriptModel, chain: tuple[cst.CSTNode, ...]
) -> list[tuple[cst.If, cst.CSTNode]]:
    """The ``if``s around each place of a way something runs (`_chains`), innermost first,
    each with the place it holds."""
    found: list[tuple[cst.If, cst.CSTNode]] = []
    seen: set[int] = set()
    for place in chain:
        for ancestor in script.ancestors(place):
            if isinstance(ancestor, cst.If) and id(ancestor) not in seen:
                seen.add(id(ancestor))
                found.append((ancestor, place))
    return found


def _negates(
    code: Callable[[cst.CSTNode], str], test: cst.BaseExpression, other: cst.BaseExpression
) -> bool:
    """``test`` is ``not <other>``."""
    return (
        isinstance(test, cst.UnaryOperation)
        and isinstance(test.operator, cst.Not)
        and code(test.expression.with_changes(lpar=[], rpar=[])) == code(other)
    )


def _message(
    script: ScriptModel,
    backward: cst.Call,
    optimizer: str,
    steps: list[cst.Call],
    test: cst.If,
    through: cst.CSTNode,
) -> str:
    accelerator = accelerator_name(script, backward)
    lines = ", ".join(str(script.line(step)) for step in steps)
    where = (
        f"its only step (line {lines}) is" if len(steps) == 1 else f"its steps (lines {lines}) are"
    )
    if all(through is not step for step in steps):  # a helper called in the other arm
        where = where.replace(") ", f", run by the call at line {script.line(through)}) ", 1)
    return (
        f"Step {optimizer} where {accelerator}.backward runs: {where} on the other side of the "
        f"test at line {script.line(test)} "
        f"(`{script.module.code_for_node(test.test)}`), so on this path the gradients pile up "
        f"and the model never trains; call {optimizer}.step() and {optimizer}.zero_grad() "
        "after the if/else, on both paths"
    )


def _other_tests(
    tests: list[tuple[cst.If, cst.CSTNode, cst.CSTNode]], first: cst.If
) -> list[cst.If]:
    """The tests besides ``first`` that part some step from the backward (a step under ``if
    use_amp:`` and another under ``if not accelerate:`` in its ``else``)."""
    found: list[cst.If] = []
    for test, _, _ in tests:
        if test is not first and all(test is not seen for seen in found):
            found.append(test)
    return found


def _several_tests(
    script: ScriptModel, message: str, optimizer: str, first: cst.If, others: list[cst.If]
) -> str:
    """The message for steps parted from the backward by different tests: it names every test,
    and the step goes right after this backward, on this path alone (after the outer if/else
    it would run twice on the path that already steps, a GradScaler's ``scaler.step``)."""
    named = ", ".join(
        f"line {script.line(t)} (`{script.module.code_for_node(t.test)}`)" for t in [first, *others]
    )
    one = (
        f"the other side of the test at line {script.line(first)} "
        f"(`{script.module.code_for_node(first.test)}`)"
    )
    message = message.replace(one, f"the other sides of the tests at {named}", 1)
    return message.replace(
        f"call {optimizer}.step() and {optimizer}.zero_grad() after the if/else, on both paths",
        f"call {optimizer}.step() and {optimizer}.zero_grad() right after this backward, on this "
        "path",
        1,
    )
