"""Evaluate a checkpoint on math problems: greedy pass@1, or pass@k and majority vote from n samples.

    python examples/eval_math.py --data arithmetic --num_samples 1          # greedy, tiny model
    python examples/eval_math.py --model models/minigrpo-tiny-calc --tools none   # its calculator off
    python examples/eval_math.py --model Qwen/Qwen3-0.6B --template chat --data test.jsonl --k 1,4,8 \\
        --output results.jsonl

--data is a synthetic kind (arithmetic, fractions, linear, countdown) or a GSM8K/MATH JSONL file
(local or hf://datasets/...). Countdown is scored by the countdown reward, everything else by the
accuracy reward. Writes one JSON row per problem to --output (question, answer, completions, correct,
tool calls) and prints one summary line last, pass@1 first. A checkpoint that records its task
(tokenizer_config.json's "minigrpo_task", as models/minigrpo-tiny-calc and its checkpoints do)
supplies the defaults of --data, --difficulty, --template, --tools, --tool_format and --max_new_tokens.
--tools calculator (or python, or a list) lets completions call tools; --tools none evaluates without,
to show how much a model leans on them.
"""

import json
import os
import sys
import time

import minigrpo  # its names, and torch with them, are imported on first use
from minigrpo import files
from minigrpo.flags import OneLineErrors
from minigrpo.model import read_task
from minigrpo.tasks import TEMPLATES, load_problems, sources_of, template
from minigrpo.verifier import RewardSpec

# The embedded default, found from this file: the default run works offline from any directory.
EMBEDDED_MODEL = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith")
)
parser = OneLineErrors(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model",
    default=EMBEDDED_MODEL,
    help="checkpoint directory or Hub repo id (default: the embedded models/minigrpo-tiny-arith)",
)
parser.add_argument(
    "--data",
    help="synthetic kind, JSONL file or hf://datasets/<owner>/<name>/<file> (default: the model's task)",
)
parser.add_argument("--split", default="test", choices=["train", "test"], help="synthetic kinds only")
parser.add_argument(
    "--count", type=int, help="number of problems (default: 200 synthetic, or the whole file)"
)
parser.add_argument("--difficulty", type=int, default=1, help="synthetic kinds only: 1, 2 or 3")
parser.add_argument(
    "--template", default="tiny", choices=list(TEMPLATES), help="how each question is put to the model"
)
parser.add_argument("--num_samples", type=int, default=8, help="samples per problem; 1 = greedy")
parser.add_argument("--k", default="1,4,8", help="comma-separated k for pass@k (each at most --num_samples)")
parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
parser.add_argument("--top_p", type=float, default=1.0)
parser.add_argument("--max_new_tokens", type=int, help="default: 512, or what the model's context leaves")
parser.add_argument(
    "--max_batch_rows", type=int, default=256, help="completions decoding at once (bounds the KV cache)"
)
parser.add_argument(
    "--tools", default="none", help="tools completions may call, comma-separated; none: no calls"
)
parser.add_argument("--tool_format", default="calc", help="calc (<calc>...</calc>) or qwen3 (<tool_call>)")
parser.add_argument("--max_tool_calls", type=int, default=4, help="calls per completion; one more ends it")
parser.add_argument("--output", default="runs/eval_math/results.jsonl", help="per-problem results, as JSONL")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", default="cpu")
parser.add_argument(
    "--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU, bfloat16 on GPU"
)


def fail(message):
    sys.exit(f"eval_math.py: {message}")


def task_defaults() -> dict:
    """This script's defaults from the model's recorded task (minigrpo.model.tokenizer.read_task)."""
    try:
        task = read_task(parser.parse_args().model)
    except ValueError as error:
        fail(error)
    names = {"data", "difficulty", "template", "tools", "tool_format"}
    defaults = {key: value for key, value in task.items() if key in names}
    if "max_completion_length" in task:
        defaults["max_new_tokens"] = task["max_completion_length"]
    return defaults


parser.set_defaults(**task_defaults())
args = parser.parse_args()
if args.data is None:
    fail("--data is required: a synthetic kind, a JSONL file or hf://datasets/... (this model names no task)")
tools = [name.strip() for name in args.tools.split(",") if name.strip() not in ("", "none")]


def check_output(path: str) -> None:
    """Before any work: --output must be a file this process can write, or one it can create."""
    problem = files.output_file_problem(path)
    if problem:
        fail(f"--output {path} {problem}")


