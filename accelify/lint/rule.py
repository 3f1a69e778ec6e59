"""What a lint rule is: a code, a message that says what to do, examples that are its tests,
and a `check` over the shared `ScriptModel`. A fix is a set of edits in the converter's `Plan`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import accelerator_argument as accelerator_argument
from accelify.analysis.syntax import dotted, root_name, walk
from accelify.edits.plan import Plan
from accelify.lint.finding import Finding


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
    ) -> Finding:
        start = script.position(node).start
        if message is None:
            message = in_file_words(self.message, accelerator_at(script, node))
        return Finding(self.code, message, start.line, start.column + 1, fix)


def in_file_words(message: str, name: str | None) -> str:
    """The rule's message in the file's words: ``self.accelerator.backward(loss)``,
    ``acc.backward(loss)`` where the accelerator goes by that name."""
    if name is None or name == "accelerator":
        return message
    return re.sub(r"\baccelerator\.", f"{name}.", message)


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
    imported = sorted(name for name in script.inherited_accelerators if "." not in name)
    if imported:
        return imported[0]
    if script.inherited_accelerators and facts.placement.is_method(
        facts.placement.enclosing_function(node) or script.module
    ):
        return min(script.inherited_accelerators)
    return None


def prepared(script: ScriptModel, node: cst.CSTNode) -> set[str]:
    """Names that hold prepared objects at ``node``: outputs of a prepare call above it, but
    not a local that ``node``'s function makes itself under the same name (``model =
    MergeT5(args)`` in a ``main_dev()`` beside the ``main_train()`` that prepares its own
    ``model``): that is another object, which no prepare placed."""
    here = script.order(node)
    found = script.prepared_before(node)
    scope = script.scope_of(node)
    if not isinstance(scope, cst.FunctionDef):
        return found
    return {name for name in found if not _made_in(script, name, scope, here)}


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
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.For):
            return ancestor
    return None


def calls_in(script: ScriptModel, node: cst.CSTNode) -> list[cst.Call]:
    """The calls somewhere under ``node`` (a loop, a block), in source order."""
    return [call for call in script.calls if any(a is node for a in script.ancestors(call))]


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
