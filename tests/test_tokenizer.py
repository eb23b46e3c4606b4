"""The tokenizer wrapper: ids round-trip, special ids come from the side files, Qwen3's chat format."""

import pytest
from helpers import tiny_tokenizer, write_json

import minigrpo


@pytest.fixture
def tokenizer(tmp_path):
    return tiny_tokenizer(str(tmp_path))


def test_encode_decode_round_trip(tokenizer):
    texts = ["What is 12 + 30?", "The answer is \\boxed{42}.", "ünïcode ✓"]
    assert [tokenizer.decode(tokenizer.encode(t)) for t in texts] == texts


def test_a_completion_is_decoded_without_its_final_eos_but_with_think_tags(tokenizer):
    body = tokenizer.encode("<think>hm</think> 42")
    assert tokenizer.decode_completion(body + [tokenizer.eos_token_id]) == "<think>hm</think> 42"
    # cut at the length limit: nothing to drop
    assert tokenizer.decode_completion(body) == "<think>hm</think> 42"


def test_special_ids_from_generation_and_tokenizer_config(tokenizer):
    im_end, endoftext = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    assert tokenizer.eos_token_ids == (im_end, endoftext)  # generation_config's list, in its order
    assert tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token_id == endoftext  # tokenizer_config's pad_token
    assert tokenizer.encode("<|im_end|>") == [im_end]  # special tokens are single ids


def test_eos_from_tokenizer_config_alone(tmp_path):
    tiny_tokenizer(str(tmp_path))
    write_json(tmp_path / "generation_config.json", {})
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": {"content": "<|endoftext|>"}})
    tokenizer = minigrpo.Tokenizer.from_directory(str(tmp_path))
    endoftext = tokenizer.token_to_id("<|endoftext|>")
    assert tokenizer.eos_token_ids == (endoftext,) and tokenizer.pad_token_id == endoftext


def test_chat_format(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}]
    assert tokenizer.has_chat_format
    assert tokenizer.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_thinking = tokenizer.apply_chat_template(messages[1:], enable_thinking=False)
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not tokenizer.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")


def test_chat_format_rejects_malformed_messages(tokenizer):
    with pytest.raises(ValueError, match="message 1 must be a dict with 'role' and 'content'"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"text": "oops"}])