# 1. settings: greedy is one sample at temperature 0
greedy = args.num_samples == 1 or args.temperature == 0
samples, temperature = (1, 0.0) if greedy else (args.num_samples, args.temperature)
try:
    ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
except ValueError:
    fail(f"--k must be comma-separated integers, got {args.k!r}")
if any(k < 1 for k in ks):
    fail(f"--k values must be >= 1, got {args.k!r}")
ks = [] if greedy else [k for k in ks if k <= samples]
if args.max_new_tokens is not None and args.max_new_tokens < 1:
    fail(
        f"--max_new_tokens must be a positive integer (leave it out for what the context leaves), "
        f"got {args.max_new_tokens}"
    )
if args.output:
    check_output(args.output)

# 2. problems, model, template, rewards
try:
    problems = load_problems(
        args.data, split=args.split, count=args.count, seed=args.seed, difficulty=args.difficulty
    )
except ValueError as error:
    fail(error)
try:
    model, tokenizer = minigrpo.load_pretrained(args.model, dtype=args.dtype, device=args.device)
except ValueError as error:  # a CheckpointError naming the file at fault, or a device this machine lacks
    fail(error)
if tokenizer is None:
    fail(f"{args.model} has no tokenizer.json")
rewards = [RewardSpec("countdown" if args.data == "countdown" else "accuracy")]

# 3. sample and score
from minigrpo.config import SamplingConfig  # noqa: E402
from minigrpo.rollout import check_prompts  # noqa: E402
from minigrpo.run import evaluate  # noqa: E402  (here, so that a bad argument above fails before torch loads)
from minigrpo.tools import declared_tools  # noqa: E402

context = model.config.max_position_embeddings
sources = sources_of(problems)  # a file's: "data.jsonl, line 7" names a prompt too long
# every prompt must survive the tokenizer (the embedded model's keeps only digits and operators), and fit
try:
    chosen = template(args.template)
    declared = declared_tools(
        tokenizer, tools
    )  # as the prompts evaluate() renders (a plain template ignores it)
    prompts = [chosen.render(p.question, tokenizer, declared) for p in problems]
    encoded = tokenizer.encode_all(
        prompts, "prompts", args.model, context - (args.max_new_tokens or 1), sources
    )
    longest = max(map(len, encoded))
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:  # 0 is refused above, never read as "the default"
        max_new_tokens = max(1, min(512, context - longest))
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    check_prompts(encoded, sampling, model.config.vocab_size, context, "prompts", sources)
except ValueError as error:
    fail(error)
start = time.perf_counter()
try:
    result = evaluate(
        model,
        tokenizer,
        problems,
        template(args.template),
        rewards,
        samples=samples,
        temperature=temperature,
        top_p=args.top_p,
        max_new_tokens=max_new_tokens,
        max_batch_rows=args.max_batch_rows,
        seed=args.seed,
        ks=tuple(ks),
        tools=tools,
        tool_format=args.tool_format,
        max_tool_calls=args.max_tool_calls,
    )
except ValueError as error:  # a prompt longer than the context, a chat template without a chat tokenizer
    fail(error)
seconds = time.perf_counter() - start

# 4. report: the per-problem rows, then the summary line, last
if args.output:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            for row in result.results:
                f.write(json.dumps(row) + "\n")
    except OSError as error:
        fail(f"cannot write {args.output}: {error}")
    print(f"per-problem results -> {args.output}")
if greedy:
    scores = f"pass@1 (greedy) {result.pass_at_1:.3f}"
else:
    scores = "  ".join(
        [f"pass@1 {result.pass_at_1:.3f}"]
        + [f"pass@{k} {result.pass_at_k[k]:.3f}" for k in ks if k != 1]
        + [f"maj@{samples} {result.majority_at_k:.3f}"]
    )
if result.step_accuracy is not None:  # completions with arithmetic steps: how faithful they are
    scores += f"  steps right {result.step_accuracy:.3f}  unfaithful {result.unfaithful_frac:.3f}"
if result.tool_calls_per_completion is not None:
    scores += f"  tool calls per completion {result.tool_calls_per_completion:.2f} ({', '.join(tools)})"
print(
    f"{args.data} ({len(problems)} problems, {samples} sample{'s' * (samples > 1)} each, "
    f"temperature {temperature}): "
    f"{scores}  [{seconds:.1f} s]"
)
