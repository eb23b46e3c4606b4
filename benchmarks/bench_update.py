"""Stage 4's cost: one update's forward and backward (token log-probs, grpo_loss) on fixed rollouts.

    python benchmarks/bench_update.py                      # cases default and vocab, every path
    python benchmarks/bench_update.py --case vocab --blocks 2
    python benchmarks/bench_update.py --case long          # long prompts: where the shared prompt pays
    python benchmarks/bench_update.py --smoke              # the smallest sizes (the suite runs this)

Paths, each in a process of its own (forked before anything is built); "growth" is the process's
peak resident memory during the updates over its resident memory just before them (the model,
the rollouts and the imports):
    full     before the chunked head: (B, Tc, V) logits, log-softmax, gather (full_vocabulary_logprobs)
    chunked  the chunked LM head (token_logprobs.ChunkedLogprobs), micro-batches of rows
    budget   chunked, micro-batches by a token budget over rollouts of similar length (micro_batch_tokens)
    shared   chunked, the same budget over whole groups, each prompt run once (shared_prompt)
    trl      transformers' Qwen3ForCausalLM with the same weights, full logits, then TRL's
             selective_log_softmax and entropy_from_logits (needs the bench extra: transformers, trl)
Cases:
    default  models/minigrpo-tiny-arith, 32 arithmetic prompts x 8 completions it samples (<= 32
             tokens), micro-batches of 256 rows: the update of python examples/train_math.py
    vocab    the 0.6B shape (vocabulary 151,936, hidden 1024) with --blocks decoder blocks, random
             weights, one prompt of 64 tokens and 4 completions of 512, micro-batches of 4 rows
    long     the benchmark tiny shape, 8 prompts of 100-300 tokens x 8 completions of 20-400
Tokens/s counts completion tokens, as the trainer's training/tokens_per_s does.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, machine_line, transformers_twin  # noqa: E402

import minigrpo  # noqa: E402
from minigrpo.rollout import Rollout, collate  # noqa: E402
from minigrpo.update import (  # noqa: E402
    full_vocabulary_logprobs,
    group_batches,
    grpo_loss,  # noqa: E402
    micro_batches,
    padding_fraction,
    token_budget_batches,
    token_logprobs,
)

PATHS = ("full", "chunked", "budget", "shared", "trl")
DEFAULT_MODEL = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith"
)
CASES = {  # rows per micro-batch, token budget, group size G, temperature
    "default": dict(rows=256, budget=4096, G=8, temperature=1.0),
    "vocab": dict(rows=4, budget=4 * 576, G=4, temperature=1.0),
    "long": dict(rows=16, budget=8192, G=8, temperature=0.7),
}


def build(case: str, blocks: int, smoke: bool):
    """(model, rollouts): the same for every path, advantages normalised per group."""
    rng = random.Random(0)
    G = CASES[case]["G"]
    if case == "default":
        model, tokenizer = minigrpo.load_pretrained(DEFAULT_MODEL)
        from minigrpo.tasks import load_problems, template

        problems = load_problems("arithmetic", "train", count=4 if smoke else 32, seed=0)
        prompts = [tokenizer.encode(template("tiny").render(p.question)) for p in problems]
        samples = minigrpo.generate(
            model, prompts, max_new_tokens=32, num_samples=G, seed=0, eos_token_ids=tokenizer.eos_token_ids
        )
        pairs = [(prompts[p], tokens) for tokens, p in zip(samples.tokens, samples.prompt_indices)]
    else:
        torch.manual_seed(0)
        shape = dict(SHAPES["0.6b" if case == "vocab" else "tiny"])
        shape["num_hidden_layers"] = blocks if case == "vocab" else shape["num_hidden_layers"]
        if smoke:
            shape.update(
                vocab_size=4096,
                hidden_size=64,
                intermediate_size=128,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=32,
                num_hidden_layers=1,
            )
        model = minigrpo.Qwen3(minigrpo.Qwen3Config(**shape))
        V, scale = shape["vocab_size"], 0.1 if smoke else 1.0
        n_prompts = 1 if case == "vocab" else 2 if smoke else 8
        pairs = []
        for _ in range(n_prompts):
            prompt = [
                rng.randrange(V)
                for _ in range(int((64 if case == "vocab" else rng.randint(100, 300)) * scale))
            ]
            for _ in range(G):
                length = 512 if case == "vocab" else rng.randint(20, 400)
                pairs.append((prompt, [rng.randrange(V) for _ in range(max(1, int(length * scale)))]))
    rollouts = []
    for prompt, completion in pairs:
        rollouts.append(
            Rollout(prompt_ids=list(prompt), completion_ids=list(completion), finish_reason="stop")
        )
    rewards = torch.tensor([rng.random() for _ in rollouts]).view(-1, G)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    for r, a in zip(rollouts, advantages.tolist()):
        r.advantage = a
    return model.train(), rollouts


def batches_for(path: str, rollouts: list[Rollout], case: str) -> list[list[int]]:
    rows, budget, G = CASES[case]["rows"], CASES[case]["budget"], CASES[case]["G"]
    lengths = [(len(r.prompt_ids), len(r.completion_ids)) for r in rollouts]
    if path == "budget":
        return token_budget_batches(lengths, rows, budget)
    if path == "shared":
        return group_batches(lengths, G, rows, budget)
    return micro_batches(len(rollouts), rows)


def logprob_function(path: str, model, case: str):
    """batch -> (logprobs, entropies) (B, Tc) for one path."""
    temperature, G = CASES[case]["temperature"], CASES[case]["G"]
    if path == "full":
        return lambda b: full_vocabulary_logprobs(
            model, b.input_ids, b.attention_mask, b.completion_start, temperature
        )
    if path in ("chunked", "budget"):
        return lambda b: token_logprobs(model, b.input_ids, b.attention_mask, b.completion_start, temperature)
    if path == "shared":
        return lambda b: token_logprobs(
            model, b.input_ids, b.attention_mask, b.completion_start, temperature, group_size=G
        )
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    twin = transformers_twin(model).train()

    def trl(b):  # TRL's GRPOTrainer: logits of the completion positions, then log-softmax, gather
        Tc = b.input_ids.shape[1] - b.completion_start
        logits = twin(input_ids=b.input_ids, attention_mask=b.attention_mask, logits_to_keep=Tc + 1).logits
        logits = logits[:, :-1] / temperature  # (B, Tc, V)
        logprobs = selective_log_softmax(logits, b.input_ids[:, b.completion_start :])
        with torch.no_grad():
            entropies = entropy_from_logits(logits)
        return logprobs, entropies

    return trl


def update(rollouts, batches, logprobs_of) -> None:
    """Forward and backward of every micro-batch, each its exact share of the step's loss."""
    tokens = sum(len(r.completion_ids) for r in rollouts)
    for chunk in batches:
        batch = collate([rollouts[i] for i in chunk], 0, "cpu")
        logprobs, entropies = logprobs_of(batch)
        loss, _ = grpo_loss(
            logprobs,
            logprobs.detach(),
            batch.advantages,
            batch.completion_mask,
            loss_type="dapo",
            num_sequences=len(rollouts),
            num_tokens=tokens,
            entropies=entropies,
        )
        loss.backward()


