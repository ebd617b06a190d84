"""How this process was launched: alone, or as one rank of torchrun / accelerate launch."""

from __future__ import annotations

import os

from pipeline.hardware import Hardware
from pipeline.planner import Launch


def launch_from_environment() -> Launch:
    """torchrun and accelerate launch set WORLD_SIZE for every process they start."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        return Launch(world_size, f"WORLD_SIZE={world_size} from the launcher (torchrun / accelerate launch)")
    return Launch()


def launch_for_profile(hardware: Hardware) -> Launch:
    """A described machine trains with one process per GPU (torchrun --nproc_per_node GPUS)."""
    gpus = len(hardware.gpus)
    if gpus > 1:
        return Launch(
            gpus, f"{hardware.source}: {gpus} GPUs, one process each (torchrun --nproc_per_node {gpus})"
        )
    return Launch(1, f"{hardware.source}: one process")
