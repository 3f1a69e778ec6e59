from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods
from accelify.lint.rule import HEADER, Example, Finding, Rule

_IMPORTS = (
    "from torch.utils.data import DataLoader\n"
    "from torch.utils.data.distributed import DistributedSampler\n"
)


class DistributedSamplerPrepared(Rule):
    """A DataLoader with a ``DistributedSampler`` passed to ``prepare``: the sampler already gives
    each rank 1/N of the data, and prepare shards that again, so each rank trains on 1/N² of
    the dataset and most samples are never seen."""

    code = "ACC402"
    name = "distributed-sampler-prepared"
    message = "Drop the DistributedSampler (use shuffle=True): prepare() shards the DataLoader"
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
    )
    good = (
        HEADER
        + _IMPORTS
        + "loader = DataLoader(data, batch_size=8, shuffle=True)\n"
        + "loader = accelerator.prepare(loader)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        prepared_inputs = {name for call in script.prepare_calls for name in call.inputs}
        samplers = script.names_of(Kind.SAMPLER)
        for binding in script.of_kind(Kind.DATALOADER):
            call = strip_self_methods(binding.value)
            if binding.name not in prepared_inputs or not isinstance(call, cst.Call):
                continue
            for argument in call.args:
                if argument.keyword is None or argument.keyword.value != "sampler":
                    continue
                value = argument.value
                inline = isinstance(value, cst.Call) and (
                    script.call_names(value) & names.DISTRIBUTED_SAMPLERS
                )
                if dotted(value) in samplers or inline:
                    yield self.finding(script, call)
