from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import DDP, backends_in_view
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.names import OPTIMIZER_NAMES
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, unwrapped_argument, walk
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_name,
    calls,
    calls_accelerator,
)

#: How many callers up a load is followed to the training that comes after it.
_DEPTH = 3
#: Calls that copy the main process's values to the other ranks after the load.
_BROADCASTS = ("broadcast", "broadcast_object_list", "sync_module_states", "_sync_params")

_RESUMED = (
    HEADER
    + "import torch\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "if accelerator.is_main_process:\n"
    + "    {load}\n"
    + "for x, y in loader:\n"
    + "    accelerator.backward(model(x).sum())\n"
    + "    optimizer.step()\n"
)

#: A helper of the file that loads a checkpoint into the model it is handed.
_LOADER = "def load_checkpoint(net, path):\n    net.load_state_dict(torch.load(path))\n"


class LoadOnOneRank(Rule):
    """``if accelerator.is_main_process: model.load_state_dict(torch.load(path))`` after
    ``prepare``, with training after it. DistributedDataParallel copies the main process's
    weights to the other ranks once, when ``prepare`` wraps the model, never again: a load after
    it on the main process alone leaves the other ranks on their old weights. The gradients are
    still averaged, so every rank applies the same updates to different weights, and the
    replicas train apart with nothing said (an optimizer's state loaded so: each rank steps
    with other moments). Before ``prepare`` the same guarded load of a model is fine under DDP
    (the wrap copies it to every rank), not of an optimizer or a scheduler, whose state the wrap
    never copies (reported too); a load after the last training step (the best weights
    reloaded for a final evaluation on the main process) trains nothing, so neither is
    reported. ``accelerator.load_state`` under the same guard restores the main process's
    objects alone, the same way."""

    code = "ACC213"
    name = "load-on-one-rank"
    message = (
        "Load on every rank: after prepare, DistributedDataParallel no longer copies the main "
        "process's weights to the others, so the ranks train from different weights"
    )
    why = "After prepare a load on one rank is never copied to the others."
    bad = (
        Example(_RESUMED.format(load="model.load_state_dict(torch.load('ckpt.pt'))"), 6, 5),
        Example(  # through the unwrapped model, the optimizer too
            _RESUMED.format(
                load="state = torch.load('ckpt.pt')\n"
                "    accelerator.unwrap_model(model).load_state_dict(state['model'])\n"
                "    optimizer.load_state_dict(state['optimizer'])"
            ),
            7,
            5,
        ),
        Example(_RESUMED.format(load="accelerator.load_state('checkpoints/last')"), 6, 5),
        # through a local the unwrapped model was bound to
        Example(
            _RESUMED.replace(
                "if accelerator.is_main_process:\n",
                "raw = accelerator.unwrap_model(model)\nif accelerator.is_main_process:\n",
            ).format(load="raw.load_state_dict(torch.load('ckpt.pt'))"),
            7,
            5,
        ),
        # through a helper of the file called under the rank test
        Example(
            _LOADER + _RESUMED.format(load="load_checkpoint(model, 'ckpt.pt')"),
            8,
            5,
        ),
        # a trainer that prepares in its constructor and resumes in a method it calls before
        # the training loop
        Example(
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "class Trainer:\n"
            "    def __init__(self, model, optimizer, loader):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
            "            model, optimizer, loader)\n\n"
            "    def resume(self, path):\n"
            "        if self.accelerator.is_main_process:\n"
            "            self.model.load_state_dict(torch.load(path))\n\n"
            "    def fit(self, path):\n"
            "        self.resume(path)\n"
            "        for x, y in self.loader:\n"
            "            self.accelerator.backward(self.model(x).sum())\n"
            "            self.optimizer.step()\n",
            13,
            13,
        ),
        # the optimizer's state loaded before prepare (fast-DiT's resume): the DDP wrap copies
        # the model's weights, never the optimizer's moments
        Example(
            HEADER
            + "import torch\n"
            + "if accelerator.is_main_process:\n"
            + "    state = torch.load('ckpt.pt')\n"
            + "    model.load_state_dict(state['model'])\n"
            + "    optimizer.load_state_dict(state['opt'])\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    accelerator.backward(model(x).sum())\n"
            + "    optimizer.step()\n",
            7,
            5,
        ),
    )
    good = (
        # the optimizer's state loaded on every rank before prepare
        HEADER
        + "import torch\n"
        + "state = torch.load('ckpt.pt')\n"
        + "optimizer.load_state_dict(state['opt'])\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    accelerator.backward(model(x).sum())\n",
        # before prepare: the DDP wrap copies the main process's weights to every rank
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process:\n"
        + "    model.load_state_dict(torch.load('ckpt.pt'))\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    accelerator.backward(model(x).sum())\n",
        # on every rank
        _RESUMED.replace("if accelerator.is_main_process:\n    ", "").format(
            load="model.load_state_dict(torch.load('ckpt.pt'))"
        ),
        # the best weights reloaded after training, for an evaluation on the main process
        HEADER
        + "import torch\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    accelerator.backward(model(x).sum())\n"
        + "accelerator.wait_for_everyone()\n"
        + "if accelerator.is_main_process:\n"
        + "    accelerator.unwrap_model(model).load_state_dict(torch.load('best.pt'))\n"
        + "    print(evaluate(model))\n",
        # loaded on the main process, then copied to the others
        HEADER
        + "import torch\nimport torch.distributed as dist\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "if accelerator.is_main_process:\n"
        + "    model.load_state_dict(torch.load('ckpt.pt'))\n"
        + "for p in model.parameters():\n"
        + "    dist.broadcast(p.data, src=0)\n"
        + "for x, y in loader:\n"
        + "    accelerator.backward(model(x).sum())\n",
        # the state loaded on every rank, before training
        _RESUMED.replace("if accelerator.is_main_process:\n    ", "").format(
            load="accelerator.load_state('checkpoints/last')"
        ),
        # the helper handed a model nothing prepares
        _LOADER + _RESUMED.format(load="load_checkpoint(ema, 'ema.pt')"),
        # a model nothing prepares (an EMA copy kept on the main process)
        _RESUMED.format(load="ema.load_state_dict(torch.load('ema.pt'))"),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not script.prepare_calls or _broadcasts(script):
            return
        yield from self._load_state(script)
        yield from self._through_a_helper(script)
        for call in script.calls:
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict"):
                continue
            if not script.under_rank_guard(call):
                continue
            name = _loaded_object(script, func.value, call)
            if name is None:
                continue
            kind = _state_kind(script, name, call)
            before = _prepared_before(script, name, call)
            # an optimizer's or a scheduler's state loaded before the prepare that takes it:
            # prepare copies no state of either to the other ranks
            if not before and not (
                kind in (Kind.OPTIMIZER, Kind.SCHEDULER) and _prepared_after(script, name, call)
            ):
                continue
            if not _trains_after(script, call, 0):
                continue
            accelerator = accelerator_name(script, call)
            guard = _guard(script, call) or script.rank_guard_of(call)
            where = f" at line {script.line(guard)}" if guard is not None else ""
            sharded = (
                "; under FSDP or DeepSpeed, which this script names, loading into the sharded "
                "model also needs every rank"
                if backends_in_view(script) != {DDP}
                else ""
            )
            if kind is Kind.OPTIMIZER:
                reason = (
                    "the other ranks keep their own optimizer state (moments, step counts), "
                    "so from the same averaged gradients they take different steps and the "
                    "ranks train apart"
                )
            elif kind is Kind.SCHEDULER:
                reason = (
                    "the other ranks keep their own schedule (its step count), so their "
                    "learning rates differ, they take different steps from the same averaged "
                    "gradients and the ranks train apart"
                )
            else:
                reason = (
                    "DistributedDataParallel copies the main process's weights to the other "
                    "ranks only then, so they keep their old weights and the ranks train apart"
                )
            if not before:
                message = (
                    f"Load {name} on every rank (outside the rank test{where}): "
                    f"{accelerator}.prepare copies the main process's model weights to the "
                    f"other ranks but no {'optimizer' if kind is Kind.OPTIMIZER else 'scheduler'}"
                    f"'s state, and {reason}"
                )
            else:
                message = (
                    f"Load {name} on every rank (outside the rank test{where}): "
                    f"{accelerator}.prepare has already wrapped it, and {reason}; or load it "
                    f"before {accelerator}.prepare{sharded}"
                )
            yield self.finding(script, call, message=message)

    def _through_a_helper(self, script: ScriptModel) -> Iterator[Finding]:
        """``if accelerator.is_main_process: load_checkpoint(model, path)`` where the file's
        ``load_checkpoint`` loads into its parameter (``model.load_state_dict(...)``, not under
        a rank test of its own) and the call hands it a model prepared above: reported at the
        call under the rank test."""
        for load in script.calls:
            func = load.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict"):
                continue
            if script.under_rank_guard(load):
                continue
            function = facts_of(script).placement.enclosing_function(load)
            parameter = _loaded_object(script, func.value, load)
            if function is None or parameter is None or "." in parameter:
                continue
            for site, implicit in script.call_graph.calls_of(function):
                if not script.under_rank_guard(site):
                    continue
                passed = [
                    a.value for n, a in bound_arguments(function, site, implicit) if n == parameter
                ]
                name = dotted(passed[0]) if passed else None
                if name is None or not _prepared_before(script, name, site):
                    continue
                if not _trains_after(script, site, 0):
                    continue
                helper = dotted(site.func) or function.name.value
                yield self.finding(
                    script,
                    site,
                    message=(
                        f"Call {helper}() on every rank (outside the rank test): it loads "
                        f"{name} (line {script.line(load)}), which "
                        f"{accelerator_name(script, site)}.prepare has already wrapped, and "
                        "DistributedDataParallel copies the main process's weights to the other "
                        "ranks only then, so they keep their old weights and the ranks train "
                        "apart; or load it before prepare"
                    ),
                )

    def _load_state(self, script: ScriptModel) -> Iterator[Finding]:
        """``accelerator.load_state(dir)`` under a rank test after prepare: it restores the
        prepared objects of the rank that calls it only."""
        if backends_in_view(script) != {DDP}:
            return  # a collective under FSDP and DeepSpeed: the hang is ACC202's finding
        for call in calls(script):
            if not calls_accelerator(script, call, ("load_state",)):
                continue
            if not script.under_rank_guard(call) or not _after_a_prepare(script, call):
                continue
            if not _trains_after(script, call, 0):
                continue
            accelerator = accelerator_name(script, call)
            yield self.finding(
                script,
                call,
                message=(
                    f"Call {accelerator}.load_state on every rank (outside the rank test): it "
                    "restores the prepared model, optimizer and scheduler of the rank that calls "
                    "it, so from the main process alone the other ranks train on from their own "
                    "weights and the ranks train apart (and where load_state is a collective, "
                    "under DeepSpeed or FSDP, the other ranks never join it)"
                ),
            )


def _after_a_prepare(script: ScriptModel, call: cst.Call) -> bool:
    """A prepare call above ``call`` in its function (or both at the module's level), or in
    the constructor of the class whose method ``call`` is in."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(call)
    owner = script.call_graph.owner(function) if function is not None else None
    for prepare in script.prepare_calls:
        where = facts.placement.enclosing_function(prepare.call)
        if where is function and script.order(prepare.call) < script.order(call):
            return True
        if (
            owner is not None
            and where is not None
            and where.name.value == "__init__"
            and script.call_graph.owner(where) is owner
        ):
            return True
    return False


def _state_kind(script: ScriptModel, name: str, at: cst.CSTNode) -> Kind | None:
    """What the object whose state is loaded is, for the reason the message gives (an
    optimizer's moments, a schedule's step count, a model's weights that DDP copies once): its
    kind by the analysis, else the kind of what the ``prepare`` that returned it was handed at
    its place, else its name (a trainer's ``self.optimizer``, ``self.lr_scheduler`` handed in
    by a caller the analysis does not read)."""
    flow = facts_of(script).flow
    kind = flow.kind_of(name, at)
    for prepare in script.prepare_calls:
        if kind is not None:
            break
        if name in prepare.outputs and len(prepare.inputs) == len(prepare.outputs):
            kind = flow.kind_of(prepare.inputs[prepare.outputs.index(name)], prepare.call)
    if kind is None:
        last = name.rsplit(".", 1)[-1].lower()
        if last in OPTIMIZER_NAMES:
            return Kind.OPTIMIZER
        if "scheduler" in last:
            return Kind.SCHEDULER
    return kind


def _loaded_object(
    script: ScriptModel, receiver: cst.BaseExpression, at: cst.CSTNode
) -> str | None:
    """``model`` for ``model.load_state_dict``, ``accelerator.unwrap_model(model)...``, and for
    a local the unwrapped model was bound to above (``m = accelerator.unwrap_model(model)``,
    then ``m.load_state_dict``: the same weights)."""
    model = unwrapped_argument(receiver)
    if model is not None:
        return dotted(model)
    if isinstance(receiver, cst.Name):
        binding = last_binding(script, receiver.value, at)
        value = binding.value if isinstance(binding, cst.Assign) else None
        if isinstance(value, cst.Call) and len(binding.targets) == 1:  # type: ignore[union-attr]
            unwraps = unwrapped_argument(value) is not None
            return _loaded_object(script, value, binding) if unwraps else dotted(receiver)
    return dotted(receiver)


def _prepared_before(script: ScriptModel, name: str, call: cst.Call) -> bool:
    """A prepare call returned ``name`` before ``call`` runs: above it in the same function
    (or both at the module's level), in the constructor of the class whose method loads
    ``self.<name>``, or at every call site that hands a helper's parameter."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(call)
    for prepare in script.prepare_calls:
        if name not in prepare.outputs:
            continue
        where = facts.placement.enclosing_function(prepare.call)
        if where is function and script.order(prepare.call) < script.order(call):
            return True
        if (
            name.startswith("self.")
            and where is not None
            and function is not None
            and where.name.value == "__init__"
            and script.call_graph.owner(where) is script.call_graph.owner(function)
        ):
            return True
    if function is not None and "." not in name:
        return facts.flow.parameter_prepared(function, name) is True
    return False


def _prepared_after(script: ScriptModel, name: str, call: cst.Call) -> bool:
    """A prepare call below ``call`` in its function (or both at the module's level) is
    handed ``name``: what ``call`` loaded is what that prepare wraps."""
    function = facts_of(script).placement.enclosing_function(call)
    return any(
        name in prepare.inputs
        and facts_of(script).placement.enclosing_function(prepare.call) is function
        and script.order(prepare.call) > script.order(call)
        for prepare in script.prepare_calls
    )


def _trains_after(script: ScriptModel, node: cst.CSTNode, depth: int) -> bool:
    """A training step runs after ``node``: a backward below it in its function (or in a loop
    around it), in a function of the file called below it, or so at a call site of its
    function."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(node)
    scope: cst.CSTNode = function if function is not None else script.module
    at = script.order(node)
    loops = [a for a in script.ancestors(node) if isinstance(a, (cst.For, cst.While))]
    for call in script.calls:
        if facts.placement.enclosing_function(call) is not function:
            continue
        if not facts.placement.inside(call, scope):
            continue
        later = script.order(call) > at or any(facts.placement.inside(call, lp) for lp in loops)
        if not later:
            continue
        if _is_backward(call):
            return True
        target = script.call_graph.callee(call)
        if target is not None and any(
            isinstance(n, cst.Call) and _is_backward(n) for n in walk(target[0])
        ):
            return True
    if function is None or depth >= _DEPTH:
        return False
    return any(
        _trains_after(script, site, depth + 1) for site, _ in script.call_graph.calls_of(function)
    )


def _is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _guard(script: ScriptModel, call: cst.Call) -> cst.If | None:
    return next(
        (a for a in script.ancestors(call) if isinstance(a, cst.If) and script.reads_rank(a.test)),
        None,
    )


def _broadcasts(script: ScriptModel) -> bool:
    """The file copies values from one rank to the others itself: what it loads may be too."""
    return any(
        isinstance(c.func, (cst.Attribute, cst.Name))
        and (dotted(c.func) or "").rsplit(".", 1)[-1] in _BROADCASTS
        for c in script.calls
    )
