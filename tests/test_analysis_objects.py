"""The analysis sees objects across calls: an attribute, a parameter and a return value are the
same object as the local they came from."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.idle_members import idle_members, sometimes_idle_members
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind, ScriptModel, analyze
from accelify.analysis.syntax import dotted, walk

HEADER = (
    "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n"
    "from accelify import Accelerator\n"
)


def script(code: str) -> ScriptModel:
    return analyze(cst.parse_module(HEADER + textwrap.dedent(code)))


def kinds(model: ScriptModel) -> dict[str, Kind]:
    return {binding.name: binding.kind for binding in model.bindings}


def test_what_a_constructor_receives_becomes_the_attribute_it_is_stored_in():
    model = script(
        """
        class Trainer:
            def __init__(self, net, loader):
                self.model = net.to("cpu")
                self.loader = loader
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        def main():
            train_loader = DataLoader(range(8))
            Trainer(nn.Linear(2, 1), train_loader)
        """
    )
    found = {b.name: b for b in model.bindings}
    assert found["self.model"].kind is Kind.MODEL and found["self.model"].received
    assert found["self.loader"].kind is Kind.DATALOADER and found["self.loader"].received
    assert found["self.loader"].sources == ["train_loader"]
    assert not found["self.optimizer"].received  # made here: where the class prepares


def test_an_attribute_that_received_a_prepared_loader_is_prepared():
    model = script(
        """
        class Evaluator:
            def __init__(self, loader):
                self.loader = loader

        def main():
            accelerator = Accelerator()
            loader = DataLoader(range(8))
            loader = accelerator.prepare(loader)
            Evaluator(loader)
        """
    )
    assert "self.loader" in model.prepared_names


def test_a_method_call_passes_objects_to_the_method_it_runs():
    model = script(
        """
        class Trainer:
            def fit(self, loader):
                self.run(loader)

            def run(self, data):
                for batch in data:
                    pass

        def main():
            loader = DataLoader(range(8))
            trainer = Trainer()
            trainer.fit(loader)
        """
    )
    facts = facts_of(model)
    loop = model.loops[0]
    assert facts.flow.kind_of("data", loop.node) is Kind.DATALOADER
    assert facts.flow.reads_loader(loop)


def test_a_factory_binds_what_it_returns_to_its_callers_names():
    model = script(
        """
        def get_loaders():
            train_loader = DataLoader(range(8))
            return train_loader, DataLoader(range(4))

        def build():
            return nn.Linear(2, 1)

        def main():
            train, val = get_loaders()
            net = build()
        """
    )
    assert {"train": Kind.DATALOADER, "val": Kind.DATALOADER, "net": Kind.MODEL}.items() <= (
        kinds(model).items()
    )


def test_an_optimizer_returned_by_a_model_method_is_an_optimizer():
    model = script(
        """
        class GPT(nn.Module):
            def configure_optimizers(self, lr):
                optimizer = torch.optim.AdamW(self.parameters(), lr=lr)
                return optimizer

        def make():
            return GPT()

        model = make()
        optimizer = model.configure_optimizers(1e-3)
        """
    )
    assert kinds(model)["optimizer"] is Kind.OPTIMIZER


def test_a_replaced_head_is_a_layer_and_its_optimizer_trains_the_whole_model():
    model = script(
        """
        model = nn.Sequential(nn.Linear(2, 4))
        model.fc = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
        """
    )
    assert "model.fc" not in kinds(model)
    (optimizer,) = model.of_kind(Kind.OPTIMIZER)
    assert parameter_owners(optimizer) == {"model"}


def test_a_dict_of_loaders_read_by_phase_is_a_loader():
    model = script(
        """
        loaders = {"train": DataLoader(range(8)), "val": DataLoader(range(4))}
        for phase in ["train", "val"]:
            for batch in loaders[phase]:
                pass
        """
    )
    assert kinds(model)["loaders"] is Kind.DATALOADER
    inner = next(loop for loop in model.loops if loop.iterable == "loaders")
    assert facts_of(model).flow.reads_loader(inner)


def test_a_module_whose_own_method_runs_backward_trains_itself():
    model = script(
        """
        class Layer(nn.Linear):
            def train(self, x):
                self(x).sum().backward()

        class Net(nn.Module):
            def forward(self, x):
                return x

        layer = Layer(4, 4)
        """
    )
    (entry,) = facts_of(model).self_training
    assert entry.name == "Layer"
    assert [b.name for b in entry.instances] == ["layer"]
    assert entry.receivers == {entry.backward_calls[0]: "self"}
    assert entry.blocker is None


def test_a_self_training_module_made_in_a_list_cannot_average_by_hand():
    """Its instances are not names the conversion can move and broadcast."""
    model = script(
        """
        class Layer(nn.Linear):
            def train(self, x):
                self(x).sum().backward()

        layers = [Layer(4, 4) for _ in range(3)]
        """
    )
    (entry,) = facts_of(model).self_training
    assert entry.blocker is not None and "not bound to a name" in entry.blocker


def test_a_self_training_module_also_trained_from_outside_is_blocked():
    model = script(
        """
        class Layer(nn.Linear):
            def train(self, x):
                self(x).sum().backward()

        layer = Layer(4, 4)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        """
    )
    (entry,) = facts_of(model).self_training
    assert entry.blocker is not None and "trains it too" in entry.blocker


def test_configure_optimizers_of_a_model_from_another_file_builds_its_optimizer():
    model = script(
        """
        from model import GPT

        model = GPT()
        optimizer = model.configure_optimizers(0.1, 6e-4)
        """
    )
    assert kinds(model) == {"model": Kind.MODEL, "optimizer": Kind.OPTIMIZER}


def test_a_dict_of_loaders_prepared_value_by_value_is_prepared():
    model = script(
        """
        accelerator = Accelerator()
        loaders = {"train": DataLoader(range(8)), "val": DataLoader(range(4))}
        loaders = {key: accelerator.prepare(loader) for key, loader in loaders.items()}
        """
    )
    assert "loaders" in model.prepared_names


def test_an_optimizer_class_looked_up_by_name_in_a_factory_trains_the_model_passed_in():
    model = script(
        """
        def build_optimizer(cfg, net):
            return getattr(torch.optim, cfg["optimizer"])(net.parameters(), lr=cfg["lr"])

        model = build_model(cfg)
        optimizer = build_optimizer(cfg, model)
        """
    )
    assert kinds(model)["optimizer"] is Kind.OPTIMIZER
    assert kinds(model)["model"] is Kind.MODEL


def test_what_a_subclass_hands_to_super_init_is_received_by_the_base_constructor():
    model = script(
        """
        class Base:
            def __init__(self, model, optimizer):
                self.model = model
                self.optimizer = optimizer

        class Child(Base):
            def __init__(self):
                model = nn.Linear(2, 2)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                super().__init__(model, optimizer)
        """
    )
    received = {b.name: b.kind for b in model.bindings if b.received}
    assert received == {"self.model": Kind.MODEL, "self.optimizer": Kind.OPTIMIZER}


def test_a_dict_of_loaders_written_in_a_super_init_call_is_a_loader_dict_of_the_base():
    from accelify.analysis.objects import is_loader_dict

    source = """
        class Base:
            def __init__(self, model, loaders):
                self.model = model
                self.loaders = loaders

        class Child(Base):
            def __init__(self, model, tl, vl):
                super().__init__(model, loaders={"train": tl, "val": VALUES})

        def main():
            tl, vl = DataLoader(range(8)), DataLoader(range(4))
            Child(nn.Linear(2, 2), tl, vl)
        """
    model = script(source.replace("VALUES", "vl"))
    loaders = next(b for b in model.bindings if b.name == "self.loaders")
    assert loaders.kind is Kind.DATALOADER and loaders.received
    assert is_loader_dict(model, loaders)
    # a dict that also holds something else (a config) is no dict of loaders
    other = script(source.replace("VALUES", "{'lr': 0.1}"))
    assert "self.loaders" not in kinds(other)


def test_a_factorys_tuple_of_loaders_bound_whole_is_a_loader_tuple():
    from accelify.analysis.objects import is_loader_tuple

    source = """
        def build_data():
            train_loader = DataLoader(range(8))
            return train_loader, SECOND

        def main():
            data = build_data()
            for batch in data[0]:
                pass
        """
    model = script(source.replace("SECOND", "DataLoader(range(4))"))
    data = next(b for b in model.bindings if b.name == "data")
    assert data.kind is Kind.DATALOADER and is_loader_tuple(model, data)
    # a tuple that also holds a number (the number of classes) is not prepared whole
    assert "data" not in kinds(script(source.replace("SECOND", "10")))


def test_what_a_subclass_forwards_through_star_args_reaches_the_base_by_position():
    model = script(
        """
        class Base:
            def __init__(self, model, optimizer, loader, epochs=3):
                self.model = model
                self.optimizer = optimizer
                self.loader = loader

        class Child(Base):
            def __init__(self, *args, smoothing=0.1, **kwargs):
                super().__init__(*args, **kwargs)

        class Tagged(Base):
            def __init__(self, tag, *args):
                super().__init__(*args)

        net = nn.Linear(2, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        train_loader = DataLoader(range(8))
        Child(net, opt, train_loader, epochs=2)
        Tagged("t", net, opt, train_loader)
        """
    )
    found = {b.name: b for b in model.bindings if b.received}
    assert {name: b.kind for name, b in found.items()} == {
        "self.model": Kind.MODEL,
        "self.optimizer": Kind.OPTIMIZER,
        "self.loader": Kind.DATALOADER,
    }
    assert found["self.loader"].sources == ["train_loader"]  # once, whichever subclass handed it


def test_a_model_known_by_its_optimizer_is_what_its_factory_returns():
    model = script(
        """
        MODELS = {"linear": nn.Linear}

        def build(cfg):
            net = MODELS[cfg.model](6, 3)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            return net, opt

        def main(cfg):
            model, optimizer = build(cfg)
        """
    )
    made = {(b.name, b.scope.name.value): b.kind for b in model.bindings}
    assert made[("model", "main")] is Kind.MODEL
    assert made[("optimizer", "main")] is Kind.OPTIMIZER


def test_self_called_in_a_model_that_trains_itself_is_a_forward_pass():
    model = script(
        """
        class Net(nn.Module):
            def fit(self, x):
                self(x).sum().backward()

            def evaluate(self, x):
                return self(x)

        class Plain(nn.Module):
            def twice(self, x):
                return self(x)
        """
    )
    flow = facts_of(model).flow
    forwards = [c for c in model.calls if dotted(c.func) == "self"]
    assert [flow.is_forward(c) for c in forwards] == [True, True, False]


def test_a_variable_named_like_a_function_of_the_module_is_not_that_function():
    model = script(
        """
        def train(model, loader):
            for x in loader:
                model(x).sum().backward()

        class Pairs:
            def __init__(self, root, train, transform=None):
                self.data = load(root, train=train)

        def fit(train, loader):
            (train, evaluate) = (train, None)
            return train(loader)

        def main():
            spawn(train)
            sort(items, key=lambda train: train.size)
            return Pairs("data", train=True), fit(train, None), train(None, None)
        """
    )
    graph = facts_of(model).calls
    train = model.functions["train"]
    main = model.line(model.functions["main"])
    assert [model.line(node) for node in graph.references(train)] == [main + 1, main + 3]
    assert [model.line(call) for call in graph.callers(train)] == [main + 3]


def test_calling_an_instance_of_a_plain_class_runs_its_dunder_call():
    model = script(
        """
        import torch.nn as nn

        class EarlyStopping:
            def __call__(self, loss, model):
                save(model.state_dict())

        class Net(nn.Module):
            def __call__(self, x):
                return x

        def fit(model, net):
            stopper = EarlyStopping()
            stopper(0.0, model)
            net = Net()
            net(1)
        """
    )
    graph = facts_of(model).calls
    fit = model.functions["fit"]
    dunder = [
        n for n in model.orders if isinstance(n, cst.FunctionDef) and n.name.value == "__call__"
    ]
    assert [model.line(call) for call in graph.callers(dunder[0])] == [model.line(fit) + 2]
    assert graph.callers(dunder[1]) == []  # a module's call runs forward through nn.Module


def test_parameters_the_forward_never_computes_with_are_idle():
    model = script(
        """
        class Base(nn.Module):
            def head(self, x):
                return self.out(x)

        class Net(Base):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(4, 4)
                self.out = nn.Linear(4, 1)
                self.unused = nn.Linear(4, 4)
                self.anchor = nn.Parameter(torch.empty(0))
                self.drop = nn.Dropout(0.1)
                self.act = nn.ReLU()

            def forward(self, x):
                x = x.to(self.anchor.device)
                return self.head(self.body(x))

        class Dynamic(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                return getattr(self, "a")(x)

        class Handed(Dynamic):
            def forward(self, x):
                return run_layers(self, x)
        """
    )
    assert [name for name, _ in idle_members(model, "Net")] == ["unused", "anchor"]
    assert idle_members(model, "Dynamic") == []  # getattr(self, ...): not followed
    assert idle_members(model, "Handed") == []  # self handed to a function
    assert idle_members(model, "Base") == []  # no __init__ or forward of its own


def test_members_a_forward_computes_with_only_in_some_calls_are_sometimes_idle():
    model = script(
        """
        class Heads(nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk = nn.Linear(4, 8)
                self.cls = nn.Linear(8, 2)
                self.aux = nn.Linear(8, 1)
                self.extra = nn.Linear(8, 1)
                self.late = nn.Linear(8, 1)
                self.noise = nn.Linear(8, 8)

            def forward(self, x, with_aux=True, scale=None):
                h = self.trunk(x)
                if self.training:
                    h = self.noise(h)
                out = self.cls(h)
                aux = self.aux(h) if with_aux else None
                extra = scale is not None and self.extra(h)
                if not with_aux:
                    return out
                return out, aux, extra, self.late(h)

        class Plain(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                if x.dim() == 1:
                    raise ValueError("batch expected")
                return self.fc(x)
        """
    )
    sometimes = [name for name, _ in sometimes_idle_members(model, "Heads")]
    assert sometimes == ["aux", "extra", "late"]  # ``if self.training:`` runs in every step
    assert idle_members(model, "Heads") == []  # each is used in some call
    assert sometimes_idle_members(model, "Plain") == []  # a raise ends the step anyway


def _printing(code: str) -> list[str]:
    model = script(code)
    return sorted(dotted(call.func) or "" for call in facts_of(model).print_alias_calls)


def test_a_name_or_attribute_that_certainly_holds_print_prints():
    assert _printing(
        """
        log = print

        class Stopper:
            def __init__(self, patience, trace_func=print):
                self.trace_func = trace_func

            def step(self):
                self.trace_func("waiting")

        def report(model, sink=print):
            sink("done")
            def inner(sink):
                sink("shadowed")

        log("start")
        stopper = Stopper(3)
        report(None)
        """
    ) == ["log", "self.trace_func", "sink"]


def test_a_caller_that_passes_another_callable_keeps_the_call():
    assert (
        _printing(
            """
        import logging

        class Stopper:
            def __init__(self, trace_func=print):
                self.trace_func = trace_func

            def step(self):
                self.trace_func("waiting")

        def report(sink=print):
            sink("done")

        stopper = Stopper(trace_func=logging.info)
        report(*[])
        log = print
        log = logging.info
        log("x")
        """
        )
        == []
    )


def test_a_field_of_a_record_is_the_object_its_construction_was_handed():
    model = script(
        """
        import collections
        import typing

        Pair = collections.namedtuple("Pair", "train val")

        class Holder(typing.NamedTuple):
            model: nn.Module
            loader: DataLoader

        def evaluate(pair, holder):
            for x in pair.val:
                holder.model(x)

        def main():
            train_loader = DataLoader(range(8))
            val_loader = DataLoader(range(4))
            net = nn.Linear(2, 1)
            evaluate(Pair(train_loader, val=val_loader), Holder(net, train_loader))
            pair = Pair(train_loader, val=val_loader)
            holder = Holder(net, train_loader)
            evaluate(pair, holder)
        """
    )
    flow = facts_of(model).flow
    loop = next(loop for loop in model.loops if loop.iterable == "pair.val")
    assert flow.kind_of("pair.val", loop.node) is Kind.DATALOADER
    assert flow.origins("pair.val", loop.node) == {"val_loader"}
    assert flow.kind_of("holder.model", loop.node) is Kind.MODEL
    assert flow.kind_of("pair.test", loop.node) is None  # no such field


def test_a_factory_returning_nested_tuples_binds_each_name_at_its_position():
    model = script(
        """
        def build():
            model = nn.Linear(2, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            return (model, optimizer), (DataLoader(range(8)), DataLoader(range(4)))

        def main():
            (net, opt), (train_dl, val_dl) = build()
            models, loaders = build()
        """
    )
    found = kinds(model)
    assert found["net"] is Kind.MODEL and found["opt"] is Kind.OPTIMIZER
    assert found["train_dl"] is Kind.DATALOADER and found["val_dl"] is Kind.DATALOADER
    assert "models" not in found and "loaders" not in found  # tuples, not one object each


def test_a_factory_that_chooses_between_two_of_one_kind_makes_that_kind():
    model = script(
        """
        def make_loader(data, train):
            return DataLoader(data, shuffle=True) if train else DataLoader(data)

        def make_head(wide):
            return nn.Linear(2, 8) if wide else "no head"

        make_model = lambda: nn.Linear(2, 1)

        def main():
            loader = make_loader(range(8), True)
            head = make_head(False)
            net = make_model()
        """
    )
    found = kinds(model)
    assert found["loader"] is Kind.DATALOADER
    assert found["net"] is Kind.MODEL
    assert "head" not in found  # a model or a string: not followed


def test_a_name_is_bound_by_plain_augmented_and_annotated_assignments_and_by_with():
    model = script(
        """
        rank = int(os.environ["RANK"])
        rank += offset
        world: int = 2
        limit: int
        with open("log.txt") as handle:
            pass
        """
    )
    values = {
        name: [model.module.code_for_node(v) for _, v in model.index.values_bound_to(name)]
        for name in ("rank", "world", "limit", "handle")
    }
    assert values == {
        "rank": ['int(os.environ["RANK"])', "offset"],
        "world": ["2"],
        "limit": [],  # declared, never bound
        "handle": ['open("log.txt")'],
    }


def test_a_name_is_also_set_by_a_walrus_a_loop_target_and_a_parameter():
    model = script(
        """
        def worker(rank, size=2):
            if (count := size * 2) > 1:
                pass
            for rank in range(size):
                pass
            total = sum(part for part in range(count))
            rank = 0
        """
    )
    values = {
        name: [model.module.code_for_node(v) for _, v in model.index.values_set_to(name)]
        for name in ("rank", "size", "count", "part", "total")
    }
    assert values == {
        "rank": ["0", "rank, ", "range(size)"],  # assigned, then the parameter, then the loop
        "size": ["size=2"],  # the parameter itself: what a caller passes
        "count": ["size * 2"],
        "part": ["range(count)"],
        "total": ["sum(part for part in range(count))"],
    }
    assert {"rank", "size", "count", "part", "total"} <= model.index.names_set()
    assert "worker" not in model.index.names_set()  # a def binds no value


def test_the_loop_around_a_statement_is_looked_for_in_its_own_function_only():
    model = script(
        """
        for epoch in range(3):
            def helper():
                stop = True
            while True:
                for batch in loader:
                    break
        """
    )
    [stop] = [a for a in model.assignments if dotted(a.targets[0].target) == "stop"]
    [brk] = model.index.of_type(cst.Break)
    [inner] = [f for f in model.index.of_type(cst.For) if dotted(f.target) == "batch"]
    assert model.index.enclosing_loop(stop) is None  # the outer loop runs the def, not the body
    assert model.index.enclosing_loop(brk) is inner


def test_a_process_rank_is_told_from_other_ranks_by_its_words():
    """A rank word with any words before it is this process's (``myrank``, Megatron's
    ``get_tensor_model_parallel_rank``), unless they make it a matrix's, an adapter's or a
    metric's rank; a ranking and a mode every rank shares are no rank."""
    from accelify.analysis.names import is_process_rank_name

    process = [
        "rank", "local_rank", "myrank", "localrank", "is_master_rank", "main_rank",
        "is_first_rank", "mpu.get_tensor_model_parallel_rank", "get_pipeline_model_parallel_rank",
        "get_context_parallel_rank", "dist.get_rank", "rank0", "is_rank_zero", "process_index",
        "is_main_process", "is_world_process_zero", "OMPI_COMM_WORLD_RANK",
    ]  # fmt: skip
    other = [
        "lora_rank", "reciprocal_rank", "ranking_loss", "ranks", "rank_r", "rank0_only",
        "main_process_only", "main_process_first", "torch.linalg.matrix_rank", "tensor_rank",
        "mean_rank", "low_rank", "svd_rank", "num_rank", "frank", "crank",
    ]  # fmt: skip
    assert [name for name in process if not is_process_rank_name(name)] == []
    assert [name for name in other if is_process_rank_name(name)] == []


def test_an_annotated_assignment_binds_as_a_plain_one():
    """``self._model: nn.Module = model`` is ``self._model = model`` to every analysis that
    follows assignments; ``epochs: int`` with no value binds nothing."""
    typed = script(
        """
        class Trainer:
            def __init__(self, net, loader):
                self._model: nn.Module = net
                self._loader: DataLoader = loader
                self.optimizer: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

        def main():
            epochs: int
            train_loader: DataLoader = DataLoader(range(8))
            trainer = Trainer(nn.Linear(2, 2), train_loader)
        """
    )
    plain = script(
        """
        class Trainer:
            def __init__(self, net, loader):
                self._model = net
                self._loader = loader
                self.optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

        def main():
            train_loader = DataLoader(range(8))
            trainer = Trainer(nn.Linear(2, 2), train_loader)
        """
    )
    for name in ("self._model", "self._loader", "self.optimizer", "train_loader"):
        (typed_assign,) = typed.index.assignments_to(name)
        (plain_assign,) = plain.index.assignments_to(name)
        assert isinstance(typed_assign, cst.AnnAssign) and isinstance(plain_assign, cst.Assign)
        assert dotted(typed_assign.target) == name
        assert typed.module.code_for_node(typed_assign.value) == plain.module.code_for_node(
            plain_assign.value
        )
        # once each, as the plain one: not again as an annotated statement
        assert len(typed.index.values_bound_to(name.removeprefix("self."))) <= 1
    assert typed.index.assignments_to("epochs") == []
    assert typed.index.values_bound_to("epochs") == []
    init = typed.classes["Trainer"].body.body[0]
    assert [dotted(a.target) for a in typed.index.own_assignments(init)] == [
        "self._model",
        "self._loader",
        "self.optimizer",
    ]
    assert kinds(typed) == kinds(plain)


def test_a_factorys_tuple_handed_to_a_constructor_binds_the_attributes_it_is_unpacked_into():
    code = """
        def make_loaders():
            return DataLoader(range(8)), DataLoader(range(4))

        class Trainer:
            def __init__(self, net, loaders):
                self.net = net
                self.train_loader, self.val_loader = loaders

        def main():
            {body}
        """
    handed = [
        "Trainer(nn.Linear(2, 1), make_loaders())",
        "loaders = make_loaders()\n            Trainer(nn.Linear(2, 1), loaders)",
    ]
    for body in handed:
        found = kinds(script(code.format(body=body)))
        assert found["self.train_loader"] is Kind.DATALOADER, body
        assert found["self.val_loader"] is Kind.DATALOADER, body
    rebound = (
        "loaders = make_loaders()\n            loaders = (1, 2)\n"
        "            Trainer(nn.Linear(2, 1), loaders)"
    )
    found = kinds(script(code.format(body=rebound)))
    assert "self.train_loader" not in found and "self.val_loader" not in found


def test_an_attribute_set_from_a_local_is_that_local_and_the_one_prepared():
    code = """
        class Fitter:
            def __init__(self):
                model = nn.Linear(4, 1)
                self.model = model
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                self.loader = DataLoader(range(8))
                {after}

            def fit(self):
                for x in self.loader:
                    loss = self.model(x).sum()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
        """
    assert kinds(script(code.format(after="")))["self.model"] is Kind.MODEL
    from accelify.convert import convert_source

    def converted(after: str):
        source = HEADER.replace("from accelify import Accelerator\n", "")
        return convert_source(
            (source + textwrap.dedent(code.format(after=after))).encode(), "fit.py"
        )

    conversion = converted("")
    assert "self.model, self.optimizer, self.loader = self.accelerator.prepare(" in (
        conversion.converted.decode()
    )
    assert "model" not in conversion.prepared and not conversion.reviews
    # the local read after the prepare: it stays the prepared one, and the attribute is reviewed
    conversion = converted("print(model)")
    assert "model" in conversion.prepared and "self.model" not in conversion.prepared
    assert any("self.model is left the bare model" in note.text for note in conversion.reviews)


def test_a_backward_whose_result_is_bound_is_a_models_own_method_not_autograds():
    model = script(
        """
        class Flow(nn.Module):
            def backward(self, z):
                for layer in self.layers:
                    z, _ = layer.backward(z)
                return z

        def train(model, loader, optimizer):
            for x in loader:
                loss = model(x).mean()
                loss.backward()
                optimizer.step()
            samples = model.backward(torch.randn(4, 2))
        """
    )
    assert [dotted(call.func) for call in model.backward_calls] == ["loss.backward"]
    assert [loop.trains for loop in model.loops] == [False, True]


def test_a_function_of_a_class_called_only_through_the_class_has_no_instance():
    model = script(
        """
        class Trainer:
            def train_model(model, loader):
                for x in loader:
                    model(x).mean().backward()

            @torch.no_grad()
            def evaluate(model, loader):
                return sum(model(x).sum() for x in loader)

            def fit(self, loader):
                Trainer.train_model(self.model, loader)

            def summary(model):
                return 0

        Trainer.train_model(model=net, loader=data)
        Trainer.evaluate(net, data)
        Trainer.fit(trainer, data)
        """
    )
    graph = facts_of(model).calls
    methods = {f.name.value: f for f in walk(model.module) if isinstance(f, cst.FunctionDef)}
    assert graph.without_instance(methods["train_model"])
    assert graph.without_instance(methods["evaluate"])
    assert not graph.without_instance(methods["fit"])  # its first parameter is self
    assert not graph.without_instance(methods["summary"])  # never called


HELD = """
from types import SimpleNamespace

def evaluate(s, model):
    for x, y in {read}:
        model(x)

def main():
    model = nn.Linear(2, 2)
    val_loader = DataLoader(range(8))
    s = {held}
    {later}
    evaluate(s, model)
"""


def _loop_read(read: str, held: str, later: str = "pass") -> tuple[bool, set[str | None]]:
    """Whether the flow sees ``evaluate``'s loop read a DataLoader, and where it came from."""
    model = script(HELD.format(read=read, held=held, later=later))
    facts = facts_of(model)
    loop = model.loops[0]
    entry = facts.flow.returned_entry_read(loop)
    name, place = entry or (loop.iterable, loop.node)
    return facts.flow.reads_loader(loop), facts.flow.origins(name, place)


def test_a_namespace_field_is_the_object_it_was_built_with():
    reads, origins = _loop_read("s.val_loader", "SimpleNamespace(val_loader=val_loader)")
    assert reads and origins == {"val_loader"}


def test_a_namespace_field_set_again_is_not_followed():
    reads, origins = _loop_read(
        "s.val_loader", "SimpleNamespace(val_loader=val_loader)", "s.val_loader = range(3)"
    )
    assert not reads and "val_loader" not in origins


def test_a_dict_entry_is_the_object_it_was_built_with():
    for held in ('{"val_loader": val_loader}', "dict(val_loader=val_loader)"):
        reads, origins = _loop_read('s["val_loader"]', held)
        assert reads and origins == {"val_loader"}, held


def test_a_dict_entry_stored_again_is_not_followed():
    reads, origins = _loop_read(
        's["val_loader"]', '{"val_loader": val_loader}', 's["val_loader"] = range(3)'
    )
    assert not reads and "val_loader" not in origins


def test_a_tuple_of_loaders_one_of_which_is_evaluated_in_a_comprehension_is_left_whole():
    """One prepare call shards every loader of the tuple: an evaluation of one of them that no
    gather fits (a sum over a generator) keeps the tuple as it is, with the review line that
    says why, or the printed total would cover one rank's shard (n 16 of 32 on 2 ranks)."""
    from accelify.convert import Options, convert_source

    source = textwrap.dedent(
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        def build_data():
            x = torch.randn(16, 3)
            train_loader = DataLoader(TensorDataset(x, x), batch_size=4)
            val_loader = DataLoader(TensorDataset(x, x), batch_size=4)
            return train_loader, val_loader

        def main():
            data = build_data()
            model = nn.Linear(3, 3)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in data[0]:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
            with torch.no_grad():
                n = sum(y.numel() for x, y in data[1] if model(x).sum() > -1e9)
            print(n)
        """
    )
    converted = convert_source(source.encode(), "train.py", Options())
    assert b"prepare(*data)" not in converted.converted
    assert any("data is evaluated in a comprehension" in line.text for line in converted.reviews), (
        converted.reviews
    )


def test_an_attribute_kept_from_a_local_is_that_local():
    """``self.scheduler = scheduler`` after the constructor's prepare returned ``scheduler``:
    the attribute holds what the local held there (the scheduler its annotation names), and its
    step in another method is that prepared scheduler's, named by the local."""
    model = script(
        """
        class Trainer:
            def __init__(self, model, loader, scheduler: torch.optim.lr_scheduler.LRScheduler):
                self.accelerator = Accelerator()
                model, loader, scheduler = self.accelerator.prepare(model, loader, scheduler)
                self.model, self.loader, self.scheduler = model, loader, scheduler

            def epoch(self):
                self.scheduler.step()
        """
    )
    flow = facts_of(model).flow
    step = next(c for c in model.calls if dotted(c.func) == "self.scheduler.step")
    assert flow.kind_of("self.scheduler", step) is Kind.SCHEDULER
    [found] = flow.scheduler_steps({"scheduler"})
    assert (found.scheduler, found.kept) == ("scheduler", True)


def test_a_class_picked_at_run_time_handed_parameters_and_stepped_is_an_optimizer():
    model = script(
        """
        import torch_ema

        def train(config, args):
            model = nn.Linear(2, 1)
            opt = config["optimizer"](model.parameters(), lr=0.1)
            optimizer_cls = getattr(torch.optim, args.optimizer)
            second = optimizer_cls(params=model.parameters())
            ema = torch_ema.ExponentialMovingAverage(model.parameters(), decay=0.9)
            never_stepped = config["optimizer"](model.parameters())
            for _ in range(2):
                opt.step()
                second.step()
                ema.step()
        """
    )
    found = kinds(model)
    assert found["opt"] is Kind.OPTIMIZER and found["second"] is Kind.OPTIMIZER
    assert "ema" not in found  # a library's class is what its name says
    assert "never_stepped" not in found  # handed parameters, never stepped: not known to train


def test_a_tuple_of_loaders_handed_on_is_followed_to_each_place_it_is_read():
    model = script(
        """
        def make_loaders():
            loaders = (DataLoader(a), DataLoader(b), DataLoader(c))
            return loaders

        class Base:
            def __init__(self, loaders):
                self.loaders = loaders
                first, second, _ = self.loaders
                self.train_loader = first
                self.val_loader = second
                self.test_loader = self.loaders[2]

        class Trainer(Base):
            def __init__(self, loaders):
                super().__init__(loaders)

        class Rebinding:
            def __init__(self, loaders):
                if not loaders:
                    loaders = make_loaders()
                self.a, self.b, self.c = loaders

        Trainer(make_loaders())
        Rebinding(make_loaders())
        """
    )
    found = kinds(model)
    for name in ("self.train_loader", "self.val_loader", "self.test_loader"):
        assert found[name] is Kind.DATALOADER, name
    assert "self.a" not in found  # which tuple it holds depends on the branch taken


def test_loaders_a_data_class_hands_out_through_a_method_are_loaders_where_unpacked():
    model = script(
        """
        class Runner:
            def __init__(self, data):
                self._train = DataLoader(data, shuffle=True)
                self._val = DataLoader(data)

            def loaders(self):
                return self._train, self._val

        class Base:
            def __init__(self, data):
                self._train = DataLoader(data, shuffle=True)

            def loaders(self):
                return self._train, self._train

        class Trainer(Base):
            def __init__(self, data):
                super().__init__(data)
                self.model = nn.Linear(2, 1)

        train, val = Runner(data).loaders()
        mine, theirs = Trainer(data).loaders()
        """
    )
    found = kinds(model)
    assert found["train"] is Kind.DATALOADER and found["val"] is Kind.DATALOADER
    # a trainer that may prepare them hands back the prepared ones: not loaders to prepare
    assert "mine" not in found and "theirs" not in found
