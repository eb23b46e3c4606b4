"""The whole GRPO loop of the default job in one plain file: sample, verify, advantages, update, evaluate.

    python examples/grpo_in_one_file.py                   # the embedded tiny model on arithmetic, CPU
    python examples/grpo_in_one_file.py --max_steps 20 --loss_type dapo --beta 0.04 --num_iterations 2

minigrpo's loop written out once as straight-line code, to read in one sitting from top to bottom:
its own Qwen3 forward (RMSNorm, rotary, grouped-query attention, SwiGLU MLP, a KV cache as a list of
tensors), G completions per prompt sampled in a plain loop, group-relative advantages, the clipped
per-token loss with an optional k3 KL to a reference, and torch's AdamW. From the library it takes
only the verifier (strings in, rewards out), the problem generator and the sampler's random numbers.
tests/test_one_file_twin.py holds the two equal stage by stage (fp64, within 1e-10): logits, nucleus,
learning rates, problem order, greedy evaluation, and three whole steps' sampled tokens and weights.

What the library has and this file leaves out: the batched sampler and its refill, the chunked LM head,
micro-batches, dynamic sampling, the other loss types, non-finite-step skips, checkpoints and resume,
several processes. None of them changes what one step computes.
"""

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from minigrpo.rollout import draw_counters, row_keys, uniform
from minigrpo.tasks import generate_problems
from minigrpo.verifier import math_rewards

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "minigrpo-tiny-arith")


@dataclasses.dataclass
class Settings:
    """The default job's settings (examples/train_math.py's, but for max_steps); each one is a flag."""

    output_dir: str = "runs/grpo_in_one_file"  # summary.json and final/ (the trained policy) go here
    max_steps: int = 350  # GRPO steps; the learning-rate schedule spans them
    seed: int = 0  # training problems, their order and the sampling all derive from it
    prompts_per_step: int = 32  # P: prompts per step
    num_generations: int = 8  # G: completions per prompt
    max_completion_length: int = 32  # new tokens per completion, EOS included
    temperature: float = 1.0  # sampling temperature, also that of every log-prob in the loss
    top_p: float = 1.0  # nucleus sampling: keep the most likely tokens holding this much probability
    epsilon: float = 0.2  # clip range of the ratio: [1 - epsilon, 1 + epsilon]
    beta: float = 0.0  # weight of the k3 KL to the starting policy; 0 keeps no reference
    loss_type: str = "grpo"  # grpo: mean per completion, then over completions; dapo: mean over all tokens
    num_iterations: int = 1  # mu: AdamW steps on each batch of completions
    learning_rate: float = 1e-4  # AdamW peak learning rate
    warmup_steps: int = 10  # linear warm-up, then cosine down to 0 at max_steps
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # clip the gradient's global norm to this
    train_count: int = 5000  # generated training problems
    eval_count: int = 200  # held-out problems, scored greedily before and after

    def __post_init__(self):
        if self.loss_type not in ("grpo", "dapo"):
            raise ValueError(f"--loss_type must be grpo or dapo, got {self.loss_type!r}")
        if not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ValueError(f"--beta must be a finite number >= 0, got {self.beta}")
        positive = ("max_steps", "prompts_per_step", "max_completion_length", "num_iterations", "eval_count")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.num_generations < 2 or not 0 < self.top_p <= 1 or not self.temperature > 0:
            raise ValueError("--num_generations must be at least 2, --top_p in (0, 1], --temperature > 0")


