"""Start of the loop, prompt: how a question is put to the model.

A template turns a question into the text the tokenizer encodes: "tiny" for the embedded default (the
question and a newline: the model writes "23*6=138;47+138=185;####185"), "base" for base models, "chat"
for chat models (the question as a user turn through the checkpoint's own chat template, which also
declares the tools a run may call). The base and chat instructions ask for \\boxed{}, which the verifier
extracts first.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Template:
    name: str
    text: str  # with a {question} field
    chat: bool = False  # wrap the text as a user turn in the tokenizer's chat format
    thinking: bool = True  # chat only: let a Qwen3 model think first (enable_thinking)

    def render(
        self, question: str, tokenizer=None, tools: list[dict] | None = None, **template_kwargs
    ) -> str:
        """The prompt's text; a chat template's renders the question as a user turn through the
        tokenizer's own chat template, declaring `tools` (JSON schemas), with `template_kwargs`."""
        body = self.text.replace("{question}", question)  # not str.format: \boxed{} has braces
        if not self.chat:
            return body
        if tokenizer is None or not tokenizer.has_chat_format:
            raise ValueError(f"the {self.name!r} template needs a tokenizer with a chat template")
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": body}],
            tools=tools,
            **{"enable_thinking": self.thinking, **template_kwargs},
        )


TEMPLATES = {
    "tiny": Template("tiny", "{question}\n"),
    "base": Template("base", "Question: {question}\n" + INSTRUCTION + "\nAnswer:"),
    "chat": Template("chat", "{question}\n" + INSTRUCTION, chat=True),
    "chat-no-thinking": Template("chat-no-thinking", "{question}\n" + INSTRUCTION, chat=True, thinking=False),
}


def template(name: str) -> Template:
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; known: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]
