"""Which main-process-only forwards of a DDP model hang: 2 ranks, gloo, CPU (the experiment
behind ACC202's DDP case, `accelify/analysis/buffered_models.py`).

    python bench/ddp_main_only_forward.py train-bn-evalmode-nograd train-lin-evalmode-nograd \
        train-bn-unwrap-evalmode train-bn-evalmode train-lin-evalmode

Each case names its parts: ``train`` (three training steps on every rank first), ``bn`` (a
BatchNorm1d, else Linear layers only), ``evalmode`` (``model.eval()`` first), ``nograd``
(under ``torch.no_grad()``), ``unwrap`` (``model.module``), ``alleval`` (a no-grad forward on
every rank first). Rank 0 alone runs the forward; then both ranks meet at a barrier and
train one step. A case prints each rank's ``ok`` or error, and ``killed: hung`` where a
process was still running after 90 s.
torch 2.13 on CPU: every ``bn`` case without ``unwrap`` hangs until the process group's
timeout (15 s here: gloo's "Application timeout caused pair closure"; 30 minutes by
default); ``lin`` and ``unwrap`` run. Under load (2 shared cores) a run takes about a minute."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def run(rank, case, port, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=15))
    torch.manual_seed(0)
    bn = "bn" in case
    layers = (
        [torch.nn.Linear(4, 4)]
        + ([torch.nn.BatchNorm1d(4)] if bn else [])
        + [torch.nn.Linear(4, 1)]
    )
    model = DDP(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for _ in range(3 if "train" in case else 0):
        model(x).sum().backward()
        opt.step()
    if "alleval" in case:
        with torch.no_grad():
            model(x)
    try:
        if rank == 0:
            if "evalmode" in case:
                model.eval()
            target = model.module if "unwrap" in case else model
            if "nograd" in case:
                with torch.no_grad():
                    target(x)
            else:
                target(x)
            model.train()
        dist.barrier()
        # the next training step on every rank
        model(x).sum().backward()
        dist.barrier()
        result[rank] = "ok"
        dist.destroy_process_group()
    except Exception as e:  # a timeout or a mismatch
        result[rank] = f"{type(e).__name__}: {str(e)[:80]}"


def main():
    cases = sys.argv[1:]
    for i, case in enumerate(cases):
        with mp.Manager() as manager:
            result = manager.dict()
            ctx = mp.spawn(run, args=(case, 29600 + i, result), nprocs=2, join=False)
            deadline = time.time() + 90
            done = False
            while not done and time.time() < deadline:
                try:
                    done = ctx.join(timeout=2)
                except Exception as e:
                    result["join"] = type(e).__name__
                    break
            if not done:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                        result["killed"] = "hung"
            print(case, dict(result), flush=True)


if __name__ == "__main__":
    main()
