"""Beside the loop: the teacher of on-policy distillation (GRPOConfig.teacher_model), loaded as the policy
is (a directory or Hub id, in the policy's dtype and on its device), in eval mode with no gradient, and
checked against the student before any step: the same tokenizer (vocabulary and chat template: the
teacher grades the student's token ids, so cross-tokenizer distillation is out of scope), the same
vocabulary rows in its LM head, and room for it in the device's free memory.

In: the settings, the student and its tokenizer. Out: the teacher, and the sha256 of its weights as
loaded (`weights_digest`; a PEFT adapter directory's base and adapters alike), which checkpoints record
and a resume compares (the teacher is reloaded, never saved). It knows files, sizes
and tokenizers, not what the teacher computes (update/distillation.py).
"""

from __future__ import annotations

import hashlib
import os

import torch

from ..config import GRPOConfig, TrainConfig
from ..model import (
    CheckpointError,
    Qwen3,
    is_adapter_directory,
    load_pretrained,
    read_adapter_config,
    read_config,
    resolve_checkpoint,
)
from ..update import LOGPROB_CHUNK_ROWS

GB = 1e9


def load_teacher(grpo: GRPOConfig, config: TrainConfig, student, tokenizer):
    """(teacher, the sha256 of its weights): grpo.teacher_model loaded frozen beside `student`, or a
    one-line ValueError naming what stands in the way (missing, another tokenizer, too large)."""
    path = grpo.teacher_model
    try:
        directory = resolve_checkpoint(path)
        check_memory(path, _config_of(directory), grpo, config.batch_size, student.dtype, student.device)
        teacher, teacher_tokenizer = load_pretrained(directory, dtype=student.dtype, device=student.device)
    except CheckpointError as error:
        raise ValueError(f"teacher_model {path}: {error}") from None
    if teacher_tokenizer is None:
        raise ValueError(
            f"teacher_model {path} has no tokenizer.json: the teacher must share the student's tokenizer, "
            "and there is none to compare"
        )
    difference = tokenizer_difference(tokenizer, teacher_tokenizer)
    if difference:
        raise ValueError(
            f"teacher_model {path} does not share the student's tokenizer: {difference} (the teacher grades "
            "the student's token ids; cross-tokenizer distillation is out of scope)"
        )
    rows, student_rows = teacher.config.vocab_size, student.config.vocab_size
    if rows != student_rows:
        raise ValueError(
            f"teacher_model {path} has {rows} rows in its LM head (vocab_size), the student {student_rows}: "
            "the reverse KL compares the two distributions row by row"
        )
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher, weights_digest(teacher)


def weights_digest(model) -> str:
    """The sha256 of a model's tensors as loaded: each one's name, dtype, shape and bytes, in name order
    (a PEFT adapter directory's base and adapters both, which its files alone do not hold)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        values = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {values.dtype} {tuple(values.shape)}\n".encode())
        digest.update(values.reshape(-1).view(torch.uint8).numpy())  # its bytes, whatever its dtype
    return digest.hexdigest()


def tokenizer_difference(student, teacher) -> str | None:
    """What differs between the student's and the teacher's tokenizers (model.Tokenizer), in a few words:
    the vocabulary's size, its first token that differs, or the chat template; None if nothing does."""
    student_vocab = student.backend.get_vocab(with_added_tokens=True)  # token -> id
    teacher_vocab = teacher.backend.get_vocab(with_added_tokens=True)
    if len(student_vocab) != len(teacher_vocab):
        return f"its vocabulary has {len(teacher_vocab)} tokens, the student's {len(student_vocab)}"
    if student_vocab != teacher_vocab:
        student_tokens = {i: token for token, i in student_vocab.items()}
        teacher_tokens = {i: token for token, i in teacher_vocab.items()}
        first = min(
            i
            for i in student_tokens.keys() | teacher_tokens.keys()
            if student_tokens.get(i) != teacher_tokens.get(i)
        )
        return (
            f"its token {first} is {teacher_tokens.get(first)!r}, the student's {student_tokens.get(first)!r}"
        )
    if _template_source(student) != _template_source(teacher):
        return "its chat template differs from the student's"
    return None


def _template_source(tokenizer):
    """The tokenizer's own chat template as written (chat_template.jinja wins), or None."""
    if tokenizer.template_file is not None:
        return tokenizer.template_file
    return tokenizer.tokenizer_config.get("chat_template")


def _config_of(directory: str):
    """The Qwen3Config of a checkpoint directory, or of an adapter directory's base."""
    if is_adapter_directory(directory):
        _, base = read_adapter_config(directory)
        if not base:
            raise CheckpointError(f"{directory}: its adapter_config.json names no base_model_name_or_path")
        directory = resolve_checkpoint(base)
    return read_config(directory)


def check_memory(path: str, teacher_config, grpo: GRPOConfig, batch_size: int, dtype, device) -> None:
    """The teacher fits in the device's free memory, before it is loaded: its weights in `dtype`, one
    (chunk, V) fp32 buffer of its LM head, and for the full form its hidden states kept for the update,
    (batch_size, max_completion_length, H_teacher). The student's activations come later: this is the
    least the teacher needs, not all the run will."""
    free = free_memory(device)
    if free is None:  # no way to tell on this system: loading will say
        return
    size = torch.empty(0, dtype=dtype).element_size()
    with torch.device("meta"):  # shapes alone: no memory
        parameters = sum(p.numel() for p in Qwen3(teacher_config).parameters())
    weights = parameters * size
    extra = LOGPROB_CHUNK_ROWS * teacher_config.vocab_size * 4
    if grpo.distillation_form == "full":
        extra += batch_size * grpo.max_completion_length * teacher_config.hidden_size * size
    if weights + extra > free:
        kept = " and its hidden states for the full form" if grpo.distillation_form == "full" else ""
        raise ValueError(
            f"teacher_model {path} needs at least {(weights + extra) / GB:.2f} GB on {device} (its "
            f"{parameters / 1e9:.2f}B weights in {str(dtype).removeprefix('torch.')} take "
            f"{weights / GB:.2f} GB, a chunk of its logits{kept} {extra / GB:.2f} GB), but {device} has "
            f"{free / GB:.2f} GB free: use a smaller teacher, or a device with more memory"
        )


def free_memory(device) -> int | None:
    """Bytes free on `device`: a GPU's as CUDA reports them, the machine's available memory for the
    CPU; None where neither can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
