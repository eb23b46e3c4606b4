"""The policy: a hand-written Qwen3 decoder, its KV cache, its tokenizer, and its files in Hugging Face
layout.

- `Qwen3`, `Qwen3Config`: the decoder (qwen3.py), built from the pieces that hold no cache (layers.py:
  products, RMSNorm, rotary embeddings, the padding mask);
- `KVCache`: the static cache the sampler decodes in (kv_cache.py);
- `Tokenizer`: text <-> token ids, EOS and padding (tokenizer.py), and the checkpoint's own chat
  template rendered as transformers renders it (chat_template.py: `ChatTemplate`, `check_tool_schemas`);
- `load_pretrained`, `save_pretrained`, `download`: checkpoints on disk and on the Hub (weights.py), each
  problem a `CheckpointError` naming the file or tensor.
It knows tensors, files and names, not the loop that trains the model. The stages use the model through
these names; nothing outside this folder imports from inside it.
"""

from .chat_template import ChatTemplate, check_tool_schemas
from .kv_cache import KVCache
from .layers import logit_dtype
from .qwen3 import ConfigError, Qwen3, Qwen3Config
from .tokenizer import Tokenizer
from .weights import (
    CheckpointError,
    check_tensors,
    download,
    hf_name,
    load_pretrained,
    parse_device,
    read_task,
    read_tokenizer,
    resolve_checkpoint,
    save_pretrained,
    to_hf_state_dict,
    write_files,
)

__all__ = [
    "ChatTemplate",
    "CheckpointError",
    "ConfigError",
    "KVCache",
    "Qwen3",
    "Qwen3Config",
    "Tokenizer",
    "check_tensors",
    "check_tool_schemas",
    "download",
    "hf_name",
    "load_pretrained",
    "logit_dtype",
    "parse_device",
    "read_task",
    "read_tokenizer",
    "resolve_checkpoint",
    "save_pretrained",
    "to_hf_state_dict",
    "write_files",
]
