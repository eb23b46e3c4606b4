"""The slow, obviously correct sampler: one prompt at a time, the whole sequence recomputed per token, no
cache.

Kept out of the library, and sharing none of its sampling code: the distribution is built the
textbook way (temperature, then top-k by a full sort, then top-p on the sorted, renormalised
probabilities) and drawn with torch.multinomial. Tests hold minigrpo.generate equal to it token
for token under greedy decoding and in distribution otherwise; bench_sampler.py times it.
"""

import torch

from minigrpo.config import SamplingConfig


def next_token_distribution(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """(V,) probabilities of the next token after temperature, top-k and top-p, from (V,) logits."""
    probs = (logits / temperature).softmax(-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k:
        keep[top_k:] = False
    kept = sorted_probs * keep
    kept = kept / kept.sum()
    if top_p < 1:
        mass_before = kept.cumsum(-1) - kept  # probability of the tokens more likely than each one
        kept = kept * (mass_before < top_p)
        kept = kept / kept.sum()
    return torch.zeros_like(probs).scatter(0, order, kept)


def naive_generate(model, prompts, **settings):
    """Completion token lists (and their log-probs), num_samples per prompt, prompt by prompt."""
    config = SamplingConfig(**settings)
    generator = torch.Generator().manual_seed(config.seed or 0)
    all_tokens, all_logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            for _ in range(config.num_samples):
                sequence, logprobs = list(prompt), []
                for _ in range(config.max_new_tokens):
                    logits = model(torch.tensor([sequence]))[0, -1]  # (V,): everything recomputed
                    if config.temperature == 0:
                        token = int(logits.argmax())
                        logprob = logits.log_softmax(-1)[token]
                    else:
                        probs = next_token_distribution(
                            logits, config.temperature, config.top_k, config.top_p
                        )
                        token = int(torch.multinomial(probs, 1, generator=generator))
                        logprob = (logits / config.temperature).log_softmax(-1)[token]
                    sequence.append(token)
                    logprobs.append(float(logprob))
                    if token in config.eos_token_ids:
                        break
                all_tokens.append(sequence[len(prompt) :])
                all_logprobs.append(logprobs)
    return all_tokens, all_logprobs


def naive_generate_with_tools(model, prompts, hook, **settings):
    """Greedy completions with tool calls, one row at a time, waiting on each call where it is made: the
    sampler's tool rules written out plainly. (tokens, generated, finish reasons) per completion."""
    config = SamplingConfig(**settings)
    assert config.temperature == 0, "the reference calls tools greedily only"
    N, G = config.max_new_tokens, config.num_samples
    all_tokens, all_generated, reasons = [], [], []
    with torch.no_grad():
        for p, prompt in enumerate(prompts):
            for g in range(G):
                request, completion, generated, calls, reason = p * G + g, [], [], 0, "length"
                while len(completion) < N:
                    token = int(model(torch.tensor([prompt + completion]))[0, -1].argmax())
                    completion.append(token)
                    generated.append(True)
                    if token in config.eos_token_ids:
                        reason = "stop"
                        break
                    if (
                        token != hook.end_token_id or len(completion) == N
                    ):  # a marker at the last step ends it
                        continue
                    calls += 1
                    if calls > hook.max_tool_calls:
                        reason = "tool_limit"
                        break
                    hook.start(request, list(completion))
                    observation = hook.poll(request)
                    while observation is None:
                        observation = hook.poll(request)
                    observation = observation[: N - len(completion)]  # it counts against the budget
                    completion += observation
                    generated += [False] * len(observation)
                all_tokens.append(completion)
                all_generated.append(generated)
                reasons.append(reason)
    return all_tokens, all_generated, reasons
