"""Across processes: which rank this is, how the policy is wrapped, and the few collectives the loop needs.

Under `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK in the environment) `setup` joins the process
group, NCCL when the device is a GPU and gloo on CPU, and gives each process its device; without
torchrun it returns a one-process `Dist` whose collectives return their input, so the trainer has
a single code path. In: the environment torchrun sets, and the policy. Out: this rank's `Dist` and the
`ParallelModel` wrapper. Gradients are never averaged here: DistributedDataParallel (or FSDP2, with
`shard`) does that during backward. It knows tensors, modules and picklable objects, not what
they mean for GRPO.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist


@dataclass(frozen=True)
class Dist:
    """This process's place in the run; one process unless torchrun started several."""

    rank: int = 0  # this process among all processes, on every node
    world_size: int = 1  # processes in the run
    local_rank: int = 0  # this process among its node's processes: picks its GPU
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank's tensors are

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes metrics, plots, checkpoints, initial_eval.json and trace.html, and prints."""
        return self.rank == 0

    def print(self, *args) -> None:
        if self.is_main:
            print(*args, flush=True)

    def block(self, n: int) -> slice:
        """This rank's contiguous block of n items: the blocks of ranks 0, 1, ... in turn cover them
        in order, and differ in size by at most one."""
        return slice(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    def block_of(self, items: list, group_size: int = 1) -> list:
        """This rank's contiguous block of `items` (see `block`), in whole groups of `group_size` items:
        all of them on one process."""
        groups = self.block(len(items) // group_size)
        return items[groups.start * group_size : groups.stop * group_size]

    def gather_joined(self, items: list) -> list:
        """Every rank's `items` joined in rank order, on every rank: the whole list that `block_of`
        cut (on one process, a copy of `items`)."""
        joined = []
        for part in self.gather(items):
            joined += part
        return joined

    def gather(self, obj) -> list:
        """[rank 0's obj, rank 1's obj, ...] on every rank (pickled; for small Python objects)."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks, in float64."""
        return self._reduce(values, tdist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, tdist.ReduceOp.MAX)

    def broadcast(self, obj):
        """Rank 0's obj on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def check_same(self, settings: dict) -> None:
        """Raise on every rank if any rank was started with other settings than rank 0."""
        first, *others = [_flat(s) for s in self.gather(settings)]
        differences = [
            f"rank {rank} has {key} = {value!r}, rank 0 has {first.get(key)!r}"
            for rank, theirs in enumerate(others, start=1)
            for key, value in theirs.items()
            if first.get(key) != value
        ]
        if differences:
            raise ValueError("the ranks disagree on the run's configuration: " + "; ".join(differences[:5]))

    def _reduce(self, values: list[float], op) -> list[float]:
        if self.world_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)  # (len(values),)
        tdist.all_reduce(t, op=op)
        return t.tolist()


def setup(device: str = "cpu") -> Dist:
    """Join torchrun's process group (once per process) and return this rank's Dist."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not tdist.is_initialized():
        return Dist(device=torch.device(device))
    kind = torch.device(device).type
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"distributed training runs on cpu (gloo) or cuda (NCCL), not on {device!r}")
    if kind == "cuda":
        placed = _gpu_for(device, local_rank)
    else:
        placed = torch.device("cpu")
    if not tdist.is_initialized():
        tdist.init_process_group(
            "nccl" if kind == "cuda" else "gloo", device_id=placed if kind == "cuda" else None
        )
        atexit.register(_leave)
    return Dist(
        rank=tdist.get_rank(), world_size=tdist.get_world_size(), local_rank=local_rank, device=placed
    )


def finish() -> None:
    """End a torchrun process whose work is done and written: all ranks leave together, then it exits with
    status 0 at once; nothing happens for one process. Once the interpreter starts finalizing, gloo's
    threads may still destroy work objects whose tensors hold Python references, and that can abort a
    rank (SIGABRT, "terminate called without an active exception") after a clean finish, which torchrun
    then reports as the whole job failing. Call it last: files must be closed, as exit handlers do not
    run."""
    if not tdist.is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    tdist.barrier()
    tdist.destroy_process_group()
    os._exit(0)


def current(device: torch.device) -> Dist:
    """The Dist of a process group someone already joined (one process if none)."""
    if not tdist.is_initialized():
        return Dist(device=torch.device(device))
    return Dist(
        tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), torch.device(device)
    )


