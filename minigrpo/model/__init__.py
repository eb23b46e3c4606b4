"""The policy: a hand-written Qwen3 decoder, its KV cache, its tokenizer, and its files in Hugging Face
layout.

- `Qwen3`, `Qwen3Config`: the decoder (qwen3.py), built from the pieces that hold no cache (layers.py:
  products, RMSNorm, rotary embeddings, the padding mask);
- `KVCache`: the static cache the sampler decodes in (kv_cache.py);
- `Tokenizer`: text <-> token ids, EOS and padding (tokenizer.py), and the checkpoint's own chat
  template rendered as transformers renders it (chat_template.py: `ChatTemplate`, `check_tool_schemas`),
  in a sandbox that bounds what a render may spend (template_sandbox.py);
- `load_pretrained`, `save_pretrained`: checkpoints in Hugging Face layout, loaded, checked and saved
  (weights.py), each problem a `CheckpointError` naming the file or tensor; a PEFT adapter directory
  loads as its base with the adapters on (adapter_files.py); `output_problem`: what stops a tool from
  saving into a directory; `resolve_checkpoint`, `download`: a checkpoint's files found locally or
  fetched from the Hub (hub.py); `parse_device`: a device checked against this machine (devices.py);
  `read_task`: the task the example scripts recorded in a tokenizer's config (tokenizer.py);
- `Adapters`, `add_adapters`, `adapters_off`, `merged`: LoRA adapters on the projections, switched off
  for the base, or merged into plain weights (lora.py).
It knows tensors, files and names, not the loop that trains the model. The stages use the model through
these names; nothing outside this folder imports from inside it.
"""

from .adapter_files import is_adapter_directory, load_adapter, read_adapter_config
from .chat_template import ChatTemplate, check_tool_schemas
from .devices import parse_device
from .hub import CHECKPOINT_FILES, CheckpointError, download, resolve_checkpoint, tokenizer_directory
from .kv_cache import KVCache
from .layers import logit_dtype
from .lora import (
    AdapterError,
    Adapters,
    adapter_state,
    adapters_of,
    adapters_off,
    add_adapters,
    check_rank,
    merged,
    set_dropout,
    trainable_parameters,
)
from .qwen3 import ConfigError, Qwen3, Qwen3Config
from .tokenizer import Tokenizer, read_task
from .weights import (
    check_tensors,
    hf_name,
    load_pretrained,
    output_problem,
    read_config,
    read_tokenizer,
    save_pretrained,
    to_hf_state_dict,
    weights_sha256,
    write_files,
)

__all__ = [
    "CHECKPOINT_FILES",
    "AdapterError",
    "Adapters",
    "adapter_state",
    "adapters_of",
    "adapters_off",
    "add_adapters",
    "check_rank",
    "is_adapter_directory",
    "load_adapter",
    "merged",
    "read_adapter_config",
    "set_dropout",
    "trainable_parameters",
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
    "output_problem",
    "parse_device",
    "read_config",
    "read_task",
    "read_tokenizer",
    "resolve_checkpoint",
    "save_pretrained",
    "to_hf_state_dict",
    "tokenizer_directory",
    "weights_sha256",
    "write_files",
]
