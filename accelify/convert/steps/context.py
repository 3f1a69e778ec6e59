"""What every conversion step reads and writes: the script's analysis, the plan being built,
the accelerator's name and constructor arguments, and the nodes that need the accelerator."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.edits.plan import Plan, expression

#: Where each name the converted code uses comes from, per target runtime.
TARGET_MODULES = {
    "accelify": {
        "Accelerator": "accelify",
        "set_seed": "accelify",
        "synchronize_rng_states": "accelify",
        "DistributedDataParallelKwargs": "accelify",
    },
    "accelerate": {
        "Accelerator": "accelerate",
        "set_seed": "accelerate.utils",
        "synchronize_rng_states": "accelerate.utils",
        "DistributedDataParallelKwargs": "accelerate",
    },
}


def import_lines(target: str, used: list[str]) -> list[str]:
    """``from accelify import Accelerator, set_seed``: one line per module, in first-use order."""
    by_module: dict[str, list[str]] = {}
    for name in used:
        by_module.setdefault(TARGET_MODULES[target][name], []).append(name)
    return [f"from {module} import {', '.join(names)}" for module, names in by_module.items()]


@dataclass
class Options:
    target: str = "accelify"
    mixed_precision: str | None = None


@dataclass
class Context:
    model: ScriptModel
    options: Options
    #: the scope that owns training: where prepare goes.
    scope: cst.Module | cst.FunctionDef | None = None
    plan: Plan = field(default_factory=Plan)
    #: ``accelerator``, or ``self.accelerator`` when training lives in a method.
    acc: str = "accelerator"
    #: keyword arguments of the ``Accelerator(...)`` call, as source text.
    constructor: dict[str, str] = field(default_factory=dict)
    #: nodes whose edits use the accelerator: it is created before the first of them.
    needs: list[cst.CSTNode] = field(default_factory=list)
    #: the statement the ``prepare`` call follows.
    prepare_anchor: cst.CSTNode | None = None
    #: the statement each prepared name's ``prepare`` call follows (a script that trains one
    #: model after another prepares each before its first use).
    prepared_after: dict[str, cst.CSTNode] = field(default_factory=dict)
    #: edits outside the class that owns ``self.accelerator`` that reach it through an instance.
    reachable_outside: list[cst.CSTNode] = field(default_factory=list)
    #: models no optimizer trains: not prepared, so their device moves stay.
    frozen: set[str] = field(default_factory=set)
    #: runtime names the converted code uses besides ``Accelerator``.
    uses: list[str] = field(default_factory=list)

    @property
    def facts(self) -> Facts:
        return facts_of(self.model)

    def need(self, node: cst.CSTNode) -> None:
        self.needs.append(node)

    def code(self, node: cst.CSTNode) -> str:
        return self.model.module.code_for_node(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line(node)

    def a(self, member: str) -> str:
        return f"{self.acc}.{member}"

    def constructor_code(self) -> str:
        arguments = ", ".join(f"{key}={value}" for key, value in self.constructor.items())
        return f"Accelerator({arguments})"

    def after_prepare(self, node: cst.CSTNode, name: str | None = None) -> bool:
        """``node`` runs after the prepare call (of ``name``, when given)."""
        anchor = self.prepared_after.get(name or "", self.prepare_anchor)
        if anchor is None:
            return False
        scope = self.model.scope_of(anchor)
        placement = self.facts.placement
        if placement.inside(node, scope) and self.model.scope_of(node) is scope:
            return self.model.line(node) > self.model.line(anchor)
        return True


def unwrap(ctx: Context, model: cst.BaseExpression, at: cst.CSTNode, text: str) -> None:
    """``model`` -> ``accelerator.unwrap_model(model)``."""
    acc = ctx.acc
    ctx.plan.replace(
        model,
        lambda updated: cst.Call(expression(f"{acc}.unwrap_model"), [cst.Arg(updated)]),
        ctx.line(at),
        text,
    )
    ctx.need(at)
