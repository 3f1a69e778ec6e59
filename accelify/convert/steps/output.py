"""9. Prints and progress bars show once: ``print`` -> ``accelerator.print`` (the local main
process), ``tqdm(...)`` disabled on the other processes."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.node_rewrites import OnlyWhere, OrAlso, Swap, WithKeyword


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        if call in ctx.facts.print_alias_calls:
            qualified = qualified | {"builtins.print"}  # it holds print: see `print_aliases`
        if call in ctx.facts.print_partial_calls:
            _guard_partial_print(ctx, call)
            continue
        if _pretty_print(ctx, call):
            _guard_pretty_print(ctx, call)
            continue
        if qualified & names.PRINT and not _print_arguments(call):
            continue  # ``tqdm.write(s, nolock=True)``: not a print the Accelerator's takes
        if qualified & names.PRINT and not ctx.facts.ranks.under_rank_guard(call):
            acc = ctx.accelerator_at(call)
            ctx.plan.add(
                rewrites.print_once(call, acc),
                line=ctx.line(call),
                text=f"{ctx.code(call.func)} -> {acc}.print (local main process only)",
                anywhere=acc != ctx.acc,  # reached through the instance or the process state
            )
            if acc == ctx.acc:
                ctx.need(call)
        elif _stream_write(ctx, call) and not ctx.facts.ranks.under_rank_guard(call):
            acc = ctx.accelerator_at(call)
            stream = dotted(call.func.value)  # type: ignore[attr-defined]
            ctx.plan.add(
                rewrites.stream_write_once(call, acc, stream),  # type: ignore[arg-type]
                line=ctx.line(call),
                text=f'{stream}.write -> {acc}.print(..., end="") (local main process only)',
                anywhere=acc != ctx.acc,
            )
            if acc == ctx.acc:
                ctx.need(call)
        elif qualified & names.TQDM and (disable := _disable_argument(call)) is not None:
            _disable_on_other_processes_too(ctx, call, disable)
        elif qualified & names.TQDM:
            acc = ctx.accelerator_at(call)  # a static method's bar: the process state
            ctx.plan.replace(
                call,
                WithKeyword("disable", f"not {acc}.is_local_main_process"),
                ctx.line(call),
                "progress bar shown on the local main process only",
                anywhere=acc != ctx.acc,
            )
            if acc == ctx.acc:
                ctx.need(call)


def _disable_argument(call: cst.Call) -> cst.Arg | None:
    """The ``disable=`` a progress bar's call passes, if any."""
    for argument in call.args:
        if argument.keyword is not None and argument.keyword.value == "disable":
            return argument
    return None


def _disable_on_other_processes_too(ctx: Context, call: cst.Call, argument: cst.Arg) -> None:
    """``tqdm(loader, disable=not args.progress)``: the script's own switch says whether a bar
    is shown at all, not on which process; left as is, every rank draws its bar (two bars on 2
    ranks). It becomes ``disable=(switch) or not accelerator.is_local_main_process``. Left as is:
    ``disable=True`` (never shown), ``disable=None`` (tqdm's own test of the terminal, which an
    ``or`` would turn off), and a switch that reads the rank already (the script chose)."""
    value = argument.value
    if isinstance(value, cst.Name) and value.value in ("True", "None"):
        return
    if ctx.facts.ranks.is_rank_test(value) or ctx.facts.ranks.under_rank_guard(call):
        return
    acc = ctx.accelerator_at(call)
    is_false = isinstance(value, cst.Name) and value.value == "False"
    ctx.plan.replace(
        value,
        Swap(f"not {acc}.is_local_main_process")
        if is_false
        else OnlyWhere(f"{acc}.is_local_main_process")
        if _only_reads(value)
        else OrAlso(f"not {acc}.is_local_main_process"),
        ctx.line(call),
        f"progress bar shown on the local main process only ({ctx.code(value)} still turns it off)"
        if not is_false
        else "progress bar shown on the local main process only",
        anywhere=acc != ctx.acc,
    )
    if acc == ctx.acc:
        ctx.need(call)


def _only_reads(value: cst.BaseExpression) -> bool:
    """``args.quiet``, ``not args.progress``, ``args.verbose == 0``: no call, no walrus, so
    it may go unevaluated on the other processes (``args.no_bar`` may be ``None``: tqdm's test
    of the terminal, kept on the main process only by a ternary, not by ``or``)."""
    return not any(isinstance(node, cst.Call | cst.NamedExpr | cst.Lambda) for node in walk(value))


def _guard_partial_print(ctx: Context, call: cst.Call) -> None:
    """``log("epoch", epoch)`` after ``log = functools.partial(print, "[train]")``: the whole
    statement under the local-main-process test, its bound arguments kept."""
    statement = ctx.model.parent(ctx.model.parent(call))
    if not isinstance(ctx.model.parent(call), cst.Expr) or ctx.facts.ranks.under_rank_guard(call):
        return
    acc = ctx.accelerator_at(call)
    ctx.plan.add(
        rewrites.local_main_process_only(statement, acc),
        line=ctx.line(call),
        text=f"{ctx.code(call.func)}() prints through functools.partial(print, ...): "
        f"on the local main process only",
        anywhere=acc != ctx.acc,
    )
    if acc == ctx.acc:
        ctx.need(call)


def _pretty_print(ctx: Context, call: cst.Call) -> bool:
    """``pprint.pprint(x)``, ``pprint.PrettyPrinter(indent=2).pprint(x)``, or ``pp.pprint(x)``
    where every binding of ``pp`` in the file is a ``pprint.PrettyPrinter(...)``."""
    if ctx.model.call_names(call) & names.PPRINT:
        return True
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in ("pprint", "pp")):
        return False
    printers = [func.value]
    if isinstance(func.value, cst.Name):
        printers = [value for _, value in ctx.model.index.values_bound_to(func.value.value)]
    return bool(printers) and all(
        isinstance(printer, cst.Call) and names.PRETTY_PRINTER in ctx.model.call_names(printer)
        for printer in printers
    )


def _guard_pretty_print(ctx: Context, call: cst.Call) -> None:
    """The ``pprint`` statement under the local-main-process test: ``accelerator.print`` would
    lose its layout."""
    expression = ctx.model.parent(call)
    statement = ctx.model.parent(expression)
    if (
        not isinstance(expression, cst.Expr)
        or not isinstance(statement, cst.SimpleStatementLine)
        or len(statement.body) != 1
        or ctx.facts.ranks.under_rank_guard(call)
    ):
        return
    acc = ctx.accelerator_at(call)
    ctx.plan.add(
        rewrites.local_main_process_only(statement, acc),
        line=ctx.line(call),
        text=f"{ctx.code(call.func)}() prints on every rank: on the local main process only",
        anywhere=acc != ctx.acc,
    )
    if acc == ctx.acc:
        ctx.need(call)


def _stream_write(ctx: Context, call: cst.Call) -> bool:
    """``sys.stdout.write(text)`` (or ``sys.stderr``) as a statement of its own, one argument:
    every rank would write it. Its return value (the count) read makes it no print."""
    return (
        bool(ctx.model.call_names(call) & STREAM_WRITES)
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
        and isinstance(ctx.model.parent(call), cst.Expr)
    )


STREAM_WRITES = {"sys.stdout.write", "sys.stderr.write"}


def _print_arguments(call: cst.Call) -> bool:
    """Every keyword is one ``print`` takes (``accelerator.print`` passes them on)."""
    return all(
        a.keyword is None or a.keyword.value in ("sep", "end", "file", "flush") for a in call.args
    )
