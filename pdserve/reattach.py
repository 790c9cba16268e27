"""Re-attach: a stream that goes on at another router when its router dies, on the routers and on
the decode workers alike.

    router A dies (or stops) mid-stream         its decode worker: the request's call broke without
                                                an Abort -> orphaned, decoding on, for the grace
    client --Generate(same id and body, resume_from_token n[, its n tokens])--> router B
    B --Find(owner, prompt digest)--> every decode worker: `HeldAttempt`s (tokens so far)
    B --Attach(attempt)--> the one that holds it: its tokens so far, then its events, from here on
    none holds it: B prefills the prompt and the client's n tokens again (the resume path)

An attempt is found by its owner (pdserve/aborts.py: the tenant and the client's id) and its
prompt (`prompt_digest`), so a client's id of another body, or of another tenant, finds nothing.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


def prompt_digest(token_ids: Sequence[int]) -> bytes:
    """blake2b-128 of the prompt's token ids (little-endian uint32 each)."""
    ids = array.array("I", token_ids)
    if sys.byteorder == "big":
        ids.byteswap()
    return hashlib.blake2b(ids.tobytes(), digest_size=16, person=b"pdserve-prompt").digest()


@dataclass(frozen=True)
class HeldAttempt:
    """An attempt of an owner a decode worker holds (Find's answer)."""

    request_id: str  # the attempt's id on the worker: what Attach and Abort name
    token_ids: tuple[int, ...]  # every token it generated so far, resumed ones included
    attachable: bool  # decoding there (its KV in, or prefilled there) or finished, and reattachable
    orphaned: bool = False  # no call drives it: it waits for Attach within the worker's grace
    attachment: int = 0  # its anchor now (0: its Decode call; each Attach the next): what an Abort names
    address: str = ""  # the worker (set by the router's client)
