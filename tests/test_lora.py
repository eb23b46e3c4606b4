"""LoRA: fresh adapters leave the model exactly as it was; adapted logits equal PEFT's on transformers'
Qwen3 for the same adapter files, whoever wrote them; merged weights (a checkpoint, the sampler's
copies) compute the adapted model; the base never changes, in bf16 too; only the adapters train,
the KL's reference is the base with them off; a LoRA run resumed after a kill ends where the
straight run ends; bad settings and files are refused with one line."""

import json
import os
import re
import shutil
import signal

import pytest
import torch
from helpers import ROWS, VOWELS, tiny_policy, tiny_train_config
from safetensors.torch import load_file, save_file
from test_crash_safety import ARGS as CRASH_ARGS

import minigrpo
from minigrpo import GRPOConfig, RewardSpec, Task, TrainConfig, Trainer, distributed
from minigrpo.model import (
    AdapterError,
    Adapters,
    adapter_state,
    adapters_off,
    add_adapters,
    check_tensors,
    is_adapter_directory,
    load_adapter,
    merged,
    read_adapter_config,
    tokenizer_directory,
    trainable_parameters,
    weights_sha256,
)
from minigrpo.rollout import generate
from minigrpo.run import CHECKPOINTS, Trace, build_run, latest_checkpoint, load_state

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def base(tiny_checkpoint):
    return tiny_checkpoint


def adapted(base: str, adapters: Adapters, seed: int = 0, scale: float = 0.1):
    """The base with `adapters`, B drawn at random (fresh adapters would compute the base)."""
    model, tokenizer = minigrpo.load_pretrained(base)
    add_adapters(model, adapters, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in adapter_state(model).items():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return model, tokenizer


def ids(vocab: int, rows: int = 2, length: int = 11) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(5))


def test_fresh_adapters_are_the_base_exactly_and_only_they_train(base):
    model, _ = minigrpo.load_pretrained(base)
    x = ids(model.config.vocab_size)
    before = model(x)
    total = sum(p.numel() for p in model.parameters())
    add_adapters(model, Adapters(rank=4, alpha=8, targets=ALL), seed=0)
    assert torch.equal(model(x), before)  # B = 0: step 0 is the base model, bit for bit
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    config = model.config
    per_block = sum(
        4 * (i + o)
        for i, o in [
            (config.hidden_size, config.num_attention_heads * config.head_dim),  # q
            (config.hidden_size, config.num_key_value_heads * config.head_dim),  # k
            (config.hidden_size, config.num_key_value_heads * config.head_dim),  # v
            (config.num_attention_heads * config.head_dim, config.hidden_size),  # o
            (config.hidden_size, config.intermediate_size),  # gate
            (config.hidden_size, config.intermediate_size),  # up
            (config.intermediate_size, config.hidden_size),  # down
        ]
    )
    assert trainable_parameters(model) == per_block * config.num_hidden_layers
    assert sum(p.numel() for p in model.parameters()) == total + trainable_parameters(model)
    with pytest.raises(AdapterError, match="already has LoRA adapters"):
        add_adapters(model, Adapters(rank=4, alpha=8, targets=ALL))


def test_adapters_off_merged_and_merged_sampling_compute_what_they_should(base):
    model, _ = adapted(base, Adapters(rank=3, alpha=6, targets=("q_proj", "v_proj", "down_proj")))
    x = ids(model.config.vocab_size)
    plain, _ = minigrpo.load_pretrained(base)
    with adapters_off(model):
        assert torch.equal(model(x), plain(x))
    moved = model(x)
    assert (moved - plain(x)).abs().max() > 1e-3
    plain_copy = merged(model)
    torch.testing.assert_close(plain_copy(x), moved, rtol=0, atol=1e-5)
    # a plain model: no adapters to save beside its weights, every weight trainable as a loaded one's
    assert plain_copy.adapters is None and not adapter_state(plain_copy)
    assert all(p.requires_grad for p in plain_copy.parameters())
    # the sampler's merged products against the adapters as their own products (the reference path)
    prompts = [[3, 5, 7, 9], [2, 4]]
    settings = dict(max_new_tokens=8, temperature=0.0, num_samples=2, seed=0)
    fast = generate(model, prompts, **settings)
    LoraLinearClass = type(model.layers[0].self_attn.q_proj)
    LoraLinearClass.MERGE_FOR_DECODING = False
    try:
        slow = generate(model, prompts, **settings)
    finally:
        LoraLinearClass.MERGE_FOR_DECODING = True
    assert fast.tokens == slow.tokens
    for a, b in zip(fast.logprobs, slow.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)


