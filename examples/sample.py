"""Sample a few completions from a checkpoint and show what the verifier makes of each.

    python examples/sample.py --prompt "47+23*6" --answer 185          # models/minigrpo-tiny-arith
    python examples/sample.py --model Qwen/Qwen3-0.6B --template chat --prompt "What is 12 + 30?" --answer 42

Each completion is printed with its extracted final answer and, given --answer, its accuracy and
format rewards (the format reward asks for a <think> block only with the "chat" template). A quick
look at a policy before and after training; nothing is written.
"""

import os
import sys

import minigrpo
from minigrpo.flags import OneLineErrors
from minigrpo.tasks import TEMPLATES, template
from minigrpo.verifier import FormatConfig, extract_answer, format_reward, math_reward

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
parser.add_argument("--prompt", required=True, help="the question, without any template around it")
parser.add_argument("--answer", help="gold answer: score each completion against it")
parser.add_argument(
    "--template", default="tiny", choices=list(TEMPLATES), help="how the question is put to the model"
)
parser.add_argument("--num_samples", type=int, default=4)
parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
parser.add_argument("--top_p", type=float, default=1.0)
parser.add_argument("--max_new_tokens", type=int, help="default: 256, or what the model's context leaves")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", default="cpu")
parser.add_argument(
    "--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU, bfloat16 on GPU"
)
args = parser.parse_args()


def fail(message):
    sys.exit(f"sample.py: {message}")


if args.max_new_tokens is not None and args.max_new_tokens < 1:
    fail(
        f"--max_new_tokens must be a positive integer (leave it out for what the context leaves), "
        f"got {args.max_new_tokens}"
    )

# 1. the model
try:
    model, tokenizer = minigrpo.load_pretrained(args.model, dtype=args.dtype, device=args.device)
except ValueError as error:  # a CheckpointError naming the file at fault, or a device this machine lacks
    fail(error)
if tokenizer is None:
    fail(f"{args.model} has no tokenizer.json")

# 2. the prompt, in the chosen template
prompt_template = template(args.template)
try:
    prompt = prompt_template.render(args.prompt, tokenizer)
except ValueError as error:
    fail(error)
try:
    room = model.config.max_position_embeddings - (args.max_new_tokens or 1)  # tokens the prompt may have
    prompt_ids = tokenizer.encode_all([prompt], "prompt", args.model, room)[0]
except ValueError as error:
    fail(error)
print(f"prompt ({len(prompt_ids)} tokens):\n{prompt}")

# 3. sample
room = model.config.max_position_embeddings - len(prompt_ids)
max_new_tokens = args.max_new_tokens
if max_new_tokens is None:  # 0 is refused above, never read as "the default"
    max_new_tokens = max(1, min(256, room))
try:
    samples = minigrpo.generate(
        model,
        [prompt_ids],
        max_new_tokens=max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        num_samples=args.num_samples,
        eos_token_ids=tokenizer.eos_token_ids,
        seed=args.seed,
    )
except ValueError as error:
    fail(error)

# 4. each completion, its answer and rewards
format_config = FormatConfig(require_thinking=prompt_template.chat and prompt_template.thinking)
correct = 0
for i, (ids, reason) in enumerate(zip(samples.tokens, samples.finish_reasons), start=1):
    text = tokenizer.decode_completion(ids)
    print(
        f"\n--- sample {i}/{len(samples.tokens)} "
        f"({len(ids) - (reason == 'stop')} tokens before EOS, {reason}) ---\n{text}"
    )
    line = f"answer: {extract_answer(text)}"
    if args.answer is not None:
        accuracy = math_reward(text, args.answer)
        correct += int(accuracy == 1.0)
        line += f"   accuracy: {accuracy:.1f}   format: {format_reward(text, format_config):.1f}"
    print(line)

summary = f"\n{samples.num_tokens} tokens at {samples.tokens_per_second:.1f} tokens/s"
if args.answer is not None:
    summary += f"; {correct}/{len(samples.tokens)} correct (gold answer {args.answer})"
print(summary)
