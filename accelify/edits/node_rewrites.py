"""Rewrites of one node, as values: two equal rewrites of one node are one edit, which a lambda
could not say. Each is a function of the node as the pass has rewritten it so far."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from accelify.edits.code import expression, with_keyword


@dataclass(frozen=True)
class Swap:
    """The node becomes ``code`` (``accelerator.device``), whatever it was."""

    code: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        return expression(self.code)


@dataclass(frozen=True)
class CallInstead:
    """``f(args)`` -> ``function(args)``; with ``receiver_first``, ``x.f(args)`` ->
    ``function(x, args)``, and with ``unscale`` too, ``scaler.scale(x).f()`` ->
    ``function(x)``. Keyword arguments named in ``dropped`` go (``foreach=``: a speed choice
    the new function does not take)."""

    function: str
    receiver_first: bool = False
    unscale: bool = False
    dropped: tuple[str, ...] = ()

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        args = _without(updated.args, self.dropped)
        if self.receiver_first:
            receiver = updated.func.value  # type: ignore[attr-defined]
            if self.unscale:
                receiver = receiver.args[0].value
            args = [cst.Arg(bare_argument(receiver)), *args]
        return updated.with_changes(func=expression(self.function), args=args)


def bare_argument(argument: cst.BaseExpression) -> cst.BaseExpression:
    """``(loss / accum)`` without its parentheses, now that it is a call's argument
    (``accelerator.backward(loss / accum)``, not ``backward((loss / accum))``); a tuple, a
    generator or a yield keeps them (bare, each would mean something else there)."""
    if not getattr(argument, "lpar", None) or isinstance(
        argument, (cst.Tuple, cst.GeneratorExp, cst.Yield)
    ):
        return argument
    return argument.with_changes(lpar=[], rpar=[])


@dataclass(frozen=True)
class PrintInsteadOfWrite:
    """``sys.stdout.write(text)`` -> ``function(text, end="")``; ``sys.stderr.write(text)`` ->
    ``function(text, end="", file=sys.stderr)``: the same characters on the same stream."""

    function: str
    stream: str | None = None

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        args = with_keyword(updated.args, "end", cst.SimpleString('""'))
        if self.stream is not None:
            args = with_keyword(args, "file", expression(self.stream))
        return updated.with_changes(func=expression(self.function), args=args)


@dataclass(frozen=True)
class Wrapped:
    """``x`` -> ``function(x)`` (``accelerator.unwrap_model(model)``); with ``owner``,
    ``x.attr`` -> ``function(x)`` (``model.module`` -> ``accelerator.unwrap_model(model)``)."""

    function: str
    owner: bool = False

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        inner = updated.value if self.owner else updated  # type: ignore[attr-defined]
        return cst.Call(expression(self.function), [cst.Arg(inner)])


@dataclass(frozen=True)
class ThroughForward:
    """``model.training_step(batch)`` -> ``helper(acc, model, "training_step", batch)``: the
    receiver and the arguments, as other rewrites left them, handed to ``helper``."""

    helper: str
    acc: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
        method = cst.SimpleString(f'"{updated.func.attr.value}"')
        leading = [cst.Arg(expression(self.acc)), cst.Arg(updated.func.value), cst.Arg(method)]
        return updated.with_changes(func=expression(self.helper), args=[*leading, *updated.args])


@dataclass(frozen=True)
class StateOf:
    """``model.state_dict()`` -> ``function(model)`` (``accelerator.get_state_dict(model)``):
    the receiver, as other rewrites left it, handed to ``function``."""

    function: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
        return cst.Call(expression(self.function), [cst.Arg(updated.func.value)])


@dataclass(frozen=True)
class Receiver:
    """``x.to(device)`` -> ``x``: the move goes, what was moved stays."""

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
        return updated.func.value


@dataclass(frozen=True)
class MethodInstead:
    """``x.cuda()`` -> ``x.to(accelerator.device)``: another method, other arguments."""

    method: str
    arguments: tuple[str, ...]

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
        return updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name(self.method)),
            args=[cst.Arg(expression(code)) for code in self.arguments],
        )


@dataclass(frozen=True)
class WithoutArgument:
    """``.to("cuda:0", dtype=torch.long)`` -> ``.to(dtype=torch.long)``: one argument goes."""

    index: int

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        kept = [a for i, a in enumerate(updated.args) if i != self.index]
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=kept)


@dataclass(frozen=True)
class WithKeyword:
    """``f(a)`` -> ``f(a, name=code)``, unless the call passes ``name`` already."""

    name: str
    code: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        if any(a.keyword and a.keyword.value == self.name for a in updated.args):
            return updated
        return updated.with_changes(
            args=with_keyword(updated.args, self.name, expression(self.code))
        )


@dataclass(frozen=True)
class OrAlso:
    """``value`` -> ``value or code`` (``disable=args.quiet`` -> ``disable=args.quiet or not
    accelerator.is_local_main_process``): what the script asked for still holds, and the other
    processes are off too. ``value`` is bracketed where ``or`` would bind into it (a ternary,
    a lambda, a walrus)."""

    code: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.BaseExpression)
        left = updated
        if isinstance(left, cst.IfExp | cst.Lambda | cst.NamedExpr) and not left.lpar:
            left = left.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.BooleanOperation(left=left, operator=cst.Or(), right=expression(self.code))


@dataclass(frozen=True)
class OnlyWhere:
    """``value`` -> ``value if test else True`` (``disable=args.quiet`` -> ``disable=args.quiet
    if accelerator.is_local_main_process else True``): where ``test`` holds, what the script
    asked for holds exactly (``None``, tqdm's own test of the terminal, stays ``None``, which
    ``value or ...`` would turn into ``False``). For a ``value`` that only reads: one that
    binds or calls must run on every process (``OrAlso``)."""

    test: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.BaseExpression)
        body = updated
        if isinstance(body, cst.IfExp | cst.Lambda) and not body.lpar:
            body = body.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.IfExp(test=expression(self.test), body=body, orelse=cst.Name("True"))


@dataclass(frozen=True)
class MovedTo:
    """``torch.randn(64, nz)`` -> ``torch.randn(64, nz).to(device)``: the call runs as written,
    its result is moved."""

    device: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.BaseExpression)
        return cst.Call(cst.Attribute(updated, cst.Name("to")), [cst.Arg(expression(self.device))])


def _without(args: Sequence[cst.Arg], dropped: tuple[str, ...]) -> list[cst.Arg]:
    kept = [a for a in args if not (a.keyword is not None and a.keyword.value in dropped)]
    if kept and len(kept) < len(args):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return kept


@dataclass(frozen=True)
class TakenOut:
    """The node, as every other rewrite of it left it, is kept in ``taken`` and ``name`` reads
    in its place: it moves into a statement of its own. The table applies it after the node's
    other wraps (an argument added to the call), whatever the order they were planned in."""

    name: str
    taken: list[cst.CSTNode] = field(default_factory=list, compare=False, hash=False)

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        self.taken.append(updated)
        return cst.Name(self.name)


@dataclass(frozen=True)
class KeptForAMove:
    """The statement, as every other rewrite of it left it, is kept in ``taken``: a `Remove`
    of it drops it from its block and the insert it moves to puts it back there."""

    taken: list[cst.CSTNode] = field(default_factory=list, compare=False, hash=False)

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        self.taken.append(updated)
        return updated


@dataclass(frozen=True)
class OnDeviceAndBack:
    """``model(x, k=y)`` -> ``send_to_device(model(send_to_device(x, device), k=...), "cpu")``
    for the arguments at ``inputs`` (their positions in the call): the model runs where it is,
    and its caller gets the output where the original had it. ``send_to_device`` passes what is
    not a tensor through and follows tuples and dicts, so no input or output shape is assumed."""

    device: str
    inputs: tuple[int, ...]
    #: False for a model whose output feeds another prepared model (``encoder`` of
    #: ``head(encoder(x))``): it stays on the device, and only the chain's end comes back
    back: bool = True

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        args = [
            arg.with_changes(value=_sent(arg.value, expression(self.device)))
            if index in self.inputs
            else arg
            for index, arg in enumerate(updated.args)
        ]
        moved = updated.with_changes(args=args)
        return _sent(moved, cst.SimpleString('"cpu"')) if self.back else moved


@dataclass(frozen=True)
class SentTo:
    """``x`` -> ``send_to_device(x, device)``: one input, or one output, of a model call moved
    where it stands (`OnDeviceAndBack` in parts, for a call another rewrite replaces)."""

    device: str

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.BaseExpression)
        return _sent(updated, expression(self.device))


def _sent(value: cst.BaseExpression, device: cst.BaseExpression) -> cst.Call:
    return cst.Call(cst.Name("send_to_device"), [cst.Arg(value), cst.Arg(device)])


@dataclass(frozen=True)
class OnHostFirst:
    """``x.numpy()`` -> ``x.cpu().numpy()``, ``np.array(x)`` -> ``np.array(x.cpu())``: a NumPy
    view needs host memory, and ``.cpu()`` of a tensor already there is the tensor itself."""

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        if not isinstance(updated.func, cst.Attribute) or updated.func.attr.value != "numpy":
            # ``np.array(pred, dtype=...)`` -> ``np.array(pred.cpu(), dtype=...)``: the array
            # argument (first positional, else ``a=``), the others kept
            args = list(updated.args)
            index = next(
                (i for i, a in enumerate(args) if a.keyword is None or a.keyword.value == "a"),
                0,
            )
            held = args[index]
            on_host = cst.Call(cst.Attribute(held.value, cst.Name("cpu")))
            args[index] = held.with_changes(value=on_host)
            return updated.with_changes(args=args)
        on_host = cst.Call(cst.Attribute(updated.func.value, cst.Name("cpu")))
        return updated.with_changes(func=updated.func.with_changes(value=on_host))
