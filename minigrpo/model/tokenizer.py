"""Between the task and the sampler (and back, before the verifier): text <-> token ids, a thin wrapper
over a `tokenizers.Tokenizer` read from tokenizer.json.

It adds what a checkpoint's side files say: EOS and padding ids (generation_config.json and
tokenizer_config.json) and the checkpoint's own chat template (chat_template.py: tokenizer_config.json's
`chat_template`, or chat_template.jinja beside it, which wins), kept as it came when the tokenizer is
saved. A tokenizer with ChatML tokens and no template (the embedded models) gets Qwen3's ChatML written
by hand, a fallback that declares no tools. The example scripts record the task a checkpoint was
made for in its tokenizer_config.json, which every checkpoint saved from it keeps (`read_task`). It
knows strings and ids, not tensors or models.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from collections import Counter

from tokenizers import Tokenizer as _HFTokenizer

from ..files import read_json_object, regular_file, write_json
from .adapter_files import is_adapter_directory
from .chat_template import SPECIAL_TOKENS, ChatTemplate, choose, read_template_file
from .hub import CheckpointError, present, read_json, tokenizer_directory

TEMPLATE_FILE = "chat_template.jinja"  # newer checkpoints keep their template here; it wins over the config's

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class Tokenizer:
    """encode / decode text, plus the special ids the sampler and trainer need."""

    def __init__(
        self,
        tokenizer: _HFTokenizer,
        tokenizer_config: dict | None = None,
        generation_config: dict | None = None,
        template_file: str | None = None,
        where: str = "the tokenizer",
    ):
        self.backend = tokenizer
        self.tokenizer_config = dict(tokenizer_config or {})  # written back unchanged by save()
        self.template_file = template_file  # chat_template.jinja's text, written back unchanged by save()
        self.where = where  # the directory it was read from, for errors
        # written back by weights.write_files, with these EOS/pad ids
        self.generation_config = dict(generation_config or {})
        self.eos_token_ids = self._eos_ids()  # every id that ends a completion, first = the canonical one
        self.pad_token_id = self._pad_id()  # id used to fill ragged batches (never attended to)

    @classmethod
    def from_directory(cls, directory: str) -> Tokenizer:
        """The tokenizer of a checkpoint directory; a missing or unreadable file is a ValueError naming it."""
        path = os.path.join(directory, "tokenizer.json")
        if not regular_file(path):  # a named pipe or a directory is refused, never opened
            raise ValueError(f"{directory} has no tokenizer.json")
        configs = [
            _read_json_if_exists(os.path.join(directory, name))
            for name in ("tokenizer_config.json", "generation_config.json")
        ]
        try:
            backend = _HFTokenizer.from_file(path)
        except Exception as e:
            # the tokenizers library raises a bare Exception: bad JSON, an unknown model, ...
            cause = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"{path} is not a tokenizer file the tokenizers library can read ({cause})"
            ) from None
        template_path = os.path.join(directory, TEMPLATE_FILE)
        template_file = None
        if regular_file(template_path):
            template_file = read_template_file(template_path)
        return cls(backend, *configs, template_file=template_file, where=directory)

    def save(self, directory: str) -> None:
        self.backend.save(os.path.join(directory, "tokenizer.json"))
        if self.template_file is not None:
            with open(os.path.join(directory, TEMPLATE_FILE), "w", encoding="utf-8") as f:
                f.write(self.template_file)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.tokenizer_config}
        write_json(os.path.join(directory, "tokenizer_config.json"), config)

    # --- text <-> ids -------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS/EOS is added (Qwen3 uses none)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_all(
        self,
        texts: list[str],
        what: str = "prompts",
        source: str = "this model",
        max_tokens: int | None = None,
        sources: list[str] | None = None,
    ) -> list[list[int]]:
        """Token ids of every text, refused when the tokenizer loses characters: a tokenizer without
        a byte fallback drops what its vocabulary lacks (the embedded model's keeps digits and
        operators), and a model trained on what is left learns from other prompts than it is given.
        With `max_tokens`, a text too long to fit in that many tokens is refused before anything is
        encoded (`fewest_tokens`; tokenizing costs seconds a megabyte); `sources` name the texts then."""
        if max_tokens is not None:
            self._refuse_too_long(texts, max_tokens, what, source, sources)
        ids = [self.encode(text) for text in texts]
        lost = 0
        example = None
        for text, row in zip(texts, ids):
            back = self.decode(row)
            if unicodedata.normalize("NFC", back) != unicodedata.normalize("NFC", text):
                lost += max(1, sum((Counter(text) - Counter(back)).values()))
                example = example or (text, back)
        if example is not None:
            text, back = (t if len(t) <= 80 else t[:77] + "..." for t in example)
            raise ValueError(
                f"the tokenizer of {source} cannot represent {lost / sum(map(len, texts)):.0%} "
                f"of the characters of the {what} ({text!r} encodes to {back!r}); "
                "use a checkpoint whose tokenizer can (a Qwen3 one)"
            )
        return ids

    def fewest_tokens(self, text: str) -> int:
        """At least how many tokens `text` takes, if encode_all accepts it, found in time linear in its length
        without encoding it: a token decodes to at most `longest_token` characters, plus a space a decoder
        may put between tokens, and NFC (under which encode_all compares) at most triples a text's length."""
        return -(-len(unicodedata.normalize("NFC", text)) // (3 * (self.longest_token + 1)))

    @functools.cached_property
    def longest_token(self) -> int:
        """The most characters a token spells: its vocabulary entry's length (bytes, for byte-level ones)."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)))

    def _refuse_too_long(
        self, texts: list[str], max_tokens: int, what: str, source: str, sources: list[str] | None
    ) -> None:
        for i, text in enumerate(texts):
            if self.fewest_tokens(text) > max_tokens:
                if sources is not None:
                    name = f"{sources[i]} ({what})"
                else:
                    name = f"row {i + 1} of the {what}" if len(texts) > 1 else f"the {what}"
                raise ValueError(
                    f"{name} has {len(text):,} characters, too many for the {max_tokens} tokens the "
                    f"model's context leaves it: no token of {source}'s tokenizer spells more than "
                    f"{self.longest_token} characters"
                )

    def decode(self, ids) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)  # the backend drops them by default

    def decode_completion(self, ids) -> str:
        """A sampled completion as text: a final EOS left out, other special tokens (<think>) kept."""
        ids = list(ids)
        if ids and ids[-1] in self.eos_token_ids:
            ids = ids[:-1]
        return self.decode(ids)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    # --- chat format ----------------------------------------------------------------------------
    @property
    def has_chat_format(self) -> bool:
        """A template of its own, or the ChatML tokens the hand-written fallback needs."""
        return self.chat_template(tools=False) is not None or self._has_chatml

    @property
    def _has_chatml(self) -> bool:
        return self.token_to_id(IM_START) is not None and self.token_to_id(IM_END) is not None

    def chat_template(self, tools: bool) -> ChatTemplate | None:
        """The checkpoint's own template (the one for tool use when `tools` and it has one), or None."""
        if self.template_file is not None:
            source = self.template_file
            where = os.path.join(self.where, TEMPLATE_FILE)
        else:
            where = os.path.join(self.where, "tokenizer_config.json")
            source = choose(self.tokenizer_config.get("chat_template"), where, tools)
        if source is None:
            return None
        return self._compiled(source, where)

    @functools.lru_cache(maxsize=4)  # noqa: B019 (a tokenizer lives as long as its run)
    def _compiled(self, source: str, where: str) -> ChatTemplate:
        return ChatTemplate(source, where, self._special_tokens())

    def _special_tokens(self) -> dict[str, str]:
        """bos_token, eos_token, ... as tokenizer_config.json names them, for a template."""
        tokens = {}
        for name in SPECIAL_TOKENS:
            token = self.tokenizer_config.get(name)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                tokens[name] = token
        return tokens

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs,
    ) -> str:
        """The prompt's text for a conversation [{"role", "content", ...}, ...], as transformers'
        apply_chat_template(..., tokenize=False) gives it: the checkpoint's own template with `tools`
        (JSON schemas) and `template_kwargs` (enable_thinking=False, ...); without one, Qwen3's ChatML
        written by hand (no tools; enable_thinking=False pre-fills an empty <think></think> block, as
        Qwen3's template does)."""
        template = self.chat_template(tools=bool(tools))
        if template is not None:
            return template.render(messages, tools, add_generation_prompt, **template_kwargs)
        if tools:
            raise ValueError(
                f"{self.where} has no chat template to declare tools in (tokenizer_config.json's "
                "chat_template, or chat_template.jinja)"
            )
        return self._chatml(messages, add_generation_prompt, template_kwargs.get("enable_thinking", True))

    def _chatml(self, messages: list[dict], add_generation_prompt: bool, enable_thinking: bool) -> str:
        """The fallback for a tokenizer with ChatML tokens and no template: Qwen3's format, text only."""
        if not self._has_chatml:
            raise ValueError(
                f"{self.where} has no chat template and no <|im_start|>/<|im_end|> tokens: it is not a chat "
                "tokenizer"
            )
        parts = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {message!r}")
            parts.append(f"{IM_START}{message['role']}\n{message['content']}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
            if not enable_thinking:
                parts.append("<think>\n\n</think>\n\n")
        return "".join(parts)

    # --- special ids from the side files ------------------------------------------------------
    def _id_of(self, token) -> int | None:
        if isinstance(token, dict):  # older tokenizer_config.json: {"content": "<|im_end|>", ...}
            token = token.get("content")
        return self.token_to_id(token) if isinstance(token, str) else None

    def _eos_ids(self) -> tuple[int, ...]:
        ids = self.generation_config.get("eos_token_id")
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        from_tokenizer = self._id_of(self.tokenizer_config.get("eos_token"))
        if from_tokenizer is not None and from_tokenizer not in ids:
            ids.append(from_tokenizer)
        return tuple(ids)

    def _pad_id(self) -> int | None:
        pad = self.generation_config.get("pad_token_id")
        if pad is None:
            pad = self._id_of(self.tokenizer_config.get("pad_token"))
        return pad if pad is not None else self.eos_token_id


def _read_json_if_exists(path: str) -> dict:
    return read_json_object(path, "the tokenizer's settings") if regular_file(path) else {}


def read_task(directory: str) -> dict:
    """The task a local checkpoint was made for, {} if it names none: tokenizer_config.json's
    "minigrpo_task" (option names of the example scripts to their values, e.g. data, template,
    tools). It travels with the tokenizer's config, so every checkpoint saved from the model keeps it
    (an adapter directory without one: its base's).
    A Hub id or a directory without the file gives {}; a malformed entry is a CheckpointError."""
    if os.path.isdir(directory) and is_adapter_directory(directory):
        directory = tokenizer_directory(directory)  # the base's settings, if the adapter has none
    path = os.path.join(directory, "tokenizer_config.json")
    if not present(path):
        return {}
    task = read_json(path, "the tokenizer's settings").get("minigrpo_task", {})
    if not isinstance(task, dict):
        raise CheckpointError(f"{path}: minigrpo_task must map option names to values, got {task!r:.80}")
    return task
