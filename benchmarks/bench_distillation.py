"""On-policy distillation's memory: one step's teacher forward and update with a teacher of the
student's shape, against the same update without one.

    python benchmarks/bench_distillation.py              # the Qwen3-0.6B shape, random weights, fp32, CPU
    python benchmarks/bench_distillation.py --smoke      # the smallest sizes (the suite runs this)

Each set-up runs in a forked process of its own: the student (Qwen3-0.6B's shape, random weights),
one prompt of 64 tokens and 8 completions of 256 in one micro-batch, and stage 4 as the trainer runs it
(update/updater.py's Updater, one AdamW step). With a teacher (another model of the same shape) the
step first takes the teacher's outputs as the trainer's teacher stage does (Updater.teacher_outputs),
then the form's advantages (`token`) or the reverse KL in the loss (`full`). "The teacher stage's
growth" is the process's peak resident memory (VmHWM) over that stage less what was resident before
it; "the step's peak" is the peak from just before the teacher's forward to the end of the update. The
student, its rollouts and, for the two teacher rows, the teacher's weights are in "resident before".

What the table holds against: the teacher's weights, one (LOGPROB_CHUNK_ROWS, V) fp32 chunk of its
logits, and the whole (B, Tc, V) fp32 logits that a forward keeping every position's distribution
would hold. The full form also keeps the teacher's last hidden states, (B, Tc, H), for the update.
"""

import argparse
import ctypes
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_update import in_own_process, resident  # noqa: E402
from common import SHAPES, machine_line  # noqa: E402

from minigrpo import GRPOConfig, TrainConfig, distributed  # noqa: E402
from minigrpo.model import Qwen3, Qwen3Config  # noqa: E402
from minigrpo.rollout import Rollout, padding_rollout  # noqa: E402
from minigrpo.update import LOGPROB_CHUNK_ROWS, Updater, distillation_for, step_totals  # noqa: E402

FORMS = ("none", "token", "full")  # no teacher, then each distillation_form
GIB = 2**30


def sizes(smoke: bool) -> tuple[dict, int, int, int]:
    """(the model's shape, prompt tokens, completion tokens, rows)."""
    shape = dict(SHAPES["0.6b"])
    if smoke:
        shape.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        return shape, 8, 16, 4
    return shape, 64, 256, 8


def rollouts_of(vocab_size: int, prompt_tokens: int, completion_tokens: int, rows: int) -> list[Rollout]:
    """One group of random completions of one random prompt, with the sampler's log-probs and an
    advantage each, as stages 1-3 leave them."""
    rng = random.Random(0)
    prompt = [rng.randrange(vocab_size) for _ in range(prompt_tokens)]
    rollouts = []
    for _ in range(rows):
        completion = [rng.randrange(vocab_size) for _ in range(completion_tokens)]
        rollout = Rollout(prompt_ids=prompt, completion_ids=completion, finish_reason="length")
        rollout.sampler_logprobs = -torch.rand(completion_tokens) * 10  # (Tc,)
        rollout.advantage = rng.uniform(-1, 1)
        rollouts.append(rollout)
    return rollouts


