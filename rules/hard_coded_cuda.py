from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.dataflow import variables_in
from accelify.analysis.device_moves import chosen_beside_accelerator_device
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_argument,
    accelerator_at,
    accelerator_name,
    calls,
    moved_by_prepare,
)

if TYPE_CHECKING:
    from accelify.edits.plan import Plan


class HardCodedCuda(Rule):
    """``torch.device("cuda:0")``, ``device="cuda:0"`` or ``.cuda(0)`` names GPU 0 for every
    rank: all ranks pile onto it and the others sit idle (or run out of memory). A bare
    ``"cuda"`` is this rank's GPU in an Accelerator script (the device is set per rank), and is
    reported only where the script must also run without CUDA (``Accelerator(cpu=...)``)."""

    code = "ACC102"
    name = "hard-coded-cuda"
    message = "Use accelerator.device instead of a hard-coded CUDA device"
    why = "Each rank has its own GPU; only accelerator.device knows which."
    bad = (
        # a default the call below leaves in place: every rank evaluates on GPU 0
        Example(
            HEADER
            + "import torch\n"
            + "def evaluate(model, loader, device=torch.device('cuda:0')):\n"
            + "    return [model(x.to(device)) for x, y in loader]\n"
            + "print(evaluate(model, loader))\n",
            4,
            36,
            HEADER
            + "import torch\n"
            + "def evaluate(model, loader, device=accelerator.device):\n"
            + "    return [model(x.to(device)) for x, y in loader]\n"
            + "print(evaluate(model, loader))\n",
        ),
        Example(  # RuSigLIP: the global rank as the GPU index (a second machine has no cuda:8)
            HEADER + "import torch\nloss = torch.tensor([0.0], device=accelerator.process_index)\n",
            4,
            35,
            HEADER + "import torch\nloss = torch.tensor([0.0], device=accelerator.device)\n",
        ),
        Example(
            HEADER + 'import torch\ndevice = torch.device("cuda:0")\n',
            4,
            10,
            HEADER + "import torch\ndevice = accelerator.device\n",
        ),
        Example(
            HEADER + 'import torch\nmask = torch.ones(4, device="cuda:0")\n',
            4,
            29,
            HEADER + "import torch\nmask = torch.ones(4, device=accelerator.device)\n",
        ),
        Example(
            "import torch\nfrom accelify import Accelerator\n"
            "accelerator = Accelerator(cpu=args.cpu)\n"
            'mask = torch.ones(4, device="cuda")\n',
            4,
            29,
            "import torch\nfrom accelify import Accelerator\n"
            "accelerator = Accelerator(cpu=args.cpu)\n"
            "mask = torch.ones(4, device=accelerator.device)\n",
        ),
        Example(HEADER + "mask = torch.ones(4).cuda(0)\n", 3, 8),
        Example(
            HEADER + 'x = x.to("cuda:0")\n',
            3,
            10,
            HEADER + "x = x.to(accelerator.device)\n",
        ),
        # a data-influence DPO script: the GPU named once, then every batch moved to it
        Example(
            HEADER + 'def step(batch):\n    device = "cuda:0"\n    return batch.to(device)\n',
            4,
            14,
            HEADER
            + "def step(batch):\n    device = accelerator.device\n    return batch.to(device)\n",
        ),
        # the accelerator exists on both arms: with --eval-only every rank runs on GPU 0
        Example(
            HEADER
            + "import sys\nimport torch\n"
            + "eval_only = '--eval-only' in sys.argv\n"
            + "device = torch.device('cuda:0') if eval_only else accelerator.device\n"
            + "model.to(device)\n",
            6,
            10,
            HEADER
            + "import sys\nimport torch\n"
            + "eval_only = '--eval-only' in sys.argv\n"
            + "device = accelerator.device if eval_only else accelerator.device\n"
            + "model.to(device)\n",
        ),
    )
    good = (
        # a default no call ever uses: the body places on accelerator.device
        HEADER
        + "import torch\n"
        + "def evaluate(model, loader, device=torch.device('cuda:0')):\n"
        + "    return [model(x.to(accelerator.device)) for x in loader]\n"
        + "print(evaluate(model, loader))\n",
        # the device chosen in one expression: GPU 0 for the plain-PyTorch reference run that
        # makes no accelerator, the accelerator's device otherwise (an Accelerate test fixture)
        "import torch\n"
        + "from accelify import Accelerator\n"
        + "accelerator = None\n"
        + "if not args.reference:\n"
        + "    accelerator = Accelerator()\n"
        + "device = torch.device('cuda:0') if args.reference else accelerator.device\n",
        HEADER + "device = accelerator.device\n",
        HEADER + 'cpu = torch.device("cpu")\n',
        HEADER + 'mask = torch.ones(4, device="cuda")\n',
        HEADER + "mask = torch.ones(4).cuda()\n",
        HEADER + 'device = "cuda"\nbatch = batch.to(device)\n',
        # a GPU name that is never a device here (a label in a log line)
        HEADER + 'name = "cuda:0"\nprint(name)\n',
        # trl's PPOTrainer: a model split over the GPUs by device_map starts on GPU 0
        HEADER
        + "import torch\n"
        + 'if not getattr(model, "is_sequential_parallel", False):\n'
        + "    current_device = accelerator.device\n"
        + "else:\n"
        + '    current_device = torch.device("cuda:0")\n',
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        also_cpu = _must_run_without_cuda(script)
        for call in calls(script):
            if not _may_name_gpu(call, also_cpu):
                continue  # none of the tests below can hold: skip the walks up
            if without_accelerator(script, call) or chosen_beside_accelerator_device(script, call):
                continue  # no accelerator there, or a fixed GPU chosen where its device cannot be
            if (
                "torch.device" in script.call_names(call)
                and _names_gpu(call, also_cpu)
                and not _default_never_used(script, call)
            ):
                yield self.finding(script, call, _use_accelerator_device(script, call))
                continue
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "cuda"
                and len(call.args) == 1
                and isinstance(call.args[0].value, cst.Integer)
                and call.args[0].keyword is None
            ):
                yield self.finding(script, call)  # the receiver's move is ACC101's when prepared
                continue
            for position, argument in enumerate(call.args):
                keyword = argument.keyword.value if argument.keyword else None
                if (
                    _moves_to(func, position, keyword)
                    and _cuda_literal(argument.value, False)
                    and not moved_by_prepare(script, call)
                ):
                    yield self.finding(
                        script, argument.value, _use_accelerator_device(script, argument.value)
                    )
                elif keyword == "device" and _cuda_literal(argument.value, also_cpu):
                    fix = _use_accelerator_device(script, argument.value)
                    yield self.finding(script, argument.value, fix)
                elif _global_rank_as_device(func, position, keyword, argument.value):
                    fix = _use_accelerator_device(script, argument.value)
                    yield self.finding(
                        script, argument.value, fix, _global_rank_message(script, argument.value)
                    )
        for literal in _device_names_holding_gpu(script):
            if not (
                without_accelerator(script, literal)
                or chosen_beside_accelerator_device(script, literal)
            ):
                yield self.finding(script, literal, _use_accelerator_device(script, literal))


