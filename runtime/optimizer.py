"""The prepared optimizer: steps only when gradients are in sync, through the scaler under fp16."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelify.runtime import pending_work
from accelify.runtime.gradient_state import GradientState

_TORCH_ZERO_GRAD = torch.optim.Optimizer.zero_grad


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; ``step``/``zero_grad`` are skipped on accumulation steps.

    Subclassing `torch.optim.Optimizer` (without running its constructor) keeps
    ``isinstance(opt, torch.optim.Optimizer)`` true for LR schedulers and user code, while
    ``param_groups``, ``state`` and ``defaults`` stay the wrapped optimizer's own objects.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_state: GradientState,
        scaler: torch.amp.GradScaler | None = None,
        tracks_step: bool = True,
        loads: Callable[[torch.optim.Optimizer, dict[str, Any]], None] | None = None,
    ) -> None:
        self.optimizer = optimizer
        #: the engine's load (`Backend.load_optimizer_state_dict`): a whole state, as one
        #: process saved it, loads into a sharded optimizer too
        self.loads = loads
        self.gradient_state = gradient_state
        self.scaler = scaler
        self.step_was_skipped = False
        self.tracks_step = tracks_step

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.loads is None:
            self.optimizer.load_state_dict(state_dict)
        else:
            self.loads(self.optimizer, state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            # torch's zero_grad is wrapped (``torch._disable_dynamo``) by a function of
            # ``*args, **kwargs``: a keyword builds and unpacks a dict there on every step, about
            # 2.5 k instructions at 32 wide (bench/step_instructions.py); torch's own default is
            # the same True, so it is left to it. Asked per call, of the bound method itself: a
            # zero_grad replaced on the object (before or after prepare) gets the keyword
            zero = self.optimizer.zero_grad
            if set_to_none is True and getattr(zero, "__func__", None) is _TORCH_ZERO_GRAD:
                zero()
            else:
                zero(set_to_none=set_to_none)

    #: Whether ``step`` tracks the collectives it launches (`pending_work.tracks`): an engine's
    #: step communicates (DeepSpeed gathers the new partitions). A block tracked costs each op
    #: in it (torch copies the thread's state, with the token, for every op: about 15 % of a
    #: small model's SGD step), so a step the engine knows to be local is not
    #: (`Backend.steps_locally`).
    tracks_step = True

    def step(self, closure: Any = None) -> Any:
        if self.tracks_step:
            return self._tracked_step(closure)
        if self.scaler is not None:
            return self._step(closure)
        # `_step`'s scaler-less branch, copied here on purpose: every untracked training step
        # runs it, and the call to `_step` it saves shows in a step's instruction count
        # (bench/step_instructions.py). Change both together.
        self.step_was_skipped = False
        if not self.gradient_state.sync_gradients:
            return None
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    @pending_work.tracks
    def _tracked_step(self, closure: Any) -> Any:
        return self._step(closure)

    def _step(self, closure: Any) -> Any:
        self.step_was_skipped = False
        if not self.gradient_state.sync_gradients:
            return None
        if self.scaler is None:  # also inlined in `step` for the untracked path: keep alike
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = (
            self.scaler.step(self.optimizer, closure)
            if closure
            else self.scaler.step(self.optimizer)
        )
        self.scaler.update()
        self.step_was_skipped = self.scaler.get_scale() < scale_before
        return result

    def train(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        # the wrapped optimizer's: a script that prints its optimizer (``print(f"Using optim:
        # {optimizer}")``) prints on N processes what it printed on one
        return repr(self.optimizer)
