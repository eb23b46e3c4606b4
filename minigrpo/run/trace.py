"""A study aid: one group's journey through every stage of one GRPO step, printed as it happens.

Pass a `Trace` to `Trainer.train_step(observer=...)` (or `--trace` to examples/train_math.py).
After stage 3 it prints the first group: the prompt, its G completions, their extracted answers,
each reward component, each arithmetic step marked right or wrong with its step reward (whether or
not the run trains on them), each tool call with its response (the observation, not trained), the
group's mean and std and each advantage; with a teacher (on-policy distillation), the tokens where the
teacher's log-prob is farthest from the policy's, both shown. After stage 4 it prints, for
the tokens of each completion the update moved most, their log-probs before and after and the
ratio, then the loss stats.
With `html_path` it also writes that group as one self-contained page (`render_html` of
`self.record`, plain data): every token coloured by how far the update moved its log-prob, a tool's
observation tokens greyed and marked "not trained", a teacher's log-prob in each token's numbers.
It only reads: the step it watches is the step that would have run anyway. Under torchrun every
rank computes what it shows (the log-probs need every rank when the policy is sharded), rank 0 prints.
"""

from __future__ import annotations

import html
import math

import torch

from ..files import replaced_whole
from ..rollout import collate
from ..step_rewards import policy_steps
from ..update import formula, token_logprobs
from ..verifier import extract_answer

# per completion in the token table: those the update moved most, in their order (and with a teacher,
# those where its log-prob is farthest from the policy's)
MAX_TOKENS_SHOWN = 8
# the update stats shown, in order
BRIEF = (
    "loss",
    "ratio/mean",
    "clip/region_frac",
    "kl",
    "entropy",
    "grad_norm",
)