def resident() -> tuple[int, int]:
    """(resident, peak resident) bytes of this process, from /proc (Linux)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def measure(path: str, case: str, blocks: int, repeats: int, smoke: bool) -> dict:
    """One path in this process (a fork of its own): seconds per update (median of repeats) and peak
    growth."""
    torch.manual_seed(0)
    model, rollouts = build(case, blocks, smoke)
    batches = batches_for(path, rollouts, case)
    logprobs_of = logprob_function(path, model, case)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak to the current resident size
    before = resident()[0]
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        update(rollouts, batches, logprobs_of)
        seconds.append(time.perf_counter() - started)
    G = CASES[case]["G"] if path == "shared" else 1
    return {
        "seconds": statistics.median(seconds),
        "growth": resident()[1] - before,
        "tokens": sum(len(r.completion_ids) for r in rollouts),
        "rows": len(rollouts),
        "micro_batches": len(batches),
        "padding": padding_fraction(rollouts, batches, G),
    }


def in_own_process(function, *args) -> dict:
    """function(*args) in a forked child, so that its peak memory is its own and what it allocates
    leaves with it: {"result": ...}, or {"error": its traceback, "missing_module": bool}."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, send the result as one JSON text, leave without cleaning up
        os.close(read)
        try:
            done = {"result": function(*args)}
        except BaseException as error:
            done = {"error": traceback.format_exc(), "missing_module": isinstance(error, ModuleNotFoundError)}
        with os.fdopen(write, "w") as pipe:
            pipe.write(json.dumps(done))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"error": "the child died without a result", "missing_module": False}


def run_case(case: str, paths, blocks: int, repeats: int, smoke: bool) -> list[str]:
    lines = [
        f"case {case}"
        + (f", {blocks} block(s)" if case == "vocab" else "")
        + f", {repeats} update(s) per path",
        "| path | micro-batches | padding | s / update | tokens/s | peak growth GB "
        "| time vs full | tokens/s vs chunked |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    results = {}
    for path in paths:
        done = in_own_process(measure, path, case, blocks, repeats, smoke)
        if "error" in done and path == "trl" and done["missing_module"]:
            lines.append("| trl | (skipped: pip install -e '.[bench]' for transformers and trl) |||||||")
        elif "error" in done:
            raise SystemExit(f"bench_update.py: path {path} failed:\n{done['error']}")
        else:
            results[path] = done["result"]
    full, chunked = results.get("full"), results.get("chunked")
    for path, r in results.items():
        lines.append(
            f"| {path} | {r['micro_batches']} | {100 * r['padding']:.1f}% | {r['seconds']:.3f} | "
            f"{r['tokens'] / r['seconds']:,.0f} | "
            f"{r['growth'] / 1e9:.2f} | "
            + (f"{r['seconds'] / full['seconds']:.2f}x" if full else "-")
            + " | "
            + (f"{chunked['seconds'] / r['seconds']:.2f}x" if chunked else "-")
            + " |"
        )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=list(CASES), action="append", help="default: default and vocab")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--blocks", type=int, default=1, help="decoder blocks of the vocab case")
    parser.add_argument(
        "--budget", type=int, help="token budget of the budget and shared paths (default: per case)"
    )
    parser.add_argument(
        "--repeats", type=int, help="updates per path (default: 5 for default, 2 for long, 1 for vocab)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one update: checks that every path runs"
    )
    args = parser.parse_args()
    for case in CASES.values() if args.budget else ():
        case["budget"] = args.budget
    paths = [p.strip() for p in args.paths.split(",")]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown paths: {', '.join(unknown)}")
    print(machine_line())
    for case in args.case or ["default", "vocab"]:
        repeats = args.repeats or (1 if args.smoke or case == "vocab" else 2 if case == "long" else 5)
        print("\n".join(run_case(case, paths, args.blocks, repeats, args.smoke)) + "\n")


if __name__ == "__main__":
    main()
