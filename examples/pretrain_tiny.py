"""Make the embedded defaults: tiny Qwen3s that half know multi-step arithmetic, with or without a calculator.

    python examples/pretrain_tiny.py --output runs/tiny-arith
    python examples/pretrain_tiny.py --overwrite                  # replaces models/minigrpo-tiny-arith
    python examples/pretrain_tiny.py --kind calc --overwrite      # replaces models/minigrpo-tiny-calc
    python examples/pretrain_tiny.py --kind countdown --overwrite # replaces models/minigrpo-tiny-countdown

Supervised warm-up on generated worked solutions ("23*6=138;47+138=185;####185"), stopped early
on purpose: GRPO needs a start that is right sometimes (20-50% greedy on held-out problems) and
right more often among several samples (pass@8 well above pass@1). The tokenizer is a small BPE
trained here with `tokenizers` (digits split one by one); the model and tokenizer are saved in
Hugging Face layout and load with `minigrpo.load_pretrained` like any Qwen3 checkpoint.

--kind calc: the problems are 3-digit by 2-digit products inside sums (synthetic.calc), and the worked
solutions send about a third of their steps to the calculator (`<calc>347*56</calc><out>19432</out>`,
the markers one token each). The loss skips the calculator's answers, which the policy never writes,
as GRPO's does. The model starts as an unreliable tool user that mostly computes in its head; its
directory records its task (data kind, template, tools and their format, completion length) in
tokenizer_config.json's "minigrpo_task", which train_math.py and eval_math.py take as defaults.

--kind countdown: reach a target with + - * and each of three numbers once ("13,12,7->8"), the worked
solution the expression that made the problem. Many answers are right, so held-out accuracy is the
Countdown check's (verifier/countdown.py), not the answer's value. It records its task as the calc model
does; it gives the comparison of objectives the task arXiv 2512.07611 ran dynamic sampling on.

The output is written whole or not at all (save_pretrained), with pretrain.json, the run's record. It is a
new or an empty directory, or, with --overwrite, a checkpoint (a model's files and pretrain.json, nothing
else), which is then replaced whole: the embedded defaults exist, so remaking one takes --overwrite. All of
this, and that a file can be written there, is checked before any work.
"""

import json
import math
import os
import re
import sys
import tempfile
import time

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import minigrpo
from minigrpo.flags import OneLineErrors
from minigrpo.model import output_problem
from minigrpo.rollout import Rollout, collate
from minigrpo.run import evaluate
from minigrpo.tasks import generate_problems, template
from minigrpo.update import token_logprobs
from minigrpo.verifier import RewardSpec

