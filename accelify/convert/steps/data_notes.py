"""Review lines for what prepare cannot shard or synchronise: batches that do not come from a
DataLoader, parameters updated by hand."""

from __future__ import annotations

from accelify.analysis.script_model import Kind
from accelify.convert.steps.context import Context


def run(ctx: Context) -> None:
    if not ctx.model.of_kind(Kind.DATALOADER):
        line = ctx.line(ctx.model.backward_calls[0])
        ctx.plan.review(
            line,
            "batches do not come from a DataLoader: every rank trains on the same data; "
            "wrap the data in a DataLoader and prepare it to shard it",
        )
    if not ctx.model.of_kind(Kind.OPTIMIZER):
        line = ctx.line(ctx.model.backward_calls[0])
        ctx.plan.review(
            line,
            "parameters are updated by hand (no torch.optim optimizer): the update runs "
            "on every rank with DDP-averaged gradients; check it",
        )
