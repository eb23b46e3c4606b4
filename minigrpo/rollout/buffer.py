"""Between the stages: the rollout buffer, one record per sampled completion.

In: the sampler's completions for a batch of prompts (stage 1, `from_samples`); each later stage
returns its values and the trainer writes them in, one place per stage: the decoded text, rewards and
step rewards (2), a teacher's log-probs and hidden states (on-policy distillation), advantages, per
completion or per token (3); the update writes the old / reference log-probs it computes (4). A
step's rollouts over its sampling rounds are a `StepRollouts`. Out: padded tensors for the update, and the
logger's length stats. It knows token ids and numbers, not rewards' meaning or
the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Rollout:
    """One sampled completion and everything the update needs to know about it."""

    prompt_ids: list[int]  # the prompt it continues
    completion_ids: list[int]  # sampled tokens, EOS included when one was emitted, and tools' observations
    finish_reason: str  # "stop" (EOS), "length" (cut at max_completion_length), "tool_limit"
    generated: list[bool] | None = None  # per completion token: the policy's (True) or a tool's; None: all
    tool_calls: list = field(default_factory=list)  # the tools.ToolCall of each call it made, in order
    text: str = ""  # the completion decoded (stage 2): what the rewards read
    rewards: dict[str, float] = field(default_factory=dict)  # each reward component, unweighted
    reward: float = 0.0  # the weighted total
    timed_out: bool = False  # a reward failed closed at the verifier's time limit (reward/timeout_frac)
    step_rewards: list[float] = field(default_factory=list)  # process supervision: each step's reward
    step_ends: list[int] = field(default_factory=list)  # the index of each step's last completion token
    step_continuations: int = 0  # Monte-Carlo step values: continuations sampled for its steps (cost)
    advantage: float = 0.0  # group-relative, from the total
    token_advantages: torch.Tensor | None = None  # (Tc,) per token (process advantages); None: `advantage`
    in_loss: bool = True  # False for a truncated completion when those are masked
    sampler_logprobs: torch.Tensor | None = None  # (Tc,) as the sampler computed them drawing the tokens
    old_logprobs: torch.Tensor | None = None  # (Tc,) under the policy that sampled it (num_iterations > 1)
    ref_logprobs: torch.Tensor | None = None  # (Tc,) under the reference model (beta > 0)
    teacher_logprobs: torch.Tensor | None = None  # (Tc,) under the teacher (on-policy distillation)
    # (Tc, H_teacher) on the device: the teacher's last hidden states (distillation_form="full")
    teacher_hidden: torch.Tensor | None = None

    @property
    def loss_tokens(self) -> int:
        """Tokens the loss sees: the policy's own, none when it is left out; never an observation."""
        if not self.in_loss:
            return 0
        return len(self.completion_ids) if self.generated is None else sum(self.generated)


def loss_positions(r: Rollout) -> torch.Tensor:
    """(Tc,) bool: the completion tokens the loss sees (the policy's own; none when it is left out)."""
    generated = r.generated if r.generated is not None else [True] * len(r.completion_ids)
    return torch.tensor(generated, dtype=torch.bool) & r.in_loss


def from_samples(samples, prompt_ids: list[list[int]], mask_truncated: bool) -> list[Rollout]:
    """Stage 1's rollouts: one per completion of the sampler's `Samples`, whose prompt_indices index
    `prompt_ids`; a completion cut at the budget is left out of the loss when `mask_truncated` (DAPO)."""
    count = len(samples.tokens)
    generated = samples.generated or [None] * count
    calls = samples.tool_calls or [[] for _ in range(count)]
    rollouts = []
    for i, p in enumerate(samples.prompt_indices):
        reason = samples.finish_reasons[i]
        rollouts.append(
            Rollout(
                prompt_ids=prompt_ids[p],
                completion_ids=samples.tokens[i],
                finish_reason=reason,
                generated=generated[i],
                tool_calls=calls[i],
                in_loss=not (mask_truncated and reason == "length"),
                sampler_logprobs=torch.tensor(samples.logprobs[i], dtype=torch.float32),  # (Tc,)
            )
        )
    return rollouts


def padding_rollout(prompt_token: int, pad_id: int) -> Rollout:
    """A rollout that weighs nothing (no token in the loss, advantage 0), for a rank's empty micro-batch."""
    zeros = torch.zeros(1)  # (1,) sampler, old and reference log-probs, never read: the token is masked
    return Rollout(
        prompt_ids=[prompt_token],
        completion_ids=[pad_id],
        finish_reason="length",
        in_loss=False,
        sampler_logprobs=zeros,
        old_logprobs=zeros,
        ref_logprobs=zeros,
    )


