"""fleetmend's checkpoint protocol for Python training jobs.

`fleetmend.protocol` is the plain part and needs no torch; `fleetmend.torch` is the protocol
around a PyTorch model and optimizer (`import fleetmend.torch as fm`).
"""

from .protocol import (
    PROTOCOL_VARS,
    InvalidCheckpoint,
    ProgressPoster,
    ProtocolEnv,
    StepExists,
    StopFlags,
    newest_valid_checkpoint,
    prune_checkpoints,
    seal_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)

__all__ = [
    "PROTOCOL_VARS",
    "InvalidCheckpoint",
    "ProgressPoster",
    "ProtocolEnv",
    "StepExists",
    "StopFlags",
    "newest_valid_checkpoint",
    "prune_checkpoints",
    "seal_checkpoint",
    "verify_checkpoint",
    "write_checkpoint",
]
