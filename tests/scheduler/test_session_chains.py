"""A session's block hashes reuse its previous prompt's: every value must still be
exactly ``chain_hashes``'s, whatever the next prompt shares with the last one."""

from __future__ import annotations

import random

from taskplane.scheduler import hashing
from taskplane.scheduler.hashing import SessionChains, chain_hashes, token_bytes


def test_byte_tokens_pack_as_their_list() -> None:
    data = bytes(range(256)) * 3
    assert token_bytes(data) == token_bytes(list(data))
    assert chain_hashes(data, 16) == chain_hashes(list(data), 16)


def test_every_prompt_of_a_session_gets_the_chain_of_its_own_tokens() -> None:
    rng = random.Random(7)
    chains = SessionChains(max_sessions=3)
    prompts: dict[str, bytes] = {}
    for i in range(400):
        session = f"s{rng.randrange(5)}"
        prev = prompts.get(session, b"")
        move = rng.randrange(5)
        if move == 0 or not prev:  # a new conversation
            tokens = rng.randbytes(rng.randrange(0, 400))
        elif move == 1:  # the usual agent step: history + reply + tool output
            tokens = prev + rng.randbytes(rng.randrange(0, 90))
        elif move == 2:  # an edit in the middle (a summarised history)
            cut = rng.randrange(len(prev))
            tokens = prev[:cut] + rng.randbytes(rng.randrange(0, 60)) + prev[cut + 1:]
        elif move == 3:  # shorter (a retry of an earlier step)
            tokens = prev[: rng.randrange(len(prev))]
        else:
            tokens = prev
        prompts[session] = tokens
        block = rng.choice((16, 16, 16, 32))
        as_list = rng.random() < 0.2  # tokens that are not byte-level (embeddings' ids)
        seq = [t * 1000 for t in tokens] if as_list else tokens
        assert chains.hashes(session, seq, block) == chain_hashes(seq, block), (i, move, block, as_list)
    assert chains.hashes(None, b"x" * 40, 16) == chain_hashes(b"x" * 40, 16)


def test_the_next_step_hashes_only_the_blocks_it_adds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    hashed: list[bytes] = []
    real = hashing.block_hash
    monkeypatch.setattr(hashing, "block_hash", lambda parent, chunk: hashed.append(chunk) or real(parent, chunk))
    chains = SessionChains()
    history = bytes(range(200)) * 8  # 100 blocks of 16
    chains.hashes("task-1", history, 16)
    assert len(hashed) == 100
    step = history + b"tool says: 42" * 4  # 52 more tokens: 3 more whole blocks
    expected = chain_hashes(step, 16)
    hashed.clear()
    assert chains.hashes("task-1", step, 16) == expected
    assert len(hashed) == 3
