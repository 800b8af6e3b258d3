"""The model directory real vLLM serves: a tiny Llama and a byte-level tokenizer, no download.

vLLM runs here with random weights (``--load-format dummy``), so all it needs on disk is a
``config.json`` and a tokenizer. Both are written by this module so that nothing is fetched
from a hub and, above all, so that vLLM's token ids equal taskplane's own tokenizer
(``taskplane.engines.tokenize``): token id == UTF-8 byte value, no BOS, and a chat template
that renders exactly what ``render_chat`` renders. Then the gateway's KV index, which hashes
taskplane's token ids, hashes the same blocks the replica caches.

The model's vocabulary is the 256 byte values only; the EOS token (id 256) exists in the
tokenizer but lies outside the model's output vocabulary, so the random weights can never
sample it and every call runs to ``max_tokens`` — a fixed, predictable amount of decode work.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

BYTE_VOCAB = 256
EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = BYTE_VOCAB

# Renders "".join(f"<|{role}|>\n{content}\n" for m in messages) + "<|assistant|>\n", exactly
# as taskplane.engines.tokenize.render_chat: a None content renders as "", a list of content
# parts as its text parts joined with "" (the replica runs with
# --chat-template-content-format openai, so vLLM hands the parts to the template instead of
# joining them with "\n" itself). The generation prompt is appended unconditionally.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part is string -%}{{- part -}}"
    "{%- elif part.get('type', 'text') == 'text' -%}{{- part.get('text', '') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{{- '<|assistant|>\\n' -}}"
)


@cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which the ByteLevel
    pre-tokenizer and decoder of the ``tokenizers`` library use internally."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes, strict=True)}


def llama_config(
    *,
    hidden_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 8192,
    samples_eos: bool = False,
) -> dict[str, Any]:
    """config.json of a tiny Llama. vLLM's CPU attention needs head_dim >= 64."""
    head_dim = hidden_size // num_heads
    if head_dim < 64 or hidden_size % num_heads:
        raise ValueError(
            f"hidden_size {hidden_size} / num_heads {num_heads} gives head_dim {head_dim}; "
            "vLLM's CPU attention needs an integral head_dim of at least 64"
        )
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": BYTE_VOCAB + (1 if samples_eos else 0),
        "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": None,
        "torch_dtype": "bfloat16",
    }


def tokenizer_json() -> dict[str, Any]:
    """A ``tokenizers`` BPE model with no merges over the byte alphabet: every UTF-8 byte
    becomes exactly one token whose id is the byte value."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": EOS_TOKEN_ID,
                "content": EOS_TOKEN,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config(max_position_embeddings: int = 8192) -> dict[str, Any]:
    """tokenizer_config.json: no BOS/EOS added to prompts, the chat template above."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def write_model_dir(
    path: Path,
    *,
    hidden_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 8192,
    samples_eos: bool = False,
) -> Path:
    """Write (or refresh) the model directory at ``path`` and return it.

    ``samples_eos`` puts the EOS token in the output vocabulary: calls may then end early,
    and guided decoding (structured outputs, whose grammar must be able to stop) works.

    Files are rewritten only when their content changes, so replicas already serving
    from the directory are undisturbed by a second call.
    """
    path.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {
        "config.json": llama_config(
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            max_position_embeddings=max_position_embeddings,
            samples_eos=samples_eos,
        ),
        "generation_config.json": {"eos_token_id": EOS_TOKEN_ID},
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(max_position_embeddings),
        "special_tokens_map.json": {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN},
    }
    for name, content in files.items():
        target = path / name
        text = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(target)
    return path