# ---- The policy: Qwen3, a dict of Hugging Face-named tensors and a forward over them -------------
def load_model(directory: str, dtype: torch.dtype) -> tuple[dict, dict]:
    """(weights by their Hugging Face names, config.json) of a Qwen3 checkpoint; the weights trainable."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "qwen3" and not config.get("attention_bias"), "a Qwen3 without biases"
    weights = load_file(os.path.join(directory, "model.safetensors"))
    weights = {name: tensor.to(dtype).requires_grad_() for name, tensor in weights.items()}
    return weights, config


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin (T, D) of the rotary embedding (RoFormer, Su et al. 2021, eq. 34) at positions (T,).
    The angles are computed in float32, as transformers' Qwen3 computes them."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (D/2,)
    angles = positions[:, None].float() * inv_freq  # (T, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, D): pair i and i + D/2 share an angle
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) with each pair (x_i, x_{i + D/2}) turned by its position's angle."""
    first, second = x.chunk(2, dim=-1)  # (B, H, T, D/2) each
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def attention(x, weights, prefix, config, cos, sin, cache, layer):
    """Grouped-query causal self-attention of x (B, T, hidden) after the tokens already in cache[layer]."""
    B, T, _ = x.shape
    H, H_kv, D = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps = config["rms_norm_eps"]
    q = (x @ weights[prefix + "q_proj.weight"].T).view(B, T, H, D)  # (B, T, H, D)
    k = (x @ weights[prefix + "k_proj.weight"].T).view(B, T, H_kv, D)  # (B, T, H_kv, D)
    v = (x @ weights[prefix + "v_proj.weight"].T).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
    # Qwen3's QK-norm: an RMSNorm over each head's query and key, before the rotary embedding.
    q = rms_norm(q, weights[prefix + "q_norm.weight"], eps).transpose(1, 2)  # (B, H, T, D)
    k = rms_norm(k, weights[prefix + "k_norm.weight"], eps).transpose(1, 2)  # (B, H_kv, T, D)
    q = rotate(q, cos, sin)
    k = rotate(k, cos, sin)
    if cache[layer] is not None:  # the keys and values of the earlier tokens come first
        k = torch.cat((cache[layer][0], k), dim=2)  # (B, H_kv, S, D), S = earlier tokens + T
        v = torch.cat((cache[layer][1], v), dim=2)
    cache[layer] = (k, v)
    k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D): each key head serves H / H_kv query heads
    v = v.repeat_interleave(H // H_kv, dim=1)
    S = k.shape[2]
    scores = q @ k.transpose(2, 3) / math.sqrt(D)  # (B, H, T, S): "Attention Is All You Need", eq. 1
    visible = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # (T, S): query t is at position S - T + t
    scores = scores.masked_fill(~visible, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    return y.transpose(1, 2).reshape(B, T, H * D) @ weights[prefix + "o_proj.weight"].T  # (B, T, hidden)


def mlp(x, weights, prefix):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""
    gate = torch.nn.functional.silu(x @ weights[prefix + "gate_proj.weight"].T)  # (B, T, intermediate)
    return (gate * (x @ weights[prefix + "up_proj.weight"].T)) @ weights[prefix + "down_proj.weight"].T


def forward(weights: dict, config: dict, ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
    """Logits (B, T, V) of token ids (B, T) that follow the tokens in `cache` (one (keys, values) pair per
    layer, or None before the first token; grown in place). Without a cache: the ids from position 0."""
    if cache is None:
        cache = [None] * config["num_hidden_layers"]
    start = 0 if cache[0] is None else cache[0][0].shape[2]  # tokens already in the cache
    positions = torch.arange(start, start + ids.shape[1])  # (T,)
    cos, sin = rotary(positions, config["head_dim"], config["rope_theta"], weights["model.norm.weight"].dtype)
    eps = config["rms_norm_eps"]
    x = weights["model.embed_tokens.weight"][ids]  # (B, T, hidden)
    for layer in range(config["num_hidden_layers"]):  # pre-norm residual blocks
        prefix = f"model.layers.{layer}."
        normed = rms_norm(x, weights[prefix + "input_layernorm.weight"], eps)
        x = x + attention(normed, weights, prefix + "self_attn.", config, cos, sin, cache, layer)
        normed = rms_norm(x, weights[prefix + "post_attention_layernorm.weight"], eps)
        x = x + mlp(normed, weights, prefix + "mlp.")
    x = rms_norm(x, weights["model.norm.weight"], eps)
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])  # (V, hidden): tied by default
    return x @ head.T  # (B, T, V)


# ---- Stage 1, sample: G completions of one prompt ------------------------------------------------
def next_tokens(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """(B,) tokens from softmax(logits / temperature) (B, V) kept to the top-p nucleus (Holtzman et al. 2020),
    drawn as the library draws them: each row's cumulative distribution inverted at its u (B,) in (0, 1]."""
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    tokens = torch.arange(probs.shape[-1]).expand_as(probs)  # (B, V): at top_p = 1, in vocabulary order
    if top_p < 1:  # most likely first, 0 past the nucleus: the library's sorting path (CPU's is rejection)
        probs, tokens = probs.sort(dim=-1, descending=True)  # (B, V) each
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)  # those before it hold top_p
    cdf = probs.cumsum(-1)  # (B, V), unnormalised: a token is drawn when u * total lands in its step
    index = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:]).clamp(max=cdf.shape[-1] - 1)  # (B, 1)
    return tokens.gather(-1, index).squeeze(-1)


