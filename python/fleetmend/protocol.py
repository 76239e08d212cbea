"""fleetmend's checkpoint protocol, the plain part: no torch needed.

- `ProtocolEnv.from_environ()`: the variables fleetmend's queue (or torchrun, or Slurm through
  `deploy/slurm/`) gives every rank, refused with every problem named at once;
- `write_checkpoint`, `verify_checkpoint`, `newest_valid_checkpoint`, `prune_checkpoints`: a
  checkpoint is a `step-<N>/` directory whose `manifest.json` (size and sha256 of every file) is
  written last, renamed into place, so that a crash leaves no half checkpoint; readers resume
  from the newest one that verifies and say why each newer one was refused;
- `StopFlags`: SIGUSR1 (checkpoint and go on) and SIGTERM (checkpoint and exit 0) only set flags,
  read at a step boundary;
- `ProgressPoster`: progress lines to the queue (hang and straggler detection, the checkpoint
  interval it asks for), following a standby repairer's `Fleetmend-Leader` answer.

docs/checkpoint-protocol.md is the protocol; runtime/src/checkpoint.rs is the same format in Rust.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO, Callable, Dict, List, Mapping, Optional, Tuple, Union

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


def emit(stream: Any, value: Mapping[str, Any]) -> None:
    """`value` as one JSON line in one write: ranks sharing a pipe (torchrun's children, say)
    never cut into each other's lines."""
    text = json.dumps(value) + "\n"
    try:
        fd = stream.fileno()
    except (AttributeError, io.UnsupportedOperation):  # not a file (a test's StringIO)
        stream.write(text)
        stream.flush()
        return
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def log(message: str, **fields: Any) -> None:
    """One JSON line on stderr (stdout carries the progress lines)."""
    sys.stderr.flush()
    emit(sys.stderr, {"msg": message, **fields})


class ProtocolEnv:
    """What a rank learns from its environment."""

    def __init__(self, rank: int, world_size: int, local_rank: int, master_addr: str,
                 master_port: int, job_id: str, checkpoint_dir: str, restart_count: int) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.job_id, self.checkpoint_dir = job_id, checkpoint_dir
        self.restart_count = restart_count

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "ProtocolEnv":
        """Reads the protocol's variables; raises ValueError naming every problem at once."""
        environ = os.environ if environ is None else environ
        problems: List[str] = []
        values: Dict[str, str] = {}
        for var in PROTOCOL_VARS:
            value = environ.get(var)
            if value is None:
                problems.append(f"{var} is not set")
            elif value == "":
                problems.append(f"{var}={value!r} is empty")
            else:
                values[var] = value

        def number(var: str, limit: int) -> Optional[int]:
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
        assert rank is not None and world_size is not None and local_rank is not None
        assert master_port is not None and restart_count is not None
        return cls(rank, world_size, local_rank, values[MASTER_ADDR], master_port, values[JOB_ID],
                   values[CHECKPOINT_DIR], restart_count)


def step_dir_name(step: int) -> str:
    """`step-00000120`: zero-padded so that names sort like steps."""
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step_dir_name(name: str) -> Optional[int]:
    """The step of a `step-<digits>` name, or None for any other name."""
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX):]
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    return int(digits)


def file_name_problem(name: str) -> Optional[str]:
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Contents = Union[bytes, bytearray, memoryview, Callable[[BinaryIO], None]]


def temp_dir_name(step: int, tag: str) -> str:
    """The name a checkpoint of `step` is written under before it is sealed (`tag` tells writers
    apart; fleetmend's pruning removes leftovers of a crashed writer)."""
    return f"{TEMP_PREFIX}{step:0{STEP_DIGITS}d}-{tag}"


def _private_tag() -> str:
    return f"{os.getpid()}-{random.getrandbits(64):016x}"


