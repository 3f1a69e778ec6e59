"""The function a conversion adds for ``model.training_step(batch)`` on a prepared model
(`rewrites.THROUGH_FORWARD`), run against a wrapper that calls the inner model as DDP does:
the method runs inside the wrapper's forward, and a forward the inner model's instance already
holds (mixed precision's autocast wrapper, set at prepare by both runtimes) is what the
method's ``self(x)`` runs and is still there afterwards (on 2 ranks with bf16 it was dropped at
the first step: the model trained in fp32 where one process trained in bf16)."""

from __future__ import annotations

import torch
import torch.nn as nn

from accelify.edits.rewrites import THROUGH_FORWARD


class _Wrapper(nn.Module):
    """Runs the inner model as DDP's forward does, counting its calls."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.module(*args, **kwargs)


class _Accelerator:
    @staticmethod
    def unwrap_model(model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, _Wrapper) else model


class _Lit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self(x).sum() * scale


def _helper():  # type: ignore[no-untyped-def]
    namespace: dict = {}
    exec(THROUGH_FORWARD.format(name="call_through_forward"), namespace)
    return namespace["call_through_forward"]


def test_the_method_runs_inside_the_wrappers_forward_and_leaves_no_forward_behind() -> None:
    inner = _Lit()
    wrapper = _Wrapper(inner)
    x = torch.ones(3, 2)
    loss = _helper()(_Accelerator(), wrapper, "training_step", x, scale=2.0)
    assert wrapper.calls == 1
    assert torch.equal(loss, inner.net(x).sum() * 2.0)
    assert "forward" not in inner.__dict__


def test_a_forward_the_instance_holds_runs_in_the_method_and_stays() -> None:
    inner = _Lit()
    seen = []
    original = inner.forward

    def autocast_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append("autocast")
        return original(*args, **kwargs)

    inner.forward = autocast_forward  # what mixed precision's prepare sets
    wrapper = _Wrapper(inner)
    helper = _helper()
    for _ in range(2):
        helper(_Accelerator(), wrapper, "training_step", torch.ones(3, 2))
    assert seen == ["autocast", "autocast"]
    assert inner.__dict__["forward"] is autocast_forward
    inner(torch.ones(3, 2))  # a later plain call (evaluation) keeps it too
    assert seen == ["autocast"] * 3


def test_an_unwrapped_model_calls_the_method_as_written() -> None:
    inner = _Lit()
    loss = _helper()(_Accelerator(), inner, "training_step", torch.ones(3, 2))
    assert loss.shape == ()
    assert "forward" not in inner.__dict__
