#!/usr/bin/env python3
"""A PyTorch DDP training script under fleetmend's checkpoint protocol (the `fleetmend` Python
package, `pip install ./python`).

Run one process per rank, as `fleetmend submit` starts them or torchrun does on each node:

    fleetmend submit --nodes 4 --checkpoint-dir /shared/ckpt/demo --max-restarts 10 -- \\
        python3 train_ddp.py --steps 1000 --checkpoint-every 100

The model is a small MLP regression, seeded and deterministic on the CPU (gloo; nccl on GPUs):
the same steps give the same weights bit for bit, however often the job was stopped and resumed.
At the end every rank prints `{"event": "done", "step", "loss", "weights_sha256"}` (a digest of the
model's parameters), the line `fleetmend up`'s scenarios compare with an uninterrupted run.
"""

import argparse
import hashlib
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import fleetmend.torch as fm


def batch(seed, step, rank, size):
    """The batch of (seed, step, rank): a resumed run sees the same data."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 4099 + rank)
    x = torch.randn(size, 64, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def weights_sha256(model):
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def build(seed, device):
    """The model under DDP and its optimizer, seeded."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    model = DistributedDataParallel(net.to(device))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, optimizer, args, step, rank, device):
    """One step; its loss."""
    x, y = batch(args.seed, step, rank, args.batch_size)
    out = F.mse_loss(model(x.to(device)), y.to(device))
    optimizer.zero_grad(set_to_none=True)
    out.backward()
    optimizer.step()
    if args.step_seconds:
        time.sleep(args.step_seconds)
    return float(out.detach())


def plain(args):
    """The same training with torch alone (no checkpoints, signals or progress): the baseline of
    the protocol's overhead (scripts/bench-torch)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    rank, device = dist.get_rank(), torch.device("cpu")
    model, optimizer = build(args.seed, device)
    started, loss = time.monotonic(), None
    for step in range(args.steps):
        loss = train_step(model, optimizer, args, step, rank, device)
    done = {"event": "done", "step": args.steps, "loss": loss, "rank": rank,
            "train_seconds": time.monotonic() - started,
            "weights_sha256": weights_sha256(model.module)}
    fm.emit(sys.stdout, done)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps; 0: only on signals and at the end")
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (a slower job to watch)")
    parser.add_argument("--plain", action="store_true", help="torch alone, no fleetmend: the overhead baseline")
    args = parser.parse_args(argv)
    if args.plain:
        return plain(args)

    session = fm.init()
    model, optimizer = build(args.seed, session.device)
    job = fm.Job(model, optimizer, session=session, checkpoint_every=args.checkpoint_every,
                 keep_last=args.keep_last)
    step = job.resume()
    loss = job.extra.get("loss")
    started, first = time.monotonic(), step
    while step < args.steps:
        loss = train_step(model, optimizer, args, step, session.rank, session.device)
        job.extra["loss"] = loss
        step += 1
        if job.step_done(step, loss, last=step == args.steps, samples=args.batch_size):
            job.close()
            return 0
    done = {"event": "done", "step": step, "loss": loss, "rank": session.rank,
            "train_seconds": time.monotonic() - started, "steps_trained": step - first,
            "weights_sha256": weights_sha256(model.module)}
    fm.emit(sys.stdout, done)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
