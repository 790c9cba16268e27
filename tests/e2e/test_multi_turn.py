"""A conversation's later turns reuse what its decode worker holds: the KV of earlier turns is
neither sent again nor recomputed there; a short new remainder is prefilled on the decode worker
itself, a long one by the prefill worker, which sends only the blocks the decode worker lacks.
Every turn's greedy output equals transformers on that turn's full prompt."""

from __future__ import annotations

import pytest

from pdserve.client import Client, Message
from pdserve.tokenizer import load_tokenizer
from tests.engine.oracle import Oracle
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BLOCK = 16  # the workers' default block size
TOKENS = 12
OPENING = ("You are a patient tutor. Here is my study plan for the week: " +
           " ".join(f"day {i}: read chapter {i}, solve exercises {i}.1 to {i}.5;" for i in range(1, 8)))
SHORT = "Which day has the most work?"
LONG = "Now some background. " + " ".join(f"Note {i}: revision works best in short, spaced sessions." for i in range(40))


@pytest.fixture(scope="module")
def client(service):
    with Client(service["target"]) as c:
        yield c


@pytest.fixture(scope="module")
def oracle(embedded_gguf_path):
    return Oracle({"embedded": embedded_gguf_path})


def _turn(client, oracle, tokenizer, messages: list[Message]):
    answer = client.generate(messages=messages, max_tokens=TOKENS, temperature=0, ignore_eos=True)
    prompt = tokenizer.apply_chat_template(messages)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.token_ids == oracle.greedy("embedded", prompt, TOKENS)
    return answer, [*messages, Message("assistant", answer.text)]


def test_later_turns_send_only_what_the_decode_worker_lacks(service, client, oracle):
    tokenizer = load_tokenizer(None)
    first, history = _turn(client, oracle, tokenizer, [Message("user", OPENING)])
    assert not first.usage.local_prefill and first.usage.decode_cached_tokens == 0
    per_block = first.usage.kv_transfer_bytes / -(-first.usage.prompt_tokens // BLOCK)

    short, history = _turn(client, oracle, tokenizer, [*history, Message("user", SHORT)])
    assert short.usage.local_prefill and short.usage.kv_transfer_bytes == 0  # a short remainder: computed there
    assert short.usage.decode_cached_tokens >= first.usage.prompt_tokens // BLOCK * BLOCK

    long, history = _turn(client, oracle, tokenizer, [*history, Message("user", LONG)])
    cached = long.usage.decode_cached_tokens
    assert not long.usage.local_prefill and cached >= short.usage.prompt_tokens // BLOCK * BLOCK
    new_blocks = -(-(long.usage.prompt_tokens - cached) // BLOCK)
    assert long.usage.kv_transfer_bytes <= (new_blocks + 1) * per_block  # not the whole prompt again
    assert long.usage.kv_transfer_bytes < 0.8 * per_block * -(-long.usage.prompt_tokens // BLOCK)
    wait_no_active_blocks(service)


def test_a_turn_cancelled_midway_frees_its_blocks_and_keeps_the_conversation_cached(service, client):
    history = [Message("user", OPENING + " (second conversation)")]
    first = client.generate(messages=history, max_tokens=TOKENS, temperature=0, ignore_eos=True)
    history.append(Message("assistant", first.text))
    chunks = client.stream(messages=[*history, Message("user", LONG)], max_tokens=200, temperature=0,
                           ignore_eos=True)
    next(chunks)
    chunks.close()  # cancels the turn midway
    wait_no_active_blocks(service)
    again = client.generate(messages=[*history, Message("user", SHORT)], max_tokens=4, temperature=0)
    assert again.usage.decode_cached_tokens >= first.usage.prompt_tokens // BLOCK * BLOCK
    wait_no_active_blocks(service)