class Trace:
    """An observer of `Trainer.train_step`: `after_advantages` shows the first group's rollouts after stage
    3, `after_update` what the update did to them after stage 4."""

    def __init__(self, write=print, html_path: str | None = None):
        self.write = write
        self.html_path = html_path
        self.group = []
        self.record = {}

    def after_advantages(self, trainer, rollouts) -> None:
        G = trainer.grpo.num_generations
        self.group = rollouts[:G]
        self.before = self._logprobs(trainer)
        rewards = torch.tensor([r.reward for r in self.group])
        prompt = trainer.tokenizer.decode(self.group[0].prompt_ids)
        self.record = {
            "step": trainer.step,
            "prompt": prompt,
            "mean": float(rewards.mean()),
            "std": float(rewards.std()),
            "completions": [
                dict(
                    text=r.text,
                    answer=extract_answer(r.text),
                    rewards=dict(r.rewards),
                    reward=r.reward,
                    advantage=r.advantage,
                    finish_reason=r.finish_reason,
                    steps=_steps(r, prompt, trainer.tokenizer),
                    calls=[_call(call) for call in r.tool_calls],
                    teacher_logprobs=None if r.teacher_logprobs is None else r.teacher_logprobs.tolist(),
                )
                for r in self.group
            ],
        }
        w = self._writer(trainer)
        w("=" * 30 + f" step {trainer.step}: one group's journey " + "=" * 30)
        w(f"[task -> prompt]   {self.record['prompt']!r}")
        w(f"[1 sample]         {G} completions at temperature {trainer.grpo.temperature}:")
        for i, r in enumerate(self.group):
            rewards_text = ", ".join(f"{k}={v:g}" for k, v in r.rewards.items())
            w(
                f"  #{i} {r.text!r:60.60}  answer={extract_answer(r.text)!r} "
                f"({r.finish_reason}, {len(r.completion_ids)} tokens)"
            )
            w(f"     [2 verify] {rewards_text} -> total {r.reward:g}   [3 advantage] {r.advantage:+.3f}")
            for call in self.record["completions"][i]["calls"]:
                w(f"     [1 tool]   {_call_text(call)}")
            steps = self.record["completions"][i]["steps"]
            if steps:
                w("     [2 steps]  " + "  ".join(_step_mark(step) for step in steps))
            if r.token_advantages is not None:
                w(f"     [3 token advantages, by step] {_by_step(r.token_advantages, r.step_ends)}")
            if r.teacher_logprobs is not None:
                cells = _teacher_cells(trainer.tokenizer, r, self.before[i])
                w("     [3 teacher]    log p policy / teacher, farthest apart: " + " ".join(cells))
        w(
            f"[3 advantages]     group mean {rewards.mean():.3f}, std {rewards.std():.3f} "
            f"(scale={trainer.grpo.scale_rewards}); "
            + (
                f"advantage_estimator={trainer.grpo.advantage_estimator}: "
                if trainer.grpo.advantage_estimator != "grpo"
                else ""
            )
            + f"advantage = {formula(trainer.grpo)}"
            + ("  -> all equal: no signal" if rewards.std() == 0 else "")
        )
        if trainer.plan.teacher is not None:
            w(
                f"[3 distillation]   {trainer.plan.distillation.describe()} (update/distillation.py): the "
                "teacher's log-probs above are those it grades the policy's tokens by"
            )
        if trainer.grpo.advantage_type != "outcome":
            w(
                f"[3 advantages]     advantage_type={trainer.grpo.advantage_type}: the loss uses each "
                "token's advantage, the sum of the normalised step rewards of the steps ending at or after it"
            )

    def after_update(self, trainer, stats: dict) -> None:
        after = self._logprobs(trainer)
        for i, (r, shown) in enumerate(zip(self.group, self.record["completions"])):
            generated = r.generated or [True] * len(r.completion_ids)
            # (text, log p before, log p after, the policy's own: False for an observation, not trained)
            shown["tokens"] = [
                (trainer.tokenizer.decode([token]), float(self.before[i, t]), float(after[i, t]), trained)
                for t, (token, trained) in enumerate(zip(r.completion_ids, generated))
            ]
        self.record["stats"] = dict(stats)
        w = self._writer(trainer)
        objective = trainer.updater.objective.describe()
        w(
            f"[4 update]         {trainer.grpo.num_iterations} pass(es), {objective}: "
            f"the {MAX_TOKENS_SHOWN} tokens of each completion it moved most, "
            "position:token log p before -> after the AdamW step (ratio)"
        )
        for i, shown in enumerate(self.record["completions"]):
            w(f"  #{i} A={shown['advantage']:+.2f}  " + " ".join(_most_moved(shown["tokens"])))
        adapters = trainer.plan.adapters
        trained = (
            "every weight"
            if adapters is None
            else f"LoRA adapters r={adapters.rank} on {','.join(adapters.targets)}; the base is frozen"
        )
        w(f"[4 trained]        {trainer.trainable_parameters:,} parameters ({trained})")
        # in BRIEF's order: stats' own order varies by run
        brief = {k: round(stats[k], 5) for k in BRIEF if k in stats}
        w(
            f"[4 loss]           {brief}   "
            "(with num_iterations=1 the ratio inside the loss is exactly 1, so the loss"
        )
        w(
            "                   is about -mean(advantage) = 0; "
            "its gradient, A * grad log p, is what moved the tokens above)"
        )
        if self.html_path and trainer.dist.is_main:
            # a page of an earlier run stays whole until this one is
            with replaced_whole(self.html_path) as f:
                f.write(render_html(self.record))
            w(f"[trace page]       {self.html_path}")
        w("=" * 92)

    def _writer(self, trainer):
        return self.write if trainer.dist.is_main else (lambda *_: None)

    def _logprobs(self, trainer) -> torch.Tensor:
        batch = collate(self.group, trainer.pad_id, trainer.model.device)
        with torch.no_grad(), trainer.policy.gathered():
            logprobs, _ = token_logprobs(
                trainer.model,
                batch.input_ids,
                batch.attention_mask,
                batch.completion_start,
                trainer.grpo.temperature,
            )
        return logprobs.cpu()  # (G, Tc)


CSS = """body { font: 15px/1.45 system-ui, sans-serif; max-width: 1180px; margin: 24px auto; \
padding: 0 16px; color: #222 }
pre, .tokens { font: 14px/1.9 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all }
pre { background: #f4f4f4; padding: 8px 12px; border-radius: 6px }
.completion { border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; margin: 8px 0 }
.tok { border-radius: 3px; outline: 1px solid #0001 } .key { color: #666 } h2 { margin: 20px 0 6px }
.stats { columns: 3; font: 13px ui-monospace, monospace } .stats div { break-inside: avoid }
.obs { background: #e4e4e4; color: #777 } .call { font: 13px ui-monospace, monospace; margin-left: 12px }"""