def fix_mmap_threshold() -> bool:
    """glibc gives a freed block back to the system only if it was mapped on its own, and raises the size
    from which it maps blocks on their own after each such free (up to 32 MiB): the teacher's freed
    buffers would then stay in the heap and count in the update's peak resident size, which would no
    longer be what lives. A fixed threshold of 128 KiB (M_MMAP_THRESHOLD) keeps it so, in this process
    and the children it forks. False where there is no glibc (the peaks then include its heap's slack)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024))  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def reset_peak() -> None:
    """The peak resident size (VmHWM) from here on (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def step_memory(form: str, smoke: bool) -> dict:
    """One step of one set-up in this (forked) process: resident bytes before and the peak over the
    teacher's forward and the update."""
    shape, prompt_tokens, completion_tokens, rows = sizes(smoke)
    torch.manual_seed(0)
    model = Qwen3(Qwen3Config(**shape))  # (random weights: memory does not depend on their values)
    teacher = None
    if form != "none":
        teacher = Qwen3(Qwen3Config(**shape)).eval().requires_grad_(False)  # as run/teacher.py leaves it
    settings = dict(num_generations=rows, max_completion_length=completion_tokens)
    if teacher is not None:
        settings.update(teacher_model="(random)", distillation_form=form)
    grpo = GRPOConfig(**settings)
    config = TrainConfig(batch_size=rows, micro_batch_size=rows, learning_rate=1e-5)
    distillation = distillation_for(grpo, teacher)
    rollouts = rollouts_of(shape["vocab_size"], prompt_tokens, completion_tokens, rows)
    dist = distributed.current(model.device)
    padding = padding_rollout(rollouts[0].prompt_ids[0], 0)
    updater = Updater(model, None, grpo, config, dist, padding, 0, teacher, distillation)
    reset_peak()
    before = resident()[0]
    if teacher is not None:  # the trainer's teacher stage, then stage 3's mix (run/trainer.py, _teach)
        for r, (logprobs, hidden) in zip(rollouts, updater.teacher_outputs(rollouts)):
            r.teacher_logprobs = logprobs
            r.teacher_hidden = hidden if distillation.keeps_hidden else None
        outcome = [r.advantage for r in rollouts]
        outcome, per_token, _ = distillation.advantages(rollouts, outcome, [None] * rows)
        for r, advantage, tokens in zip(rollouts, outcome, per_token):
            r.advantage, r.token_advantages = advantage, tokens
    teacher_peak = resident()[1]
    reset_peak()
    stats = updater(rollouts, 1, step_totals(rollouts))  # one process: the whole step
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "before": before,
        "teacher_growth": teacher_peak - before,
        "peak": max(teacher_peak, resident()[1]),
        "skipped": stats["skipped"],
        "weights": parameters * 4,  # fp32
        "chunk": LOGPROB_CHUNK_ROWS * shape["vocab_size"] * 4,
        "logits": rows * completion_tokens * shape["vocab_size"] * 4,  # (B, Tc, V) fp32
        "hidden": rows * completion_tokens * shape["hidden_size"] * 4,  # (B, Tc, H) fp32
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the smallest sizes: checks that it runs")
    args = parser.parse_args()
    shape, prompt_tokens, completion_tokens, rows = sizes(args.smoke)
    fixed = fix_mmap_threshold()
    print(machine_line())
    print(
        f"\nmemory: {'a tiny shape (smoke)' if args.smoke else 'the Qwen3-0.6B shape'}, fp32, CPU, one step "
        f"of {rows} x ({prompt_tokens} + {completion_tokens}) tokens in one micro-batch, "
        + ("glibc mmap threshold fixed at 128 KiB" if fixed else "no glibc mallopt: heap slack included")
    )
    results = {}
    for form in FORMS:
        done = in_own_process(step_memory, form, args.smoke)
        if "error" in done:
            sys.exit(f"bench_distillation: {form} failed:\n{done['error']}")
        results[form] = done["result"]
        assert results[form]["skipped"] == 0.0, f"{form}: the update was skipped"
    base = results["none"]
    print(
        "| teacher | resident before | the teacher stage's growth | the step's peak | its growth "
        "(peak - before) | peak - no teacher's peak |"
    )
    print("|---|---|---|---|---|---|")
    for form, r in results.items():
        print(
            f"| {form} | {r['before'] / GIB:.3f} GiB | {r['teacher_growth'] / GIB:.3f} GiB "
            f"| {r['peak'] / GIB:.3f} GiB | {(r['peak'] - r['before']) / GIB:.3f} GiB "
            f"| {(r['peak'] - base['peak']) / GIB:+.3f} GiB |"
        )
    print(
        f"\nfor scale: the teacher's weights {base['weights'] / GIB:.3f} GiB; one ({LOGPROB_CHUNK_ROWS}, V) "
        f"fp32 chunk of logits {base['chunk'] / GIB:.3f} GiB; the full form's kept hidden states (B, Tc, H) "
        f"{base['hidden'] / GIB:.4f} GiB; the whole (B, Tc, V) fp32 logits {base['logits'] / GIB:.3f} GiB"
    )


if __name__ == "__main__":
    main()
