from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.sharded_loaders import ShardingSampler, sharding_sampler
from accelify.analysis.syntax import dotted, strip_self_methods, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule

_IMPORTS = (
    "from torch.utils.data import DataLoader\n"
    "from torch.utils.data.distributed import DistributedSampler\n"
)


#: A project's bucketing batch sampler that deals its batches out by the rank it is handed.
_BUCKETS = (
    HEADER
    + "import math\n"
    + "from torch.utils.data import DataLoader, Sampler\n\n\n"
    + "class BucketBatchSampler(Sampler):\n"
    + "    def __init__(self, lengths, batch_size, num_replicas=1, rank=0):\n"
    + "        self.lengths, self.batch_size = lengths, batch_size\n"
    + "        self.num_replicas, self.rank = num_replicas, rank\n\n"
    + "    def __iter__(self):\n"
    + "        order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)\n"
    + "        size = self.batch_size\n"
    + "        batches = [order[i : i + size] for i in range(0, len(order), size)]\n"
    + "        return iter(batches[self.rank :: self.num_replicas])\n\n"
    + "    def __len__(self):\n"
    + "        return math.ceil(len(self.lengths) / self.batch_size / self.num_replicas)\n\n\n"
    + "sampler = BucketBatchSampler(lengths, 8{ranks})\n"
    + "loader = DataLoader(data, batch_sampler=sampler)\n"
    + "model, loader = accelerator.prepare(model, loader)\n"
)


