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
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

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
        signals across ranks, writes the checkpoint that is due (periodic, SIGUSR1, SIGTERM,
        `last`), prints and posts the step's progress. True when the job must stop now (SIGTERM:
        checkpointed; exit 0)."""
        now = time.monotonic()
        step_seconds, self._last_step_at = now - self._last_step_at, now
        flags = self.session.flags
        periodic = self.checkpoint_every > 0 and step % self.checkpoint_every == 0
        usr1, term, periodic_any, lost, is_last = self._agree(
            [int(flags.checkpoint_requested), int(flags.stop_requested), int(periodic),
             int(not math.isfinite(loss)), int(last)], dist.ReduceOp.MAX)
        flags.checkpoint_requested = False
        # Weights that gave a NaN or infinite loss on any rank are never checkpointed: a restart
        # resumes from the newest checkpoint before them.
        self._lost = self._lost or bool(lost)
        wrote = None
        if (usr1 or term or periodic_any or is_last) and not self._lost:
            wrote = self.save(step)
        line: Dict[str, Any] = {
            "job": self.env.job_id, "attempt": self.env.restart_count, "rank": self.env.rank,
            "step": step, "start_step": self.start_step,
            # JSON has no NaN: a loss that is not finite goes as null.
            "loss": loss if math.isfinite(loss) else None,
            "step_seconds": step_seconds,
            **({"samples_per_second": samples / max(step_seconds, 1e-9)} if samples else {}),
            **({"checkpoint_step": step} if wrote else {}),
            "at_ms": int(time.time() * 1000),
        }
        sys.stdout.flush()
        emit(sys.stdout, line)
        wanted = self.progress.post(line) if self.progress else None
        if wanted:
            self.checkpoint_every = wanted
        if term:
            log("stopping after a checkpoint (SIGTERM)", rank=self.env.rank, step=step)
        return bool(term)

    def close(self) -> None:
        """Leaves the process group if `init` joined it."""
        if self.session.owns_group and dist.is_initialized():
            dist.destroy_process_group()
