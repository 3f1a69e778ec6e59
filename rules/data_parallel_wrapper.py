from collections.abc import Iterator

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls


class DataParallelWrapper(Rule):
    """Wrapping a model in ``DataParallel``/``DistributedDataParallel`` by hand in an Accelerator
    script: prepare wraps it again (DDP inside DDP), or the hand-made wrapper runs on a process
    group the Accelerator does not manage."""

    code = "ACC103"
    name = "data-parallel-wrapper"
    message = "Remove the DataParallel/DistributedDataParallel wrapper: accelerator.prepare wraps"
    why = "A model wrapped twice all-reduces twice, or hangs on a group that was never set up."
    bad = (
        Example(HEADER + "import torch\nmodel = torch.nn.DataParallel(model)\n", 4, 9),
        Example(
            HEADER
            + "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)\n",
            4,
            9,
        ),
    )
    good = (HEADER + "model = accelerator.prepare(model)\n",)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if script.call_names(call) & names.DDP_WRAPPERS:
                yield self.finding(script, call)
