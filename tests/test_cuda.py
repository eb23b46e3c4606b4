"""Every test that needs a GPU, in one file: `python -m pytest -q tests/test_cuda.py` on a CUDA machine.

The graphed decode (decode_graphs.py, the default on CUDA) against the eager reference path on the same
GPU, under every way the engine moves rows: refills under a row budget, compaction, rows finishing
early, tool calls pausing and resuming rows, a bf16 model, LoRA adapters, calls in a row that reuse the
graphs, one row and a batch that is no power of two. Then eager on the GPU against the slow reference sampler,
and one trainer step on the GPU against the same step on CPU, in fp32. On a machine without CUDA the
whole file is skipped, with its reason.
"""

import copy

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer
from reference_sampler import naive_generate
from test_tool_rollout import Hook
from test_train_step import make_trainer, tiny_policy_model

import minigrpo
import minigrpo.rollout.decode_graphs as decode_graphs
from minigrpo import GRPOConfig

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none"
)

# rows of varied lengths; row 0 crosses 64 and 128 cache slots
PROMPTS = [list(range(1, 61)), [13, 4, 9], [7, 7, 2, 30], [5, 9, 2, 77, 31, 8, 64], [90, 1, 1, 3, 45]]
SAMPLED = dict(max_new_tokens=76, temperature=0.9, num_samples=3, seed=11, eos_token_ids=[5])


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3).cuda()


def both_paths(model, prompts, **settings):
    """(eager, graphed) samples of the same call."""
    eager = minigrpo.generate(model, prompts, compile=False, **settings)
    graphed = minigrpo.generate(model, prompts, **settings)  # compile="auto": CUDA graphs here
    return eager, graphed


def assert_same(eager, graphed, tolerance=1e-5):
    assert graphed.compiled and not eager.compiled
    assert graphed.tokens == eager.tokens
    assert graphed.finish_reasons == eager.finish_reasons and graphed.generated == eager.generated
    for a, b in zip(graphed.logprobs, eager.logprobs):
        assert (torch.tensor(a) - torch.tensor(b)).abs().max() <= tolerance


@pytest.mark.parametrize("rows", [None, 1, 5, 7])
def test_graphs_give_eager_tokens_under_refill_and_compaction(model, rows):
    """Every row at once (15, no power of two: compaction pads to 8, 4, ...), one row at a time, and budgets
    of 5 and 7 rows refilled as rows finish; rows end early (EOS) and row 0 crosses two span buckets."""
    eager, graphed = both_paths(model, PROMPTS, max_batch_rows=rows, **SAMPLED)
    assert_same(eager, graphed)
    lengths = list(map(len, eager.tokens))
    assert min(lengths) < 20 and max(lengths) + len(PROMPTS[0]) > 128, "the test needs early and late ends"


def test_graphs_give_eager_tokens_for_a_single_row(model):
    eager, graphed = both_paths(model, PROMPTS[:1], **{**SAMPLED, "num_samples": 1})
    assert_same(eager, graphed)


def test_graphs_are_kept_from_one_call_to_the_next_and_see_new_weights(model):
    """The second call captures nothing and still gives eager's tokens; after the weights change in place
    (as an optimizer step changes them) the same graphs give the new weights' tokens."""
    model = copy.deepcopy(model)
    settings = dict(SAMPLED, max_batch_rows=6)
    first = minigrpo.generate(model, PROMPTS, **settings)
    decoder = decode_graphs._decoders[model]
    second = minigrpo.generate(model, PROMPTS, **settings)
    assert first.warmup_seconds > 0 and second.warmup_seconds == 0
    assert second.tokens == first.tokens
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    eager, graphed = both_paths(model, PROMPTS, **settings)
    assert decode_graphs._decoders[model] is decoder and graphed.tokens != first.tokens
    assert_same(eager, graphed)
    # a call larger than the cache holds starts anew, and gives eager's tokens too
    eager, graphed = both_paths(model, PROMPTS * 3, **SAMPLED)
    assert decode_graphs._decoders[model] is not decoder
    assert_same(eager, graphed)
    decode_graphs.release(model)
    assert model not in decode_graphs._decoders