def _may_name_gpu(call: cst.Call, also_cpu: bool) -> bool:
    """The syntactic half of each test of `HardCodedCuda.check`: a call for which this is
    False is never reported, so the costly tests (`without_accelerator` walks up the tree)
    are asked only of the few calls that name a GPU or a rank."""
    func = call.func
    if _names_gpu(call, also_cpu):
        return True
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "cuda"
        and len(call.args) == 1
        and isinstance(call.args[0].value, cst.Integer)
        and call.args[0].keyword is None
    ):
        return True
    for position, argument in enumerate(call.args):
        keyword = argument.keyword.value if argument.keyword else None
        if _moves_to(func, position, keyword) and _cuda_literal(argument.value, False):
            return True
        if keyword == "device" and _cuda_literal(argument.value, also_cpu):
            return True
        if _global_rank_as_device(func, position, keyword, argument.value):
            return True
    return False


def _device_names_holding_gpu(script: ScriptModel) -> Iterator[cst.SimpleString]:
    """``device = "cuda:0"`` (a later ``.to(device)`` or ``device=device`` in the same scope
    puts every rank on GPU 0): the literal, where the name is then used as a device."""
    for assign in script.assignments:
        value = assign.value
        if not (
            isinstance(value, cst.SimpleString)
            and _cuda_literal(value, False)
            and len(assigned_targets(assign)) == 1
            and isinstance(assigned_targets(assign)[0], cst.Name)
        ):
            continue
        name = assigned_targets(assign)[0].value
        scope = script.scope_of(assign)
        if any(
            script.scope_of(call) is scope and _passes_as_device(call, name)
            for call in script.calls
        ):
            yield value