def test_the_base_stays_bit_identical_over_many_sampling_calls_and_updates_in_bf16(base, tmp_path):
    grpo = GRPOConfig(num_generations=2, max_completion_length=4)
    trainer = lora_trainer(base, tmp_path, grpo, "bfloat16", batch_size=4, lora_rank=2)
    model = trainer.model
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    lora = {name: p.detach().clone() for name, p in adapter_state(model).items()}
    for _ in range(10):  # 10 AdamW steps of the adapters, each with the merges of a sampling call
        trainer.train_step()
    projection = model.layers[0].mlp.down_proj
    x = torch.randn(4, 1, projection.in_features, dtype=torch.bfloat16)
    adapted_product = projection(x)
    for _ in range(200):  # and 200 sampling calls' products more
        with model.packed_for_decoding(batch_size=4):
            # bf16: the sampler adds the adapter's own products, never a merged bf16 weight that would
            # round a young adapter's updates away
            assert torch.equal(projection(x), adapted_product)
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(p, lora[name]) for name, p in adapter_state(model).items())
    assert all(p.dtype == torch.float32 for p in adapter_state(model).values())  # fp32 adapters on bf16


def write_peft_adapter(base: str, directory: str, rslora: bool = False):
    """An adapter written by PEFT itself on transformers' Qwen3 (B random: init_lora_weights=False);
    returns the PEFT model."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    # all-linear: PEFT writes each adapted module's path (model.layers.0.self_attn.q_proj, ...)
    config = peft.LoraConfig(
        r=4, lora_alpha=12, target_modules="all-linear", init_lora_weights=False, use_rslora=rslora
    )
    peft_model = peft.get_peft_model(hf, config).eval()
    peft_model.save_pretrained(directory)
    return peft_model


@pytest.mark.parametrize("rslora", [False, True], ids=["lora", "rslora"])
def test_minigrpo_loads_an_adapter_peft_wrote_and_computes_its_logits(base, tmp_path, rslora):
    peft_model = write_peft_adapter(base, str(tmp_path / "peft"), rslora)
    model, tokenizer = minigrpo.load_pretrained(str(tmp_path / "peft"))  # the base named in its config
    assert tokenizer is not None and model.adapters == Adapters(rank=4, alpha=12, targets=ALL, rslora=rslora)
    # PEFT writes no tokenizer: the base's serves (train_math.py reads it before the model)
    assert tokenizer_directory(str(tmp_path / "peft")) == base
    x = ids(model.config.vocab_size)
    with torch.no_grad():
        expected = peft_model(input_ids=x).logits
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-5)
    config_path = tmp_path / "peft" / "adapter_config.json"
    config = json.load(open(config_path))
    config["target_modules"] = ["model.layers.0.self_attn.q_proj", "lm_head"]
    json.dump(config, open(config_path, "w"))
    with pytest.raises(AdapterError, match="'lm_head' is not a projection of a Qwen3 block"):
        minigrpo.load_pretrained(str(tmp_path / "peft"))


def test_peft_loads_the_adapters_minigrpo_saves(base, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    model, tokenizer = adapted(base, Adapters(rank=2, alpha=16, targets=ALL, rslora=True))
    minigrpo.save_pretrained(model, tokenizer, str(tmp_path / "ours"))
    assert is_adapter_directory(str(tmp_path / "ours"))
    config = json.load(open(tmp_path / "ours" / "adapter_config.json"))
    assert config["base_model_name_or_path"] == os.path.abspath(base) and config["use_rslora"]
    tensors = load_file(tmp_path / "ours" / "adapter_model.safetensors")
    a = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a.shape == (2, model.config.intermediate_size) and b.shape == (model.config.hidden_size, 2)
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(tmp_path / "ours")).eval()
    x = ids(model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=x).logits, model(x), rtol=0, atol=1e-5)
    again, _ = minigrpo.load_pretrained(str(tmp_path / "ours"))  # and minigrpo reads its rsLoRA back
    assert again.adapters == model.adapters
    torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_merge_lora_writes_a_full_checkpoint_with_the_adapted_logits(examples_server, base, tmp_path):
    model, tokenizer = adapted(base, Adapters(rank=2, alpha=4, targets=ALL))
    minigrpo.save_pretrained(model, tokenizer, str(tmp_path / "adapter"))
    args = [str(tmp_path / "adapter"), str(tmp_path / "merged")]
    assert examples_server.run("merge_lora.py", args, str(tmp_path), "merge") == 0
    full, _ = minigrpo.load_pretrained(str(tmp_path / "merged"))
    assert full.adapters is None and os.path.exists(tmp_path / "merged" / "model.safetensors")
    x = ids(model.config.vocab_size)
    torch.testing.assert_close(full(x), model(x), rtol=0, atol=1e-5)
    assert examples_server.run("merge_lora.py", [base, str(tmp_path / "m2")], str(tmp_path), "bad") == 1
    lines = (tmp_path / "bad.err").read_text().strip().splitlines()
    assert len(lines) == 1 and "is not a LoRA adapter directory" in lines[0]


def test_eval_math_and_sample_take_an_adapter_checkpoint(examples_server, base, tmp_path):
    model, tokenizer = adapted(base, Adapters(rank=2, alpha=4, targets=ALL))
    minigrpo.save_pretrained(model, tokenizer, str(tmp_path / "adapter"))
    common = ["--model", str(tmp_path / "adapter"), "--template", "tiny", "--max_new_tokens", "4"]
    evaluated = ["--data", "arithmetic", "--count", "3", "--output", str(tmp_path / "results.jsonl")]
    assert examples_server.run("eval_math.py", common + evaluated, str(tmp_path), "eval") == 0, (
        tmp_path / "eval.err"
    ).read_text()[-2000:]
    assert "pass@1" in (tmp_path / "eval.out").read_text()
    sampled = ["--prompt", "1+2", "--answer", "3", "--num_samples", "2"]
    assert examples_server.run("sample.py", common + sampled, str(tmp_path), "sample") == 0, (
        tmp_path / "sample.err"
    ).read_text()[-2000:]


def test_dropout_drops_an_adapter_s_input_while_training_and_never_in_eval(base):
    model, _ = adapted(base, Adapters(rank=3, alpha=6, targets=("down_proj",), dropout=0.5))
    projection = model.layers[0].mlp.down_proj
    W, A, B, s = projection.weight, projection.lora_A.weight, projection.lora_B.weight, projection.scaling
    x = torch.randn(2, 5, projection.in_features, generator=torch.Generator().manual_seed(3))  # (B, T, in)
    with torch.no_grad():
        projection.eval()
        torch.testing.assert_close(projection(x), x @ W.T + s * (x @ A.T @ B.T), rtol=0, atol=1e-6)
        projection.train()
        torch.manual_seed(11)
        dropped = projection(x)
        torch.manual_seed(11)  # the same draw: each input kept times 1 / (1 - p) = 2, or 0
        kept = torch.nn.functional.dropout(torch.ones_like(x), p=0.5)
        assert set(kept.unique().tolist()) == {0.0, 2.0}
        torch.testing.assert_close(dropped, x @ W.T + s * ((x * kept) @ A.T @ B.T), rtol=0, atol=1e-6)


def lora_trainer(model_path: str, tmp_path, grpo=None, dtype=None, **train):
    model, tokenizer = minigrpo.load_pretrained(model_path, dtype=dtype)
    grpo = grpo or GRPOConfig(num_generations=4, max_completion_length=8, beta=0.1)
    config = tiny_train_config(tmp_path / "run", **{"lora_rank": 4, **train})
    return Trainer(model, tokenizer, Task(ROWS, [RewardSpec(VOWELS)]), grpo, config)


def test_the_reference_is_the_base_with_adapters_off_and_only_adapters_reach_adamw(base, tmp_path):
    trainer = lora_trainer(base, tmp_path)
    assert trainer.plan.reference is None  # no second copy of the model
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in adapter_state(trainer.model).values()}
    printed = []
    stats, _ = trainer.train_step(Trace(write=printed.append))
    assert stats["training/trainable_parameters"] == trainer_parameters(trainer.model)
    trained = f"{trainer.trainable_parameters:,} parameters (LoRA adapters r=4 on q_proj,k_proj"
    assert any(line.startswith("[4 trained]") and trained in line for line in printed), printed
    stats, _ = trainer.train_step()
    assert stats["kl"] > 0  # the adapters moved away from the base, which the KL measures
    plain, _ = minigrpo.load_pretrained(base)
    x = ids(plain.config.vocab_size)
    reference = trainer.updater.reference
    with torch.no_grad():
        mask = torch.ones_like(x)
        theirs = minigrpo.update.TokenLogprobs(plain)(x, mask, 4, 1.0)[0]
        torch.testing.assert_close(reference(x, mask, 4, 1.0)[0], theirs, rtol=0, atol=0)


def test_the_run_s_lora_settings_reach_its_adapters(base, tmp_path):
    settings = dict(
        lora_alpha=12.0, use_rslora=True, lora_dropout=0.1, lora_target_modules="down_proj,q_proj"
    )
    trainer = lora_trainer(base, tmp_path, seed=7, **settings)  # lora_rank 4
    wanted = Adapters(rank=4, alpha=12.0, targets=("q_proj", "down_proj"), dropout=0.1, rslora=True)
    assert trainer.plan.adapters == wanted
    modules = {name: m for name, m in trainer.model.named_modules() if hasattr(m, "lora_A")}
    assert sorted(modules) == [
        f"layers.{i}.{p}" for i in (0, 1) for p in ("mlp.down_proj", "self_attn.q_proj")
    ]
    assert all(m.scaling == 12.0 / 2.0 and m.dropout.p == 0.1 for m in modules.values())  # alpha / sqrt(r)
    # A drawn from the run's seed, as add_adapters draws it from 7 (and not from 0)
    for seed, same in [(7, True), (0, False)]:
        model, _ = minigrpo.load_pretrained(base)
        drawn = adapter_state(add_adapters(model, wanted, seed=seed))
        assert all(torch.equal(p, drawn[name]) for name, p in adapter_state(trainer.model).items()) == same
    assert trainer.plan.base_sha256 == weights_sha256(base)  # pinned for its checkpoints
    assert lora_trainer(base, tmp_path, lora_rank=0).plan.base_sha256 is None  # trained whole: no base


def trainer_parameters(model) -> float:
    return float(sum(p.numel() for p in model.parameters() if p.requires_grad))


def test_a_run_starting_from_an_adapter_directory_continues_it_against_a_frozen_merged_reference(
    base, tmp_path
):
    model, tokenizer = adapted(base, Adapters(rank=4, alpha=32, targets=ALL))
    minigrpo.save_pretrained(model, tokenizer, str(tmp_path / "start"))
    # continues the file's adapters, with this run's dropout
    trainer = lora_trainer(str(tmp_path / "start"), tmp_path, lora_rank=0, lora_dropout=0.25)
    assert trainer.plan.adapters.rank == 4 and trainer.plan.adapters.dropout == 0.25
    assert all(m.dropout.p == 0.25 for m in trainer.model.modules() if hasattr(m, "lora_A"))
    assert trainer.plan.reference is not None and trainer.plan.reference.adapters == trainer.plan.adapters
    assert not any(p.requires_grad for p in trainer.plan.reference.parameters())  # a frozen copy of the start
    x = ids(model.config.vocab_size)
    assert torch.equal(trainer.plan.reference(x), model(x))
    mask = torch.ones_like(x)
    with torch.no_grad():  # the KL's reference log-probs are that copy's
        theirs = minigrpo.update.TokenLogprobs(model)(x, mask, 4, 1.0)[0]
        torch.testing.assert_close(trainer.updater.reference(x, mask, 4, 1.0)[0], theirs, rtol=0, atol=0)
    assert trainer.model.name_or_path == os.path.abspath(base)  # its checkpoints name the base, not start
    with pytest.raises(ValueError, match="already has LoRA adapters.*leave the lora flags out"):
        lora_trainer(str(tmp_path / "start"), tmp_path, lora_rank=8)


class TwoRanks(distributed.Dist):
    """Rank 0 of two that checks nothing with the other (there is no process group): what a Trainer
    decides before any collective, tested in one process."""

    def check_same(self, values) -> None:
        pass


def test_adapters_put_on_in_memory_name_the_run_s_model_and_are_refused_under_fsdp_across_ranks(
    base, tmp_path
):
    grpo = GRPOConfig(num_generations=4, max_completion_length=8)
    task = Task(ROWS, [RewardSpec(VOWELS)])
    settings = dict(output_dir=str(tmp_path / "run"), batch_size=8, micro_batch_size=4, progress_bar=False)
    model, tokenizer = adapted(base, Adapters(rank=2, alpha=4, targets=("q_proj",)))
    model.name_or_path = ""  # as a model built in memory, its adapters on
    trainer = Trainer(model, tokenizer, task, grpo, TrainConfig(**settings), model_path=base)
    saved = minigrpo.run.Run(trainer).save()  # its checkpoints name it, the model left as it came
    assert read_adapter_config(saved)[1] == base and trainer.plan.base_sha256 is None
    assert trainer.model.name_or_path == ""
    model, tokenizer = adapted(base, Adapters(rank=2, alpha=4, targets=("q_proj",)))
    one_process = Trainer(model, tokenizer, task, grpo, TrainConfig(fsdp=True, **settings))
    assert one_process.plan.adapters is not None  # fsdp is a setting of several ranks: one trains as it is
    model, tokenizer = adapted(base, Adapters(rank=2, alpha=4, targets=("q_proj",)))
    message = r"fsdp cannot be combined with LoRA \(the model was loaded with adapters\)"
    with pytest.raises(ValueError, match=message):
        Trainer(model, tokenizer, task, grpo, TrainConfig(fsdp=True, **settings), dist=TwoRanks(world_size=2))


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(lora_rank=4, lora_target_modules="q_proj,qkv_proj"), "'qkv_proj' is not a projection"),
        (dict(lora_rank=0, lora_target_modules="q_proj"), "need a lora_rank > 0"),
        (dict(lora_rank=0, lora_alpha=8.0), "lora_alpha=8.0 describes new adapters"),
        (dict(lora_rank=4, lora_alpha=-8.0), "lora_alpha must be > 0"),
        (dict(lora_rank=-1), "lora_rank must be an integer >= 0"),
        (dict(lora_rank=4, lora_dropout=1.0), r"lora_dropout must be in \[0, 1\)"),
    ],
)
def test_bad_lora_settings_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


def test_an_adapter_for_another_base_is_refused_before_any_step(base, tmp_path):
    other = tiny_policy(str(tmp_path / "other"), max_position_embeddings=96, hidden_size=64)
    model, tokenizer = adapted(other, Adapters(rank=2, alpha=4, targets=ALL))
    minigrpo.save_pretrained(model, tokenizer, str(tmp_path / "adapter"))
    config_path = tmp_path / "adapter" / "adapter_config.json"
    config = json.load(open(config_path))
    config["base_model_name_or_path"] = base
    json.dump(config, open(config_path, "w"))
    with pytest.raises(AdapterError, match=r"has shape .* \(an adapter made for another base"):
        minigrpo.load_pretrained(str(tmp_path / "adapter"))
    for key, value, message in [
        ("use_dora", True, "use_dora = True is not supported"),
        ("alora_invocation_tokens", [5, 6], "alora_invocation_tokens = .* is not supported"),
        ("lora_dropout", "0.1", "lora_dropout must be in"),
        ("target_modules", 5, "target_modules must be a list"),
        ("rank_pattern", None, "has shape"),  # null means unused: read on to the shapes
    ]:
        json.dump({**config, key: value}, open(config_path, "w"))
        with pytest.raises(AdapterError, match=message):
            minigrpo.load_pretrained(str(tmp_path / "adapter"))


# --- adapter files are untrusted input: checked whole before anything is allocated ------------------
PREFIX = "base_model.model.model."  # of every tensor name in PEFT's file
SAVED = Adapters(rank=2, alpha=4, targets=("q_proj", "down_proj"))  # saved_adapter's


def saved_adapter(base: str, directory):
    """`adapted` with SAVED (B random) saved in `directory`: (adapter_config.json's path, the weights')."""
    model, tokenizer = adapted(base, SAVED)
    minigrpo.save_pretrained(model, tokenizer, str(directory))
    return directory / "adapter_config.json", directory / "adapter_model.safetensors"


def edit_config(path, **changes):
    json.dump({**json.load(open(path)), **changes}, open(path, "w"))


def refused(base: str, directory, message: str) -> None:
    """load_adapter on a fresh base refuses `directory` in one line matching `message`, leaving the base as
    it was: no adapters, nothing frozen."""
    model, _ = minigrpo.load_pretrained(base)
    with pytest.raises(AdapterError, match=message) as error:
        load_adapter(model, str(directory))
    assert "\n" not in str(error.value)
    assert model.adapters is None and not adapter_state(model)
    assert all(p.requires_grad for p in model.parameters())


def test_a_rank_above_the_narrowest_projection_is_refused_before_any_adapter_is_allocated(base, tmp_path):
    # TINY: k_proj and v_proj (48 in, 32 out) are the narrowest of the seven; q_proj (48 in, 64 out) takes 48
    with pytest.raises(AdapterError, match="^lora_rank = 1000000000000 is above 32, the most k_proj takes"):
        lora_trainer(base, tmp_path, lora_rank=10**12)  # (an allocation of terabytes, never tried)
    with pytest.raises(AdapterError, match="^lora_rank = 49 is above 48, the most q_proj takes"):
        lora_trainer(base, tmp_path, lora_rank=49, lora_target_modules="q_proj")
    assert lora_trainer(base, tmp_path, lora_rank=48, lora_target_modules="q_proj").plan.adapters.rank == 48
    config_path, weights = saved_adapter(base, tmp_path / "adapter")
    edit_config(config_path, r=10**12)
    refused(
        base,
        tmp_path / "adapter",
        re.escape(f"{config_path}: r = 1000000000000 is above 48, the most q_proj"),
    )
    # a rank the projections allow, but not the file's: its header says so before any allocation
    edit_config(config_path, r=3)
    name = PREFIX + "layers.0.self_attn.q_proj.lora_A.weight"
    message = f"{weights}: {name} has shape (2, 48), but this model's projection takes (3, 48)"
    refused(base, tmp_path / "adapter", re.escape(message))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_an_adapter_holding_nan_or_inf_is_refused_naming_the_tensor(base, tmp_path, value):
    _, weights = saved_adapter(base, tmp_path / "adapter")
    tensors = load_file(weights)
    name = PREFIX + "layers.1.mlp.down_proj.lora_B.weight"
    tensors[name][3, 1] = value
    save_file(tensors, weights, metadata={"format": "pt"})
    refused(base, tmp_path / "adapter", re.escape(f"{weights}: {name} holds NaN or infinite values"))


def test_an_alpha_that_float32_cannot_hold_is_refused_in_a_file_and_as_a_flag(base, tmp_path):
    largest = float(torch.finfo(torch.float32).max)
    assert Adapters(rank=1, alpha=largest, targets=ALL).scaling == largest  # the bound itself is allowed
    config_path, _ = saved_adapter(base, tmp_path / "adapter")
    edit_config(config_path, lora_alpha=1e39)
    message = (
        "lora_alpha must be a number > 0 that float32 holds (at most 3.403e+38: the adapters compute in "
    )
    refused(base, tmp_path / "adapter", re.escape(f"{config_path}: {message}float32), got 1e+39"))
    with pytest.raises(AdapterError, match=re.escape(message)):
        lora_trainer(base, tmp_path, lora_alpha=1e39)


def test_tensors_no_adapted_projection_takes_are_refused_by_name_and_missing_ones_named(base, tmp_path):
    directory = tmp_path / "adapter"
    _, weights = saved_adapter(base, directory)  # q_proj and down_proj of blocks 0 and 1
    good = load_file(weights)
    model = "(2 layers, targets q_proj,down_proj)"
    outside_any_name = [
        PREFIX + "layers.0.self_attn.k_proj.lora_A.weight",  # a projection the config does not target
        PREFIX + "layers.0.self_attn.q_proj.lora_B.bias",  # PEFT's lora_bias
        PREFIX + "layers.0.mlp.q_proj.lora_A.weight",  # a projection under the wrong parent
        "base_model.model.lm_head.weight",  # PEFT's modules_to_save, trainable tokens, ...
    ]
    for surplus in [*outside_any_name, PREFIX + "layers.2.self_attn.q_proj.lora_A.weight"]:
        save_file({**good, surplus: torch.zeros(2, 48)}, weights, metadata={"format": "pt"})
        message = f"{weights} holds {surplus}, which no adapted projection of this model {model} takes"
        refused(base, directory, re.escape(message))
        if surplus in outside_any_name:  # (block 2 needs the base to tell: the header alone cannot)
            message = f"{weights} holds {surplus}, which is not the A or B of a projection its adapter_config"
            with pytest.raises(AdapterError, match=re.escape(message)):
                check_tensors(str(directory))  # what a resume checks in a checkpoint
    blocks = {name: t for name, t in good.items() if ".layers.1." not in name}  # block 0's alone
    save_file(blocks, weights, metadata={"format": "pt"})
    missing = sorted(set(good) - set(blocks))  # block 1's A and B of down_proj and q_proj
    message = f"{weights} lacks {', '.join(missing[:3])} and 1 more for this model {model}"
    refused(base, directory, re.escape(message))
    save_file({**blocks, missing[3]: good[missing[3]]}, weights, metadata={"format": "pt"})
    refused(base, directory, re.escape(f"{weights} lacks {', '.join(missing[:3])} for this model"))


@pytest.mark.parametrize(
    "key, value",
    [
        ("layers_to_transform", 0),  # block 0 alone in PEFT, though falsy
        ("layers_to_transform", False),  # (== 0)
        ("layers_to_transform", 1),
        ("layers_to_transform", [1]),
        ("exclude_modules", ["model.layers.0.self_attn.q_proj"]),
        ("exclude_modules", "model\\.layers\\.1\\..*"),  # a pattern
        ("layers_pattern", "layers"),
    ],
)
def test_peft_settings_that_leave_some_projections_unadapted_are_refused(base, tmp_path, key, value):
    config_path, _ = saved_adapter(base, tmp_path / "adapter")
    edit_config(config_path, **{key: value})
    message = f"{config_path}: {key} = {value!r} is not supported by minigrpo's adapters, which go on every "
    refused(base, tmp_path / "adapter", re.escape(message + "targeted projection of every block"))


def test_the_empty_values_of_those_settings_load_as_peft_loads_them(base, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    config_path, _ = saved_adapter(base, tmp_path / "adapter")
    x = ids(97)
    # PEFT's every block: null and [] (layers_to_transform), null, "" and [] (exclude_modules)
    for changes in [dict(layers_to_transform=[], exclude_modules=[]), dict(exclude_modules="")]:
        edit_config(config_path, **changes)
        ours, _ = minigrpo.load_pretrained(str(tmp_path / "adapter"))
        hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        theirs = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(input_ids=x).logits, rtol=0, atol=1e-5)
    edit_config(config_path, layers_to_transform=0)  # what PEFT makes of 0: block 0's adapters alone
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert (ours(x) - theirs(input_ids=x).logits).abs().max() > 1e-3


def test_a_resume_refuses_a_base_whose_weights_changed_in_place(base, tmp_path):
    copy = shutil.copytree(base, tmp_path / "base")  # changed below: not the module's base
    task = Task(ROWS, [RewardSpec(VOWELS)])
    grpo = GRPOConfig(num_generations=2, max_completion_length=4)
    settings = dict(output_dir=str(tmp_path / "run"), batch_size=4, micro_batch_size=4, lora_rank=2)
    settings.update(progress_bar=False, log_completions_every=0)
    minigrpo.train(str(copy), task, grpo, TrainConfig(max_steps=1, **settings))
    saved = load_state(latest_checkpoint(str(tmp_path / "run")))
    assert saved["base_sha256"] == weights_sha256(str(copy))
    # the same base, and the same targets named otherwise (all-linear is the default's seven): resumed
    resumed = TrainConfig(max_steps=2, resume=True, **settings, lora_target_modules="all-linear")
    assert build_run(str(copy), task, grpo, resumed).trainer.step == 1
    weights = load_file(copy / "model.safetensors")
    weights["model.norm.weight"][0] = torch.nextafter(weights["model.norm.weight"][0], torch.tensor(9.0))
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})  # one float's last bit
    message = f"trained adapters on {copy}, whose weights have changed since (their sha256 differs"
    with pytest.raises(ValueError, match=re.escape(message)):
        build_run(str(copy), task, grpo, resumed)


# test_crash_safety's killed runs, of LoRA adapters with a KL to their base
ARGS = [*CRASH_ARGS, "--lora_rank", "2", "--learning_rate", "1e-2", "--beta", "0.05"]


def test_a_killed_lora_run_resumes_to_the_straight_runs_end_bit_for_bit(examples_server, base, tmp_path):
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    code = examples_server.train_math(
        ["--model", base, "--output_dir", straight, *ARGS], None, str(tmp_path), "s"
    )
    assert code == 0, (tmp_path / "s.err").read_text()[-3000:]
    kill = "save 2: every file written and fsynced, not yet renamed into place"
    args = ["--model", base, "--output_dir", killed, *ARGS]
    assert examples_server.train_math(args, kill, str(tmp_path), "k") == -signal.SIGKILL
    assert examples_server.train_math(args + ["--resume"], None, str(tmp_path), "r") == 0, (
        tmp_path / "r.err"
    ).read_text()[-3000:]
    for step in ("step-000002", "step-000003"):
        ours, theirs = (os.path.join(out, CHECKPOINTS, step) for out in (killed, straight))
        assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs))
        assert not os.path.exists(os.path.join(ours, "model.safetensors"))  # the adapters alone
        a, b = (load_file(os.path.join(d, "adapter_model.safetensors")) for d in (ours, theirs))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        for x, y in zip(*(load_state(d)["optimizer"]["state"].values() for d in (ours, theirs))):
            assert all(torch.equal(x[k], y[k]) for k in x)
    history = [
        [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))] for out in (killed, straight)
    ]
    for a, b in zip(*history, strict=True):
        assert {k: v for k, v in a.items() if k.startswith(("reward", "loss", "kl", "grad"))} == {
            k: v for k, v in b.items() if k.startswith(("reward", "loss", "kl", "grad"))
        }
    # --resume with other adapters is refused with one line, before any step
    args = ["--model", base, "--output_dir", killed, *ARGS, "--resume", "--lora_rank", "4"]
    assert examples_server.train_math(args, None, str(tmp_path), "changed") == 1
    lines = (tmp_path / "changed.err").read_text().strip().splitlines()
    assert len(lines) == 1 and "was trained with lora_rank=2, and this run asks for 4" in lines[0], lines
    assert latest_checkpoint(killed).endswith("step-000003")


def test_an_adapter_config_reads_peft_s_defaults_and_refuses_what_is_not_lora_in_one_line(base, tmp_path):
    directory = tmp_path / "adapter"
    config_path, weights = saved_adapter(base, directory)
    # PEFT's LoraConfig defaults for what a file leaves out: r 8, lora_alpha 8, no dropout, no rsLoRA
    json.dump({"target_modules": ["q_proj"], "base_model_name_or_path": base}, open(config_path, "w"))
    assert read_adapter_config(str(directory)) == (Adapters(rank=8, alpha=8, targets=("q_proj",)), base)
    edit_config(config_path, target_modules="all-linear")  # PEFT's one string besides a projection's name
    assert read_adapter_config(str(directory))[0].targets == ALL
    edit_config(config_path, target_modules="down_proj")
    assert read_adapter_config(str(directory))[0].targets == ("down_proj",)
    for key, value, message in [
        ("peft_type", "LOHA", "peft_type 'LOHA' is not LORA, the one minigrpo runs"),
        (
            "target_modules",
            ".*q_proj",
            "target_modules '.*q_proj' is a pattern; minigrpo reads a list of names",
        ),
        ("target_modules", ["q_proj", 5], "target_modules entry 5 is not a projection of a Qwen3 block"),
        ("base_model_name_or_path", 5, "base_model_name_or_path must be a path or a Hub id, got 5"),
    ]:
        saved = json.load(open(config_path))
        edit_config(config_path, **{key: value})
        refused(base, directory, re.escape(f"{config_path}: {message}"))
        json.dump(saved, open(config_path, "w"))
    os.remove(weights)
    message = f"{weights} does not exist: an adapter directory needs adapter_model.safetensors"
    refused(base, directory, re.escape(message))


def test_a_checkpoint_s_adapter_header_is_checked_against_its_config(base, tmp_path):
    directory = tmp_path / "adapter"
    _, weights = saved_adapter(base, directory)  # rank 2 on q_proj and down_proj
    good = load_file(weights)
    check_tensors(str(directory))  # what a resume checks in a checkpoint: this one is whole
    a = PREFIX + "layers.0.self_attn.q_proj.lora_A.weight"
    b = PREFIX + "layers.0.self_attn.q_proj.lora_B.weight"
    for name, tensor, message in [
        (a, torch.zeros(3, 48), f"{a} has shape (3, 48), not rank 2"),  # A is (r, in)
        (b, torch.zeros(64, 3), f"{b} has shape (64, 3), not rank 2"),  # B is (out, r)
        (a, torch.zeros(2, 48, 1), f"{a} has shape (2, 48, 1), not rank 2"),
    ]:
        save_file({**good, name: tensor}, weights, metadata={"format": "pt"})
        with pytest.raises(AdapterError, match=re.escape(f"{weights}: {message}")):
            check_tensors(str(directory))
    save_file({}, weights, metadata={"format": "pt"})
    with pytest.raises(AdapterError, match=re.escape(f"{weights} holds no adapter tensors")):
        check_tensors(str(directory))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(rank=0), "a LoRA rank must be a positive integer, got 0"),
        (dict(rank=-2), "a LoRA rank must be a positive integer, got -2"),
        (dict(rank=True), "a LoRA rank must be a positive integer, got True"),
        (dict(rank=2.0), "a LoRA rank must be a positive integer, got 2.0"),
        (dict(alpha=0), "lora_alpha must be a number > 0"),
        (dict(alpha=True), "lora_alpha must be a number > 0"),
        (dict(alpha=float("nan")), "lora_alpha must be a number > 0"),
        (dict(alpha="8"), "lora_alpha must be a number > 0"),
        (dict(dropout=1), "lora_dropout must be in [0, 1), got 1"),
        (dict(dropout=-0.1), "lora_dropout must be in [0, 1), got -0.1"),
        (dict(dropout=True), "lora_dropout must be in [0, 1), got True"),
        (dict(targets=()), "LoRA targets must be some of"),
        (dict(targets=("k_proj", "q_proj")), "LoRA targets must be some of"),  # not in LORA_TARGETS' order
        (dict(targets=["q_proj"]), "LoRA targets must be some of"),
    ],
)
def test_adapters_that_cannot_be_are_refused_when_described(fields, message):
    """What a PEFT file or a library caller describes is checked where an Adapters is made."""
    with pytest.raises(AdapterError, match=re.escape(message)):
        Adapters(**{**dict(rank=2, alpha=4, targets=("q_proj",)), **fields})
    assert Adapters(rank=1, alpha=0.5, targets=("q_proj",), dropout=0.0).dropout == 0.0  # the edges held


def test_a_resume_refuses_other_adapters_than_its_checkpoint_s_in_one_line(base, tmp_path):
    task = Task(ROWS, [RewardSpec(VOWELS)])
    grpo = GRPOConfig(num_generations=2, max_completion_length=4)
    settings = dict(output_dir=str(tmp_path / "run"), batch_size=4, micro_batch_size=4, lora_rank=2)
    settings.update(
        lora_alpha=4.0, lora_target_modules="q_proj,v_proj", progress_bar=False, log_completions_every=0
    )
    minigrpo.train(base, task, grpo, TrainConfig(max_steps=1, **settings))
    for name, value, shown in [
        ("lora_rank", 4, "lora_rank=2, and this run asks for 4"),
        ("lora_alpha", 8.0, "lora_alpha=4.0, and this run asks for 8.0"),
        (
            "lora_target_modules",
            "q_proj",
            "lora_target_modules=('q_proj', 'v_proj'), and this run asks for ('q_proj',)",
        ),
        ("use_rslora", True, "use_rslora=False, and this run asks for True"),
    ]:
        changed = TrainConfig(max_steps=2, resume=True, **{**settings, name: value})
        with pytest.raises(
            ValueError, match=re.escape(f"was trained with {shown}: resume with the checkpoint's")
        ):
            build_run(base, task, grpo, changed)
    # the same targets named otherwise, and another dropout (the run's, not the adapters'): resumed
    same = {**settings, "lora_target_modules": "v_proj, q_proj", "lora_dropout": 0.1}
    assert build_run(base, task, grpo, TrainConfig(max_steps=2, resume=True, **same)).trainer.step == 1
