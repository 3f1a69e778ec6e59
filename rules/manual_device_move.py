from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.device_moves import (
    fixed_device,
    hard_coded_cuda,
    is_identity_assignment,
    is_pure_move,
    moved_to,
    moves_to_cpu,
    saved_whole,
)
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, root_name, target_names, walk
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_argument,
    batch_names_of,
    calls,
    prepared,
)

if TYPE_CHECKING:
    from accelify.edits.plan import Plan

_PREPARED = HEADER + "model, loader = accelerator.prepare(model, loader)\n"
#: A loader of nested dict batches (TorchIO's ``{'source': {'data': ...}}``), for ACC101's
#: batch parts; its step, after the part's move.
_DICT_BATCHES = (
    HEADER
    + "import torch\n"
    + "batches = [{'source': {'data': x}, 'label': {'data': y}}]\n"
    + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    + "model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(batches))\n"
    + "for i, inputs in enumerate(loader):\n"
    + "    with accelerator.accumulate(model):\n"
    + "        img, label = inputs['source']['data'][0], inputs['label']['data'][0]\n"
)
_DICT_STEP = (
    "        accelerator.backward((model(img) - label).pow(2).mean())\n"
    + "        opt.step()\n"
    + "        opt.zero_grad()\n"
)


class ManualDeviceMove(Rule):
    """A prepared model, or a batch from a prepared DataLoader, moved to a fixed device:
    ``.cuda(0)``, ``.to("cuda:0")``. Prepare placed them on this rank's device; the move sends
    every rank's copy to the same GPU, where the DDP wrapper and the other ranks' tensors are
    not. The prepared model moved to the CPU (``.to("cpu")``) is reported too: on GPUs the DDP
    wrapper's forward sends its inputs back to the rank's device, where the parameters no
    longer are. A batch's tensor taken to the CPU (``y.to("cpu")`` for logging, metrics or
    NumPy) is not: each process has host memory of its own, and the move is what the code
    after it needs. Moved to a hard-coded CUDA device (``.cuda()``,
    ``.to("cuda")``, ``.to(device)`` after ``device = torch.device("cuda")``), it is already
    there on GPUs and the script crashes where there is no CUDA (``--cpu``, MPS), the runs the
    Accelerator's choice of device exists for. A move to ``accelerator.device`` or another
    per-rank device, and moves of objects that were never prepared (an EMA copy kept on the GPU
    on purpose), are not reported."""

    code = "ACC101"
    name = "manual-device-move"
    message = (
        "Remove this device move: prepare() placed it on this rank's device, and this moves "
        "every rank's copy to one fixed device"
    )
    why = (
        "`.cuda(0)` means GPU 0 on every rank; prepared objects are already on each rank's device."
    )
    bad = (
        # the function's own model, prepared by the project's setup() it hands it to
        Example(
            HEADER + "import torch\n\n\ndef setup(model, optimizer):\n"
            "    model, optimizer = accelerator.prepare(model, optimizer)\n"
            "    return model, optimizer\n\n\n"
            "def main():\n    model = Net()\n"
            "    optimizer = torch.optim.SGD(model.parameters())\n"
            "    model, optimizer = setup(model, optimizer)\n    model = model.cuda()\n",
            15,
            13,
        ),
        Example(
            _PREPARED + "for x, y in loader:\n    x = x.cuda(0)\n    loss = model(x)\n",
            5,
            9,
            _PREPARED + "for x, y in loader:\n    loss = model(x)\n",
        ),
        Example(_PREPARED + "model.to('cuda:0')\n", 4, 1, _PREPARED),
        # a LoRA fine-tuning's dict batches, moved key by key to a hard-coded CUDA device
        Example(
            _PREPARED + "import torch\ndevice = torch.device('cuda')\n"
            "for batch in loader:\n"
            "    batch = {k: v.to(device) for k, v in batch.items()}\n"
            "    loss = model(**batch).loss\n",
            7,
            17,
        ),
        Example(
            _PREPARED + "for x, y in loader:\n    loss = model(x.to('cuda:0'))\n",
            5,
            18,
            _PREPARED + "for x, y in loader:\n    loss = model(x)\n",
        ),
        Example(
            _PREPARED
            + "import torch\nfor x, y in loader:\n    y = y.to('cuda:0', dtype=torch.long)\n",
            6,
            9,
            _PREPARED + "import torch\nfor x, y in loader:\n    y = y.to(dtype=torch.long)\n",
        ),
        Example(
            _PREPARED
            + 'import torch\ndevice = torch.device("cuda")\n'
            + "for xb, yb in loader:\n    xb = xb.to(device)\n    loss = model(xb)\n",
            7,
            10,
            _PREPARED
            + 'import torch\ndevice = torch.device("cuda")\n'
            + "for xb, yb in loader:\n    loss = model(xb)\n",
        ),
        Example(
            _PREPARED
            + 'import torch\ndevice = torch.device("cuda")\n'
            + "for xb, yb in loader:\n    xb, yb = xb.to(device), yb.to(device)\n",
            7,
            14,
            _PREPARED
            + 'import torch\ndevice = torch.device("cuda")\nfor xb, yb in loader:\n    pass\n',
        ),
        Example(_PREPARED + "model.cuda()\n", 4, 1, _PREPARED),
        Example(_PREPARED + "model.to('cpu')\n", 4, 1, _PREPARED),
        # lintreal42 (a TorchIO segmentation trainer): the parts of a nested dict batch, taken
        # out under accumulate() and moved to a hard-coded CUDA device
        Example(
            _DICT_BATCHES + "        img = img.cuda()\n" + _DICT_STEP,
            10,
            15,
            _DICT_BATCHES + _DICT_STEP,
        ),
        # ... the factory that prepares them returning them to train() under other names
        Example(
            "from accelerate import Accelerator\n\n\n"
            + "def build_accelerator(model, opt, trainloader):\n"
            + "    accelerator = Accelerator()\n"
            + "    model, opt, trainloader = accelerator.prepare(model, opt, trainloader)\n"
            + "    return accelerator, model, opt, trainloader\n\n\n"
            + "def train(net, optimizer, trainLoader):\n"
            + "    accelerator, net, optimizer, trainLoader = build_accelerator(\n"
            + "        net, optimizer, trainLoader)\n"
            + "    for inputs in trainLoader:\n"
            + "        img = inputs['source']['data'].cuda()\n"
            + "        accelerator.backward(net(img).sum())\n",
            14,
            15,
        ),
        # ... its loader prepared by prepare_data_loader, as the trainer's factory does
        Example(
            "from accelerate import Accelerator\naccelerator = Accelerator()\n"
            + "model = accelerator.prepare_model(model)\n"
            + "loader = accelerator.prepare_data_loader(data_loader=loader)\n"
            + "for inputs in loader:\n"
            + "    img = inputs['source']['data']\n"
            + "    out = model(img.cuda())\n",
            7,
            17,
        ),
    )
    good = (
        # the module's model, moved before the training function (which prepares its own local
        # of that name) runs: a routing-replay study's __main__
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "def train(model, loader):\n"
        + "    accelerator = Accelerator()\n"
        + "    model, loader = accelerator.prepare(torch.load('stage1.pth'), loader)\n"
        + "    for batch in loader:\n        accelerator.backward(model(batch))\n\n\n"
        + "if __name__ == '__main__':\n"
        + "    device = torch.device('cuda')\n"
        + "    model = Net()\n    model.to(device)\n    train(model, loader)\n",
        # another function's own model under the same name (a dev stage that loads the best
        # checkpoint into a fresh model): no prepare placed it
        HEADER
        + "import torch\n\n\ndef main_train():\n"
        + "    model = Net()\n    model = accelerator.prepare(model)\n\n\n"
        + "def main_dev():\n    model = Net()\n"
        + "    model.load_state_dict(torch.load('best.pt'))\n    model = model.cuda()\n",
        _PREPARED + "for x, y in loader:\n    y_hat = model(x)\n",
        # a batch's tensors taken to host memory for logging and NumPy metrics: no device bug
        _PREPARED
        + "import torch\nfor x, y in loader:\n"
        + "    labels = y.to('cpu')\n    logged.append(labels)\n"
        + "    feats = x.to(torch.device('cpu')).numpy()\n",
        _PREPARED
        + "for batch in loader:\n    batch = batch.to('cpu')\n    stats.append(batch.numpy())\n",
        # an EMA copy that was never prepared, kept on the GPU on purpose
        _PREPARED + "import copy\nema = copy.deepcopy(model)\nema.to('cuda')\n",
        _PREPARED
        + "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        + "teacher = Teacher().to(device)\n",
        _PREPARED + "for batch in loader:\n    batch.to(accelerator.device)\n",
        _PREPARED + "model.to(device=accelerator.device, dtype=torch.float16)\n",
        _PREPARED + "device = accelerator.device\nfor x, y in loader:\n    x = x.to(device)\n",
        HEADER + "vae = Vae()\nvae.to('cuda:0')\n",
        # a factory that prepares the model but hands the loader back as it was given
        "from accelerate import Accelerator\n\n\n"
        + "def build_accelerator(model, trainloader):\n"
        + "    accelerator = Accelerator()\n"
        + "    model = accelerator.prepare(model)\n"
        + "    return accelerator, model, trainloader\n\n\n"
        + "def train(net, trainLoader):\n"
        + "    accelerator, net, trainLoader = build_accelerator(net, trainLoader)\n"
        + "    for inputs in trainLoader:\n"
        + "        img = inputs['source']['data'].cuda()\n"
        + "        accelerator.backward(net(img).sum())\n",
        # a part of the batch sent through a CPU transform, then moved back: the move is needed
        _PREPARED
        + "for batch in loader:\n"
        + "    img = batch['img']\n"
        + "    img = augment_on_cpu(img)\n"
        + "    img = img.cuda()\n",
        _PREPARED
        + "for batch in loader:\n"
        + "    img = batch['img'].cpu().numpy()\n"
        + "    out = model(torch.from_numpy(img).cuda())\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if _placement_disabled(script):
            return  # Accelerator(device_placement=False): moving batches is the script's job
        handed: list[tuple[cst.Assign, str]] | None = None
        for call in calls(script):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda"):
                continue
            fixed = fixed_device(call)
            cuda = not fixed and _hard_coded_cuda(script, call)
            if not (fixed or cuda):
                continue
            names = prepared(script, call)
            if handed is None:
                handed = _handed_back_prepared(script)
            names |= _handed_before(script, call, handed)
            if dotted(func.value) in names and saved_whole(script, call):
                continue  # the wrapper pickled whole: ACC503 unwraps it, which keeps the move
            batches = batch_names_of(script, call, names)
            batches |= _batch_parts(script, call, names, batches)
            if moves_to_cpu(call) and dotted(func.value) not in names:
                continue  # a batch's tensor taken to host memory (logging, metrics, NumPy)
            if _over_a_batch(script, call, batches):
                # ``{k: v.to(device) for k, v in batch.items()}``: no removal leaves clean code
                yield self.finding(script, call, None, message=None if fixed else _CUDA_MESSAGE)
                continue
            if dotted(func.value) in names or root_name(func.value) in batches:
                pure = len(call.args) == 1 if fixed else is_pure_move(call)
                fix = _removal(script, call) if pure else _device_dropped(call)
                yield self.finding(script, call, fix, message=None if fixed else _CUDA_MESSAGE)


_CUDA_MESSAGE = (
    "Remove this device move: prepare() already placed it on accelerator.device, and a "
    "hard-coded CUDA device breaks runs without CUDA (--cpu, MPS)"
)


def _over_a_batch(script: ScriptModel, call: cst.Call, batches: set[str]) -> bool:
    """``v.to(device)`` where ``v`` is a comprehension's variable over a batch of a prepared
    loader (``{k: v.to(device) for k, v in batch.items()}``, as HF scripts move dict batches):
    each ``v`` is part of the batch prepare already placed."""
    moved = root_name(call.func.value)  # type: ignore[union-attr]
    for ancestor in script.ancestors(call):
        if not isinstance(ancestor, (cst.DictComp, cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            continue
        for_in: cst.CompFor | None = ancestor.for_in
        while for_in is not None:
            source = for_in.iter
            if (
                isinstance(source, cst.Call)
                and isinstance(source.func, cst.Attribute)
                and source.func.attr.value in ("items", "values")
            ):
                source = source.func.value
            if moved in target_names(for_in.target) and root_name(source) in batches:
                return True
            for_in = for_in.inner_for_in
    return False


def _handed_back_prepared(script: ScriptModel) -> list[tuple[cst.Assign, str]]:
    """Each caller's name for what a function of the file prepares and returns: ``accelerator,
    model, opt, trainLoader = build_accelerator(model, opt, trainLoader)`` where
    ``build_accelerator`` returns its ``prepare_data_loader`` output at that place (a
    segmentation trainer's factory; the caller's name need not be the factory's)."""
    from accelify.analysis.facts import facts_of
    from accelify.analysis.returned_values import held_by_callers

    by_function: dict[int, tuple[cst.FunctionDef, set[str]]] = {}
    for prepare in script.prepare_calls:
        function = script.index.enclosing_function(prepare.call)
        if function is not None:
            entry = by_function.setdefault(id(function), (function, set()))
            entry[1].update(name for name in prepare.outputs if name and "." not in name)
    facts = facts_of(script)
    return [
        pair
        for function, outputs in by_function.values()
        for pair in held_by_callers(facts, function, outputs)
    ]


def _handed_before(
    script: ScriptModel, call: cst.Call, handed: list[tuple[cst.Assign, str]]
) -> set[str]:
    """The names `_handed_back_prepared` binds earlier in ``call``'s own function."""
    function = script.index.enclosing_function(call)
    here = script.order(call)
    return {
        name
        for assign, name in handed
        if script.index.enclosing_function(assign) is function and script.order(assign) < here
    }


#: What a tensor's method hands back off the device, or not as a tensor at all.
_OFF_DEVICE = frozenset({"cpu", "numpy", "tolist", "item", "detach_", "size", "dim"})
#: Attributes of a tensor that are no tensor on the device.
_NOT_ON_DEVICE = frozenset({"shape", "dtype", "device", "ndim", "is_cuda"})


def _batch_parts(
    script: ScriptModel, call: cst.Call, loaders: set[str], batches: set[str]
) -> set[str]:
    """Names the loop body binds to parts of a batch of a prepared loader, anywhere in it (also
    under ``with accelerator.accumulate(model):``): ``img, label = inputs['source']['data'],
    inputs['label']['data']`` (a TorchIO loader's nested dicts), ``x = batch['x'].float()``.
    prepare placed every tensor of the batch, nested or not, so these are on the device too. A
    name also bound to anything else in the loop (``img = cpu_transform(img)``, ``.cpu()``,
    ``.numpy()``) is left out: its move may be needed."""
    found: set[str] = set()
    for loop in script.loops:
        if loop.iterable not in loaders or not (loop.batch_names & batches):
            continue
        if not any(a is loop.node for a in script.ancestors(call)):
            continue
        bindings: list[tuple[str, cst.BaseExpression]] = []
        for node in walk(loop.node.body):
            if type(node) is cst.Assign:
                for target in node.targets:  # type: ignore[attr-defined]
                    bindings += _paired(target.target, node.value)  # type: ignore[attr-defined]
        parts: set[str] = set()
        for _ in range(4):  # ``inputs = batch['inputs']`` then ``x = inputs['x']``
            sources = loop.batch_names | parts
            grown = {
                name
                for name, _value in bindings
                if name not in loop.batch_names
                and all(_on_device(v, sources | {name}) for n, v in bindings if n == name)
                and any(_on_device(v, sources) for n, v in bindings if n == name)
            }
            if grown <= parts:
                break
            parts |= grown
        found |= parts
    return found


def _paired(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[str, cst.BaseExpression]]:
    """``(name, value)`` for each plain name an assignment binds, element by element where
    both sides are tuples of one length; a name unpacked from one value gets no value
    (``cst.Ellipsis``), so it counts as bound to something else."""
    if isinstance(target, cst.Name):
        return [(target.value, value)]
    if isinstance(target, (cst.Tuple, cst.List)):
        if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
            return [
                pair
                for kept, source in zip(target.elements, value.elements, strict=True)
                for pair in _paired(kept.value, source.value)
            ]
        return [(name, cst.Ellipsis()) for name in target_names(target)]
    return []


def _on_device(value: cst.BaseExpression, sources: set[str]) -> bool:
    """``value`` is a tensor of one of ``sources`` left where it was: indexed (``b['x'][0]``),
    an attribute (``b.x``), or a tensor method that keeps its device (``.float()``,
    ``.cuda()``, ``.unsqueeze(0)``)."""
    node = value
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value in _OFF_DEVICE:
                return False
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Attribute):
            if node.attr.value in _NOT_ON_DEVICE:
                return False
            node = node.value
        else:
            return isinstance(node, cst.Name) and node.value in sources


def _hard_coded_cuda(script: ScriptModel, call: cst.Call) -> bool:
    """``.cuda()``, ``.to("cuda")``, ``.to(device)`` after ``device = torch.device("cuda")``."""
    if call.func.attr.value == "cuda":  # type: ignore[union-attr]
        return is_pure_move(call)
    return hard_coded_cuda(script, moved_to(call))


def _placement_disabled(script: ScriptModel) -> bool:
    for binding in script.of_kind(Kind.ACCELERATOR):
        argument = accelerator_argument(binding.value, "device_placement")
        if argument is not None and dotted(argument.value) == "False":
            return True
    return False


def _removal(script: ScriptModel, call: cst.Call) -> "Plan":
    """Drop the move; a statement left doing nothing (``x = x``, ``model``) goes entirely."""
    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
    from accelify.edits.plan import Plan

    parent = script.parent(call)
    line = script.parent(parent) if parent is not None else None
    receiver = call.func.value  # type: ignore[union-attr]
    element = script.parent(parent) if isinstance(parent, cst.Element) else None
    assign = script.parent(element) if isinstance(element, cst.Tuple) else None
    if isinstance(assign, cst.Assign) and is_identity_assignment(assign, set()):
        # ``xb, yb = xb.to(device), yb.to(device)``: the statement does nothing but move
        line = script.parent(assign)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return Plan.of(rewrites.drop_statement(line))
    if (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and (
            isinstance(parent, cst.Expr)
            or (
                isinstance(parent, cst.Assign)
                and len(parent.targets) == 1
                and dotted(parent.targets[0].target) == dotted(receiver)
            )
        )
    ):
        return Plan.of(rewrites.drop_statement(line))
    return Plan.of(rewrites.drop_move(call))


def _device_dropped(call: cst.Call) -> "Plan":
    """``.to("cuda:0", dtype=torch.long)`` -> ``.to(dtype=torch.long)``: only the move goes."""
    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
    from accelify.edits.plan import Plan

    index = next(
        (
            i
            for i, a in enumerate(call.args)
            if a.keyword is not None and a.keyword.value == "device"
        ),
        0,
    )
    return Plan.of(rewrites.drop_device_argument(call, index))
