from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: How many calls up from a ``load_state`` or a ``prepare`` the order is looked for: a trainer's
#: ``__init__`` calling ``self.resume()`` and ``self.setup()``, or a ``main`` calling helpers.
_DEPTH = 3

_TRAINER = (
    "from accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, resume):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = model\n"
    "{body}"
    "    def load_checkpoint(self, path):\n"
    "        self.accelerator.load_state(path)\n\n"
    "    def prepare_training(self):\n"
    "        self.model = self.accelerator.prepare(self.model)\n"
)


class LoadStateBeforePrepare(Rule):
    """``accelerator.load_state`` restores into the objects that were prepared. Called before
    ``prepare`` there are none yet: nothing is restored, and training silently starts over.
    The order counts through the file's own functions too: a trainer whose ``__init__`` calls
    ``self.load_checkpoint()`` (which runs ``load_state``) before ``self.prepare_training()``
    (which runs ``prepare``) restores nothing either; it is reported at the ``load_state``."""

    code = "ACC501"
    name = "load-state-before-prepare"
    message = "Call accelerator.load_state after accelerator.prepare: before it nothing is restored"
    why = "load_state fills the prepared model, optimizer, scheduler and loaders."
    bad = (
        Example(
            HEADER + "accelerator.load_state('ckpt')\nmodel = accelerator.prepare(model)\n", 3, 1
        ),
        # a diffusion trainer's __init__: load_checkpoint() runs before prepare_training()
        Example(
            _TRAINER.format(
                body="        self.load_checkpoint(resume)\n        self.prepare_training()\n\n"
            ),
            12,
            9,
        ),
    )
    good = (
        HEADER + "model = accelerator.prepare(model)\naccelerator.load_state('ckpt')\n",
        _TRAINER.format(
            body="        self.prepare_training()\n        self.load_checkpoint(resume)\n\n"
        ),
        # called from outside the file: the order is the caller's, not known here
        _TRAINER.format(body="\n"),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not script.prepare_calls:
            return
        prepares = [_reach(script, p.call) for p in script.prepare_calls]
        for call in calls(script):
            if not calls_accelerator(script, call, ("load_state",)):
                continue
            func = call.func
            order = _before_every_prepare(script, _reach(script, call), prepares)
            if order is None:
                continue
            load_at, prepares_at = order
            if load_at is call:
                yield self.finding(script, call)
                continue
            accelerator = dotted(func.value)
            preparing = ", ".join(
                f"{_called(node)} (line {script.line(node)})" for node in prepares_at
            )
            yield self.finding(
                script,
                call,
                message=(
                    f"Call {accelerator}.load_state after {accelerator}.prepare: it runs from "
                    f"{_called(load_at)} (line {script.line(load_at)}), before anything is "
                    f"prepared (by {preparing}), so nothing is restored; call it after the "
                    "last of them"
                ),
            )


def _reach(script: ScriptModel, node: cst.CSTNode) -> dict[object, cst.CSTNode]:
    """For each scope from which ``node`` runs, the node in that scope that runs it: itself in
    its own scope, the call of its function in the caller's scope, and so on up the file's
    calls. A function with several callers is followed no further (the order is each
    caller's)."""
    found: dict[object, cst.CSTNode] = {script.scope_of(node): node}
    at = node
    for _ in range(_DEPTH):
        function = script.index.enclosing_function(at)
        if function is None:
            break
        callers = script.call_graph.callers(function)
        if len(callers) != 1:
            break
        at = callers[0]
        found.setdefault(script.scope_of(at), at)
    return found


def _before_every_prepare(
    script: ScriptModel,
    load: dict[object, cst.CSTNode],
    prepares: list[dict[object, cst.CSTNode]],
) -> tuple[cst.CSTNode, list[cst.CSTNode]] | None:
    """The load runs before each prepare it shares a scope with (compared in the innermost
    shared scope), and shares one with at least one: there, nothing is prepared yet. Returns
    the call that leads to the load and those that lead to the prepares, in order, else None."""
    load_at: cst.CSTNode | None = None
    preparing: list[cst.CSTNode] = []
    for prepare in prepares:
        scope = next((scope for scope in load if scope in prepare), None)
        if scope is None:
            continue
        here, prepare_at = load[scope], prepare[scope]
        if here is prepare_at or script.order(here) >= script.order(prepare_at):
            return None
        if _same_loop(script, here, prepare_at):
            return None  # the next pass loads after this pass's prepare
        load_at = load_at or here
        if not any(prepare_at is seen for seen in preparing):
            preparing.append(prepare_at)
    if load_at is None:
        return None
    return load_at, sorted(preparing, key=script.order)


def _called(node: cst.CSTNode) -> str:
    """``self.load_checkpoint()`` for the call that leads to the load or the prepare."""
    name = dotted(node.func) if isinstance(node, cst.Call) else None
    return f"{name}()" if name else "this call"


def _same_loop(script: ScriptModel, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    loops = {a for a in script.ancestors(first) if isinstance(a, (cst.For, cst.While))}
    return any(a in loops for a in script.ancestors(second))