class StepRollouts:
    """One step's rollouts over its sampling rounds: every one sampled, and the groups trained on.

    Every group is trained on, unless dynamic sampling or drop_zero_variance_groups leave out the
    groups whose rewards are all equal (no signal, `drop_flat`); then each round samples prompts for the
    groups still missing, and the batch is full at batch_size / G groups."""

    def __init__(self, group_size: int, batch_size: int, drop_flat: bool):
        self.group_size = group_size  # G
        self.wanted_groups = batch_size // group_size
        self.drop_flat = drop_flat
        self.sampled: list[Rollout] = []  # every round's rollouts, group by group
        self.trained: list[Rollout] = []  # the groups stages 3 and 4 see
        self.flat_groups = 0  # sampled groups whose rewards are all equal

    def missing_groups(self) -> int:
        """Groups the batch still wants: the prompts to sample next."""
        return self.wanted_groups - len(self.trained) // self.group_size

    def full(self) -> bool:
        return len(self.trained) >= self.wanted_groups * self.group_size

    def add(self, rollouts: list[Rollout], flat: list[bool]) -> None:
        """A round's rollouts, scored (stage 2), group by group, and which of their groups are flat."""
        G = self.group_size
        self.sampled += rollouts
        self.flat_groups += sum(flat)
        for g, is_flat in enumerate(flat):
            if not (self.drop_flat and is_flat):
                self.trained += rollouts[g * G : (g + 1) * G]

    def stats(self, sample_seconds: float) -> dict[str, float]:
        """The logger's group and sampling-throughput stats of the step."""
        G = self.group_size
        seconds = max(sample_seconds, 1e-9)
        sampled_groups = len(self.sampled) // G
        return {
            "groups/zero_variance_frac": self.flat_groups / max(sampled_groups, 1),
            "groups/trained": len(self.trained) // G,
            "groups/sampled": sampled_groups,
            "sampling/samples_per_s": len(self.sampled) / seconds,
            "sampling/tokens_per_s": sum(len(r.completion_ids) for r in self.sampled) / seconds,
        }


@dataclass
class Batch:
    """Rollouts collated for one forward pass: [left-padded prompt | right-padded completion]."""

    input_ids: torch.Tensor  # (B, Lp + Tc)
    attention_mask: torch.Tensor  # (B, Lp + Tc) 1 for real tokens
    completion_start: int  # Lp: the column of each completion's first token
    completion_mask: torch.Tensor  # (B, Tc) 1 for tokens in the loss: the policy's, up to and with EOS
    advantages: torch.Tensor  # (B, Tc) each token's advantage: its rollout's, or its own (process)
    sampler_logprobs: torch.Tensor | None  # (B, Tc) or None
    old_logprobs: torch.Tensor | None  # (B, Tc) or None
    ref_logprobs: torch.Tensor | None  # (B, Tc) or None
    teacher_hidden: torch.Tensor | None = None  # (B, Tc, H_teacher) or None


def collate(rollouts: list[Rollout], pad_id: int, device) -> Batch:
    """Pad prompts on the left and completions on the right, so every completion starts at column Lp."""
    prompt_width = max(len(r.prompt_ids) for r in rollouts)
    completion_width = max(len(r.completion_ids) for r in rollouts)
    B = len(rollouts)
    ids = torch.full((B, prompt_width + completion_width), pad_id, dtype=torch.long)  # (B, Lp + Tc)
    attention = torch.zeros_like(ids)  # (B, Lp + Tc)
    loss_mask = torch.zeros(B, completion_width)  # (B, Tc)
    for row, r in enumerate(rollouts):
        start = prompt_width - len(r.prompt_ids)
        end = prompt_width + len(r.completion_ids)
        ids[row, start:prompt_width] = torch.tensor(r.prompt_ids)
        ids[row, prompt_width:end] = torch.tensor(r.completion_ids, dtype=torch.long)
        attention[row, start:end] = 1
        loss_mask[row, : len(r.completion_ids)] = float(r.in_loss)
        if r.generated is not None:  # observation tokens are context, not the policy's actions
            loss_mask[row, : len(r.completion_ids)] *= torch.tensor(r.generated, dtype=torch.float32)
    return Batch(
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        completion_start=prompt_width,
        completion_mask=loss_mask.to(device),
        advantages=_token_advantages(rollouts, completion_width).to(device),
        sampler_logprobs=_pad([r.sampler_logprobs for r in rollouts], completion_width, device),
        old_logprobs=_pad([r.old_logprobs for r in rollouts], completion_width, device),
        ref_logprobs=_pad([r.ref_logprobs for r in rollouts], completion_width, device),
        # (B, Tc, H_teacher) in its own dtype, on the device it was computed on
        teacher_hidden=_pad([r.teacher_hidden for r in rollouts], completion_width, dtype=None),
    )


def _token_advantages(rollouts: list[Rollout], width: int) -> torch.Tensor:
    """(B, width): each rollout's per-token advantages, or its one advantage on every token."""
    out = torch.zeros(len(rollouts), width, dtype=torch.float32)  # (B, Tc)
    for i, r in enumerate(rollouts):
        if r.token_advantages is None:
            out[i, : len(r.completion_ids)] = r.advantage
        else:
            out[i, : len(r.completion_ids)] = r.token_advantages
    return out


def _pad(rows: list, width: int, device=None, dtype=torch.float32) -> torch.Tensor | None:
    """(B, width, ...) of rows (Tc_i, ...), zero on padding, made where the rows are and moved to
    `device` (None: left there); in `dtype` (None: the rows' own). None if any row has none."""
    if any(r is None for r in rows):
        return None
    like = rows[0]
    out = torch.zeros(len(rows), width, *like.shape[1:], dtype=dtype or like.dtype, device=like.device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out if device is None else out.to(device)


def completion_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """Length stats of the logger over (non-empty) rollouts: mean, longest, share cut at the budget."""
    lengths = torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.float32)  # (N,)
    return {
        "completion/length_mean": float(lengths.mean()),
        "completion/length_max": float(lengths.max()),
        "completion/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }


def split_logprobs(rollouts: list[Rollout], logprobs: torch.Tensor) -> list[torch.Tensor]:
    """Each row of a (B, Tc) log-prob tensor, trimmed to its rollout's completion: (Tc_i,) each, fp32."""
    return [row[: len(r.completion_ids)].clone() for r, row in zip(rollouts, logprobs.detach().float().cpu())]