def test_graphs_give_eager_tokens_in_bf16(model):
    """A bf16 copy of the policy, as sampling_dtype="bfloat16" samples with."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    eager, graphed = both_paths(half, PROMPTS, max_batch_rows=7, **{**SAMPLED, "max_new_tokens": 40})
    assert_same(eager, graphed, tolerance=1e-3)


def test_graphs_give_eager_tokens_with_lora_adapters_and_see_them_train(model):
    """The graphs run the adapters as their own products (their tensors are the graphs' inputs, updated
    in place by AdamW); eager multiplies by merged copies of the weights: the same tokens, before and
    after the adapters change."""
    from minigrpo.config import LORA_TARGETS
    from minigrpo.model import Adapters, adapter_state, add_adapters

    adapted = add_adapters(copy.deepcopy(model), Adapters(rank=4, alpha=8, targets=LORA_TARGETS), seed=0)
    with torch.no_grad():
        for name, p in adapter_state(adapted).items():
            if ".lora_B." in name:
                p.normal_(std=0.05)
    eager, graphed = both_paths(adapted, PROMPTS, max_batch_rows=7, **SAMPLED)
    assert_same(eager, graphed)
    with torch.no_grad():
        for p in adapter_state(adapted).values():
            p.mul_(1.5)
    again_eager, again_graphed = both_paths(adapted, PROMPTS, max_batch_rows=7, **SAMPLED)
    assert again_graphed.tokens != graphed.tokens
    assert_same(again_eager, again_graphed)
    decode_graphs.release(adapted)


@pytest.mark.parametrize("rows", [None, 3])
def test_graphs_give_eager_tokens_with_tool_calls(model, rows):
    """Rows pause on the marker and resume with observations that arrive late and at varied steps."""
    settings = dict(max_new_tokens=30, temperature=1.0, num_samples=3, seed=1, max_batch_rows=rows)
    eager_hook, graphed_hook = Hook(76), Hook(76, delay=2)
    eager = minigrpo.generate(model, PROMPTS, tools=eager_hook, compile=False, **settings)
    graphed = minigrpo.generate(model, PROMPTS, tools=graphed_hook, **settings)
    assert len(eager_hook.calls) >= 3, "the test needs rows that call"
    assert sorted(graphed_hook.calls) == sorted(eager_hook.calls)
    assert_same(eager, graphed)


def test_eager_on_the_gpu_gives_the_reference_samplers_tokens(model):
    settings = dict(max_new_tokens=24, temperature=0, num_samples=1, eos_token_ids=[56, 0, 17, 82])
    samples = minigrpo.generate(model, PROMPTS, compile=False, **settings)
    naive, naive_logprobs = naive_generate(copy.deepcopy(model).cpu(), PROMPTS, **settings)  # on CPU
    assert samples.tokens == naive
    for ours, reference in zip(samples.logprobs, naive_logprobs):
        assert torch.allclose(torch.tensor(ours), torch.tensor(reference), atol=1e-4)


def test_a_trainer_step_on_the_gpu_lands_on_the_cpu_steps_weights(tmp_path):
    """Stages 2-4 on fixed completions, fp32 on both (no autocast; TF32 is off by default): the weights
    after one step agree to 1e-5, and the step moved them by over 5x that. AdamW's first step moves a
    weight by about the learning rate whatever its gradient's size, so gradients near 0, where the two
    devices' sums differ most, move it as much as any: the learning rate is 1e-4, so that a 10% difference
    in such a gradient is under the tolerance."""
    tokenizer = tiny_tokenizer(str(tmp_path / "tokenizer"))
    start = tiny_policy_model(tokenizer)
    weights = {}
    for device in ("cpu", "cuda"):
        grpo = GRPOConfig(num_generations=4, max_completion_length=8)
        model = copy.deepcopy(start).to(device)
        trainer, _ = make_trainer(
            tokenizer, tmp_path / device, grpo, model=model, bf16=False, learning_rate=1e-4
        )
        trainer.train_step()
        weights[device] = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    apart = max((weights["cpu"][k] - v).abs().max() for k, v in weights["cuda"].items())
    moved = max((weights["cpu"][k] - v).abs().max() for k, v in start.state_dict().items())
    assert apart <= 1e-5 and moved > 5e-5
