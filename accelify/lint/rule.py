"""What a lint rule is: a code, a message that says what to do, examples that are its tests,
and a `check` over the shared `ScriptModel`. A fix is a set of edits in the converter's `Plan`."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import accelerator_argument as accelerator_argument
from accelify.analysis.syntax import dotted, root_name, walk
from accelify.lint.finding import Finding

if TYPE_CHECKING:  # a fix's plan: the edits are imported where a rule builds one
    from accelify.edits.plan import Plan


@dataclass(frozen=True)
class Example:
    """A bad example: the code, where the finding is (1-based line and column), the fixed code."""

    code: str
    line: int
    column: int
    fixed: str | None = None


class Rule:
    """Subclasses set the attributes and implement `check`; the class docstring is its page."""

    code: str = ""
    name: str = ""
    message: str = ""
    why: str = ""
    bad: tuple[Example, ...] = ()
    good: tuple[str, ...] = ()
    #: Why the rule is left out of the default set, for a rule whose findings are not a hang, a
    #: crash, a lost or corrupted file or a silently wrong number; empty for the default set.
    opt_in: str = ""
    #: Codes whose finding at the same line is the same bug, which this rule's finding reports
    #: with advice that fixes all of it: where both are selected, only this rule's is reported
    #: (one finding per bug and place).
    covers: tuple[str, ...] = ()

    @property
    def default(self) -> bool:
        """On unless ``--select`` says otherwise (ruff's default set: bugs only)."""
        return not self.opt_in

    @property
    def fixable(self) -> bool:
        return any(example.fixed is not None for example in self.bad)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        raise NotImplementedError

    def finding(
        self,
        script: ScriptModel,
        node: cst.CSTNode,
        fix: Plan | None = None,
        message: str | None = None,
        covers: Collection[tuple[int, int, str]] = (),
    ) -> Finding:
        """``covers``: other rules' findings (line, column, code) of the same bug that this one
        reports where the user sees it (`Finding.covers`)."""
        start = script.position(node).start
        # every message names the accelerator as it is reachable at the finding
        text = self.message if message is None else message
        message = in_file_words(text, accelerator_name(script, node))
        return Finding(self.code, message, start.line, start.column + 1, fix, covers=tuple(covers))


def in_file_words(message: str, name: str | None) -> str:
    """The rule's message in the file's words: ``self.accelerator.backward(loss)``,
    ``acc.backward(loss)`` where the accelerator goes by that name. Only a bare
    ``accelerator.`` is renamed: one already reached through an object
    (``self.trainer.accelerator.save``) is how the file spells it."""
    if name is None or name == "accelerator":
        return message
    return re.sub(r"(?<![\w.])accelerator\.", f"{name}.", message)


def accelerator_at(script: ScriptModel, node: cst.CSTNode) -> str | None:
    """The name of an Accelerator bound where ``node`` runs: created above it in the same or an
    enclosing scope, ``self.<name>`` in a method of the class that sets it, or a parameter that
    call sites pass one to. None when there is none: a fix there would not run."""
    from accelify.analysis.facts import facts_of

    facts = facts_of(script)
    here = script.order(node)
    for binding in script.of_kind(Kind.ACCELERATOR):
        if binding.name.startswith("self."):
            owner = facts.placement.class_of(binding.scope)
            if owner is not None and owner is facts.placement.class_of(node):
                return binding.name
            continue
        visible = isinstance(binding.scope, cst.Module) or facts.placement.inside(
            node, binding.scope
        )
        if visible and script.order(binding.assign) < here:
            return binding.name
    function = facts.placement.enclosing_function(node)
    while function is not None:
        for name, kind in facts.flow.params.get(function, {}).items():
            if kind is Kind.ACCELERATOR:
                return name
        function = facts.placement.enclosing_function(function)
    held = held_accelerator(script, node)
    if held is not None:
        return held
    imported = sorted(name for name in script.inherited_accelerators if "." not in name)
    if imported:
        return imported[0]
    if script.inherited_accelerators and facts.placement.is_method(
        facts.placement.enclosing_function(node) or script.module
    ):
        return min(script.inherited_accelerators)
    return None


def accelerator_name(script: ScriptModel, node: cst.CSTNode) -> str:
    """How advice at ``node`` names the Accelerator: as it is reachable there
    (`accelerator_at`: in scope, ``self.accelerator``, a runner's ``self.trainer.accelerator``),
    else the module-level one a function reads when it runs (made below the function's
    definition), else ``accelerator`` (one from another module, under a name this file does
    not show). Every rule's advice names it through here."""
    found = accelerator_at(script, node)
    if found is not None:
        return found
    module_level = sorted(
        (script.order(b.assign), b.name)
        for b in script.of_kind(Kind.ACCELERATOR)
        if isinstance(b.scope, cst.Module) and "." not in b.name
    )
    return module_level[0][1] if module_level else "accelerator"


def accelerator_missing(script: ScriptModel, node: cst.CSTNode) -> str:
    """What advice at ``node`` says when no Accelerator exists there (`accelerator_at` found
    none: a teacher trained before the trainer that makes the accelerator): that one is to be
    made above it, and where the file makes its own, so the advice never names an object the
    line cannot reach. Empty where one exists there."""
    if accelerator_at(script, node) is not None:
        return ""
    from accelify.analysis.facts import facts_of

    function = facts_of(script).placement.enclosing_function(node)
    if function is not None:
        sites = [
            (script.line(call), accelerator_at(script, call))
            for call, _ in facts_of(script).flow.calls_of(function)
        ]
        handing = sorted((line, name) for line, name in sites if name is not None)
        if handing:
            named = ", ".join(f"`{name}` at line {line}" for line, name in handing)
            # only the calls that have an accelerator can hand one: the others are told apart
            without = sorted(line for line, name in sites if name is None)
            rest = (
                f"; the call{'s' if len(without) > 1 else ''} at line"
                f"{'s' if len(without) > 1 else ''} {', '.join(map(str, without))} "
                f"{'have' if len(without) > 1 else 'has'} none: default the parameter to None "
                "for it and keep loss.backward() when it is None"
                if without
                else ""
            )
            return (
                f"; {function.name.value}() has no Accelerator: add an `accelerator` parameter "
                f"and have the calls that have one hand it theirs ({named}){rest}"
            )
    made = sorted(
        {b.line for b in script.of_kind(Kind.ACCELERATOR) if not b.received},
    )
    later = f" (the file makes its Accelerator at line {made[0]}, which this line does not reach)"
    return (
        "; no Accelerator exists at this line"
        + (later if made else "")
        + ": make one above it (`accelerator = Accelerator()`) and pass what this code trains "
        "to its prepare"
    )


def calls_accelerator(
    script: ScriptModel,
    node: cst.CSTNode,
    methods: Collection[str],
    accelerators: Collection[str] | None = None,
) -> bool:
    """``node`` is ``<accelerator>.<method>(...)`` for one of ``methods``, the receiver a name
    the file binds to an Accelerator (`names_of(ACCELERATOR)`, also the parameters that receive
    one); ``accelerators`` where the rule knows more of them (the object flow's)."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in methods):
        return False
    if accelerators is None:
        accelerators = script.names_of(Kind.ACCELERATOR)
    return dotted(func.value) in accelerators


def held_accelerator(script: ScriptModel, node: cst.CSTNode) -> str | None:
    """The Accelerator of an object held where ``node`` runs, when none is in scope itself: a
    runner's ``self.trainer.accelerator`` (``self.trainer`` set to an instance of a trainer
    class whose ``self.accelerator`` is one, made there or handed to the runner), or
    ``trainer.accelerator`` for a local or parameter holding such an instance."""
    from accelify.analysis.construction import constructed_instance

    own = _own_accelerators(script)
    if not own:
        return None
    graph = script.call_graph

    def accelerator_of(value: cst.BaseExpression, at: cst.CSTNode) -> str | None:
        cls = graph.classes.get(graph.made_by(value) or "")
        if cls is None and isinstance(value, cst.Name):
            cls = constructed_instance(script, value, "accelerator", at)
        for candidate, member in own.items():
            if cls is not None and graph.is_or_derives(cls, candidate):
                return member
        return None

    here = script.order(node)
    runner = script.index.enclosing_class(node)
    if runner is not None:
        for assign in script.index.of_type(cst.Assign):
            assert isinstance(assign, cst.Assign)
            if len(assign.targets) != 1 or script.index.enclosing_class(assign) is not runner:
                continue
            target = dotted(assign.targets[0].target) or ""
            if not target.startswith("self.") or target.count(".") != 1:
                continue
            member = accelerator_of(assign.value, assign)
            if member is not None:
                return f"{target}.{member}"
    scope = script.scope_of(node)
    for assign in script.index.of_type(cst.Assign):
        assert isinstance(assign, cst.Assign)
        if len(assign.targets) != 1 or script.scope_of(assign) is not scope:
            continue
        target = assign.targets[0].target
        if not isinstance(target, cst.Name) or script.order(assign) >= here:
            continue
        member = accelerator_of(assign.value, assign)
        if member is not None:
            return f"{target.value}.{member}"
    return None


def _own_accelerators(script: ScriptModel) -> dict[cst.ClassDef, str]:
    """Each class of the file that sets ``self.<name>`` to an Accelerator, with that name."""
    from accelify.analysis.facts import facts_of

    placement = facts_of(script).placement
    found: dict[cst.ClassDef, str] = {}
    for binding in script.of_kind(Kind.ACCELERATOR):
        if not binding.name.startswith("self.") or binding.name.count(".") != 1:
            continue
        owner = placement.class_of(binding.scope)
        if owner is not None:
            found.setdefault(owner, binding.name.removeprefix("self."))
    return found


def prepared(script: ScriptModel, node: cst.CSTNode) -> set[str]:
    """Names that hold prepared objects at ``node``: outputs of a prepare call above it, but
    not a local that ``node``'s function makes itself under the same name (``model =
    MergeT5(args)`` in a ``main_dev()`` beside the ``main_train()`` that prepares its own
    ``model``): that is another object, which no prepare placed."""
    here = script.order(node)
    found = script.prepared_before(node)
    scope = script.scope_of(node)
    if not isinstance(scope, cst.FunctionDef):
        return found - _locals_of_functions(script, found)
    return {
        name
        for name in found
        if not _made_in(script, name, scope, here)
        and not _another_functions_local(script, name, scope)
    }


def _another_functions_local(script: ScriptModel, name: str, scope: cst.FunctionDef) -> bool:
    """``name`` is a local that only other functions prepare (a runner's ``sample_net =
    self.accelerator.prepare(sample_net)`` in ``new_cacheloader``), and ``scope`` binds its
    own ``name`` (``sample_net = self.ema.copy(self.net)`` in ``save_step``): Python makes it
    ``scope``'s local, another object than the one that prepare returned."""
    if "." in name:
        return False
    outputs = [call for call in script.prepare_calls if name in call.outputs]
    if not outputs or any(
        script.scope_of(call.call) is scope
        or not isinstance(script.scope_of(call.call), cst.FunctionDef)
        for call in outputs
    ):
        return False
    if any(
        isinstance(node, (cst.Global, cst.Nonlocal))
        and any(alias.name.value == name for alias in node.names)
        for node in walk(scope.body)
    ):
        return False
    own = [
        value
        for statement, value in script.index.values_bound_to(name)
        if script.scope_of(statement) is scope
    ]
    # a value a function of the file returns may be what its prepare made (``model, optimizer
    # = setup(model, optimizer)``): that binding is still the prepared object
    return bool(own) and not any(
        isinstance(value, cst.Call)
        and (script.call_graph.callee(value) is not None or "prepare" in (dotted(value.func) or ""))
        for value in own
    )


