"""Which conditions every rank agrees on. A collective (a barrier, a gather, a ``break`` out of
a loop the others keep running) under a condition the ranks may disagree on hangs the run.

A condition is rank-uniform when it reads only counters (names set to integer literals and
stepped by them, ``range``/``enumerate`` indices), constants and settings (``args.x``,
``config.x``); anything computed from this rank's data, a call, or an attribute of an object the
run mutates may differ between ranks.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.placement import Placement
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, root_name, target_names

SETTINGS_ROOTS = ("args", "config", "cfg", "opt", "opts", "hparams", "FLAGS")


class RankDependence:
    def __init__(self, model: ScriptModel, placement: Placement) -> None:
        self.model = model
        self.placement = placement
        self._counters: set[str] | None = None

    def under_rank_guard(self, node: cst.CSTNode) -> bool:
        return self.model.under_rank_guard(node)

    def per_process_breaks(self) -> Iterator[tuple[cst.If, cst.SimpleStatementLine]]:
        """``if <value this rank computed>: break`` inside a loop: other ranks would hang."""
        for node in self.placement.all_nodes():
            if not isinstance(node, cst.If) or node.orelse is not None:
                continue
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
            if not body or not _is_break(body[-1]):
                continue
            if not any(isinstance(a, (cst.For, cst.While)) for a in self.model.ancestors(node)):
                continue
            if self.uniform(node.test):
                continue
            yield node, body[-1]  # type: ignore[misc]

    def divergent_branch(
        self, node: cst.CSTNode, within: cst.CSTNode | None = None
    ) -> cst.If | None:
        """The outermost ``if``/``elif`` around ``node`` (inside ``within``) whose condition the
        ranks may disagree on, or None when every rank reaches ``node`` together. A rank guard
        (``if accelerator.is_main_process``) counts: the other ranks never get there."""
        found = None
        for ancestor in self.model.ancestors(node):
            if within is not None and ancestor is within:
                break
            if isinstance(ancestor, cst.If) and not self.uniform(ancestor.test):
                found = ancestor
        return found

    def counters(self) -> set[str]:
        """Names only set to integer literals or stepped by them: equal on every rank."""
        if self._counters is None:
            self._counters = self._find_counters()
        return self._counters

    def _find_counters(self) -> set[str]:
        assigned: dict[str, bool] = {}
        for node in self.placement.all_nodes():
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                uniform = isinstance(node.value, cst.Integer)
                assigned[node.target.value] = assigned.get(node.target.value, True) and uniform
            elif isinstance(node, cst.Assign):
                for target in node.targets:
                    for name in target_names(target.target):
                        uniform = isinstance(node.value, cst.Integer)
                        assigned[name] = assigned.get(name, True) and uniform
            elif isinstance(node, cst.For):
                iterable = node.iter
                is_range = isinstance(iterable, cst.Call) and dotted(iterable.func) in (
                    "range",
                    "enumerate",
                )
                for name in target_names(node.target):
                    if is_range and (
                        dotted(iterable.func) == "range"  # type: ignore[union-attr]
                        or _is_first_target(node.target, name)
                    ):
                        assigned.setdefault(name, True)
                    else:
                        assigned[name] = False
        return {name for name, uniform in assigned.items() if uniform}

    def uniform(self, test: cst.BaseExpression) -> bool:
        """Only counters, constants and settings: every rank agrees."""
        counters = self.counters()
        if isinstance(test, cst.Call):
            return False
        if isinstance(test, cst.Attribute):
            root = root_name(test)
            return root in (*SETTINGS_ROOTS, "self") or root in counters
        if isinstance(test, cst.Name):
            return (
                test.value in counters
                or test.value in ("True", "False", "None")
                or test.value.isupper()
            )
        if isinstance(test, cst.Subscript):
            return self.uniform(test.value)
        children = [c for c in test.children if isinstance(c, cst.BaseExpression)]
        return all(self.uniform(child) for child in children)


def _is_first_target(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        first = target.elements[0].value
        return isinstance(first, cst.Name) and first.value == name
    return False


def _is_break(line: cst.CSTNode) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Break)
    )