def write_checkpoint(checkpoint_dir: str, step: int, world_size: int, job_id: str,
                     files: Mapping[str, Contents], extra: Optional[Mapping[str, Any]] = None) -> str:
    """Writes checkpoint `step` into `checkpoint_dir` and returns its path.

    `files` maps each file name to its contents: bytes, or a function that writes to the binary
    file object it is given (for large state, streamed). Every file is fsynced, then
    `seal_checkpoint` writes the manifest and renames the directory into place.
    """
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    for name in files:
        problem = file_name_problem(name)
        if problem:
            raise ValueError(f"cannot add {name!r} to a checkpoint: {problem}")
    os.makedirs(checkpoint_dir, exist_ok=True)
    temp = os.path.join(checkpoint_dir, temp_dir_name(step, _private_tag()))
    os.mkdir(temp)
    try:
        entries = []
        for name in sorted(files):
            contents = files[name]
            digest, size = hashlib.sha256(), 0
            with open(os.path.join(temp, name), "xb") as out:
                def write(data: bytes) -> None:
                    nonlocal size
                    digest.update(data)
                    size += len(data)
                    out.write(data)
                if callable(contents):
                    contents(_HashingFile(write))  # type: ignore[arg-type]
                else:
                    view = memoryview(contents)
                    for start in range(0, len(view), IO_BYTES):
                        write(bytes(view[start:start + IO_BYTES]))
                out.flush()
                os.fsync(out.fileno())
            entries.append({"name": name, "size": size, "sha256": digest.hexdigest()})
        return seal_checkpoint(checkpoint_dir, temp, step, world_size, job_id, entries, extra)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _hash_file(path: str) -> Tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(IO_BYTES), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def seal_checkpoint(checkpoint_dir: str, temp: str, step: int, world_size: int, job_id: str,
                    entries: Optional[List[Dict[str, Any]]] = None,
                    extra: Optional[Mapping[str, Any]] = None) -> str:
    """Makes the files in `temp` (already written and fsynced, by this process or by every rank)
    checkpoint `step`: `manifest.json` (size and sha256 of every file; `entries` where the writer
    knew them already, else read here) is written last and fsynced, `temp` is renamed to
    `step-<N>` and the parent fsynced. A crash at any point leaves either no `step-<N>` or a
    complete one. An invalid `step-<N>` in the way is replaced; a valid one raises StepExists.
    `extra` adds fields to the manifest (readers ignore fields they do not know).
    """
    if entries is None:
        entries = []
        for name in sorted(os.listdir(temp)):
            problem = file_name_problem(name)
            if problem:
                raise ValueError(f"cannot seal {temp}: {name!r}: {problem}")
            size, sha256 = _hash_file(os.path.join(temp, name))
            entries.append({"name": name, "size": size, "sha256": sha256})
    manifest: Dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "world_size": world_size,
        "job_id": job_id,
        "created_unix_ms": int(time.time() * 1000),
        "files": entries,
        **dict(extra or {}),
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
            aside = os.path.join(checkpoint_dir, temp_dir_name(step, _private_tag() + "-replaced"))
            os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            raise StepExists(f"a valid checkpoint {final} exists already")
    os.rename(temp, final)
    _fsync_dir(checkpoint_dir)
    return final


class _HashingFile(io.RawIOBase):
    """The binary file object a streaming writer gets: whatever it writes is hashed and counted."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        super().__init__()
        self._write = write

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._write(data)
        return len(data)


def verify_checkpoint(path: str) -> Dict[str, Any]:
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
        _, actual_sha256 = _hash_file(os.path.join(path, name))
        if actual_sha256 != sha256.lower():
            raise InvalidCheckpoint(f"checkpoint {path}: {name!r} has sha256 {actual_sha256} but the "
                                    f"manifest says {sha256} (corrupted)")
    return manifest


def step_dirs(checkpoint_dir: str) -> List[Tuple[int, str]]:
    """Every `step-<N>` directory, newest first, unverified: [(step, path)]."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    dirs: List[Tuple[int, str]] = []
    for name in names:
        step = parse_step_dir_name(name)
        path = os.path.join(checkpoint_dir, name)
        if step is not None and os.path.isdir(path):
            dirs.append((step, path))
    dirs.sort(key=lambda d: (d[0], d[1]), reverse=True)
    return dirs


def newest_valid_checkpoint(checkpoint_dir: str) -> Optional[Tuple[int, str, Dict[str, Any]]]:
    """(step, path, manifest) of the newest checkpoint that verifies, or None; logs each refused."""
    for step, path in step_dirs(checkpoint_dir):
        try:
            return step, path, verify_checkpoint(path)
        except InvalidCheckpoint as reason:
            log("checkpoint refused; trying the previous one", checkpoint=path, reason=str(reason))
    return None