def _passes_as_device(call: cst.Call, name: str) -> bool:
    """``.to(name)``, ``.cuda(name)``, ``device=name``, ``torch.device(name)``."""
    for position, argument in enumerate(call.args):
        keyword = argument.keyword.value if argument.keyword else None
        if not (isinstance(argument.value, cst.Name) and argument.value.value == name):
            continue
        if keyword == "device" or _moves_to(call.func, position, keyword):
            return True
        if dotted(call.func) == "torch.device" and position == 0:
            return True
    return False


def _moves_to(func: cst.BaseExpression, position: int, keyword: str | None) -> bool:
    """The first positional argument of ``.to(...)`` or ``.cuda(...)``: where it moves to."""
    moves = isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda")
    return moves and keyword is None and position == 0


def _global_rank_as_device(
    func: cst.BaseExpression, position: int, keyword: str | None, value: cst.BaseExpression
) -> bool:
    """``device=accelerator.process_index``, ``.to(state.process_index)``,
    ``.cuda(accelerator.process_index)``: the rank across every machine used as a GPU index."""
    if not (dotted(value) or "").endswith(".process_index"):
        return False
    return keyword == "device" or _moves_to(func, position, keyword)


def _global_rank_message(script: ScriptModel, node: cst.CSTNode) -> str:
    accelerator = accelerator_name(script, node)
    return (
        f"Use {accelerator}.device: process_index is the rank across all machines, so from the "
        "second machine on it names a GPU that machine does not have (cuda:8 on 8-GPU nodes); "
        "the device of this rank is accelerator.device (local_process_index)"
    )


def _use_accelerator_device(script: ScriptModel, node: cst.CSTNode) -> "Plan | None":
    accelerator = accelerator_at(script, node)
    if accelerator is None:
        return None  # no Accelerator bound here: the fix would not run
    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
    from accelify.edits.plan import Plan

    return Plan.of(rewrites.use_device(node, accelerator))


def _names_gpu(call: cst.Call, also_cpu: bool) -> bool:
    if not call.args:
        return False
    if len(call.args) == 2:
        return isinstance(call.args[1].value, cst.Integer) and _cuda_literal(
            call.args[0].value, True
        )
    return _cuda_literal(call.args[0].value, also_cpu)


def _cuda_literal(node: cst.BaseExpression, bare_counts: bool) -> bool:
    """``"cuda:N"``; a bare ``"cuda"`` only when ``bare_counts``."""
    if not isinstance(node, cst.SimpleString):
        return False
    text = str(node.evaluated_value)
    return text.startswith("cuda:") or (bare_counts and text == "cuda")


def _must_run_without_cuda(script: ScriptModel) -> bool:
    """``Accelerator(cpu=...)``: the script is meant to run on CPU too, where "cuda" fails."""
    return any(
        accelerator_argument(b.value, "cpu") is not None for b in script.of_kind(Kind.ACCELERATOR)
    )


def _default_never_used(script: ScriptModel, value: cst.CSTNode) -> bool:
    """``value`` is a parameter's default that never places anything: the function never reads
    the parameter (``def evaluate(model, loader, device=torch.device("cuda:0"))`` whose body
    uses ``accelerator.device``), or every call of it in the file passes its own."""
    param = script.parent(value)
    if not isinstance(param, cst.Param) or param.default is not value:
        return False
    function = next((a for a in script.ancestors(param) if isinstance(a, cst.FunctionDef)), None)
    if function is None:
        return False
    name = param.name.value
    if name not in variables_in(script, function.body):
        return True
    sites = script.call_graph.calls_of(function)
    return bool(sites) and all(
        any(bound == name for bound, _ in bound_arguments(function, site, implicit))
        for site, implicit in sites
    )
