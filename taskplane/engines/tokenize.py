"""The one tokenizer every part of taskplane shares: byte-level, no BOS.

Why bytes: the gateway must hash a prompt into KV blocks exactly as the engine
does, without shipping a vocabulary. A token is a UTF-8 byte (id 0..255), so
equal prompt prefixes give equal token prefixes and hence equal blocks. The tiny
random-weight model served by real vLLM gets a tokenizer written to match this
module exactly (256-entry vocabulary, no BOS, same chat template), so the
simulator, the gateway and real vLLM agree on token counts and block hashes.

Chat template (one line per message, then the generation prompt)::

    <|system|>\\nYou are terse.\\n<|user|>\\nHi\\n<|assistant|>\\n
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ROLE_OPEN = "<|"
ROLE_CLOSE = "|>\n"
GENERATION_PROMPT = "<|assistant|>\n"


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, or a list of parts whose
    text parts are joined (images and other parts carry no text here)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                texts.append(str(part.get("text", "")))
        return "".join(texts)
    return str(content)


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """Render chat messages with taskplane's template, ending with the generation prompt.

    Because the assistant's reply is appended verbatim after ``<|assistant|>\\n``, the
    next turn's prompt starts with this turn's prompt + reply: multi-turn sessions
    share their whole history as a prefix.
    """
    parts = [
        f"{ROLE_OPEN}{m.get('role', 'user')}{ROLE_CLOSE}{content_text(m.get('content'))}\n"
        for m in messages
    ]
    parts.append(GENERATION_PROMPT)
    return "".join(parts)


def token_string(text: str) -> bytes:
    """Token ids of ``text`` as one ``bytes`` object: the same sequence of ints as
    ``tokenize``, without a Python int per token (the gateway hashes it as it is)."""
    return text.encode("utf-8")


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes."""
    return list(token_string(text))


def chat_tokens(messages: Iterable[Mapping[str, Any]]) -> list[int]:
    """Token ids of the rendered chat prompt."""
    return tokenize(render_chat(messages))


def chat_token_string(messages: Iterable[Mapping[str, Any]]) -> bytes:
    """``chat_tokens`` as one ``bytes`` object (see ``token_string``)."""
    return token_string(render_chat(messages))
