"""A study aid: one group's journey through every stage of one GRPO step, printed as it happens.

Pass a `Trace` to `Trainer.train_step(observer=...)` (or `--trace` to examples/train_math.py).
After stage 3 it prints the first group: the prompt, its G completions, their extracted answers,
each reward component, the group's mean and std and each advantage. After stage 4 it prints,
token by token, the log-probs before and after the update and their ratio, then the loss stats.
It only reads: the step it watches is the step that would have run anyway. Under torchrun every
rank computes what it shows (the log-probs need every rank when the policy is sharded), rank 0 prints.
"""

from __future__ import annotations

import torch

from .loss import token_logprobs
from .rollout import collate
from .verifier import extract_answer

MAX_TOKENS_SHOWN = 16  # per completion in the token table


class Trace:
    def __init__(self, write=print):
        self.write = write
        self.group = []

    def rollouts(self, trainer, rollouts, texts) -> None:
        G = trainer.grpo.num_generations
        self.group = rollouts[:G]
        self.before = self._logprobs(trainer)
        rewards = torch.tensor([r.reward for r in self.group])
        w = self._writer(trainer)
        w("=" * 30 + f" step {trainer.step}: one group's journey " + "=" * 30)
        w(f"[task -> prompt]   {trainer.tokenizer.decode(self.group[0].prompt_ids)!r}")
        w(f"[1 sample]         {G} completions at temperature {trainer.grpo.temperature}:")
        for i, (r, text) in enumerate(zip(self.group, texts[:G])):
            rewards_text = ", ".join(f"{k}={v:g}" for k, v in r.rewards.items())
            w(f"  #{i} {text!r:60.60}  answer={extract_answer(text)!r} ({r.finish_reason}, {len(r.completion_ids)} tokens)")
            w(f"     [2 verify] {rewards_text} -> total {r.reward:g}   [3 advantage] {r.advantage:+.3f}")
        w(f"[3 advantages]     group mean {rewards.mean():.3f}, std {rewards.std():.3f} (scale={trainer.grpo.scale_rewards}); "
          f"advantage = (reward - mean) / (std + eps)" + ("  -> all equal: no signal" if rewards.std() == 0 else ""))

    def updated(self, trainer, stats: dict) -> None:
        after = self._logprobs(trainer)
        w = self._writer(trainer)
        w(f"[4 update]         {trainer.grpo.num_iterations} pass(es), loss_type={trainer.grpo.loss_type}: "
          "per token, log p before -> after the AdamW step, and ratio p_after / p_before")
        for i, r in enumerate(self.group):
            n = min(len(r.completion_ids), MAX_TOKENS_SHOWN)
            cells = []
            for t in range(n):
                token = trainer.tokenizer.decode([r.completion_ids[t]])
                ratio = float(torch.exp(after[i, t] - self.before[i, t]))
                cells.append(f"{token!r}:{self.before[i, t]:.2f}->{after[i, t]:.2f}(x{ratio:.3f})")
            w(f"  #{i} A={r.advantage:+.2f}  " + " ".join(cells) + (" ..." if len(r.completion_ids) > n else ""))
        shown = {k: round(v, 5) for k, v in stats.items() if k in ("loss", "ratio/mean", "clip/region_frac", "kl", "entropy", "grad_norm")}
        w(f"[4 loss]           {shown}   (with num_iterations=1 the ratio inside the loss is exactly 1, so the loss")
        w("                   is about -mean(advantage) = 0; its gradient, A * grad log p, is what moved the tokens above)")
        w("=" * 92)

    def _writer(self, trainer):
        return self.write if trainer.dist.is_main else (lambda *_: None)

    def _logprobs(self, trainer) -> torch.Tensor:
        batch = collate(self.group, trainer.pad_id, trainer.model.device)
        with torch.no_grad(), trainer.gathered():
            logprobs, _ = token_logprobs(trainer.model, batch.input_ids, batch.attention_mask,
                                         batch.completion_start, trainer.grpo.temperature)
        return logprobs.cpu()  # (G, Tc)