def digest(rows: list[dict]) -> str:
    """A short fingerprint of a task's rows, so ranks can check they read the same data."""
    text = json.dumps(rows, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the policy across ranks -----------------------------------------------------------------------
# FSDP2, DDP and the distributed state dicts are imported where they are used: importing them costs every
# process that imports the trainer most of a second, and one process uses only the state dicts, to save.


class ParallelModel:
    """A log-probs module (token_logprobs.TokenLogprobs) as every rank's update uses it. On one process it is
    the module itself and each method below is the obvious one-process step; under torchrun it is replicated
    by DistributedDataParallel or, with `shard`, sharded by FSDP2 (each of `blocks`, then the rest). All that
    only a run of several processes needs is here, so the trainer reads as one:

    - `parts`: as many micro-batches on every rank; a rank short of rollouts forwards `padding`,
      which weighs nothing, since every rank must join every forward (FSDP2's all-gathers) and backward;
    - `accumulating`: DDP's no_sync for every micro-batch but the step's last;
    - `gathered`: FSDP2's weights whole on every rank, for sampling and evaluation;
    - `clip_gradients`: the global norm, over every shard;
    - `weights`, `optimizer_state`, `load_optimizer_state`: whole state for checkpoints.

    A frozen module (`trainable=False`, the reference) that is not sharded stays a plain local copy."""

    def __init__(
        self,
        module: torch.nn.Module,
        dist: Dist,
        *,
        shard: bool,
        blocks=(),
        trainable: bool = True,
        padding=None,
        warm_up=None,
    ):
        self.dist = dist
        self.padding = padding
        wrapped = dist.world_size > 1 and (shard or trainable)
        self.module = _wrap(module, dist, shard, blocks, trainable) if wrapped else module
        self.sharded = wrapped and shard  # FSDP2
        self.replicated = wrapped and not shard  # DistributedDataParallel
        if self.sharded and trainable:
            # FSDP2 sets itself up in the root's first forward, and the sampler calls the blocks directly:
            # one forward (every rank) first. The root then keeps its weights whole until a backward: reshard.
            with torch.no_grad():
                warm_up(self.module)
            self.module.reshard()

    def __call__(self, *args):
        return self.module(*args)

    def parts(self, items: list, chunks: list[list[int]]) -> list[list]:
        """Each chunk's items, then [padding] up to the most chunks any rank has."""
        most = int(self.dist.max([len(chunks)])[0])
        return [[items[i] for i in chunk] for chunk in chunks] + [[self.padding]] * (most - len(chunks))

    def accumulating(self, last: bool):
        """No all-reduce in the backward of any micro-batch but the last (DDP). FSDP2 reduce-scatters
        every micro-batch's gradients: postponing that would keep whole gradients on every rank, the
        memory it saves."""
        if last or not self.replicated:
            return contextlib.nullcontext()
        return self.module.no_sync()

    @contextlib.contextmanager
    def gathered(self):
        """Every FSDP2-sharded parameter whole on every rank until the block ends, and no resharding after
        each block's forward: the sampler runs without collectives, so ranks may take different numbers of
        decode steps. Nothing happens when not sharded. Every rank must enter it (an all-gather)."""
        if not self.sharded:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        for m in sharded:
            m.unshard()
            if m is not self.module:
                m.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for m in sharded:
                m.reshard()
                if m is not self.module:
                    m.set_reshard_after_forward(True, recurse=False)

    def clip_gradients(self, max_norm: float) -> float:
        """Clip the gradients' global norm to max_norm (0: no clipping); the norm before clipping."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        if not params:
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor

    def weights(self) -> dict | None:
        """The model's whole state dict on rank 0 (other ranks: empty) when sharded; None when the
        model's own state_dict is whole."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        # gathered from the root FSDP2 was applied to
        whole = get_model_state_dict(self.module, options=_whole())
        return {name.removeprefix("model."): t for name, t in whole.items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The optimizer's state keyed by parameter names, whole: a checkpoint written by one process, by
        DDP or by FSDP2 resumes under any of them. None before the first AdamW step (asked for an empty
        optimizer's state, torch takes a step with lr 0 to create it, shifting AdamW's bias correction)."""
        if not optimizer.state:
            return None
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.module, optimizer, options=_whole())

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict | None) -> None:
        if state is None:  # saved before the first step: a fresh AdamW is the same
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            self.module, optimizer, state, options=StateDictOptions(full_state_dict=True)
        )


def _whole():
    """The state dicts' options for a checkpoint: whole, gathered to rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _wrap(module: torch.nn.Module, dist: Dist, shard: bool, blocks, trainable: bool) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if shard:
        mesh = init_device_mesh(dist.device.type, (dist.world_size,))
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        # The root keeps its weights whole from forward to backward; a frozen one has no backward.
        fully_shard(module, mesh=mesh, reshard_after_forward=None if trainable else True)
        return module
    device_ids = [dist.device.index] if dist.device.type == "cuda" else None
    # Qwen3 has no buffers: no forward syncs any
    return DistributedDataParallel(module, device_ids=device_ids)


def _gpu_for(device: str, local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {device} asks for the NCCL backend on GPUs, but torch sees no GPU here "
            "(a CPU build of torch, or no driver); use --device cpu, which runs on gloo"
        )
    if torch.device(device).index is not None:
        raise ValueError(
            f"under torchrun each process takes the GPU of its LOCAL_RANK; pass --device cuda, not {device}"
        )
    if local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"torchrun started more processes on this node than it has GPUs ({torch.cuda.device_count()}): "
            f"use --nproc_per_node {torch.cuda.device_count()} or fewer"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _flat(settings: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _leave() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()
