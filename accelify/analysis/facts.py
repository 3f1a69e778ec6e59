"""Every fact about one script that a conversion step or a lint rule asks for, built once from
its `ScriptModel`: where things are (`placement`), where objects go (`flow`), which calls reach
which functions and methods (`calls`), which conditions the ranks agree on (`ranks`), what each
evaluation loop computes and what manual accumulation there is. Computed on first use, then
kept."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.accumulation import ManualAccumulation, find_manual_accumulation
from accelify.analysis.collective_reach import CollectiveReach, CollectiveUse, LoaderPass
from accelify.analysis.evaluation import Evaluation, evaluation_of
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.helper_evaluation import HelperEvaluation, helper_evaluation_of
from accelify.analysis.outside_callers import project_calls
from accelify.analysis.outside_forward import (
    OutsideForward,
    layers_outside_forward,
    unwrapped_forwards,
)
from accelify.analysis.placement import Placement
from accelify.analysis.precision import Precision, precision_of
from accelify.analysis.print_aliases import print_alias_calls, print_partial_calls
from accelify.analysis.rank_dependence import RankDependence
from accelify.analysis.repeated_effects import RepeatedEffect, callers_of, repeated_effects
from accelify.analysis.sample_counts import SampleCount, samples_counted
from accelify.analysis.saved_values import saves_of_states
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.self_training import SelfTraining, self_training_of
from accelify.analysis.shard_totals import (
    MeterTotal,
    ShardTotal,
    meters_over_shards,
    totals_over_dataset,
)
from accelify.analysis.shared_files import SharedFiles
from accelify.analysis.shared_loops import (
    PhaseLoaders,
    SharedLoopEvaluation,
    phase_loaders,
    shared_loop_evaluations,
    shared_loop_trained_calls,
)
from accelify.analysis.side_effects import opens_for_writing, repository_path
from accelify.analysis.step_driven_loops import step_driven_loops
from accelify.analysis.syntax import dotted
from accelify.analysis.writing_helpers import writing_helpers

if TYPE_CHECKING:
    from accelify.analysis.agreed_values import AgreedValues

#: How many calls up a loop is followed to the work a function of the file does for it.
_WORK_CALL_DEPTH = 3


class Facts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.placement = Placement(model)
        self.flow = ObjectFlow(model, self.placement)
        self.ranks = RankDependence(model, self.placement)
        self.calls = model.call_graph
        self.shared_files = SharedFiles(model, self.placement, self.flow, self.ranks)

    @cached_property
    def single_device_functions(self) -> dict[int, tuple[cst.FunctionDef, bool]]:
        """`single_device.single_device_twin`'s answer for each function asked about (by id,
        kept with the function): the same for every node of it."""
        return {}

    @cached_property
    def agreed(self) -> AgreedValues:
        """Values every rank holds alike: those folded from evaluations the script gathers
        itself, and what is computed from them (`agreed_values`)."""
        from accelify.analysis.agreed_values import AgreedValues

        return AgreedValues(self, lambda e: e.already_gathered and not e.syncs_itself)

    @cached_property
    def shared_loop_evaluations(self) -> dict[str, SharedLoopEvaluation]:
        """Loaders evaluated only through a loop that trains when its flag says so, by the name
        the call hands and by the names it was made or received under (``self.val_loader``
        and the ``val_loader`` a factory built it as); none that a training call also reaches."""
        found = shared_loop_evaluations(self.model)
        trained = {
            origin
            for call in shared_loop_trained_calls(self.model)
            for origin in self.held_origins(call[0], call[1])
        }
        for name, shared in list(found.items()):
            for origin in self.held_origins(name, shared.call) - {name}:
                found.setdefault(origin, shared)
        return {name: shared for name, shared in found.items() if name not in trained}

    @cached_property
    def phase_loaders(self) -> dict[str, PhaseLoaders]:
        """Dicts of loaders read as ``loaders[phase]`` by a loop that trains in some phases, by
        the loop's name for the dict and by the names its callers hand in (or the attribute
        holding it was received as)."""
        found = phase_loaders(self.model)
        for name, phases in list(found.items()):
            for origin in self.held_origins(name, phases.loop.node):
                found.setdefault(origin, phases)
                phases.names.add(origin)
        return found

    def held_origins(self, name: str, at: cst.CSTNode) -> set[str]:
        """The names an object read as ``name`` at ``at`` was made or received under: through
        the helpers' parameters (`Flow.origins`) and through the attributes a constructor
        stored it in (``self.val_loader = val_loader``: the names its callers handed)."""
        pending = [o for o in self.flow.origins(name, at) if o is not None]
        found: set[str] = set()
        while pending:
            current = pending.pop()
            if current in found:
                continue
            found.add(current)
            pending += [
                source
                for binding in self.model.bindings
                if binding.name == current and binding.received
                for source in binding.sources
            ]
        return found

    @cached_property
    def layers_outside_forward(self) -> dict[cst.Call, OutsideForward]:
        """Calls in training steps that run a model's layers outside its forward, by call."""
        found = layers_outside_forward(self.model, self.placement, self.flow, unprepared=set())
        return {entry.call: entry for entry in found}

    @cached_property
    def unwrapped_forwards(self) -> dict[cst.Call, str]:
        """Forwards of a prepared model through ``unwrap_model`` in training steps, by call."""
        return unwrapped_forwards(
            self.model, self.placement, self.flow, self.model.names_of(Kind.ACCELERATOR)
        )

    @cached_property
    def print_alias_calls(self) -> set[cst.Call]:
        """Calls through a name that holds ``print`` (``self.trace_func(...)``)."""
        return print_alias_calls(self.model)

    @cached_property
    def print_partial_calls(self) -> set[cst.Call]:
        """Calls through ``log = functools.partial(print, ...)``: they print on every rank."""
        return print_partial_calls(self.model)

    @cached_property
    def collective_reach(self) -> CollectiveReach:
        return CollectiveReach(self.model, self.placement, self.flow, self.ranks.backend_guards)

    @cached_property
    def collective_uses(self) -> list[CollectiveUse]:
        """Calls that are or reach a collective, and the backends some ranks skip them on."""
        return self.collective_reach.uses()

    @cached_property
    def loader_passes(self) -> list[LoaderPass]:
        """Passes over a prepared DataLoader that start with a collective, on some ranks only."""
        return self.collective_reach.loader_passes()

    def synchronising_call(
        self, function: cst.FunctionDef, everywhere: bool = False
    ) -> cst.Call | None:
        """The ``prepare``, ``backward`` or collective that ``function`` runs, if any: a
        function that must never be run on one rank only (``everywhere``: a collective on
        every backend, so that every rank certainly runs the function)."""
        return self.collective_reach.synchronising_call(function, everywhere)

    def barrier_after(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """A collective every rank reaches after ``node``: later in its function (or module), or
        after a call of that function. Whatever every rank did before, all of them have done
        when any rank goes on from there."""
        if any(_takes_turns(ancestor) for ancestor in self.model.ancestors(node)):
            return True  # ``with accelerator.main_process_first():`` one rank after another
        function = self.placement.enclosing_function(node)
        here = self.model.order(node)
        if any(
            not use.skipped_on
            and self.model.order(use.call) > here
            and self.placement.enclosing_function(use.call) is function
            for use in self.collective_uses
        ):
            return True
        if function is None or depth >= 3:
            return False
        return any(
            self.barrier_after(site, depth + 1)
            for site in callers_of(self.model, self.placement, function)
        )

    def read_after(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """A call that may read a file runs after ``node``: a load (``from_pretrained``,
        ``torch.load``, ``load_state``...) or an ``open`` not for writing, later in its function
        (or module), or after a call of that function. Without one, identical bytes that every
        rank writes are whole by the time anything reads them: once the ranks are done."""
        function = self.placement.enclosing_function(node)
        here = self.model.order(node)
        for call in self.model.calls:
            if self.model.order(call) <= here or not _may_read(self.model, call):
                continue
            if self.placement.enclosing_function(call) is function:
                return True
        if function is None or depth >= 3:
            return False
        return any(
            self.read_after(site, depth + 1)
            for site in callers_of(self.model, self.placement, function)
        )

    def synchronising_in(self, node: cst.CSTNode) -> cst.Call | None:
        """A call inside ``node`` that every rank must make (a collective, or a function that
        reaches one): a guard around ``node`` would hang."""
        return self.collective_reach.synchronising_in(node)

    @cached_property
    def project_calls(self) -> list[tuple[cst.Call, Path, str]]:
        """The calls of the file that run another project module's function, class or method,
        with that module and the member (`outside_callers.project_calls`), read once."""
        project = self.model.project
        return [] if project is None else list(project_calls(self.model, project.path))

    @cached_property
    def repeated_effects(self) -> list[RepeatedEffect]:
        """Files every rank writes or deletes together: at the write, or at the call sites of
        a helper that other call sites run on the main process only."""
        return repeated_effects(
            self.model,
            self.placement,
            self.ranks.backend_guards,
            self.synchronising_call,
            self.shared_files,
            self.project_calls,
        )

    @cached_property
    def work_loops(self) -> set[int]:
        """The ``id`` of every loop that trains or evaluates: over a DataLoader, around one (the
        epoch loop), or running a forward pass, a backward or an optimizer step, there or in a
        function of the file it calls (``for epoch in ...: runner.train_epoch()``, followed
        through the call graph). A loop over tokens, config entries or text encoders is setup,
        run once per process by design."""
        marked: set[int] = set()
        anchors: list[cst.CSTNode] = [
            loop.node for loop in self.model.loops if self.flow.reads_loader(loop)
        ]
        optimizers = self.flow.names_of(Kind.OPTIMIZER)
        backwards = {id(call) for call in self.model.backward_calls}
        for call in self.model.calls:
            func = call.func
            stepping = (
                isinstance(func, cst.Attribute)
                and func.attr.value == "step"
                and dotted(func.value) in optimizers
            )
            if stepping or self.flow.is_forward(call) or id(call) in backwards:
                anchors.append(call)
        anchors += self._calls_of_working_functions(anchors)
        for anchor in anchors:
            for node in (anchor, *self.model.ancestors(anchor)):
                if isinstance(node, (cst.For, cst.While)):
                    marked.add(id(node))
        return marked

    def _calls_of_working_functions(self, anchors: list[cst.CSTNode]) -> list[cst.Call]:
        """The calls of the file's functions that hold a work anchor (a loop over a DataLoader,
        a forward, a backward, a step), and of the functions that call those, a few calls deep:
        the loop that calls ``runner.train_epoch()`` trains as much as one that holds its body."""
        index, graph = self.model.index, self.model.call_graph
        working = {index.enclosing_function(anchor) for anchor in anchors} - {None}
        found: list[cst.Call] = []
        seen: set[int] = set()
        for _ in range(_WORK_CALL_DEPTH):
            reached = [
                call
                for function in working
                for call in graph.callers(function)  # type: ignore[arg-type]
                if id(call) not in seen
            ]
            if not reached:
                break
            seen.update(id(call) for call in reached)
            found += reached
            working = {index.enclosing_function(call) for call in reached} - {None} - working
        return found

    @cached_property
    def precision(self) -> Precision:
        """The script's autocasts and scalers, and the ``mixed_precision`` that means the same
        where training is set up (or why there is none)."""
        return precision_of(self.model, self.placement.prepare_scope())

    @cached_property
    def self_training(self) -> list[SelfTraining]:
        """Model classes whose own methods run the backward, with their instances and, where
        their gradients cannot be averaged by hand, why."""
        return self_training_of(self.model, self.placement, self.calls, self.precision)

    @cached_property
    def step_driven_loops(self) -> list[tuple[Loop, cst.FunctionDef]]:
        """Loops with no backward of their own that call a step of this file which runs one
        (``for x, y in loader: trainer(x, y)``), with that step."""
        return step_driven_loops(self.model)

    @cached_property
    def writing_helpers(self) -> set[cst.FunctionDef]:
        """Functions of the file that write files and do nothing else another rank needs: each
        call of one is a write (`writing_helpers`)."""
        return writing_helpers(
            self.model, self.placement, self.calls, self.flow, self.shared_files.reads_files
        )

    @cached_property
    def saved_states(self) -> dict[int, tuple[cst.Call, cst.Call]]:
        """Each ``x.state_dict()`` call a ``torch.save`` writes, by id, with that save."""
        return saves_of_states(self.model)

    @cached_property
    def shard_totals(self) -> list[ShardTotal]:
        """Training totals summed per batch and divided by ``len(loader.dataset)`` (or by a
        parameter its callers pass that size in)."""
        return totals_over_dataset(self.model, self.placement, self.flow.reads_loader, self.calls)

    @cached_property
    def sample_counts(self) -> list[SampleCount]:
        """Counts of a training loop's samples shown after it, alone or under a total."""
        return samples_counted(self.model, self.placement, self.calls, self.flow.reads_loader)

    @cached_property
    def shard_meters(self) -> list[MeterTotal]:
        """Metric objects a training loop updates per batch and that are read after it."""
        return meters_over_shards(self.model, self.placement, self.flow.reads_loader, self.calls)

    def shard_meters_with(self, imported: Mapping[str, cst.ClassDef]) -> list[MeterTotal]:
        """`shard_meters`, with instances of meter classes of the project's other modules
        counted too: ``imported``, by the name this file calls them (``AverageMeter`` of
        ``utils.py``, which only the conversion of a whole folder reads)."""
        if not imported:
            return self.shard_meters
        return meters_over_shards(
            self.model, self.placement, self.flow.reads_loader, self.calls, imported
        )

    def trains_itself(self, backward: cst.Call) -> bool:
        """``backward`` runs in a method of a model class that trains itself."""
        return any(backward in entry.backward_calls for entry in self.self_training)

    @cached_property
    def evaluations(self) -> list[Evaluation]:
        """Loops over a DataLoader that evaluate (no backward, gradients off around or inside).
        A loop that trains through a step of this file (``self.train_step(batch)``, a subclass's
        override) does not, though its own body has no backward."""
        found = []
        stepped = {id(loop.node) for loop, _ in self.step_driven_loops}
        for loop in self.model.loops:
            if id(loop.node) in stepped:
                continue
            evaluation = evaluation_of(loop, self)
            if evaluation is not None:
                found.append(evaluation)
        return found

    @cached_property
    def helper_evaluations(self) -> dict[int, HelperEvaluation]:
        """Evaluation loops whose forward runs in a helper called per batch (``eval_step``),
        by the loop's ``id``, where the helper's gather makes every metric global."""
        found = {}
        for loop in self.model.loops:
            helper = helper_evaluation_of(loop, self)
            if helper is not None:
                found[id(loop.node)] = helper
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


def _takes_turns(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call)
        and isinstance(item.item.func, cst.Attribute)
        and item.item.func.attr.value in ("main_process_first", "local_main_process_first")
        for item in node.items
    )


def facts_of(model: ScriptModel) -> Facts:
    """The one `Facts` of ``model``: conversion steps and rules share it."""
    facts = model.__dict__.get("_facts")
    if facts is None:
        facts = Facts(model)
        model.__dict__["_facts"] = facts
    return facts


#: Calls that read a file back: a saved model, tokenizer, state or settings.
_READERS = {
    "from_pretrained",
    "load",
    "load_state",
    "safe_load",
    "load_file",
    "read_text",
    "read_bytes",
    "read_csv",
    "read_json",
    "imread",
    "listdir",
    "glob",
    "copy",
    "copy2",
    "copytree",
    "copyfile",
}


#: The copies among `_READERS`: they read their source.
_COPIES = frozenset({"copy", "copy2", "copytree", "copyfile"})


def _may_read(model: ScriptModel, call: cst.Call) -> bool:
    """``call`` may read a file: a loader by its name, or ``open`` in a mode that is not only
    for writing."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
    if name == "open":
        return not opens_for_writing(call)
    if name in _COPIES and call.args and isinstance(call.args[0].value, cst.SimpleString):
        # ``shutil.copytree("./config", run_dir)``: a fixed path this file names nowhere else
        # is the repository's own, never a file the run wrote
        return not repository_path(model, call.args[0].value)
    return name in _READERS