def _colour(delta: float, scale: float, decades: float = 3.0) -> str:
    """Green when the update raised the token's log-prob, red when it lowered it; the shade is on a
    log scale, full at |delta| = scale (the page's largest change), none at scale / 10**decades."""
    alpha = (
        min(max(1 + math.log10(abs(delta) / scale) / decades, 0.0), 1.0) * 0.85 if delta and scale else 0.0
    )
    return f"rgba(0, 170, 60, {alpha:.3f})" if delta >= 0 else f"rgba(220, 30, 30, {alpha:.3f})"


def _steps(r, prompt: str, tokenizer) -> list[dict]:
    """A completion's arithmetic steps, right or wrong, each with the step reward the run trains on
    (the checker's, or a Monte-Carlo value) where it has them, else the checker's; then, in a process-
    supervised run, the answer step (step_rewards/checked.py) with its reward. The steps are those
    training reads: none inside a tool's output."""
    steps = policy_steps(tokenizer, r.completion_ids, r.generated, r.text, prompt)
    trained = r.step_rewards if len(r.step_rewards) == len(steps) + 1 else [step.reward for step in steps]
    shown = [
        dict(text=r.text[step.start : step.end], correct=step.correct, reward=reward)
        for step, reward in zip(steps, trained)
    ]
    if len(trained) > len(steps):
        shown.append(dict(text="answer", correct=r.reward > 0, reward=trained[-1]))
    return shown


def _call(call) -> dict:
    """A tools.ToolCall as plain data."""
    return dict(
        tool=call.tool, call=call.call, response=call.response, error=call.error, seconds=call.seconds
    )


def _call_text(call: dict) -> str:
    """One tool call as the trace prints it."""
    failed = " (error)" if call["error"] else ""
    shown = f"{call['tool'] or '(no tool)'}({call['call']!r:.60}) -> {call['response']!r:.60}{failed}"
    return shown + "  [observation: not trained]"


def _by_step(token_advantages: torch.Tensor, step_ends: list[int]) -> str:
    """Process advantages as the trace shows them: the value on the tokens of each step (up to its last
    token), then on the tokens after the last step."""
    starts = [0] + [end + 1 for end in step_ends]
    values = [f"{float(token_advantages[start]):+.3f}" for start in starts if start < len(token_advantages)]
    return " | ".join(values)


def _step_mark(step: dict) -> str:
    """One arithmetic step as the trace shows it: its text, right or wrong, and its step reward."""
    return f"{step['text']} {'right' if step['correct'] else 'WRONG'} ({step['reward']:+.3g})"


def _most_moved(tokens: list[tuple[str, float, float, bool]]) -> list[str]:
    """Cells of the MAX_TOKENS_SHOWN tokens (text, log p before, after, trained) whose log-prob moved most,
    in order; observations are not the policy's, so not among them."""
    trained = [t for t in range(len(tokens)) if tokens[t][3]]
    moved = sorted(trained, key=lambda t: -abs(tokens[t][2] - tokens[t][1]))[:MAX_TOKENS_SHOWN]
    return [
        f"{t}:{tokens[t][0]!r} {tokens[t][1]:.2f}->{tokens[t][2]:.2f}"
        f"(x{math.exp(tokens[t][2] - tokens[t][1]):.3f})"
        for t in sorted(moved)
    ]


def _teacher_cells(tokenizer, r, policy_logprobs: torch.Tensor) -> list[str]:
    """Cells of the MAX_TOKENS_SHOWN policy tokens whose log-prob under the policy (before the update)
    is farthest from the teacher's, in order: position:token, both log-probs."""
    generated = r.generated or [True] * len(r.completion_ids)
    positions = [t for t, trained in enumerate(generated) if trained]  # the policy's own tokens
    gaps = {t: float(policy_logprobs[t] - r.teacher_logprobs[t]) for t in positions}
    shown = sorted(sorted(positions, key=lambda t: -abs(gaps[t]))[:MAX_TOKENS_SHOWN])
    return [
        f"{t}:{tokenizer.decode([r.completion_ids[t]])!r} "
        f"{float(policy_logprobs[t]):.2f}/{float(r.teacher_logprobs[t]):.2f}"
        for t in shown
    ]


def _steps_html(steps: list[dict]) -> str:
    """A completion's arithmetic steps, each marked right (green) or wrong (red) with its step reward."""
    if not steps:
        return ""
    marks = "".join(
        f"<span class='step {'right' if s['correct'] else 'wrong'}' "
        f"style='background:{_colour(1 if s['correct'] else -1, 1)}'>"
        f"{html.escape(s['text'])} {'✓' if s['correct'] else '✗'} step reward {s['reward']:+g}</span> "
        for s in steps
    )
    return f"<div class='steps'><span class='key'>steps</span> {marks}</div>"


