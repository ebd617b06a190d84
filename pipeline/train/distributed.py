"""Several processes, one run: torchrun / accelerate launch, with rank 0 doing the shared work.

Rank 0 scrapes, tokenizes, plans and packs once; the other ranks wait for it
on a gloo group of their own whose timeout (`distributed.setup_wait_hours`)
outlasts any scrape, then receive what rank 0 produced, or its error, so a
failure on rank 0 never leaves them hanging. Training itself is the Hugging
Face Trainer's DDP (or FSDP/DeepSpeed) on the default process group, with
the usual timeout. No distribution layer of our own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from pipeline.config import DistributedConfig
from pipeline.errors import USER_ERRORS, PipelineError
from pipeline.types import Launch

T = TypeVar("T")
TRAINING_TIMEOUT = timedelta(minutes=30)  # the Trainer's own default (ddp_timeout) for training collectives


def launch_from_environment() -> Launch:
    """torchrun and accelerate launch set WORLD_SIZE, RANK and LOCAL_RANK for every process they start."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Launch()
    launcher = (
        "accelerate"
        if "ACCELERATE_MIXED_PRECISION" in os.environ or "ACCELERATE_DYNAMO_BACKEND" in os.environ
        else "torchrun"
    )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    nodes = max(1, world_size // local_world)
    return Launch(
        world_size=world_size,
        reason=f"WORLD_SIZE={world_size} from {launcher}: {nodes} node(s) × {local_world} process(es)",
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=local_world,
        launcher=launcher,
    )


def backend_for(config: DistributedConfig) -> str:
    if config.backend != "auto":
        return config.backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


class Coordinator:
    """The ranks of one launch; a single process needs none of this and gets the same interface."""

    def __init__(self, launch: Launch, config: DistributedConfig):
        self.launch = launch
        self.config = config
        self.backend: str | None = None
        self._setup_group = None

    def start(self) -> Coordinator:
        if self.launch.world_size <= 1:
            return self
        import torch
        import torch.distributed as dist

        self.backend = backend_for(self.config)
        if self.backend == "nccl":
            gpus = torch.cuda.device_count()
            if self.launch.local_rank >= gpus:  # CUDA would say "invalid device ordinal" on this rank alone
                raise PipelineError(
                    f"{self.launch.local_world_size} processes on this node but {gpus} GPU(s): start one "
                    f"process per GPU (torchrun --nproc_per_node={gpus}), or hide the GPUs "
                    "(CUDA_VISIBLE_DEVICES=) to train on the CPU"
                )
            torch.cuda.set_device(self.launch.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend=self.backend, timeout=TRAINING_TIMEOUT)
        self._setup_group = dist.new_group(
            backend="gloo", timeout=timedelta(hours=self.config.setup_wait_hours)
        )
        return self

    def share(self, work: Callable[[], T]) -> T:
        """Rank 0 does `work` and every rank gets its result (or rank 0's error, raised again here)."""
        if self._setup_group is None:
            return work()
        import torch.distributed as dist

        message: list[Any] = [None]
        if self.launch.rank == 0:
            try:
                message[0] = ("ok", work())
            except USER_ERRORS as err:
                message[0] = ("error", str(err), err.exit_code)
                dist.broadcast_object_list(message, src=0, group=self._setup_group)
                raise
            except BaseException as err:
                message[0] = ("error", f"rank 0 failed: {type(err).__name__}: {err}", 1)
                dist.broadcast_object_list(message, src=0, group=self._setup_group)
                raise
        dist.broadcast_object_list(message, src=0, group=self._setup_group)
        if message[0][0] == "error":
            error = PipelineError(message[0][1])
            error.exit_code = message[0][2]
            raise error
        return message[0][1]

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any (all ranks must call it at the same point)."""
        if self._setup_group is None:
            return flag
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([int(flag)])
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._setup_group)
        return bool(tensor.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on rank 0 (an empty list elsewhere)."""
        if self._setup_group is None:
            return [value]
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.launch.world_size if self.launch.rank == 0 else None
        dist.gather_object(value, gathered, dst=0, group=self._setup_group)
        return gathered or []

    def close(self, finished: bool) -> None:
        """Leave the process groups; after a success, first wait for rank 0 to finish writing."""
        if self._setup_group is None:
            return
        import torch.distributed as dist

        if finished:
            dist.barrier(group=self._setup_group)
        # Without this, gloo's threads outlive the interpreter and abort the process at exit.
        dist.destroy_process_group()
        self._setup_group = None

    def to_manifest(self) -> dict[str, Any]:
        launch = self.launch
        return {
            "world_size": launch.world_size,
            "nodes": launch.nodes,
            "processes_per_node": launch.local_world_size,
            "backend": self.backend,
            "launcher": launch.launcher,
            "writer_rank": 0,
            "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            if launch.world_size > 1
            else None,
            "hostname": socket.gethostname(),
        }
