#!/usr/bin/env python3
"""A PyTorch DDP training script that speaks fleetmend's checkpoint protocol.

Run one process per rank, as `fleetmend submit` (or torchrun) starts them:

    fleetmend submit --nodes 4 --checkpoint-dir /shared/ckpt/demo --max-restarts 10 -- \\
        python3 train_ddp.py --steps 1000 --checkpoint-every 100

What it does (docs/checkpoint-protocol.md explains the protocol):
- reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, FLEETMEND_JOB_ID,
  FLEETMEND_CHECKPOINT_DIR and FLEETMEND_RESTART_COUNT, and refuses to start, naming every
  missing or bad one;
- SIGUSR1 and SIGTERM only set flags; at each step boundary the ranks agree on the flags with an
  all_reduce (MAX), so every rank checkpoints at the same step even when the signals arrived at
  slightly different times;
- rank 0 writes `step-<N>/` (every file fsynced, `manifest.json` last, the directory renamed into
  place) every --checkpoint-every steps, on SIGUSR1 (then trains on), on SIGTERM (then every rank
  exits 0), and at the end;
- on start, every rank resumes from the newest checkpoint whose manifest and files verify; refused
  ones are logged with the reason.

The protocol part (environment, checkpoint writing, verification, retention, signal flags) is
plain Python and runs without torch; `--backend fake` trains a stand-in model in pure Python so
the protocol can be exercised (and is, by tests/tests/pytorch_example.rs) on a machine without
torch. `--backend torch` (the default) needs torch.
"""

import argparse
import hashlib
import io
import json
import math
import os
import random
import shutil
import signal
import sys
import time

# ---------------------------------------------------------------------------------------------
# The protocol (no torch)

RANK, WORLD_SIZE, LOCAL_RANK = "RANK", "WORLD_SIZE", "LOCAL_RANK"
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
JOB_ID, CHECKPOINT_DIR = "FLEETMEND_JOB_ID", "FLEETMEND_CHECKPOINT_DIR"
RESTART_COUNT = "FLEETMEND_RESTART_COUNT"
#: Every variable of the protocol, in the order fleetmend documents them.
PROTOCOL_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, JOB_ID, CHECKPOINT_DIR,
                 RESTART_COUNT)

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
STEP_PREFIX = "step-"
TEMP_PREFIX = ".tmp-step-"
STEP_DIGITS = 8
IO_BYTES = 1 << 20


def log(message, **fields):
    """One JSON line on stderr (stdout carries the progress lines)."""
    print(json.dumps({"msg": message, **fields}), file=sys.stderr, flush=True)


class ProtocolEnv:
    """What a rank learns from its environment."""

    def __init__(self, rank, world_size, local_rank, master_addr, master_port, job_id,
                 checkpoint_dir, restart_count):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.job_id, self.checkpoint_dir = job_id, checkpoint_dir
        self.restart_count = restart_count

    @classmethod
    def from_environ(cls, environ=None):
        """Reads the protocol's variables; raises ValueError naming every problem at once."""
        environ = os.environ if environ is None else environ
        problems, values = [], {}
        for var in PROTOCOL_VARS:
            value = environ.get(var)
            if value is None:
                problems.append(f"{var} is not set")
            elif value == "":
                problems.append(f"{var}={value!r} is empty")
            else:
                values[var] = value

        def number(var, limit):
            if var not in values:
                return None
            text = values[var]
            if not text.isdigit() or int(text) > limit:
                problems.append(f"{var}={text!r} is not a whole number from 0 to {limit}")
                return None
            return int(text)

        rank = number(RANK, 2**32 - 1)
        world_size = number(WORLD_SIZE, 2**32 - 1)
        local_rank = number(LOCAL_RANK, 2**32 - 1)
        master_port = number(MASTER_PORT, 65535)
        restart_count = number(RESTART_COUNT, 2**32 - 1)
        if world_size == 0:
            problems.append(f"{WORLD_SIZE}='0' must be at least 1")
        if master_port == 0:
            problems.append(f"{MASTER_PORT}='0' is not a port to connect to")
        if world_size:
            for var, index in ((RANK, rank), (LOCAL_RANK, local_rank)):
                if index is not None and index >= world_size:
                    problems.append(f"{var}={str(index)!r} must be less than {WORLD_SIZE}={world_size}")
        if problems:
            raise ValueError("cannot read the checkpoint protocol's environment: " + "; ".join(problems))
        return cls(rank, world_size, local_rank, values[MASTER_ADDR], master_port, values[JOB_ID],
                   values[CHECKPOINT_DIR], restart_count)


