"""fleetmend's checkpoint protocol for a PyTorch job, in a few lines of its training script.

    import fleetmend.torch as fm

    session = fm.init()                          # the environment checked, signals, process group
    model = DistributedDataParallel(Net().to(session.device))
    job = fm.Job(model, optimizer, session=session, checkpoint_every=100, keep_last=3)
    step = job.resume()                          # the newest checkpoint that verifies, or 0
    while step < total_steps:
        loss = train_step(step)
        step += 1
        if job.step_done(step, loss, last=step == total_steps):
            break                                # SIGTERM: checkpointed, exit 0
    job.close()

A checkpoint is written through `torch.distributed.checkpoint`: every rank writes its own part
of the state into one directory, then rank 0 seals it with fleetmend's manifest (size and sha256
of every file, written last, the directory renamed into place; `fleetmend.protocol`). The
signals are agreed across ranks at a step boundary (an all-reduce of the flags), so every rank
checkpoints at the same step; the step's progress goes to the queue (hang and straggler
detection), and the checkpoint interval the queue asks for (`--checkpoint-every auto`) is taken.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .protocol import (
    InvalidCheckpoint,
    ProgressPoster,
    ProtocolEnv,
    StepExists,
    StopFlags,
    emit,
    log,
    newest_valid_checkpoint,
    prune_checkpoints,
    seal_checkpoint,
    step_dir_name,
    temp_dir_name,
    verify_checkpoint,
)

#: Steps whose compute a post's `step_seconds` is the mean of.
COMPUTE_WINDOW = 32
#: The job's own state beside the tensors (step, data cursor, RNG states), written by rank 0.
JOB_STATE_FILE = "job_state.json"
#: `torch.distributed.checkpoint`'s metadata file, kept under a name the manifest allows (names
#: starting with "." are reserved); a load sees it under its own name again.
DCP_METADATA = ".metadata"
METADATA_FILE = "dcp.metadata"


@dataclass
class Session:
    """What `init` set up: the protocol's environment, the device of this rank, and whether the
    process group is this module's to destroy."""

    env: ProtocolEnv
    flags: StopFlags
    device: torch.device
    owns_group: bool

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size


def init(backend: Optional[str] = None) -> Session:
    """Reads the protocol's environment (exits 2 naming every problem), installs the signal
    flags before the slow process group setup (an early SIGTERM is not lost), and joins the
    process group (`env://`: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) unless the script did:
    nccl on GPUs, gloo on the CPU."""
    try:
        env = ProtocolEnv.from_environ()
    except ValueError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    flags = StopFlags()
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend or ("nccl" if use_cuda else "gloo"), init_method="env://")
    return Session(env, flags, device, owns_group)