def _locals_of_functions(script: ScriptModel, found: set[str]) -> set[str]:
    """Plain names that only functions' prepare calls return: at module level ``model`` is the
    module's own (``if __name__ == "__main__": model = Net(); model.to(device); train(model)``
    beside a ``train`` that prepares its local ``model``), which no prepare has placed yet."""
    at_module = set()
    in_functions = set()
    for call in script.prepare_calls:
        scope = script.scope_of(call.call)
        outputs = {name for name in call.outputs if name and "." not in name}
        if not isinstance(scope, cst.FunctionDef):
            at_module |= outputs
            continue
        declared = {
            name.name.value
            for node in walk(scope.body)
            if isinstance(node, cst.Global)
            for name in node.names
        }
        in_functions |= outputs - declared
    return (in_functions - at_module) & found


def _made_in(script: ScriptModel, name: str, scope: cst.FunctionDef, here: int) -> bool:
    """At ``here``, ``name`` is ``scope``'s own local, built there (``model = Net()``, then
    maybe ``model = nn.DataParallel(model)``, ``model = model.cuda()``) by a call that is
    neither a prepare nor a factory of prepared objects, and no prepare in ``scope`` rebinds
    it. (Any assignment makes the name local to the whole function: the prepared global is
    not what it reads.)"""
    from accelify.analysis.objects import returned_local  # objects builds on the script model

    if "." in name or any(
        name in call.outputs and script.scope_of(call.call) is scope
        for call in script.prepare_calls
    ):
        return False
    bound = [
        (statement, value)
        for statement, value in script.index.values_bound_to(name)
        if isinstance(statement, cst.Assign)
        and script.scope_of(statement) is scope
        and script.order(statement) < here
    ]
    outputs = {output for call in script.prepare_calls for output in call.outputs if output}
    for statement, value in reversed(bound):
        if not isinstance(value, cst.Call) or "prepare" in (dotted(value.func) or ""):
            return False
        returned = returned_local(script, name, statement)
        if (returned is not None and returned[0] in outputs) or _prepares_in(script, value):
            return False  # ``model, opt = setup(model, opt)``: a factory that prepares
        if any(isinstance(n, cst.Name) and n.value == name for n in walk(value)):
            continue  # made from the local itself (a wrapper, a move): look further up
        return True
    return False


