"""Outside the loop: how well a policy solves held-out problems (before and after training, and
for checkpoints).

In: a model, its tokenizer, problems, a prompt template and the task's rewards. Out: per-problem
results and pass@1 (greedy or sampled), pass@k (the unbiased estimator of Chen et al. 2021 from
n samples) and majority-vote@k; for completions with checkable arithmetic steps, how faithful they
are: the share of steps that are right, and the share of right answers reached through a wrong or
irrelevant step; with tools, how many calls a completion makes. It uses the batched sampler (and a
tools.ToolRunner) and the verifier, and trains nothing. During a run, a Trainer's policy is evaluated
with its ranks sharing the problems (`evaluate_held_out`), and the starting policy's score is measured
once per output_dir and kept in its initial_eval.json (`initial_evaluation`, through checkpoint.py).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass

from ..rollout import generate
from ..step_rewards import policy_steps
from ..tasks import Problem, Template, to_task
from ..tools import ToolRunner, declared_tools
from ..verifier import RewardSpec, compute_rewards, extract_answer, normalize
from . import checkpoint


@dataclass
class Evaluation:
    pass_at_1: float  # mean correctness of single samples (greedy when temperature is 0)
    pass_at_k: dict[int, float]  # k -> probability that one of k samples is correct
    majority_at_k: float  # the most common answer among the n samples is correct
    results: list[dict]  # per problem: question, answer, completions, correct flags, steps
    step_accuracy: float | None = None  # share of the completions' arithmetic steps that are right
    unfaithful_frac: float | None = None  # share of right completions with a wrong or irrelevant step
    tool_calls_per_completion: float | None = None  # calls a completion made; None: evaluated without tools

    def stats(self) -> dict[str, float]:
        """The logger's held-out stats: eval/accuracy, and the faithfulness of steps where there were any."""
        stats = {"eval/accuracy": self.pass_at_1}
        if self.step_accuracy is not None:
            stats["held_out/step_accuracy"] = self.step_accuracy
            stats["held_out/unfaithful_frac"] = self.unfaithful_frac
        if self.tool_calls_per_completion is not None:
            stats["held_out/tool_calls_per_completion"] = self.tool_calls_per_completion
        return stats


def evaluate(
    model,
    tokenizer,
    problems: list[Problem],
    template: Template,
    rewards: list[RewardSpec] | None = None,
    *,
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    max_batch_rows: int = 256,
    seed: int = 0,
    ks: tuple[int, ...] = (),
    tools: list[str] = (),
    tool_format: str = "calc",
    max_tool_calls: int = 4,
) -> Evaluation:
    """Sample `samples` completions per problem (greedy if temperature is 0) and score them; with
    `tools` (registered names), completions may call them in `tool_format`, up to max_tool_calls each.

    One sampler call for every problem: at most `max_batch_rows` rows decode at once (the KV cache
    holds that many), and a finished row is refilled with the next waiting one.
    """
    if not problems:  # a rank whose block of the held-out set is empty
        return summarize([], samples, ks)
    declared = declared_tools(tokenizer, list(tools))  # as training's prompts (a plain template ignores it)
    task = to_task(problems, template, rewards or [RewardSpec("accuracy")], tokenizer, declared)
    prompts = tokenizer.encode_all([row["prompt"] for row in task.rows], "held-out prompts")
    runner = ToolRunner(tokenizer, tool_format, list(tools), max_tool_calls) if tools else None
    with runner or contextlib.nullcontext():
        out = generate(
            model,
            prompts,
            tools=runner,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            num_samples=samples,
            eos_token_ids=tokenizer.eos_token_ids,
            seed=seed,
            max_batch_rows=max_batch_rows,
        )
    # each completion's tool calls, as the sampler reports them (None: tools off)
    calls = [len(made) for made in out.tool_calls] if out.tool_calls is not None else [None] * len(out.tokens)
    texts = [tokenizer.decode_completion(ids) for ids in out.tokens]
    marks = out.generated or [None] * len(out.tokens)  # per token: the policy's (True) or a tool's
    columns = task.columns(task.rows, samples)  # each row's values, once per completion
    columns["completion_tokens"] = [len(ids) for ids in out.tokens]  # for a length reward in tokens
    scores = compute_rewards(texts, columns, task.rewards).total
    results = []
    for i, p in enumerate(problems):
        problem_rows = slice(i * samples, (i + 1) * samples)
        results.append(
            {
                "question": p.question,
                "answer": p.answer,
                "completions": texts[problem_rows],
                "correct": [s > 0.5 for s in scores[problem_rows]],
                # per completion, each step's (right, relevant): see verifier/steps.py
                "steps": [
                    _step_marks(tokenizer, out.tokens[j], marks[j], texts[j], p.question)
                    for j in range(problem_rows.start, problem_rows.stop)
                ],
                "tool_calls": calls[problem_rows],  # per completion; None without tools
            }
        )
    return summarize(results, samples, ks)


