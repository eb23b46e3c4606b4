"""The slow, obviously correct sampler: one prompt at a time, the whole sequence recomputed per token, no cache.

Kept out of the library; tests hold minigrpo.generate equal to it, and bench_sampler.py times it.
"""

import torch

from minigrpo.sampler import SamplingConfig, sample


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
                    logits = model(torch.tensor([sequence]))[:, -1]  # (1, V): everything recomputed
                    token, logprob = sample(logits, config, generator)
                    sequence.append(int(token))
                    logprobs.append(float(logprob))
                    if int(token) in config.eos_token_ids:
                        break
                all_tokens.append(sequence[len(prompt) :])
                all_logprobs.append(logprobs)
    return all_tokens, all_logprobs