def _prepares_in(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` runs a function of this file that calls ``prepare`` itself."""
    target = script.call_graph.callee(call)
    return target is not None and any(
        script.scope_of(prepare.call) is target[0] for prepare in script.prepare_calls
    )


def batch_names_of(script: ScriptModel, node: cst.CSTNode, loaders: set[str]) -> set[str]:
    """The batch names of the loops over ``loaders`` that ``node`` is in."""
    found: set[str] = set()
    for loop in script.loops:
        if loop.iterable in loaders and any(a is loop.node for a in script.ancestors(node)):
            found |= loop.batch_names
    return found


def moved_by_prepare(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` moves (``x.to(...)``) something ``prepare`` already placed: a prepared object
    or a batch of a prepared loader. Its move is ACC101's to report."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    names = prepared(script, call)
    return dotted(func.value) in names or root_name(func.value) in batch_names_of(
        script, call, names
    )


def loop_of(script: ScriptModel, node: cst.CSTNode) -> cst.For | None:
    """The innermost ``for`` around ``node``, through the functions in between."""
    return script.index.nearest(node, cst.For)  # type: ignore[return-value]


def calls_in(script: ScriptModel, node: cst.CSTNode) -> list[cst.Call]:
    """The calls somewhere under ``node`` (a loop, a block), in source order."""
    if node not in script.orders:
        return []  # not of the analysed tree: none of its calls is
    return [call for call in walk(node) if type(call) is cst.Call and call is not node]  # type: ignore[misc]


def under_rank_guard(script: ScriptModel, node: cst.CSTNode) -> bool:
    return script.under_rank_guard(node)


def calls(script: ScriptModel) -> list[cst.Call]:
    """Every call in the file, in source order (collected once, by the analysis)."""
    return script.calls


def optimizer_models(script: ScriptModel) -> dict[str, set[str]]:
    """Optimizer name -> the models whose ``.parameters()`` it was built from."""
    return {binding.name: parameter_owners(binding) for binding in script.of_kind(Kind.OPTIMIZER)}


#: The two lines most examples start with: an Accelerator script.
HEADER = "from accelify import Accelerator\naccelerator = Accelerator()\n"

#: A good example of several rules: the plain-PyTorch reference of a parity fixture (an
#: Accelerate FSDP/DeepSpeed test script). The accelerator is made only when no reference run
#: is asked for, and the helper that scales and backwards by hand is called in the reference
#: branch alone.
PARITY_REFERENCE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    + "def train_reference(model, batch, scaler):\n"
    + "    with torch.autocast('cuda', dtype=torch.float16):\n"
    + "        loss = model(batch)\n"
    + "    scaler.scale(loss).backward()\n\n\n"
    + "accelerator = None\nif not args.reference:\n    accelerator = Accelerator()\n"
    + "if args.reference:\n"
    + "    train_reference(model, batch, torch.amp.GradScaler('cuda'))\n"
    + "else:\n    model = accelerator.prepare(model)\n"
    + "    accelerator.backward(model(batch))\n"
)

