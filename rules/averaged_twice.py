from collections.abc import Iterator

import libcst as cst

from accelify.analysis.process_count import averaged_over_ranks, process_count
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule


class AveragedTwice(Rule):
    """A value already averaged over the ranks divided by the number of processes again:
    ``accelerator.reduce(loss, "mean") / accelerator.num_processes``,
    ``accelerator.gather(loss).mean() / world_size`` (also through a name bound to either,
    ``/=``, ``.item()``, ``torch.mean``/``np.mean`` of the gathered tensor, and Accelerate's
    ``reduce`` utility, whose default is the mean). The mean over ranks already divides by N,
    so the printed or logged number is N times too small (half the true value on 2 processes,
    right on 1): a silently wrong metric. Divide the sum (``reduce(x, "sum")``,
    ``gather(x).sum()``) by N, or keep the mean undivided. Reported at the division."""

    code = "ACC414"
    name = "averaged-twice"
    message = (
        "Do not divide this by the number of processes: it is already a mean over the ranks, "
        "so the division makes it num_processes times too small; keep the mean, or divide "
        'the sum (accelerator.reduce(x, "sum"), accelerator.gather(x).sum())'
    )
    why = "A mean over ranks divided by the rank count again is N times too small."
    bad = (
        Example(
            HEADER
            + 'avg = accelerator.reduce(loss.detach(), "mean") / accelerator.num_processes\n',
            3,
            7,
        ),
        Example(
            HEADER
            + "losses = accelerator.gather(loss.detach())\n"
            + "print(losses.mean().item() / accelerator.num_processes)\n",
            4,
            7,
        ),
        # through a name, divided in place, by torch.distributed's count
        Example(
            HEADER
            + "import torch.distributed as dist\n"
            + "val = torch.mean(accelerator.gather_for_metrics(val_loss))\n"
            + "val /= dist.get_world_size()\n",
            5,
            1,
        ),
        # Accelerate's reduce utility averages by default
        Example(
            HEADER
            + "from accelerate.utils import reduce\n"
            + "world_size = accelerator.num_processes\n"
            + "avg = reduce(loss) / world_size\n",
            5,
            7,
        ),
    )
    good = (
        HEADER + 'avg = accelerator.reduce(loss.detach(), "sum") / accelerator.num_processes\n',
        # Accelerator.reduce sums by default
        HEADER + "avg = accelerator.reduce(loss.detach()) / accelerator.num_processes\n",
        HEADER + "avg = accelerator.gather(loss.detach()).sum() / accelerator.num_processes\n",
        HEADER + 'avg = accelerator.reduce(loss.detach(), "mean")\n',
        # a mean over the second axis: each sample's mean, not the ranks'
        HEADER
        + "per_sample = accelerator.gather(scores).mean(dim=1) / accelerator.num_processes\n",
        # a mean of this rank's own values
        HEADER + "avg = loss.mean() / accelerator.num_processes\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for node in script.index.of_type((cst.BinaryOperation, cst.AugAssign)):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
                divided, divisor = node.left, node.right
            elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
                divided, divisor = node.target, node.value
            else:
                continue
            if process_count(script, divisor, node) and averaged_over_ranks(script, divided, node):
                yield self.finding(script, node)
