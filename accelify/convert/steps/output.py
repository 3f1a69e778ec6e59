"""9. Prints and progress bars show once: ``print`` -> ``accelerator.print`` (the local main
process), ``tqdm(...)`` disabled on the other processes."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.node_rewrites import WithKeyword


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        if call in ctx.facts.print_alias_calls:
            qualified = qualified | {"builtins.print"}  # it holds print: see `print_aliases`
        if qualified & names.PRINT and not _print_arguments(call):
            continue  # ``tqdm.write(s, nolock=True)``: not a print the Accelerator's takes
        if qualified & names.PRINT and not ctx.facts.ranks.under_rank_guard(call):
            outside = ctx.instance_outside_class(call)
            if outside is None and not ctx.plan.reaches(call):
                _print_through_the_process_state(ctx, call)
                continue
            acc = ctx.acc if outside is None else f"{outside}.accelerator"
            ctx.plan.add(
                rewrites.print_once(call, acc),
                line=ctx.line(call),
                text=f"{ctx.code(call.func)} -> {acc}.print (local main process only)",
                anywhere=outside is not None,  # reached through the instance
            )
            if outside is None:
                ctx.need(call)
        elif qualified & names.TQDM and not any(
            a.keyword and a.keyword.value == "disable" for a in call.args
        ):
            acc = ctx.acc
            ctx.plan.replace(
                call,
                WithKeyword("disable", f"not {acc}.is_local_main_process"),
                ctx.line(call),
                "progress bar shown on the local main process only",
            )
            ctx.need(call)


def _print_through_the_process_state(ctx: Context, call: cst.Call) -> None:
    """A print where ``self.accelerator`` cannot be reached (``print(Trainer(...).fit())`` in
    ``main``): ``PartialState()`` is the same process state the Accelerator holds, and prints
    on the local main process as ``accelerator.print`` does."""
    ctx.plan.add(
        rewrites.print_once(call, "PartialState()"),
        line=ctx.line(call),
        text=f"{ctx.code(call.func)} -> PartialState().print (local main process only)",
        anywhere=True,
    )
    if "PartialState" not in ctx.uses:
        ctx.uses.append("PartialState")


def _print_arguments(call: cst.Call) -> bool:
    """Every keyword is one ``print`` takes (``accelerator.print`` passes them on)."""
    return all(
        a.keyword is None or a.keyword.value in ("sep", "end", "file", "flush") for a in call.args
    )
