"""Before the loop: where and in what precision the policy lives. A device name checked against this
machine (torch knows it, and the GPU it names is here), and a dtype name parsed, with the default for
the device. In: names, as a user gives them. Out: torch.device and torch.dtype. It knows torch's
devices, not models or files.
"""

from __future__ import annotations

import torch


def parse_device(device) -> torch.device:
    """torch.device(device), or a ValueError saying why not: torch does not know the device, or this
    machine does not have it. load_pretrained and run.build_run check every device here, first."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}: use cpu, cuda, cuda:N (GPU N) or mps") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} asks for a GPU, but torch sees none here (a CPU build of torch, or no "
            "driver); use cpu"
        )
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r} asks for GPU {parsed.index}, but torch sees {torch.cuda.device_count()} "
            f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
        )
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device {device!r} asks for Apple's GPU (MPS), which torch does not see here; use cpu"
        )
    return parsed


def parse_dtype(dtype, device: torch.device) -> torch.dtype:
    """A torch dtype from a dtype, its name (float32, bf16, ...) or None: float32 on CPU, bfloat16 on a GPU
    (a ValueError names the choices)."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
    return names[dtype]