@torch.inference_mode()
def sample_group(weights, config, prompt: list[int], s: Settings, eos: int, keys) -> list[list[int]]:
    """G completions of `prompt`, each up to and including its EOS, or cut at max_completion_length; row i's
    token t is drawn at uniform(keys[i], t), a hash, as in the library. One prompt's rows need no padding."""
    G = s.num_generations
    noise = uniform(keys[:, None], draw_counters(s.max_completion_length, 0, keys.device))  # (G, L + 1)
    cache = [None] * config["num_hidden_layers"]
    logits = forward(weights, config, torch.tensor([prompt] * G), cache)[:, -1]  # (G, V): prefill
    tokens = torch.empty(G, 0, dtype=torch.long)  # (G, t)
    for t in range(s.max_completion_length):
        token = next_tokens(logits, s.temperature, s.top_p, noise[:, t])  # (G,)
        tokens = torch.cat((tokens, token[:, None]), dim=1)
        if (tokens == eos).any(dim=1).all():  # every row has ended (rows past their EOS decode on, unread)
            break
        logits = forward(weights, config, token[:, None], cache)[:, -1]  # (G, V): one decode step
    return [row[: row.index(eos) + 1] if eos in row else row for row in tokens.tolist()]  # cut after EOS


# ---- Stage 3, advantages -------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, G: int) -> torch.Tensor:
    """(N,) advantages of (N,) rewards ordered group by group. DeepSeekMath (Shao et al. 2024), section
    4.1.2, outcome supervision: A_i = (r_i - mean(group)) / std(group), with the unbiased std + 1e-4 (TRL's).
    A group whose rewards are all equal teaches nothing: its advantages are exactly 0."""
    groups = rewards.view(-1, G)  # (P, G)
    advantages = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-4)
    flat = (groups == groups[:, :1]).all(dim=1)  # (P,)
    advantages[flat] = 0.0
    return advantages.reshape(-1)  # (N,)


# ---- Stage 4, update -----------------------------------------------------------------------------
def completion_logprobs(weights, config, prompts: list[list[int]], completions: list[list[int]], temperature):
    """(N, L - 1) log-prob of each next token under softmax(logits / temperature), and the (N, L - 1) mask of
    those that are completion tokens. Row i is prompt i then completion i from position 0, right-padded to
    the longest, L: causal attention never lets a real token see the padding after it."""
    rows = [prompt + completion for prompt, completion in zip(prompts, completions)]
    L = max(len(row) for row in rows)
    ids = torch.tensor([row + [0] * (L - len(row)) for row in rows])  # (N, L)
    mask = torch.zeros(len(rows), L - 1)  # (N, L - 1)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        mask[i, len(prompt) - 1 : len(prompt) + len(completion) - 1] = 1  # the positions that predict it
    logits = forward(weights, config, ids)[:, :-1] / temperature  # (N, L - 1, V): position t predicts t + 1
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (N, L - 1)
    return logprobs, mask.to(logprobs.dtype)


def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, s: Settings) -> torch.Tensor:
    """The loss of a step's N completions; logprobs, old_logprobs, ref_logprobs, mask (N, T), advantages (N,).
    DeepSeekMath eq. 3: per token, -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * KL."""
    ratio = torch.exp(logprobs - old_logprobs)  # (N, T): pi_theta / pi_theta_old (PPO, Schulman et al. 2017)
    A = advantages[:, None].to(logprobs.dtype)  # (N, 1): one advantage for every token of a completion
    per_token = -torch.minimum(ratio * A, ratio.clamp(1 - s.epsilon, 1 + s.epsilon) * A)  # (N, T)
    if s.beta > 0:  # DeepSeekMath eq. 4: the k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020), >= 0
        log_ref_ratio = ref_logprobs - logprobs  # (N, T)
        per_token = per_token + s.beta * (torch.exp(log_ref_ratio) - log_ref_ratio - 1)
    if s.loss_type == "grpo":  # eq. 3: the mean over a completion's tokens, then over the step's completions
        return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()
    return (per_token * mask).sum() / mask.sum()  # DAPO (Yu et al. 2025) eq. 12: the mean over all tokens


