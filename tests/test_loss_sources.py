"""What a backward's loss is computed from (accelify/analysis/loss_sources.py): followed through
names, a function's return value and a helper's parameter, numerators only."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.analysis.loss_sources import backwards, loss_sources
from accelify.analysis.script_model import ScriptModel, analyze


def script(code: str) -> ScriptModel:
    source = "from accelify import Accelerator\n" + textwrap.dedent(code)
    return analyze(cst.parse_module(source), source)


def calls_behind_each_backward(model: ScriptModel) -> list[set[str]]:
    return [
        {
            model.module.code_for_node(node.func)
            for node in loss_sources(model, backward.loss, backward.call)
            if isinstance(node, cst.Call)
        }
        for backward in backwards(model)
    ]


def test_a_loss_is_followed_through_the_names_it_was_bound_to():
    found = calls_behind_each_backward(
        script(
            """
            accelerator = Accelerator()
            logits = model(x)
            preds = accelerator.gather(logits)
            loss = criterion(preds, y)
            accelerator.backward(loss)
            """
        )
    )
    # the accelerator the gather goes through is what the loss is computed by, not from: its
    # construction (``Accelerator()``) is no value of the loss
    assert found == [{"criterion", "accelerator.gather", "model"}]


def test_a_loss_returned_by_a_method_is_the_loss_it_returns():
    found = calls_behind_each_backward(
        script(
            """
            class Trainer:
                def __init__(self):
                    self.accelerator = Accelerator()
                def compute_loss(self, batch):
                    return self.criterion(self.model(batch))
                def step(self, batch):
                    loss = self.compute_loss(batch)
                    self.accelerator.backward(loss)
            """
        )
    )
    assert found == [{"self.compute_loss", "self.criterion", "self.model"}]


def test_a_helper_parameter_is_what_its_callers_pass():
    found = calls_behind_each_backward(
        script(
            """
            def step(accelerator, loss):
                accelerator.backward(loss)
            def main():
                accelerator = Accelerator()
                step(accelerator, mse(model(x), y))
            """
        )
    )
    assert found == [{"mse", "model"}]


def test_a_denominator_and_a_detached_value_are_no_gradient_path():
    found = calls_behind_each_backward(
        script(
            """
            accelerator = Accelerator()
            n = accelerator.gather(count).sum()
            loss = loss_sum(model(x)) / n + scale(x).detach() * penalty(x)
            loss.backward()
            """
        )
    )
    assert found == [{"loss_sum", "model", "scale(x).detach", "penalty"}]  # not scale, gather


def test_x_equals_f_of_x_reads_the_binding_before_it():
    found = calls_behind_each_backward(
        script(
            """
            accelerator = Accelerator()
            loss = model(x)
            loss = loss.mean()
            accelerator.backward(loss)
            loss = unrelated()
            """
        )
    )
    assert found == [{"loss.mean", "model"}]


def test_a_deepspeed_engine_backwards_its_argument():
    found = calls_behind_each_backward(
        script(
            """
            accelerator = Accelerator()
            model_engine, optimizer, _, _ = deepspeed.initialize(model=net)
            model_engine.backward(criterion(model_engine(x), y))
            criterion(net(x), y).backward(retain_graph=True)
            """
        )
    )
    assert found == [{"criterion", "model_engine"}, {"criterion", "net"}]