def prune_checkpoints(checkpoint_dir: str, keep_last: int) -> None:
    """Keeps the newest `keep_last` valid checkpoints (at least 1) and removes every checkpoint
    older than the oldest kept one; invalid ones newer than that stay, as fleetmend's prune does."""
    kept: List[int] = []
    others: List[Tuple[int, str]] = []
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
            aside = os.path.join(checkpoint_dir, temp_dir_name(step, _private_tag() + "-pruned"))
            os.rename(path, aside)
            shutil.rmtree(aside, ignore_errors=True)


class StopFlags:
    """SIGUSR1 and SIGTERM set flags that the training loop reads at a step boundary. A handler
    does nothing else: a checkpoint written from inside a handler could catch the model
    half-updated."""

    def __init__(self) -> None:
        self.checkpoint_requested = False
        self.stop_requested = False
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_usr1(self, signum: int, frame: Any) -> None:
        self.checkpoint_requested = True

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_requested = True


class ProgressPoster:
    """Posts progress lines to FLEETMEND_PROGRESS_URL (when the queue set it), at most once a
    second, and returns the checkpoint interval the queue asks for (`--checkpoint-every auto`).
    While no step finishes, a daemon thread repeats the newest line every HEARTBEAT_SECONDS with
    a fresh `at_ms`: the queue declares the job hung when the step stops advancing, and names a
    rank whose heartbeats stopped too (a stopped or crashed process). Never blocks training for
    long and never fails it: the queue's view is a convenience."""

    HEARTBEAT_SECONDS = 2.0

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token, self.last, self.warned = url, token, 0.0, False
        self.latest: Optional[Dict[str, Any]] = None
        self.lock = threading.Lock()
        threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True).start()

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> Optional["ProgressPoster"]:
        """The poster for FLEETMEND_PROGRESS_URL, or None where the queue set none."""
        environ = os.environ if environ is None else environ
        url = environ.get("FLEETMEND_PROGRESS_URL")
        return cls(url, environ.get("FLEETMEND_PROGRESS_TOKEN", "")) if url else None

    def _beat(self) -> None:
        while True:
            time.sleep(self.HEARTBEAT_SECONDS)
            with self.lock:
                due = self.latest is not None and time.monotonic() - self.last >= self.HEARTBEAT_SECONDS
                line = dict(self.latest, at_ms=int(time.time() * 1000)) if due else None
            if line:
                self.post(line)

    def post(self, line: Dict[str, Any]) -> Optional[int]:
        with self.lock:
            self.latest = line
            now = time.monotonic()
            # A checkpoint goes at once: the queue waits for it before it stops the ranks.
            if now - self.last < 1.0 and "checkpoint_step" not in line:
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

    def _send(self, line: Dict[str, Any]) -> Optional[int]:
        request = urllib.request.Request(
            self.url, data=json.dumps(line).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                wanted = json.loads(reply.read() or b"{}").get("checkpoint_every")
                return wanted if isinstance(wanted, int) and wanted > 0 else None
        except urllib.error.HTTPError as e:
            leader = e.headers.get("Fleetmend-Leader") if e.code == 503 else None
            if leader:
                raise _StandbyAnswer(leader, e) from e
            raise

    def _at(self, leader: str) -> Optional[str]:
        """This post's URL at the leader's base URL, or None when it is not one (or is here)."""
        here, there = urllib.parse.urlsplit(self.url), urllib.parse.urlsplit(leader.strip())
        if there.scheme not in ("http", "https") or not there.netloc or there.netloc == here.netloc:
            return None
        path = there.path.rstrip("/") + here.path
        return urllib.parse.urlunsplit((there.scheme, there.netloc, path, here.query, ""))

    def _failed(self, error: BaseException) -> None:
        if not self.warned:
            log("cannot post progress; training goes on", url=self.url, error=str(error))
            self.warned = True
        return None


class _StandbyAnswer(Exception):
    """A standby repairer's 503 naming the leader's base URL."""

    def __init__(self, leader: str, error: BaseException) -> None:
        super().__init__(f"a standby repairer; the leader is {leader}")
        self.leader, self.error = leader, error


