"""Every fact about one script that a conversion step or a lint rule asks for, built once from
its `ScriptModel`: where things are (`placement`), where objects go (`flow`), which conditions
the ranks agree on (`ranks`), what each evaluation loop computes and what manual accumulation
there is. Computed on first use, then kept."""

from __future__ import annotations

from functools import cached_property

from accelify.analysis.accumulation import ManualAccumulation, find_manual_accumulation
from accelify.analysis.evaluation import Evaluation, evaluation_of
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.placement import Placement
from accelify.analysis.rank_dependence import RankDependence
from accelify.analysis.script_model import Loop, ScriptModel


class Facts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.placement = Placement(model)
        self.flow = ObjectFlow(model, self.placement)
        self.ranks = RankDependence(model, self.placement)

    @cached_property
    def evaluations(self) -> list[Evaluation]:
        """Loops over a DataLoader that evaluate (no backward, gradients off around or inside)."""
        found = []
        for loop in self.model.loops:
            evaluation = evaluation_of(loop, self)
            if evaluation is not None:
                found.append(evaluation)
        return found

    @cached_property
    def accumulations(self) -> dict[int, ManualAccumulation]:
        """Manual gradient accumulation per training loop (keyed by the loop's ``id``)."""
        found = {}
        for loop in self.model.loops:
            if loop.trains:
                accumulation = find_manual_accumulation(loop, self)
                if accumulation is not None:
                    found[id(loop.node)] = accumulation
        return found

    def accumulation_in(self, loop: Loop) -> ManualAccumulation | None:
        return self.accumulations.get(id(loop.node))


def facts_of(model: ScriptModel) -> Facts:
    """The one `Facts` of ``model``: conversion steps and rules share it."""
    facts = model.__dict__.get("_facts")
    if facts is None:
        facts = Facts(model)
        model.__dict__["_facts"] = facts
    return facts
