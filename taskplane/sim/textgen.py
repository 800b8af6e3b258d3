"""Deterministic pseudo-text for simulated completions, and the engine's own block hashes.

The text is ASCII, so with the byte tokenizer one character is one token and
``max_tokens`` is exactly the number of characters generated. The same seed, prompt
and sampling parameters give the same text (as greedy decoding would); a request with
``temperature > 0`` and no ``seed`` also mixes in a per-server counter, so repeated
sampled calls differ, as they do on vLLM.

The engine hashes blocks with its own seeded function, unlike the gateway's: real vLLM
seeds its hashes per process too, so consumers must map engine hashes through the
token ids carried by ``BlockStored``, and the simulator makes them do so.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

WORDS = (
    "the agent reads the file and finds a bug in the parser so it writes a test first then "
    "patches the loop checks the output again and reports back to the user with a short "
    "summary of what changed why it failed before and how the fix was verified step by step "
    "under load with cached context tools logs traces and metrics"
).split()


def natural_length(rng: random.Random) -> int:
    """Tokens a model would generate before its end-of-sequence (no max_tokens given)."""
    return int(16 + rng.random() ** 2 * 240)


def request_rng(seed: int, prompt: Sequence[int], salt: str) -> random.Random:
    h = hashlib.blake2b(digest_size=8, person=b"tp-simtext")
    h.update(seed.to_bytes(8, "little", signed=True))
    h.update(bytes(t & 0xFF for t in prompt))
    h.update(salt.encode())
    return random.Random(int.from_bytes(h.digest(), "little"))


def generate_text(rng: random.Random, n_chars: int) -> str:
    """``n_chars`` characters of words separated by spaces."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        size += len(w) + (1 if parts else 0)
        parts.append(w)
    return " ".join(parts)[:n_chars]


def apply_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` before the first stop string; True when one was found."""
    cut = -1
    for s in stops:
        if s:
            i = text.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
    return (text, False) if cut < 0 else (text[:cut], True)


def engine_root(seed: int) -> int:
    return int.from_bytes(hashlib.blake2b(seed.to_bytes(8, "little", signed=True), digest_size=8,
                                          person=b"tp-simroot").digest(), "little")


def engine_block_hashes(tokens: Sequence[int], block_size: int, root: int) -> list[int]:
    """Chained 64-bit hashes of the full blocks of ``tokens`` (the engine's own scheme)."""
    out: list[int] = []
    h = root
    data = bytes(t & 0xFF for t in tokens)  # byte tokenizer: ids are 0..255
    blake = hashlib.blake2b
    for i in range(len(tokens) // block_size):
        chunk = data[i * block_size : (i + 1) * block_size]
        h = int.from_bytes(blake(h.to_bytes(8, "little") + chunk, digest_size=8, person=b"tp-simblk").digest(), "little")
        out.append(h)
    return out