def learning_rate_at(step: int, s: Settings) -> float:
    """Linear warm-up over warmup_steps (step 1 gets 1 / (warmup_steps + 1) of the peak), then cosine to 0."""
    if step <= s.warmup_steps:
        return s.learning_rate * step / (s.warmup_steps + 1)
    progress = min((step - 1 - s.warmup_steps) / max(s.max_steps - s.warmup_steps, 1), 1.0)
    return s.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(weights: dict, s: Settings) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over every weight; the learning rate is set per step."""
    adam = dict(betas=(s.adam_beta1, s.adam_beta2), eps=s.adam_epsilon, weight_decay=s.weight_decay)
    return torch.optim.AdamW(list(weights.values()), lr=s.learning_rate, **adam)


def grpo_step(weights, config, reference, optimizer, tokenizer, prompts, golds, step, s: Settings):
    """One GRPO step on P prompts (token ids) with their gold answers: the stages in order; its stats."""
    G = s.num_generations
    eos = tokenizer.token_to_id("<|endoftext|>")
    # Stage 1, sample: G completions per prompt from the current policy (pi_theta_old of this step).
    step_seed = random.Random(f"{s.seed}-{step}-0").getrandbits(62)  # the library's: seed, step, round 0
    keys = row_keys(step_seed, len(prompts) * G, "cpu")  # (N,): a random stream per completion
    completions = []  # N = P * G completions, group by group
    for p, prompt in enumerate(prompts):
        completions += sample_group(weights, config, prompt, s, eos, keys[p * G : (p + 1) * G])
    prompt_of = [prompt for prompt in prompts for _ in range(G)]  # (N) each completion's prompt
    # Stage 2, verify: each completion's text (its EOS left out) against its prompt's gold answer.
    texts = []
    for completion in completions:
        ids = completion[:-1] if completion[-1] == eos else completion
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    gold_of = [gold for gold in golds for _ in range(G)]  # (N) each completion's gold answer
    rewards = torch.tensor(math_rewards(texts, gold_of))  # (N,) float32
    # Stage 3, advantages: each completion against the others of its group.
    advantages = group_advantages(rewards, G)  # (N,)
    # Stage 4, update: the log-probs the ratio and the KL compare against, then mu AdamW steps.
    with torch.no_grad():
        old_logprobs = None  # mu = 1: pi_theta_old is the current policy, detached below (the ratio is 1)
        if s.num_iterations > 1:
            old_logprobs = completion_logprobs(weights, config, prompt_of, completions, s.temperature)[0]
        ref_logprobs = None
        if s.beta > 0:
            ref_logprobs = completion_logprobs(reference, config, prompt_of, completions, s.temperature)[0]
    for group in optimizer.param_groups:
        group["lr"] = learning_rate_at(step, s)
    for _ in range(s.num_iterations):
        logprobs, mask = completion_logprobs(weights, config, prompt_of, completions, s.temperature)  # (N, T)
        old = old_logprobs if old_logprobs is not None else logprobs.detach()
        loss = grpo_loss(logprobs, old, ref_logprobs, advantages, mask, s)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(weights.values()), s.max_grad_norm)
        optimizer.step()
    return {
        "reward": float(rewards.mean()),
        "loss": loss.item(),
        "grad_norm": float(grad_norm),
        "lr": optimizer.param_groups[0]["lr"],
        "length": sum(map(len, completions)) / len(completions),
    }


# ---- Evaluation: greedy accuracy on held-out problems --------------------------------------------
@torch.inference_mode()
def greedy_accuracy(weights, config, tokenizer, problems, s: Settings) -> float:
    """The share of held-out problems whose greedy completion the verifier scores right."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    texts = []
    for problem in problems:
        cache = [None] * config["num_hidden_layers"]
        logits = forward(weights, config, torch.tensor([encode(tokenizer, problem.question)]), cache)[:, -1]
        completion = []
        for _ in range(s.max_completion_length):
            token = int(logits.argmax(-1))
            if token == eos:
                break
            completion.append(token)
            logits = forward(weights, config, torch.tensor([[token]]), cache)[:, -1]  # (1, V)
        texts.append(tokenizer.decode(completion, skip_special_tokens=False))
    return sum(math_rewards(texts, [p.answer for p in problems])) / len(problems)


