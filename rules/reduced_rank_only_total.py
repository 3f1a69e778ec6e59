from collections.abc import Iterator

from accelify.analysis.facts import facts_of
from accelify.analysis.rank_only_totals import rank_only_totals
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule

#: A validation loss summed over the prepared loader; ``{fold}`` adds each batch's loss.
_EVALUATION = (
    HEADER
    + "import torch\n"
    + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    + "    model, optimizer, loader, val_loader\n"
    + ")\n"
    + "total = torch.zeros(1, device=accelerator.device)\n"
    + "for x, y in val_loader:\n"
    + "    with torch.no_grad():\n"
    + "        loss = (model(x) - y).pow(2).mean()\n"
    + "{fold}"
    + "total = accelerator.reduce(total{reduction})\n"
    + "accelerator.print(total.item() / len(val_loader.dataset))\n"
)
_ON_MAIN = "    if accelerator.is_main_process:\n        total += loss.detach()\n"
_ON_EVERY_RANK = "    total += loss.detach()\n"


class ReducedRankOnlyTotal(Rule):
    """A total folded from this rank's shard only under a rank test (``if
    accelerator.is_main_process: total += loss.detach()`` in the loop over a prepared
    DataLoader), then combined by every rank (``accelerator.reduce(total)``, ``gather``,
    ``gather_for_metrics``, ``dist.all_reduce``): the other ranks never add their batches and
    hand the collective the value they started with, so the sum over the ranks is the main
    process's shard alone (a mean over them is that divided by N), a silently wrong number on
    any run of more than one process. Fold on every rank and keep only what is shown under the
    test. A value the main process decides alone and shares through the collective (a stop flag
    set under the test and reduced), a count (``n += 1``: it reads no data, and the reduce
    hands back the main process's count of batches, the per-rank number, not N times it), and a
    total folded in both arms of the test are not reported; a combine run on some ranks only
    is ACC202's hang."""

    code = "ACC418"
    name = "reduced-rank-only-total"
    message = (
        "Fold this total on every rank: only the ranks under the rank test add their batches, "
        "so the others combine the value they started with (the main process's shard alone)"
    )
    why = "A total folded on the main process only is one shard, whatever the reduce adds."
    bad = (
        Example(_EVALUATION.format(fold=_ON_MAIN, reduction=""), 13, 9),
        Example(_EVALUATION.format(fold=_ON_MAIN, reduction=", 'mean'"), 13, 9),
        # the total kept in a helper that returns it, gathered as one value per rank
        Example(
            HEADER
            + "import torch\n"
            + "model, loader = accelerator.prepare(model, loader)\n\n\n"
            + "def evaluate(model, loader):\n"
            + "    correct = torch.zeros(1, device=accelerator.device)\n"
            + "    for x, y in loader:\n"
            + "        if accelerator.is_local_main_process:\n"
            + "            correct = correct + (model(x).argmax(-1) == y).sum()\n"
            + "    return accelerator.gather(correct).sum().item()\n",
            12,
            12,
        ),
    )
    good = (
        _EVALUATION.format(fold=_ON_EVERY_RANK, reduction=""),
        # folded in both arms of the test: every rank adds its batches
        _EVALUATION.format(
            fold=_ON_MAIN + "    else:\n        total += loss.detach()\n", reduction=""
        ),
        # the main process decides a stop alone and shares it through the reduce (a broadcast)
        HEADER
        + "import torch\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "for epoch in range(10):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(model(x).sub(y).pow(2).mean())\n"
        + "    stop = torch.zeros(1, device=accelerator.device)\n"
        + "    if accelerator.is_main_process and os.path.exists('STOP'):\n"
        + "        stop += 1\n"
        + "    if accelerator.reduce(stop).item() > 0:\n"
        + "        break\n",
        # counted under the test: no data of the shard, and the reduce hands back the main
        # process's count of batches (the per-rank number, every rank has as many), not N times it
        HEADER
        + "import torch\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "seen = torch.zeros(1, device=accelerator.device)\n"
        + "for x, y in loader:\n"
        + "    if accelerator.is_main_process:\n"
        + "        seen += 1\n"
        + "seen = accelerator.reduce(seen)\n",
        # a batch entry refilled from itself, gathered on every rank (trlx's evaluate: the
        # entry's fill reads the entry, followed once, not until the stack runs out)
        HEADER
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "for batch in loader:\n"
        + "    batch['input_ids'] = batch['input_ids'].repeat_interleave(2, dim=0)\n"
        + "    ids = accelerator.gather_for_metrics(batch['input_ids'])\n",
        # reduced under the same test: ACC202's hang, not this rule's
        _EVALUATION.format(fold=_ON_MAIN, reduction="").replace(
            "total = accelerator.reduce(total)\n",
            "if accelerator.is_main_process:\n    total = accelerator.reduce(total)\n",
        ),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for total in rank_only_totals(facts_of(script)):
            called = dotted(total.combine.func) or "the collective"
            fold, guard = script.line(total.fold), script.line(total.guard)
            yield self.finding(
                script,
                total.combine,
                message=(
                    f"Fold {total.name} on every rank: it adds this rank's batches only under "
                    f"the rank test at line {guard} (line {fold}), so the other ranks hand "
                    f"{called}() the value they started with and the result is the main "
                    f"process's shard alone (a silently wrong total); move line {fold} out of "
                    "the rank test and keep only what is shown under it"
                ),
            )