def summarize(results: list[dict], samples: int, ks: tuple[int, ...] = ()) -> Evaluation:
    """The Evaluation of per-problem results (each with `samples` correct flags), e.g. joined from
    several ranks."""
    step_accuracy, unfaithful_frac = _faithfulness(results)
    return Evaluation(
        pass_at_1=_mean([sum(r["correct"]) / samples for r in results]),
        pass_at_k={
            k: _mean([pass_at_k(samples, sum(r["correct"]), k) for r in results]) for k in ks if k <= samples
        },
        majority_at_k=_mean([_majority_correct(r) for r in results]),
        results=results,
        step_accuracy=step_accuracy,
        unfaithful_frac=unfaithful_frac,
        tool_calls_per_completion=_calls_per_completion(results),
    )


def _calls_per_completion(results: list[dict]) -> float | None:
    """Mean tool calls per completion; None when evaluated without tools."""
    counts = [n for r in results for n in r.get("tool_calls", []) if n is not None]
    return _mean(counts) if counts else None


def _step_marks(tokenizer, ids, generated, completion: str, question: str) -> list[tuple[bool, bool]]:
    """(right, relevant) of each arithmetic step the policy wrote in a completion, as training reads
    them (none inside a tool's output)."""
    steps = policy_steps(tokenizer, ids, generated, completion, question)
    return [(step.correct, step.relevant) for step in steps]


def _faithfulness(results: list[dict]) -> tuple[float | None, float | None]:
    """(share of steps that are right, share of right completions with a wrong or irrelevant step);
    (None, None) when no completion has a step to check."""
    steps = 0
    right_steps = 0
    right_completions = 0
    unfaithful = 0
    for result in results:
        for marks, correct in zip(result.get("steps", []), result["correct"]):
            steps += len(marks)
            right_steps += sum(right for right, _ in marks)
            if correct:
                right_completions += 1
                unfaithful += any(not (right and relevant) for right, relevant in marks)
    if not steps:
        return None, None
    return right_steps / steps, unfaithful / max(right_completions, 1)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _majority_correct(result: dict) -> float:
    """Whether the most common final answer (by normalised spelling) is among the correct ones.

    Extracting and normalising run here, in this process, not in the verifier's bounded workers:
    both are single linear scans (see their modules), so a hostile completion costs milliseconds."""
    answers = [extract_answer(c) for c in result["completions"]]
    keyed = [(normalize(a) if a else None, ok) for a, ok in zip(answers, result["correct"])]
    counts = Counter(key for key, _ in keyed if key)
    if not counts:
        return 0.0
    top = counts.most_common(1)[0][0]
    return float(any(ok for key, ok in keyed if key == top))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# -- during a run: its trainer's policy, and the starting policy's score kept in output_dir ---------
def evaluate_held_out(trainer, problems, template, rewards=None, **settings) -> Evaluation:
    """`evaluate` of a Trainer's policy on held-out problems, each rank taking a block of them;
    every rank gets the result over all of them. Greedy results do not depend on the number of ranks;
    sampled ones (temperature > 0) do, as each rank seeds its own block."""
    rank_problems = trainer.dist.block_of(problems)
    trainer.model.eval()
    with trainer.policy.gathered():
        results = evaluate(
            trainer.model, trainer.tokenizer, rank_problems, template, rewards, **settings
        ).results
    return summarize(trainer.dist.gather_joined(results), settings.get("samples", 1), settings.get("ks", ()))


def initial_evaluation(trainer, measure, measured_on: dict) -> dict:
    """The starting policy's score, measured once per output_dir: a fresh run calls measure(), which
    returns held-out stats ({"eval/accuracy": ..., and others such as "held_out/step_accuracy"}), and
    keeps {"initial_accuracy", "initial_stats", "wall_seconds_before", "held_out": measured_on} in
    initial_eval.json; a resumed run reads it back (its policy is no longer the starting one). Every
    rank calls it (measure() is an evaluation they run together)."""
    config = trainer.config
    dist = trainer.dist
    recorded = {}
    if config.resume and dist.is_main:
        recorded = checkpoint.read_initial_evaluation(config.output_dir)
    recorded = dist.broadcast(recorded)  # every rank takes the same branch below
    if recorded.get("held_out") == measured_on:
        return recorded
    if trainer.step > 0:  # the starting policy is gone: measuring now would compare the run with itself
        was = _described(recorded["held_out"]) if recorded.get("held_out") else "problems not recorded"
        raise ValueError(
            f"this run's accuracy before GRPO was measured on {was}, not on "
            f"{_described(measured_on)}: resume with the same held-out problems and tools (or start "
            "a new output_dir), so that before and after measure the same thing"
        )
    stats = measure()
    initial = {
        "initial_accuracy": stats["eval/accuracy"],
        "initial_stats": stats,
        "wall_seconds_before": 0.0,
        "held_out": measured_on,
    }
    if dist.is_main:
        checkpoint.save_initial_evaluation(config.output_dir, initial)
    return initial


def _described(settings: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in settings.items())