def _token_html(
    text: str, before: float, after: float, trained: bool, scale: float, teacher: float | None = None
) -> str:
    """One token: coloured by its change, or greyed when it is a tool's observation (not trained); its
    numbers, a teacher's log-prob too, in its title."""
    if not trained:
        return f"<span class='tok obs' title='tool observation: not trained'>{html.escape(text)}</span>"
    taught = "" if teacher is None else f", teacher log p {teacher:.6f}"
    return (
        f"<span class='tok' style='background:{_colour(after - before, scale)}' "
        f"title='log p {before:.6f} → {after:.6f} (Δ {after - before:+.3g}){taught}'>"
        f"{html.escape(text)}</span>"
    )


def _calls_html(calls: list[dict]) -> str:
    """A completion's tool calls, each with its response."""
    if not calls:
        return ""
    rows = "".join(
        f"<div class='call'>{html.escape(c['tool'])}({html.escape(c['call'])}) → "
        f"{html.escape(c['response'])}{' <b>error</b>' if c['error'] else ''} "
        f"<span class='key'>{c['seconds'] * 1e3:.1f} ms, observation not trained</span></div>"
        for c in calls
    )
    return f"<div class='calls'><span class='key'>tool calls</span>{rows}</div>"


def render_html(record: dict) -> str:
    """Trace.record as one page: inline CSS, no script, no URL; each token's numbers in its title."""
    e = html.escape
    step = record["step"]
    completions = record["completions"]
    scale = max((abs(a - b) for c in completions for _, b, a, trained in c["tokens"] if trained), default=0.0)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>minigrpo trace, step {step}</title>",
        f"<style>{CSS}</style></head><body><h1>Step {step}: one group's journey</h1>",
        f"<h2>Prompt</h2><pre class='prompt'>{e(record['prompt'])}</pre>"
        f"<h2>{len(completions)} completions</h2>",
        f"<p>Group reward mean {record['mean']:.4g}, std {record['std']:.4g}; "
        "advantage = (reward − mean) / (std + eps). "
        "A token's colour is its log p after − before the update: "
        f"<span style='background:{_colour(1, 1)}'>up</span>, "
        f"<span style='background:{_colour(-1, 1)}'>down</span>, "
        f"shaded on a log scale from |Δ| = {scale / 1000:.2g} "
        f"to {scale:.2g}; hover over a token for its numbers. "
        "<span class='tok obs'>Grey</span> tokens are a tool's observation: context, not trained.</p>",
    ]
    for i, c in enumerate(completions):
        rewards = ", ".join(f"{k} {v:g}" for k, v in c["rewards"].items())
        before = sum(b for _, b, _, trained in c["tokens"] if trained)
        after = sum(a for _, _, a, trained in c["tokens"] if trained)
        teacher = c.get("teacher_logprobs") or [None] * len(c["tokens"])  # a teacher's, per token
        spans = "".join(_token_html(*token, scale, taught) for token, taught in zip(c["tokens"], teacher))
        parts.append(
            f"<div class='completion'><b>#{i}</b> "
            f"<span class='key'>reward</span> <b class='reward'>{c['reward']:.6g}</b> ({e(rewards)}) "
            f"<span class='key'>advantage</span> <b class='advantage'>{c['advantage']:+.6g}</b> "
            f"<span class='key'>answer</span> {e(repr(c['answer']))} "
            f"<span class='key'>{e(c['finish_reason'])}, "
            f"{len(c['tokens'])} tokens, log p {before:.4f} → {after:.4f}</span>"
            f"{_steps_html(c.get('steps', []))}{_calls_html(c.get('calls', []))}"
            f"<div class='tokens'>{spans}</div></div>"
        )
    loss_first = sorted(record["stats"].items(), key=lambda kv: (kv[0] != "loss", kv[0]))
    stats = "".join(
        f"<div><span class='key'>{e(k)}</span> <span class='stat'>{v:.6g}</span></div>" for k, v in loss_first
    )
    return "\n".join(
        parts + [f"<h2>Loss and stats of the update</h2><div class='stats'>{stats}</div></body></html>"]
    )
