"""Multi-process training through torchrun: DistributedDataParallel, one process per device.

`setup()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and joins the process
group (NCCL on GPUs, gloo on CPU). Without those variables it is a single process and nothing changes, so the
same command runs under ``python -m debertakit pretrain`` and ``torchrun --nproc-per-node N -m debertakit
pretrain``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available")
    return device


def setup(device: str = "auto") -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=pick_device(device))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    return Dist(rank, world, local, dev)


def cleanup(info: Dist) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: Dist) -> None:
    if info.enabled:
        dist.barrier()


def all_gather_object(info: Dist, obj):
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(info: Dist, t: torch.Tensor) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