#: A good example of several rules: each rank saves its image to a temporary named by its pid
#: and publishes it with one os.replace, removing the temporary in `finally` (a text-to-image
#: benchmark's write_image_atomic): no rank ever sees a torn file, nor deletes another's.
WRITE_ATOMIC_PER_PROCESS = (
    HEADER
    + "import os\n\n\ndef write_atomic(image, path):\n"
    + "    temporary = path.with_name(f'.{path.name}.{os.getpid()}.tmp')\n"
    + "    try:\n        image.save(temporary, format='PNG')\n"
    + "        os.replace(temporary, path)\n"
    + "    finally:\n        if temporary.exists():\n            temporary.unlink()\n\n\n"
    + "for image, path in images:\n    write_atomic(image, path)\n"
)

#: A good example of ACC301, ACC302 and ACC504: a Pokemon offline-RL trainer set up for DDP,
#: Accelerate or one GPU; the GradScaler, the plain backward and torch's clip belong to the arms
#: that make no Accelerator
MULTI_BACKEND_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
    + "    def setup(self):\n"
    + "        if self.world_size > 1:\n            self._setup_ddp()\n"
    + "        elif HAS_ACCELERATE:\n            self._setup_accelerate()\n"
    + "        else:\n            self.scaler = torch.amp.GradScaler('cuda')\n\n"
    + "    def _setup_ddp(self):\n"
    + "        self.model = DDP(self.model.to(self.device))\n"
    + "        self.scaler = torch.amp.GradScaler('cuda') if fp16 else None\n\n"
    + "    def _setup_accelerate(self):\n"
    + "        self.accelerator = Accelerator(mixed_precision='fp16')\n"
    + "        self.model, self.optimizer = self.accelerator.prepare(\n"
    + "            self.model, self.optimizer)\n\n"
    + "    def step(self, loss):\n"
    + "        if HAS_ACCELERATE and hasattr(self, 'accelerator'):\n"
    + "            self.accelerator.backward(loss)\n"
    + "            self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)\n"
    + "        else:\n"
    + "            self.scaler.scale(loss).backward()\n"
    + "            self.scaler.unscale_(self.optimizer)\n"
    + "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n"
    + "            self.scaler.step(self.optimizer)\n"
)