def encode(tokenizer: Tokenizer, question: str) -> list[int]:
    """The prompt's token ids: the default model's format is the question and a newline."""
    return tokenizer.encode(question + "\n", add_special_tokens=False).ids


# ---- Saving: the policy in Hugging Face layout, written whole or not at all ----------------------
def save_policy(weights: dict, source: str, directory: str) -> None:
    """`directory` holds the policy (model.safetensors under Hugging Face names) and the source's config and
    tokenizer files, written in a temporary sibling and renamed, so no half-written directory is left."""
    staging = tempfile.mkdtemp(prefix=".final-", dir=os.path.dirname(os.path.abspath(directory)))
    try:
        tensors = {name: tensor.detach().contiguous() for name, tensor in weights.items()}
        save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(source, name), staging)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ---- The loop: the training problems in the library's order, P per step ---------------------------
def problem_order(count: int, seed: int):
    """Problem indices, epoch after epoch, each epoch in the order the library's PromptStream gives it."""
    for epoch in itertools.count():
        order = list(range(count))
        random.Random(f"{seed}-{epoch}").shuffle(order)  # a seed per epoch, not one per run, as resume needs
        yield from order


def train(weights, config, tokenizer, problems, s: Settings) -> None:
    """max_steps GRPO steps on the problems, prompts_per_step at a time, in problem_order; stats printed."""
    reference = None  # pi_ref of the KL: the starting policy, frozen
    if s.beta > 0:
        reference = {name: w.detach().clone() for name, w in weights.items()}
    optimizer = make_optimizer(weights, s)
    order = problem_order(len(problems), s.seed)
    for step in range(1, s.max_steps + 1):
        batch = [problems[next(order)] for _ in range(s.prompts_per_step)]  # an epoch may end mid-batch
        step_started = time.monotonic()
        prompts = [encode(tokenizer, problem.question) for problem in batch]
        golds = [problem.answer for problem in batch]
        stats = grpo_step(weights, config, reference, optimizer, tokenizer, prompts, golds, step, s)
        stats["seconds"] = time.monotonic() - step_started
        shown = [f"{key} {value:.4g}" for key, value in stats.items()]
        print(" | ".join([f"step {step}"] + shown), flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Evaluate, train, evaluate again; write output_dir/summary.json and output_dir/final. The summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Settings):  # one flag per field, named after it
        parser.add_argument(f"--{field.name}", type=type(field.default), default=field.default)
    try:
        s = Settings(**vars(parser.parse_args(argv)))
        os.makedirs(s.output_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=s.output_dir).close()  # a file can be written there
    except ValueError as error:
        sys.exit(f"grpo_in_one_file.py: {error}")
    except OSError as error:
        reason = error.strerror or error
        sys.exit(f"grpo_in_one_file.py: --output_dir {s.output_dir} cannot be written: {reason}")
    started = time.monotonic()
    torch.set_num_threads(1)  # this model's products are too small to gain from a second thread
    weights, config = load_model(MODEL, torch.float32)
    tokenizer = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    problems = generate_problems("arithmetic", s.train_count, "train", seed=s.seed)
    held_out = generate_problems("arithmetic", s.eval_count, "test", seed=0)  # the same for every run
    initial = greedy_accuracy(weights, config, tokenizer, held_out, s)
    print(f"held-out greedy accuracy before GRPO: {initial:.3f} ({len(held_out)} problems)", flush=True)
    train(weights, config, tokenizer, problems, s)
    final = greedy_accuracy(weights, config, tokenizer, held_out, s)
    seconds = time.monotonic() - started
    summary = {"initial_accuracy": initial, "final_accuracy": final, "steps": s.max_steps}
    summary.update(seconds=round(seconds, 1), settings=dataclasses.asdict(s))
    with open(os.path.join(s.output_dir, "summary.json.tmp"), "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(f.name, os.path.join(s.output_dir, "summary.json"))  # whole or not at all
    save_policy(weights, MODEL, os.path.join(s.output_dir, "final"))
    gain = 100 * (final - initial)
    print(f"held-out accuracy {initial:.3f} -> {final:.3f} ({gain:+.1f} points), {seconds / 60:.1f} min")
    return summary


if __name__ == "__main__":
    main()