def step_dir_name(step):
    """`step-00000120`: zero-padded so that names sort like steps."""
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step_dir_name(name):
    """The step of a `step-<digits>` name, or None for any other name."""
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX):]
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    return int(digits)


def file_name_problem(name):
    """Why `name` cannot be a checkpoint file, or None."""
    if not name:
        return "the name is empty"
    if name == MANIFEST_FILE:
        return "the manifest's name is reserved"
    if name.startswith("."):
        return "names starting with '.' are reserved"
    if any(c in name for c in "/\\\0"):
        return "a name is one path component"
    return None


class InvalidCheckpoint(Exception):
    """A checkpoint directory that must not be resumed from; the message says why."""


class StepExists(Exception):
    """A valid checkpoint of this step exists already (it is left as it is)."""


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(checkpoint_dir, step, world_size, job_id, files):
    """Writes checkpoint `step` into `checkpoint_dir` and returns its path.

    `files` maps each file name to its contents: bytes, or a function that writes to the binary
    file object it is given (for large state, streamed). Every file is fsynced, `manifest.json`
    (size and sha256 of every file) is written last, the temporary directory is renamed to
    `step-<N>` and the parent fsynced: a crash at any point leaves either no `step-<N>` or a
    complete one. An invalid `step-<N>` in the way is replaced; a valid one raises StepExists.
    """
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    for name in files:
        problem = file_name_problem(name)
        if problem:
            raise ValueError(f"cannot add {name!r} to a checkpoint: {problem}")
    os.makedirs(checkpoint_dir, exist_ok=True)
    temp = os.path.join(checkpoint_dir,
                        f"{TEMP_PREFIX}{step:0{STEP_DIGITS}d}-{os.getpid()}-{random.getrandbits(64):016x}")
    os.mkdir(temp)
    try:
        entries = []
        for name in sorted(files):
            contents = files[name]
            digest, size = hashlib.sha256(), 0
            with open(os.path.join(temp, name), "xb") as out:
                def write(data):
                    nonlocal size
                    digest.update(data)
                    size += len(data)
                    out.write(data)
                if callable(contents):
                    contents(_HashingFile(write))
                else:
                    view = memoryview(contents)
                    for start in range(0, len(view), IO_BYTES):
                        write(view[start:start + IO_BYTES])
                out.flush()
                os.fsync(out.fileno())
            entries.append({"name": name, "size": size, "sha256": digest.hexdigest()})
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "world_size": world_size,
            "job_id": job_id,
            "created_unix_ms": int(time.time() * 1000),
            "files": entries,
        }
        with open(os.path.join(temp, MANIFEST_FILE), "x") as out:
            out.write(json.dumps(manifest, indent=2) + "\n")
            out.flush()
            os.fsync(out.fileno())
        _fsync_dir(temp)
        final = os.path.join(checkpoint_dir, step_dir_name(step))
        if os.path.lexists(final):
            try:
                verify_checkpoint(final)
            except InvalidCheckpoint as reason:
                log("replacing an invalid checkpoint of the same step", dir=final, reason=str(reason))
                aside = os.path.join(checkpoint_dir, f"{TEMP_PREFIX}{step:0{STEP_DIGITS}d}-{os.getpid()}-"
                                                     f"{random.getrandbits(64):016x}-replaced")
                os.rename(final, aside)
                shutil.rmtree(aside, ignore_errors=True)
            else:
                raise StepExists(f"a valid checkpoint {final} exists already")
        os.rename(temp, final)
        _fsync_dir(checkpoint_dir)
        return final
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