class DistributedSamplerPrepared(Rule):
    """A DataLoader with a ``DistributedSampler`` passed to ``prepare``: the sampler already gives
    each rank 1/N of the data, and prepare shards that again, so each rank trains on 1/N² of
    the dataset and most samples are never seen.

    The same by hand: a batch of a prepared loader sliced by rank (``batch[rank::world]``,
    a split written for one process that sees the whole batch) keeps 1/N of the rank's own
    shard, and ``batch[accelerator.process_index]`` takes one row (or one field of an ``(x,
    y)`` batch) chosen by the rank; a position or a key is not a rank, and is not reported.
    ``accelerator.split_between_processes(batch)`` of such a batch shards it again the same
    way.

    The advice fits the shape: ``shuffle=`` in place of a ``sampler=DistributedSampler(...)``
    (its own ``shuffle`` value); a batch sampler rebuilt over ``RandomSampler(data)`` (a
    DataLoader refuses ``shuffle=`` beside ``batch_sampler=``, and prepare shards a batch
    sampler by dealing out its batches); a project's own sampler that shards by the rank it is
    handed (or derives from DistributedSampler) made for one process, or its loader left out
    of prepare."""

    code = "ACC402"
    name = "distributed-sampler-prepared"
    message = (
        "Drop the DistributedSampler (sampler=) and pass shuffle=True to the DataLoader: "
        "prepare() shards the DataLoader again, so each rank reads 1/N² of the data"
    )
    why = "Sharded twice, each rank sees 1/N² of the data."
    bad = (
        Example(
            HEADER
            + _IMPORTS
            + "sampler = DistributedSampler(data)\n"
            + "loader = DataLoader(data, batch_size=8, sampler=sampler)\n"
            + "loader = accelerator.prepare(loader)\n",
            6,
            10,
        ),
        # a batch sampler built over a DistributedSampler: prepare splits its batches again
        Example(
            HEADER
            + _IMPORTS
            + "from torch.utils.data import BatchSampler\n"
            + "batches = BatchSampler(DistributedSampler(data), batch_size=8, drop_last=False)\n"
            + "loader = DataLoader(data, batch_sampler=batches)\n"
            + "loader = accelerator.prepare(loader)\n",
            7,
            10,
        ),
        # a project's batch sampler handed the rank: it deals out its batches, and prepare
        # deals them out again
        Example(
            _BUCKETS.format(ranks=", accelerator.num_processes, accelerator.process_index"),
            23,
            10,
        ),
        # a prepared loader's batch sharded again by rank (a hand-written split kept after
        # the conversion): each rank keeps 1/N of its own shard, or one row of it
        Example(
            HEADER
            + "model, loader = accelerator.prepare(model, loader)\n"
            + "rank, world = accelerator.process_index, accelerator.num_processes\n"
            + "for batch in loader:\n    batch = batch[rank::world]\n"
            + "    accelerator.backward(model(batch).sum())\n",
            6,
            13,
        ),
        Example(
            HEADER
            + "model, loader = accelerator.prepare(model, loader)\n"
            + "for batch in loader:\n"
            + "    accelerator.backward(model(batch[accelerator.process_index]).sum())\n",
            5,
            32,
        ),
        # axolotl's batch evaluation: each batch of a prepared loader split between the
        # processes again (1/N of the data evaluated; a rank may get no samples)
        Example(
            HEADER
            + "import torch\ndataloader, model = accelerator.prepare(dataloader, model)\n"
            + "with torch.no_grad():\n"
            + "    for batch in tqdm(dataloader):\n"
            + "        with accelerator.split_between_processes(batch) as batch:\n"
            + "            loss = model(**batch).loss\n",
            7,
            14,
        ),
    )
    good = (
        # an unprepared loader split by hand; a prepared batch indexed by a position or
        # field; a loop variable named rank
        HEADER
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "for batch in raw_loader:\n    part = batch[accelerator.process_index]\n"
        + "for batch in loader:\n    x, y = batch[0], batch[1:]\n"
        + "    for rank in range(4):\n        print(batch[rank])\n"
        + "    accelerator.backward(model(x).sum())\n",
        HEADER
        + _IMPORTS
        + "loader = DataLoader(data, batch_size=8, shuffle=True)\n"
        + "loader = accelerator.prepare(loader)\n",
        # the batch sampler over the whole data set: prepare deals its batches out
        HEADER
        + _IMPORTS
        + "from torch.utils.data import BatchSampler, RandomSampler\n"
        + "batches = BatchSampler(RandomSampler(data), batch_size=8, drop_last=False)\n"
        + "loader = DataLoader(data, batch_sampler=batches)\n"
        + "loader = accelerator.prepare(loader)\n",
        # the project's batch sampler made for one process: it yields every batch
        _BUCKETS.format(ranks=""),
        # what split_between_processes is for: prompts no loader has sharded
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "for prompts in batches_of(all_prompts):\n"
        + "    with accelerator.split_between_processes(prompts) as mine:\n"
        + "        outputs = model.generate(mine)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        yield from self._sampler_prepared(script)
        yield from self._batch_sharded_again(script)

    def _batch_sharded_again(self, script: ScriptModel) -> Iterator[Finding]:
        """A batch of a prepared loader indexed or sliced by rank: ``batch[rank::world]``
        keeps 1/N of the rank's own shard (the rest of the data is never trained on or
        counted), and ``batch[accelerator.process_index]`` takes one row, or one field of an
        ``(x, y)`` batch, picked by the rank. The prepared loader already gave each rank its
        own batch."""
        flow = facts_of(script).flow
        for loop in script.loops:
            if not loop.batch_names or not flow.over_prepared_loader(loop):
                continue
            for node in walk(loop.node.body):
                if _split_again(node, loop.batch_names):
                    batch = dotted(node.args[0].value)  # type: ignore[attr-defined]
                    yield self.finding(
                        script,
                        node,
                        message=(
                            f"Use {batch} as it is: the prepared loader already gives each rank "
                            f"its own batch, and split_between_processes({batch}) keeps 1/N of "
                            "it (the rest of the data is never used; a rank whose share is "
                            "empty runs the model on no samples)"
                        ),
                    )
                    continue
                if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
                    continue
                if not isinstance(node.value, cst.Name) or node.value.value not in loop.batch_names:
                    continue
                item = node.slice[0].slice
                if isinstance(item, cst.Index):
                    sharded = _rank(script, item.value, node)
                else:
                    sharded = (
                        isinstance(item, cst.Slice)
                        and item.lower is not None
                        and item.step is not None
                        and _rank(script, item.lower, node)
                        and _world(script, item.step, node)
                    )
                if not sharded:
                    continue
                batch = node.value.value
                what = (
                    "indexing it by the rank takes one row (or one field of an (x, y) batch), "
                    "a different one on each rank"
                    if isinstance(item, cst.Index)
                    else "slicing it by rank again keeps 1/N of this rank's shard, and the rest "
                    "of the data is never used"
                )
                yield self.finding(
                    script,
                    node,
                    message=(
                        f"Use {batch} as it is: the prepared loader already gives each rank its "
                        f"own batch, and {what}"
                    ),
                )

    def _sampler_prepared(self, script: ScriptModel) -> Iterator[Finding]:
        prepared_inputs = {name for call in script.prepare_calls for name in call.inputs}
        for binding in script.of_kind(Kind.DATALOADER):
            call = strip_self_methods(binding.value)
            if binding.name not in prepared_inputs or not isinstance(call, cst.Call):
                continue
            found = sharding_sampler(script, call)
            if found is not None:
                yield self.finding(script, call, message=_sampler_message(script, found))


def _sampler_message(script: ScriptModel, found: ShardingSampler) -> str:
    """Advice that works for the shape at hand: ``shuffle=`` beside a ``sampler=`` only (a
    DataLoader refuses it beside ``batch_sampler=``); a batch sampler rebuilt over the plain
    sampler, which prepare shards by batches; a project's own sampler made for one process,
    or its loader kept out of prepare."""
    code = script.module.code_for_node
    if found.own is not None:
        made = found.own.name.value
        return (
            f"Make {made} for one process (leave out its rank and replica arguments, or pass "
            f"one replica and rank 0) so it yields every batch, which prepare() then deals out "
            f"to the ranks; or leave this DataLoader out of prepare(), since {made} already "
            "gives each rank its part: prepared as it is, each rank reads 1/N² of the data"
        )
    shuffle = _shuffle_of(found.sampler)
    plain = "RandomSampler" if shuffle != "False" else "SequentialSampler"
    dataset = (
        code(found.sampler.args[0].value)
        if found.sampler is not None and found.sampler.args
        else "dataset"
    )
    if found.batches is not None or found.keyword == "batch_sampler":
        rebuilt = f"`{plain}({dataset})`"
        first = found.batches.args[0].value if found.batches and found.batches.args else None
        if first is not None and first is found.sampler:
            batches = found.batches.deep_replace(first, cst.parse_expression(rebuilt[1:-1]))  # type: ignore[union-attr]
            rebuilt = f"`{code(batches)}`"
        elif isinstance(first, cst.Name):
            rebuilt = f"`{first.value} = {plain}({dataset})`"
        return (
            f"Build the batch sampler over the whole data set, not a DistributedSampler "
            f"({rebuilt}): prepare() shards a batch sampler too, dealing each rank every N-th "
            "batch, and over the DistributedSampler each rank reads 1/N² of the data "
            "(shuffle= cannot go beside batch_sampler=)"
        )
    return (
        f"Drop the DistributedSampler (sampler=) and pass shuffle={shuffle} to the DataLoader: "
        "prepare() shards the DataLoader again, so each rank reads 1/N² of the data"
    )


def _shuffle_of(sampler: cst.Call | None) -> str:
    """The ``shuffle=`` a DistributedSampler was made with (its default shuffles)."""
    if sampler is None:
        return "True"
    for argument in sampler.args:
        if argument.keyword is not None and argument.keyword.value == "shuffle":
            value = argument.value
            return value.value if isinstance(value, cst.Name) else "True"
    return "True"


def _split_again(node: cst.CSTNode, batch_names: set[str] | frozenset[str]) -> bool:
    """``accelerator.split_between_processes(batch)`` of a batch of the loop (axolotl's batch
    evaluation over a prepared loader): the batch is this rank's already."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "split_between_processes"
        and bool(node.args)
        and isinstance(node.args[0].value, cst.Name)
        and node.args[0].value.value in batch_names
    )


_RANKS = ("process_index", "local_process_index", "get_rank")
_WORLDS = ("num_processes", "get_world_size")


def _rank(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``accelerator.process_index`` (``dist.get_rank()``), or a name bound only to it."""
    return _reads(script, value, at, _RANKS)


def _world(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    return _reads(script, value, at, _WORLDS)


def _reads(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, members: tuple[str, ...]
) -> bool:
    """``value`` is ``<x>.<member>`` (or a call of it without arguments), or a name every
    binding of which, all in ``at``'s scope, is one (``rank, world = accelerator.process_index,
    accelerator.num_processes``)."""
    if isinstance(value, cst.Call) and not value.args:
        value = value.func
    if isinstance(value, cst.Attribute):
        return value.attr.value in members
    if not isinstance(value, cst.Name):
        return False
    scope = script.scope_of(at)
    bound = script.index.values_bound_to(value.value)
    if not bound or any(script.scope_of(statement) is not scope for statement, _ in bound):
        return False
    for statement, bound_value in bound:
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
            return False
        single = _element(statement.targets[0].target, bound_value, value.value)
        if (
            single is None
            or isinstance(single, cst.Name)
            or not _reads(script, single, at, members)
        ):
            return False
    return True


def _element(
    target: cst.BaseExpression, value: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    """What ``name`` is bound to by ``target = value`` (also ``a, b = x, y``)."""
    if isinstance(target, cst.Name):
        return value if target.value == name else None
    if isinstance(target, cst.Tuple | cst.List) and isinstance(value, cst.Tuple | cst.List):
        if len(target.elements) != len(value.elements):
            return None
        for element, item in zip(target.elements, value.elements, strict=True):
            if isinstance(element.value, cst.Name) and element.value.value == name:
                return item.value
    return None
