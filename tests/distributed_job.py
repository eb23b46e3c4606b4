"""Run by test_distributed.py under torchrun: GRPO runs of a tiny policy, one per entry of the JSON
job in argv[1], each into its own output_dir. With "fixed": true the sampler is replaced by
completions that depend only on (prompt, sample, step), never on how prompts are cut across ranks,
so one process and several must train to the same weights."""

import json
import os
import random
import sys

from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, distributed
from minigrpo.sampler import Samples
from minigrpo.trainer import Trainer, build_trainer
from minigrpo.verifier import register_reward

ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(4) for b in range(3)]


@register_reward("test_length")
def _length(completions, **_):
    """A reward random completions earn unevenly: their length in characters, modulo 4, over 3."""
    return [(len(c) % 4) / 3 for c in completions]


def fixed_sample(self, indices, round_):
    """G completions per prompt from (prompt, sample, step) alone; every third prompt's G are
    identical, so its group has no signal (dynamic sampling replaces it)."""
    G, tokens = self.grpo.num_generations, []
    for i in indices:
        for j in range(G):
            rng = random.Random(f"{i}-{0 if i % 3 == 0 else j}-{self.step}")
            length = rng.randint(2, self.grpo.max_completion_length)
            tokens.append([rng.randrange(self.model.config.vocab_size) for _ in range(length)])
    return Samples(tokens=tokens, logprobs=[[0.0] * len(t) for t in tokens], finish_reasons=["length"] * len(tokens),
                   prompt_indices=[p for p in range(len(indices)) for _ in range(G)])


def main(job: dict) -> None:
    if job.get("fixed"):
        Trainer._sample = fixed_sample
    for run in job["runs"]:
        train = dict(run["train"])
        if job.get("disagree"):  # each rank asks for another learning rate
            train["learning_rate"] *= 1 + int(os.environ.get("RANK", "0"))
        task = Task(ROWS, [RewardSpec("test_length")])
        trainer = build_trainer(job["checkpoint"], task, GRPOConfig(**run["grpo"]), TrainConfig(**train))
        trainer.train()


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except ValueError as error:
        sys.exit(f"distributed_job.py: {error}")
    distributed.finish()  # as train_math.py does: no rank aborts while the interpreter finalizes