class _HashingFile(io.RawIOBase):
    """The binary file object a streaming writer gets: whatever it writes is hashed and counted."""

    def __init__(self, write):
        super().__init__()
        self._write = write

    def writable(self):
        return True

    def write(self, data):
        data = bytes(data)
        self._write(data)
        return len(data)


def verify_checkpoint(path):
    """Checks `path` as fleetmend's readers do and returns its manifest; raises InvalidCheckpoint."""
    step = parse_step_dir_name(os.path.basename(os.path.normpath(path)))
    if step is None:
        raise InvalidCheckpoint(f"checkpoint {path}: the directory name is not step-<N>")
    try:
        with open(os.path.join(path, MANIFEST_FILE), "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise InvalidCheckpoint(f"checkpoint {path}: no {MANIFEST_FILE} (an unfinished write)") from None
    except (OSError, ValueError) as e:
        raise InvalidCheckpoint(f"checkpoint {path}: cannot read {MANIFEST_FILE}: {e}") from None
    try:
        version, manifest_step, entries = manifest["format_version"], manifest["step"], manifest["files"]
        names = [(entry["name"], int(entry["size"]), str(entry["sha256"])) for entry in entries]
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidCheckpoint(f"checkpoint {path}: {MANIFEST_FILE} does not parse: {e}") from None
    if version > FORMAT_VERSION:
        raise InvalidCheckpoint(f"checkpoint {path}: manifest format version {version} is newer than "
                                f"the supported {FORMAT_VERSION}")
    if manifest_step != step:
        raise InvalidCheckpoint(f"checkpoint {path}: the manifest says step {manifest_step}, "
                                f"the directory name {step}")
    seen = set()
    for name, _, _ in names:
        problem = file_name_problem(name)
        if problem:
            raise InvalidCheckpoint(f"checkpoint {path}: the manifest lists a bad file name {name!r}: {problem}")
        if name in seen:
            raise InvalidCheckpoint(f"checkpoint {path}: the manifest lists {name!r} twice")
        seen.add(name)
    for name, size, _ in names:
        try:
            actual = os.path.getsize(os.path.join(path, name))
        except FileNotFoundError:
            raise InvalidCheckpoint(f"checkpoint {path}: {name!r} is missing") from None
        if actual != size:
            raise InvalidCheckpoint(f"checkpoint {path}: {name!r} is {actual} bytes but the manifest "
                                    f"says {size} (truncated or overwritten)")
    for name, _, sha256 in names:
        digest = hashlib.sha256()
        with open(os.path.join(path, name), "rb") as f:
            for block in iter(lambda: f.read(IO_BYTES), b""):
                digest.update(block)
        if digest.hexdigest() != sha256.lower():
            raise InvalidCheckpoint(f"checkpoint {path}: {name!r} has sha256 {digest.hexdigest()} but the "
                                    f"manifest says {sha256} (corrupted)")
    return manifest


def step_dirs(checkpoint_dir):
    """Every `step-<N>` directory, newest first, unverified: [(step, path)]."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    dirs = []
    for name in names:
        step = parse_step_dir_name(name)
        path = os.path.join(checkpoint_dir, name)
        if step is not None and os.path.isdir(path):
            dirs.append((step, path))
    dirs.sort(key=lambda d: (d[0], d[1]), reverse=True)
    return dirs


def newest_valid_checkpoint(checkpoint_dir):
    """(step, path, manifest) of the newest checkpoint that verifies, or None; logs each refused."""
    for step, path in step_dirs(checkpoint_dir):
        try:
            return step, path, verify_checkpoint(path)
        except InvalidCheckpoint as reason:
            log("checkpoint refused; trying the previous one", checkpoint=path, reason=str(reason))
    return None


def prune_checkpoints(checkpoint_dir, keep_last):
    """Keeps the newest `keep_last` valid checkpoints (at least 1) and removes every checkpoint
    older than the oldest kept one; invalid ones newer than that stay, as fleetmend's prune does."""
    kept, others = [], []
    for step, path in step_dirs(checkpoint_dir):
        if len(kept) < max(keep_last, 1):
            try:
                verify_checkpoint(path)
                kept.append(step)
                continue
            except InvalidCheckpoint:
                pass
        others.append((step, path))
    if not kept:
        return
    for step, path in others:
        if step < kept[-1]:
            # Renamed first, so that a crash half way never leaves a partial step-<N>.
            aside = os.path.join(checkpoint_dir, f"{TEMP_PREFIX}{step:0{STEP_DIGITS}d}-{os.getpid()}-"
                                                 f"{random.getrandbits(64):016x}-pruned")
            os.rename(path, aside)
            shutil.rmtree(aside, ignore_errors=True)


class StopFlags:
    """SIGUSR1 and SIGTERM set flags that the training loop reads at a step boundary. A handler
    does nothing else: a checkpoint written from inside a handler could catch the model
    half-updated."""

    def __init__(self):
        self.checkpoint_requested = False
        self.stop_requested = False
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_usr1(self, signum, frame):
        self.checkpoint_requested = True

    def _on_term(self, signum, frame):
        self.stop_requested = True


class ProgressPoster:
    """Posts progress lines to FLEETMEND_PROGRESS_URL (when the queue set it), at most once a
    second, and returns the checkpoint interval the queue asks for (`--checkpoint-every auto`).
    While no step finishes, a daemon thread repeats the newest line every HEARTBEAT_SECONDS with
    a fresh `at_ms`: the queue declares the job hung when the step stops advancing, and names a
    rank whose heartbeats stopped too (a stopped or crashed process). Never blocks training for
    long and never fails it: the queue's view is a convenience."""

    HEARTBEAT_SECONDS = 2.0

    def __init__(self, url, token):
        import threading
        self.url, self.token, self.last, self.warned = url, token, 0.0, False
        self.latest, self.lock = None, threading.Lock()
        threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True).start()

    @classmethod
    def from_environ(cls, environ=None):
        environ = os.environ if environ is None else environ
        url = environ.get("FLEETMEND_PROGRESS_URL")
        return cls(url, environ.get("FLEETMEND_PROGRESS_TOKEN", "")) if url else None

    def _beat(self):
        while True:
            time.sleep(self.HEARTBEAT_SECONDS)
            with self.lock:
                due = self.latest is not None and time.monotonic() - self.last >= self.HEARTBEAT_SECONDS
                line = dict(self.latest, at_ms=int(time.time() * 1000)) if due else None
            if line:
                self.post(line)

    def post(self, line):
        with self.lock:
            self.latest = line
            now = time.monotonic()
            if now - self.last < 1.0:
                return None
            self.last = now
        try:
            return self._send(line)
        except _StandbyAnswer as standby:
            # A standby repairer (several share one store) answers 503 and names the leader in
            # Fleetmend-Leader: this post and the next go there. Once per post, so two repairers
            # that name each other cannot loop.
            leader = self._at(standby.leader)
            if leader is None:
                return self._failed(standby.error)
            log("progress goes to the leading repairer", url=leader)
            self.url = leader
            try:
                return self._send(line)
            except _StandbyAnswer as again:
                return self._failed(again.error)
            except (OSError, ValueError) as e:
                return self._failed(e)
        except (OSError, ValueError) as e:
            return self._failed(e)

    def _send(self, line):
        import urllib.error
        import urllib.request
        request = urllib.request.Request(
            self.url, data=json.dumps(line).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return json.loads(reply.read() or b"{}").get("checkpoint_every")
        except urllib.error.HTTPError as e:
            leader = e.headers.get("Fleetmend-Leader") if e.code == 503 else None
            if leader:
                raise _StandbyAnswer(leader, e) from e
            raise

    def _at(self, leader):
        """This post's URL at the leader's base URL, or None when it is not one (or is here)."""
        import urllib.parse
        here, there = urllib.parse.urlsplit(self.url), urllib.parse.urlsplit(leader.strip())
        if there.scheme not in ("http", "https") or not there.netloc or there.netloc == here.netloc:
            return None
        path = there.path.rstrip("/") + here.path
        return urllib.parse.urlunsplit((there.scheme, there.netloc, path, here.query, ""))

    def _failed(self, error):
        if not self.warned:
            log("cannot post progress; training goes on", url=self.url, error=str(error))
            self.warned = True
        return None


class _StandbyAnswer(Exception):
    """A standby repairer's 503 naming the leader's base URL."""

    def __init__(self, leader, error):
        super().__init__(f"a standby repairer; the leader is {leader}")
        self.leader, self.error = leader, error


# ---------------------------------------------------------------------------------------------
# Trainers: what the loop needs from a model (torch, or a pure-Python stand-in)

class FakeTrainer:
    """A stand-in for a model, in pure Python: its state is a list of floats that moves towards
    a target. Only for a world of one; for exercising the protocol without torch."""

    def __init__(self, env, args):
        if env.world_size != 1:
            raise SystemExit("--backend fake runs a world of one rank")
        rng = random.Random(args.seed)
        self.weights = [rng.uniform(-1, 1) for _ in range(1024)]
        self.step_sleep = args.fake_step_seconds

    def train_step(self, step):
        time.sleep(self.step_sleep)  # stands in for compute
        self.weights = [w * 0.99 for w in self.weights]
        return sum(w * w for w in self.weights) / len(self.weights)

    def agree(self, flags):
        return flags  # a world of one agrees with itself

    def broadcast_step(self, step):
        return step

    def barrier(self):
        pass

    def state_files(self, step, data_cursor):
        return {
            "weights.json": json.dumps(self.weights).encode(),
            "trainer_state.json": json.dumps({"step": step, "data_cursor": data_cursor}).encode(),
        }

    def load(self, path):
        with open(os.path.join(path, "weights.json"), "rb") as f:
            self.weights = json.loads(f.read())
        with open(os.path.join(path, "trainer_state.json"), "rb") as f:
            return json.loads(f.read())

    def close(self):
        pass


class TorchTrainer:
    """A small MLP regression under DistributedDataParallel (gloo on CPU, nccl on GPUs)."""

    def __init__(self, env, args):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.env = torch, dist, env
        use_cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: the protocol's variables.
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        model.to(self.device)
        self.model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.local_rank] if use_cuda else None)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.seed, self.batch = args.seed, args.batch_size

    def _batch(self, step):
        # Data is a function of (seed, step, rank): a resumed run sees the same batches.
        generator = self.torch.Generator().manual_seed(self.seed * 1_000_003 + step * 4099 + self.env.rank)
        x = self.torch.randn(self.batch, 64, generator=generator)
        y = x.sum(dim=1, keepdim=True).sin()
        return x.to(self.device), y.to(self.device)

    def train_step(self, step):
        x, y = self._batch(step)
        loss = self.torch.nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def agree(self, flags):
        """Every rank learns whether any rank saw a signal (MAX over ranks)."""
        tensor = self.torch.tensor([int(f) for f in flags], dtype=self.torch.int32, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return [bool(v) for v in tensor.tolist()]

    def broadcast_step(self, step):
        """Rank 0's choice of checkpoint to resume from, for everyone (-1: none)."""
        tensor = self.torch.tensor([step], dtype=self.torch.int64, device=self.device)
        self.dist.broadcast(tensor, src=0)
        return int(tensor.item())

    def barrier(self):
        self.dist.barrier()

    def state_files(self, step, data_cursor):
        def saved(obj):
            buffer = io.BytesIO()
            self.torch.save(obj, buffer)
            return buffer.getvalue()
        return {
            "model.pt": saved(self.model.module.state_dict()),
            "optimizer.pt": saved(self.optimizer.state_dict()),
            "trainer_state.json": json.dumps({
                "step": step,
                "data_cursor": data_cursor,
                "torch_rng": self.torch.get_rng_state().tolist(),
            }).encode(),
        }

    def load(self, path):
        model = self.torch.load(os.path.join(path, "model.pt"), map_location=self.device)
        self.model.module.load_state_dict(model)
        optimizer = self.torch.load(os.path.join(path, "optimizer.pt"), map_location=self.device)
        self.optimizer.load_state_dict(optimizer)
        with open(os.path.join(path, "trainer_state.json"), "rb") as f:
            state = json.loads(f.read())
        self.torch.set_rng_state(self.torch.tensor(state["torch_rng"], dtype=self.torch.uint8))
        return state

    def close(self):
        self.dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The loop

def run(env, trainer, args, flags):
    """Trains from the newest valid checkpoint to --steps; returns the exit code (always 0 here:
    errors raise, and an exception's non-zero exit tells the queue to requeue the job)."""
    # Rank 0 chooses the checkpoint (verifying it) and tells the others, so all resume from the
    # same step even if a file changes between their reads.
    chosen = -1
    if env.rank == 0:
        newest = newest_valid_checkpoint(env.checkpoint_dir)
        chosen = newest[0] if newest else -1
    chosen = trainer.broadcast_step(chosen)
    step = 0
    if chosen >= 0:
        path = os.path.join(env.checkpoint_dir, step_dir_name(chosen))
        verify_checkpoint(path)
        state = trainer.load(path)
        step = state["step"]
        log("resumed", rank=env.rank, step=step, checkpoint=path, restart_count=env.restart_count)
    start_step = step
    progress = ProgressPoster.from_environ()
    lost_weights = False
    while step < args.steps:
        started = time.monotonic()
        loss = trainer.train_step(step)
        step_seconds = time.monotonic() - started
        samples_per_second = args.batch_size / max(step_seconds, 1e-9)
        step += 1
        periodic = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
        # A step boundary: agree on the flags (MAX over ranks), so every rank takes the same
        # branch even if a signal reached only some of them yet, or their intervals differ.
        usr1, term, periodic, lost = trainer.agree(
            [flags.checkpoint_requested, flags.stop_requested, periodic, not math.isfinite(loss)])
        flags.checkpoint_requested = False
        # Weights that gave a NaN or infinite loss on any rank are never checkpointed: a restart
        # resumes from the newest checkpoint before them (the queue restarts the job on it).
        lost_weights = lost_weights or lost
        wrote = None
        if (usr1 or term or periodic or step == args.steps) and not lost_weights:
            if env.rank == 0:
                try:
                    wrote = write_checkpoint(env.checkpoint_dir, step, env.world_size, env.job_id,
                                             trainer.state_files(step, data_cursor=step))
                    prune_checkpoints(env.checkpoint_dir, args.keep_last)
                except StepExists:
                    pass  # resumed at this very step: the checkpoint is there already
            # Nobody exits (or trains on) before the checkpoint is complete.
            trainer.barrier()
        line = {
            "job": env.job_id, "attempt": env.restart_count, "rank": env.rank, "step": step,
            # JSON has no NaN: a loss that is not finite goes as null.
            "start_step": start_step, "loss": loss if math.isfinite(loss) else None,
            "samples_per_second": samples_per_second,
            "step_seconds": step_seconds,
            **({"checkpoint_step": step} if wrote else {}),
            "at_ms": int(time.time() * 1000),
        }
        print(json.dumps(line), flush=True)
        wanted = progress.post(line) if progress else None
        if wanted:
            args.checkpoint_every = wanted
        if term:
            log("stopping after a checkpoint (SIGTERM)", rank=env.rank, step=step)
            return 0
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps; 0: only on signals and at the end")
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--backend", choices=("torch", "fake"), default="torch")
    parser.add_argument("--fake-step-seconds", type=float, default=0.01)
    args = parser.parse_args(argv)
    try:
        env = ProtocolEnv.from_environ()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    # Before the (slow) process group setup, so that an early SIGTERM is not lost.
    flags = StopFlags()
    trainer = (TorchTrainer if args.backend == "torch" else FakeTrainer)(env, args)
    try:
        return run(env, trainer, args, flags)
    finally:
        trainer.close()


if __name__ == "__main__":
    sys.exit(main())