class Job:
    """The protocol around one model and optimizer: resume, checkpoints, signals, progress."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 session: Session, checkpoint_every: int = 100, keep_last: int = 3,
                 progress: Optional[ProgressPoster] = None) -> None:
        if checkpoint_every < 0:
            raise ValueError("checkpoint_every is a number of steps, 0 for none but at signals")
        self.model, self.optimizer, self.session = model, optimizer, session
        self.env = session.env
        self.checkpoint_every, self.keep_last = checkpoint_every, max(keep_last, 1)
        self.progress = progress if progress is not None else ProgressPoster.from_environ()
        #: The script's own state saved beside the tensors (a data cursor, say): JSON values.
        self.extra: Dict[str, Any] = {}
        self.start_step = 0
        self._lost = False
        self._last_step_at = time.monotonic()
        # This rank's compute, timed apart from the collectives (a straggler is measured by it:
        # under data parallelism every rank's wall time per step is the slowest one's): the
        # forward pass and the optimizer's step, which in DDP run no collective.
        self._compute = 0.0
        self._timed = False
        self._started: Optional[float] = None
        # The last steps' compute: the mean over them is what a post says. A throttled rank is
        # slowed in bursts (a cgroup's quota runs out, it waits for the next period), which a
        # single step's time misses more often than not.
        self._recent: Deque[float] = deque(maxlen=COMPUTE_WINDOW)
        # The late agreement in flight, and the interval the queue asked for, to agree next.
        self._in_flight: Optional[Tuple[Any, torch.Tensor]] = None
        self._wanted = 0
        model.register_forward_pre_hook(lambda *_: self._begin())
        model.register_forward_hook(lambda *_: self._end())
        if optimizer is not None:
            optimizer.register_step_pre_hook(lambda *_: self._begin())
            optimizer.register_step_post_hook(lambda *_: self._end())

    def _begin(self) -> None:
        self._started = time.monotonic()

    def _end(self) -> None:
        if self._started is not None:
            self._compute += time.monotonic() - self._started
            self._timed = True
            self._started = None

    # -- the state -----------------------------------------------------------------------

    def _state(self) -> Dict[str, Any]:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_state, optimizer_state = get_state_dict(self.model, optimizers)
        state: Dict[str, Any] = {"model": model_state}
        if self.optimizer is not None:
            state["optimizer"] = optimizer_state
        return state

    def _agree(self, values: List[int], op: Any) -> List[int]:
        tensor = torch.tensor(values, dtype=torch.int64, device=self.session.device)
        dist.all_reduce(tensor, op=op)
        return [int(v) for v in tensor.tolist()]

    def _agree_late(self, values: List[int]) -> List[int]:
        """Sends `values` for MAX over the ranks and returns what the previous call sent came to
        (zeros the first time)."""
        tensor = torch.tensor(values, dtype=torch.int64, device=self.session.device)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=True)
        previous, self._in_flight = self._in_flight, (work, tensor)
        if previous is None:
            return [0] * len(values)
        previous[0].wait()
        return [int(v) for v in previous[1].tolist()]

    def _broadcast(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=self.session.device)
        dist.broadcast(tensor, src=0)
        return int(tensor.item())

    # -- checkpoints -----------------------------------------------------------------------

    def save(self, step: int) -> Optional[str]:
        """Checkpoint `step` from every rank (call it on all of them): each writes its part,
        rank 0 seals it and prunes old ones. Returns its path, or None when a valid one of this
        step was there already (a job resumed at this very step)."""
        env = self.env
        temp = os.path.join(env.checkpoint_dir,
                            temp_dir_name(step, f"{env.job_id}-{env.restart_count}"))
        ready = 1
        if env.rank == 0:
            try:
                os.makedirs(env.checkpoint_dir, exist_ok=True)
                shutil.rmtree(temp, ignore_errors=True)
                os.mkdir(temp)
            except OSError as e:
                log("cannot make the checkpoint's directory", dir=temp, error=str(e))
                ready = 0
        if not self._broadcast(ready):
            raise OSError(f"rank 0 could not make {temp}")
        dcp.save(self._state(), storage_writer=dcp.FileSystemWriter(temp, sync_files=True))
        sealed = 1
        if env.rank == 0:
            try:
                with open(os.path.join(temp, JOB_STATE_FILE), "x") as out:
                    out.write(json.dumps({"step": step, "extra": self.extra}))
                    out.flush()
                    os.fsync(out.fileno())
                os.rename(os.path.join(temp, DCP_METADATA), os.path.join(temp, METADATA_FILE))
                path: Optional[str] = seal_checkpoint(env.checkpoint_dir, temp, step,
                                                      env.world_size, env.job_id)
                prune_checkpoints(env.checkpoint_dir, self.keep_last)
            except StepExists:
                shutil.rmtree(temp, ignore_errors=True)
                sealed = 2
            except Exception as e:  # every rank must learn that it failed
                log("checkpoint not written", step=step, error=repr(e))
                shutil.rmtree(temp, ignore_errors=True)
                sealed = 0
        sealed = self._broadcast(sealed)
        if sealed == 0:
            raise OSError(f"checkpoint {step} could not be sealed (rank 0 logged why)")
        return None if sealed == 2 else os.path.join(env.checkpoint_dir, step_dir_name(step))

    def resume(self) -> int:
        """Loads the newest checkpoint that verifies (rank 0 chooses, every rank loads it) and
        returns its step, or 0 when there is none. Each newer one refused is logged with why."""
        env = self.env
        chosen = -1
        if env.rank == 0:
            newest = newest_valid_checkpoint(env.checkpoint_dir)
            chosen = newest[0] if newest else -1
        chosen = self._broadcast(chosen)
        if chosen < 0:
            self.start_step = 0
            return 0
        path = os.path.join(env.checkpoint_dir, step_dir_name(chosen))
        manifest = verify_checkpoint(path) if env.rank == 0 else None
        view = tempfile.mkdtemp(prefix="fleetmend-load-")
        try:
            # The part files under their own names, the metadata under DCP's.
            names = [f["name"] for f in manifest["files"]] if manifest else os.listdir(path)
            for name in names:
                if name == "manifest.json":
                    continue
                as_name = DCP_METADATA if name == METADATA_FILE else name
                os.symlink(os.path.join(os.path.abspath(path), name), os.path.join(view, as_name))
            state = self._state()
            dcp.load(state, storage_reader=dcp.FileSystemReader(view))
        finally:
            shutil.rmtree(view, ignore_errors=True)
        set_state_dict(self.model, [self.optimizer] if self.optimizer is not None else [],
                       model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}))
        with open(os.path.join(path, JOB_STATE_FILE), "rb") as f:
            job_state = json.loads(f.read())
        if int(job_state.get("step", -1)) != chosen:
            raise InvalidCheckpoint(f"checkpoint {path}: {JOB_STATE_FILE} says step {job_state.get('step')}")
        self.extra = dict(job_state.get("extra") or {})
        self.start_step = chosen
        log("resumed", rank=env.rank, step=chosen, checkpoint=path, restart_count=env.restart_count)
        return chosen

    # -- the step boundary -----------------------------------------------------------------

    def step_done(self, step: int, loss: float, *, last: bool = False,
                  samples: Optional[int] = None) -> bool:
        """Call after every optimizer step, on every rank, with the step count done. Agrees the
        signals across ranks (a step after they arrived), writes the checkpoint that is due
        (periodic, SIGUSR1, SIGTERM, `last`), prints and posts the step's progress. True when the
        job must stop now (SIGTERM: checkpointed; exit 0)."""
        now = time.monotonic()
        wall_seconds, self._last_step_at = now - self._last_step_at, now
        # Compute where the hooks timed it, else the wall time; the mean of the last steps'.
        self._recent.append(self._compute if self._timed else wall_seconds)
        step_seconds = sum(self._recent) / len(self._recent)
        self._compute, self._timed = 0.0, False
        flags = self.session.flags
        # The signals and the interval the queue asked for are agreed a step late, by an
        # all-reduce that runs while the next step computes: every rank still acts on them at the
        # same step, and no step waits for a collective of its own.
        usr1, term, interval = self._agree_late(
            [int(flags.checkpoint_requested), int(flags.stop_requested), self._wanted])
        flags.checkpoint_requested = False
        self._wanted = 0
        if interval > 0:
            self.checkpoint_every = interval
        periodic = self.checkpoint_every > 0 and step % self.checkpoint_every == 0
        self._lost = self._lost or not math.isfinite(loss)
        wrote = None
        if usr1 or term or periodic or last:
            # Weights that gave a NaN or infinite loss on any rank are never checkpointed (a
            # restart resumes from the newest checkpoint before them): agreed now, at once.
            (lost,) = self._agree([int(self._lost)], dist.ReduceOp.MAX)
            self._lost = bool(lost)
            if not self._lost:
                wrote = self.save(step)
        line: Dict[str, Any] = {
            "job": self.env.job_id, "attempt": self.env.restart_count, "rank": self.env.rank,
            "step": step, "start_step": self.start_step,
            # JSON has no NaN: a loss that is not finite goes as null.
            "loss": loss if math.isfinite(loss) else None,
            "step_seconds": step_seconds,
            "wall_seconds": wall_seconds,
            **({"samples_per_second": samples / max(wall_seconds, 1e-9)} if samples else {}),
            **({"checkpoint_step": step} if wrote else {}),
            "at_ms": int(time.time() * 1000),
        }
        sys.stdout.flush()
        emit(sys.stdout, line)
        wanted = self.progress.post(line) if self.progress else None
        if wanted:
            self._wanted = wanted
        if term:
            log("stopping after a checkpoint (SIGTERM)", rank=self.env.rank, step=step)
        return bool(term)

    def close(self) -> None:
        """Leaves the process group if `init` joined it, once every rank is there: a rank that
        tears its group down while a peer still talks to it makes gloo's threads abort that peer
        at exit (`terminate called without an active exception`, exit -6), a finished job's rank
        then counting as failed."""
        if self._in_flight is not None:
            self._in_flight[0].wait()
            self._in_flight = None
        if self.session.owns_group and dist.is_initialized():
            try:
                dist.barrier()
            except RuntimeError as e:  # a peer already gone: nothing left to wait for
                log("leaving the process group without every rank", error=str(e))
            dist.destroy_process_group()
