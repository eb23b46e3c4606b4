"""Run by test_distributed.py under torchrun: GRPO runs of a tiny policy, one per entry of the JSON
job in argv[1], each into its own output_dir. For a run with "fixed": true the sampler is replaced
by completions that depend only on (prompt, sample, step), never on how prompts are cut across
ranks, so one process and several must train to the same weights; with "disagree": true each rank asks
for another learning rate (the run must stop every rank in one line). Every process records where it
imported minigrpo from (in the job's imports_dir), and keeps each AdamW step's gradients in
output_dir/gradients.pt (rank 0 writes them)."""

import json
import os
import random
import sys

import torch
from helpers import ROWS, tiny_train_config

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, distributed
from minigrpo.rollout import Samples
from minigrpo.run import Trainer, build_run
from minigrpo.tools import ToolCall
from minigrpo.verifier import register_reward


@register_reward("test_length")
def _length(completions, **_):
    """A reward random completions earn unevenly: their length in characters, modulo 4, over 3."""
    return [(len(c) % 4) / 3 for c in completions]


def fixed_sample(self, indices, round_):
    """G completions per prompt from (prompt, sample, step) alone; every third prompt's G are
    identical, so its group has no signal (dynamic sampling replaces it). With tools, a completion of
    4 tokens or more made one call, answered by its tokens 1 and 2: an observation, not generated."""
    G, tokens = self.grpo.num_generations, []
    for i in indices:
        for j in range(G):
            rng = random.Random(f"{i}-{0 if i % 3 == 0 else j}-{self.step}")
            length = rng.randint(2, self.grpo.max_completion_length)
            tokens.append([rng.randrange(self.model.config.vocab_size) for _ in range(length)])
    samples = Samples(
        tokens=tokens,
        logprobs=[[0.0] * len(t) for t in tokens],
        finish_reasons=["length"] * len(tokens),
        prompt_indices=[p for p in range(len(indices)) for _ in range(G)],
    )
    if self.grpo.tool_names:
        samples.generated = [[k not in (1, 2) or len(t) < 4 for k in range(len(t))] for t in tokens]
        samples.tool_calls = [[ToolCall("calculator", "1+1", "2")] * (len(t) >= 4) for t in tokens]
    return samples


GRADIENTS = []  # one {parameter name: whole gradient} per AdamW step of the run in progress


def recording_clip(clip):
    """distributed.ParallelModel.clip_gradients that first keeps the gradients every rank holds before the
    clip, whole (FSDP2 gathers its shards: every rank joins) and named as one process names them."""

    def clip_gradients(self, max_norm: float) -> float:
        GRADIENTS.append(
            {
                name.removeprefix("module."): _whole(p.grad)
                for name, p in self.module.named_parameters()
                if p.grad is not None
            }
        )
        return clip(self, max_norm)

    return clip_gradients


def _whole(gradient: torch.Tensor) -> torch.Tensor:
    # FSDP2: a DTensor
    return gradient.full_tensor() if hasattr(gradient, "full_tensor") else gradient.detach().clone()


def main(job: dict) -> None:
    if "imports_dir" in job:
        # A file per process, not a line on stdout: two ranks share torchrun's stdout, where a line
        # can reach the reader cut or joined to another.
        with open(os.path.join(job["imports_dir"], f"process-{os.getpid()}.txt"), "w") as f:
            f.write(f"{os.environ.get('RANK', '0')}\n{minigrpo.__file__}\n")
    sample = Trainer._sample
    distributed.ParallelModel.clip_gradients = recording_clip(distributed.ParallelModel.clip_gradients)
    for run in job["runs"]:
        Trainer._sample = fixed_sample if run.get("fixed") else sample
        train = dict(run["train"])
        if run.get("disagree"):  # each rank asks for another learning rate
            train["learning_rate"] *= 1 + int(os.environ.get("RANK", "0"))
        task = Task(ROWS, [RewardSpec("test_length")])
        grpo = dict(run["grpo"])
        if grpo.get("teacher_model") == "TEACHER":  # test_distributed.py's teacher, made beside the policy
            grpo["teacher_model"] = os.environ["MINIGRPO_TEST_TEACHER"]
        config = tiny_train_config(train.pop("output_dir"), **train)
        built = build_run(job["checkpoint"], task, GRPOConfig(**grpo), config)
        trainer = built.trainer
        GRADIENTS.clear()
        built.train()
        if trainer.dist.is_main:
            torch.save(GRADIENTS, os.path.join(config.output_dir, "gradients.pt"))


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except ValueError as error:
        sys.exit(f"distributed_job.py: {error}")
    distributed.finish()  # as train_math.py does: no rank aborts while the interpreter finalizes