# The embedded defaults, found from this file: the default runs work offline from any directory.
MODELS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
# per kind: its directory, how many worked solutions it learns from (countdown at difficulty 1 has under
# 14,000 distinct train problems), its warm-up's length (an upper bound, and the held-out greedy accuracy that
# stops it earlier), and the task it records there: option values train_math.py and eval_math.py take
# as defaults (eval_math.py those of its own options). The calc model's greedy accuracy stays near 0
# (its greedy completions compute the product in the head), so its warm-up stops on steps alone.
KINDS = {
    "arithmetic": dict(
        directory="minigrpo-tiny-arith", train_problems=20_000, max_steps=600, stop_accuracy=0.30, task=None
    ),
    "calc": dict(
        directory="minigrpo-tiny-calc",
        train_problems=20_000,
        max_steps=200,
        stop_accuracy=1.0,
        task={
            "data": "calc",
            "difficulty": 1,
            "template": "tiny",
            "tools": "calculator",
            "tool_format": "calc",
            "max_completion_length": 64,
            "max_steps": 100,
        },
    ),
    "countdown": dict(
        directory="minigrpo-tiny-countdown",
        train_problems=10_000,
        max_steps=600,
        stop_accuracy=0.30,
        task={"data": "countdown", "difficulty": 1, "template": "tiny", "max_completion_length": 40},
    ),
}
# the calc tool format's markers (tools/registry.py's FORMATS), one token each
CALC_MARKERS = ["<calc>", "</calc>", "<out>", "</out>"]
RECORD = "pretrain.json"  # in the output, beside the checkpoint's files: the command and its figures
parser = OneLineErrors(description=__doc__.split("\n")[0])
parser.add_argument(
    "--kind", choices=list(KINDS), default="arithmetic", help="what the model learns to solve"
)
parser.add_argument(
    "--output",
    help="a new or empty directory, or see --overwrite (default: models/minigrpo-tiny-arith or -calc)",
)
parser.add_argument(
    "--overwrite",
    action="store_true",
    help="replace the checkpoint already in --output, whole (never a directory holding anything else)",
)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--max_steps", type=int, help="upper bound on warm-up steps (default: the kind's)")
parser.add_argument(
    "--stop_accuracy",
    type=float,
    help="stop once held-out greedy accuracy reaches this (default: the kind's)",
)
parser.add_argument("--batch_size", type=int, default=128)
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--eval_every", type=int, default=25)
parser.add_argument("--eval_count", type=int, default=200, help="held-out problems of the evaluations")


def check_output(path: str, overwrite: bool) -> None:
    """Before any work: --output is replaced whole by save_pretrained, so it is new, empty, or (with
    --overwrite) a checkpoint of this script's, in a place that takes a new file."""
    if not path:  # "" would be read as the working directory
        sys.exit("pretrain_tiny.py: --output is empty: name a directory, such as runs/tiny (or leave it out)")
    problem = output_problem(path, overwrite, also=(RECORD,))
    if problem:
        sys.exit(f"pretrain_tiny.py: --output {path} {problem}")


args = parser.parse_args()
kind = KINDS[args.kind]
task = kind["task"]
args.output = os.path.join(MODELS, kind["directory"]) if args.output is None else args.output
args.max_steps = kind["max_steps"] if args.max_steps is None else args.max_steps
args.stop_accuracy = kind["stop_accuracy"] if args.stop_accuracy is None else args.stop_accuracy
check_output(args.output, args.overwrite)
for flag, value in (("--learning_rate", args.learning_rate), ("--stop_accuracy", args.stop_accuracy)):
    if not math.isfinite(value):  # AdamW takes an inf learning rate; a nan accuracy is never reached
        sys.exit(f"pretrain_tiny.py: {flag} must be a finite number, got {value}")
for flag, value in (
    ("--max_steps", args.max_steps),
    ("--eval_every", args.eval_every),
    ("--eval_count", args.eval_count),
):
    if value < 1:
        sys.exit(f"pretrain_tiny.py: {flag} must be a positive integer, got {value}")
torch.manual_seed(args.seed)
torch.set_num_threads(min(2, torch.get_num_threads()))  # at most 2, fewer under OMP_NUM_THREADS
EOS = "<|endoftext|>"
TEMPLATE = template("tiny")

# 1. Data: worked solutions to train on, held-out problems to decide when to stop.
train = generate_problems(args.kind, kind["train_problems"], "train", seed=args.seed)
held_out = generate_problems(args.kind, args.eval_count, "test", seed=args.seed)
texts = [TEMPLATE.render(p.question) + p.solution for p in train]
calculator = bool(task and task.get("tools"))
markers = CALC_MARKERS if calculator else []
# the held-out evaluations' settings: the tool, and the check where many answers are right
evaluation = dict(tools=["calculator"], tool_format="calc") if calculator else {}
evaluation["rewards"] = [RewardSpec("countdown")] if args.kind == "countdown" else None
max_new_tokens = task["max_completion_length"] if task else 40

# 2. Tokenizer: byte-level BPE over this text, each digit its own token.
backend = HFTokenizer(models.BPE())
backend.pre_tokenizer = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
)
backend.decoder = decoders.ByteLevel()
# BPE learns its merges from the text between the markers: a merge across one (`</calc><out>`) would be
# a second token spelling a marker, which the sampler would not take for one.
pieces = (
    [piece for text in texts for piece in re.split("|".join(map(re.escape, markers)), text)]
    if markers
    else texts
)
backend.train_from_iterator(
    pieces, trainers.BpeTrainer(vocab_size=48, special_tokens=[EOS] + markers, show_progress=False)
)
# its files, read back as a Tokenizer, in a temporary directory: not beside --output, which is replaced whole
with tempfile.TemporaryDirectory(prefix="minigrpo-tokenizer-") as staging:
    backend.save(os.path.join(staging, "tokenizer.json"))
    with open(os.path.join(staging, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": EOS, "pad_token": EOS, **({"minigrpo_task": task} if task else {})}, f)
    with open(os.path.join(staging, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [backend.token_to_id(EOS)], "pad_token_id": backend.token_to_id(EOS)}, f)
    tokenizer = minigrpo.Tokenizer.from_directory(staging)
eos = tokenizer.eos_token_id

# 3. Model: Qwen3's architecture at 0.6 M parameters.
config = minigrpo.Qwen3Config(
    vocab_size=tokenizer.vocab_size,
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=128,
    rope_theta=10_000.0,
    tie_word_embeddings=True,
)
model = minigrpo.Qwen3(config)
print(
    f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, vocabulary {tokenizer.vocab_size}"
)


def example(problem) -> Rollout:
    """A worked solution to learn from; the calculator's answers (<out>...</out>) are not the model's."""
    ids = tokenizer.encode(problem.solution) + [eos]
    generated, inside = [], False
    for token in ids:
        inside |= token == tokenizer.token_to_id("<out>")
        generated.append(not inside)
        inside &= token != tokenizer.token_to_id("</out>")
    return Rollout(tokenizer.encode(TEMPLATE.render(problem.question)), ids, "stop", generated=generated)


examples = [example(p) for p in train]

# 4. Warm-up: cross-entropy on the solution tokens only, until held-out accuracy reaches the mark.
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
generator = torch.Generator().manual_seed(args.seed)
started, accuracy, step = time.time(), 0.0, 0
for step in range(1, args.max_steps + 1):
    for group in optimizer.param_groups:
        group["lr"] = args.learning_rate * min(1.0, step / 50)
    chunk = torch.randint(len(examples), (args.batch_size,), generator=generator).tolist()
    batch = collate([examples[i] for i in chunk], eos, "cpu")
    model.train()
    logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_start, 1.0)
    loss = -(logprobs * batch.completion_mask).sum() / batch.completion_mask.sum()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if step % args.eval_every == 0:
        model.eval()
        accuracy = evaluate(
            model, tokenizer, held_out, TEMPLATE, max_new_tokens=max_new_tokens, **evaluation
        ).pass_at_1
        print(
            f"step {step}: loss {loss.item():.3f}, held-out greedy accuracy {accuracy:.3f} "
            f"({time.time() - started:.0f} s)"
        )
        if accuracy >= args.stop_accuracy:
            break

# 5. Where it starts from, and the checkpoint.
model.eval()
sampled = evaluate(
    model,
    tokenizer,
    held_out,
    TEMPLATE,
    samples=8,
    temperature=1.0,
    max_new_tokens=max_new_tokens,
    ks=(1, 8),
    **evaluation,
)
greedy = evaluate(model, tokenizer, held_out, TEMPLATE, max_new_tokens=max_new_tokens, **evaluation)
print(
    f"stopped at step {step}: greedy {accuracy:.3f}, "
    f"sampled pass@1 {sampled.pass_at_1:.3f}, pass@8 {sampled.pass_at_k[8]:.3f}"
)
with_tools = {}
if calculator:  # how much it leans on the calculator: calls per completion, and accuracy with the tool off
    without = evaluate(model, tokenizer, held_out, TEMPLATE, max_new_tokens=max_new_tokens).pass_at_1
    with_tools = {
        "tool_calls_per_completion": greedy.tool_calls_per_completion,
        "greedy_accuracy_tools_off": without,
    }
    calls = greedy.tool_calls_per_completion
    print(f"greedy: {calls:.2f} calculator calls per completion; with the calculator off {without:.3f}")
minigrpo.save_pretrained(model, tokenizer, args.output)
with open(os.path.join(args.output, RECORD), "w") as f:
    json.dump(
        {
            "command": "python examples/pretrain_tiny.py "
            + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k not in ("output", "overwrite"))
            + f" --output {os.path.relpath(args.output)}",
            "steps": step,
            "greedy_accuracy": accuracy,
            "sampled_pass_at_1": sampled.pass_at_1,
            "pass_at_8": sampled.pass_at_k[8],
            **with_tools,
            "seconds": round(time.time() - started),
        },
        f,
        indent=1,
    )
print(f"saved to {args.output}")
