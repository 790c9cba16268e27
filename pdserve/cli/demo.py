"""The `make run` demo: a few streaming chats of mixed priority beside one long document."""

from __future__ import annotations

import concurrent.futures

from pdserve.client import Client, Message
from pdserve.stats import distribution

CHATS = [
    ("vip", "What is the capital of France?"),
    ("normal", "Give me three tips for writing clear code."),
    ("normal", "What is a prime number? Answer briefly."),
    ("vip", "Name two planets of the solar system."),
]
DOCUMENT = ("Summarise the following notes in two sentences.\n\n" +
            " ".join(f"Note {i}: the service splits prefill from decode so that long prompts do not stall "
                     f"streaming chats, and it moves KV cache blocks between workers." for i in range(60)))


def run_demo(target: str) -> None:
    jobs = [("batch", DOCUMENT, 48)] + [(p, t, 48) for p, t in CHATS]
    with Client(target) as client, concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: client.generate(messages=[Message("user", j[1])], priority=j[0],
                                                          max_tokens=j[2], temperature=0.0), jobs))
    print(f"\n{'priority':8} {'prompt':>7} {'tokens':>6} {'TTFT ms':>8} {'TBT p50':>8} {'TBT max':>8}  answer")
    for (priority, _, _), r in zip(jobs, results):
        gaps = r.timings.gaps_s
        tbt = distribution(gaps)
        p50, worst = (tbt.p50 * 1e3, tbt.max * 1e3) if tbt else (0.0, 0.0)
        answer = r.text.strip().replace("\n", " ")
        print(f"{priority:8} {r.usage.prompt_tokens:7d} {len(r.token_ids):6d} {(r.timings.ttft_s or 0) * 1e3:8.0f} "
              f"{p50:8.0f} {worst:8.0f}  {answer[:70]}")
