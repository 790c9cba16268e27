"""Model throughput on CPU: the paged pdserve model against transformers' generate(), same prompts.

    prefill: one prompt of --prompt-tokens tokens, tokens/s of the forward pass
    decode:  batches of --batches sequences, each with a --context-token prompt already prefilled,
             then --steps greedy decode steps; tokens/s = batch x steps / time of the steps

transformers is timed with generate(): decode time = generate(1 + steps new tokens) minus
generate(1 new token) on the same batch, so both sides exclude the prefill of the batch.
Each figure is the best of --repeats runs, the two sides interleaved (a busy machine slows
both alike).

    .venv/bin/python benchmarks/model_throughput.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from pdserve.attention import make_attention_backend  # noqa: E402
from pdserve.attention.batch import ForwardBatch, SeqSpan  # noqa: E402
from pdserve.kv.kv_cache import KVCache  # noqa: E402
from pdserve.model import LoadedModel, load_model  # noqa: E402

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Row:
    name: str
    ours: float  # tokens/s
    reference: float | None

    def line(self) -> str:
        ref = f"{self.reference:14.1f}" if self.reference else f"{'-':>14}"
        ratio = f"{self.ours / self.reference:7.2f}x" if self.reference else f"{'-':>8}"
        return f"{self.name:<22}{self.ours:12.1f}{ref}{ratio}"


class PagedRunner:
    """Sequences laid out in consecutive blocks; one ForwardBatch per pass."""

    def __init__(self, loaded: LoadedModel, max_tokens: int, batch: int):
        self.model = loaded.model
        blocks_per_seq = -(-max_tokens // BLOCK_SIZE)
        self.kv = KVCache(loaded.config.kv_shape(BLOCK_SIZE), blocks_per_seq * batch, torch.float32, "cpu")
        self.attn = make_attention_backend("torch", "cpu")
        self.tables = [tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]

    def forward(self, tokens: list[list[int]], starts: list[int]) -> torch.Tensor:
        """tokens[i]: the new tokens of sequence i, at positions starts[i]...; logits of each last one."""
        ids, positions, slots, spans, last = [], [], [], [], []
        for i, (new, start) in enumerate(zip(tokens, starts)):
            end = start + len(new)
            spans.append(SeqSpan(len(ids), len(new), end, self.tables[i]))
            ids += new
            positions += range(start, end)
            slots += [self.tables[i][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]
            last.append(len(ids) - 1)
        as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        batch = ForwardBatch(as_long(ids), as_long(positions), as_long(slots), tuple(spans), as_long(last))
        return self.model(batch, self.kv, self.attn)


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, vocab, (length - 1,), generator=gen).tolist() for _ in range(count)]


def ours_prefill(loaded: LoadedModel, prompt: list[int]) -> float:
    runner = PagedRunner(loaded, len(prompt), 1)
    start = time.perf_counter()
    runner.forward([prompt], [0])
    return len(prompt) / (time.perf_counter() - start)


def ours_decode(loaded: LoadedModel, batch: list[list[int]], steps: int) -> float:
    context = len(batch[0])
    runner = PagedRunner(loaded, context + steps, len(batch))
    logits = runner.forward(batch, [0] * len(batch))
    start = time.perf_counter()
    for step in range(steps):
        next_ids = logits.argmax(-1).tolist()
        logits = runner.forward([[t] for t in next_ids], [context + step] * len(batch))
    return len(batch) * steps / (time.perf_counter() - start)


def hf_generate_seconds(model, batch: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(batch)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def hf_prefill(model, prompt: list[int]) -> float:
    return len(prompt) / hf_generate_seconds(model, [prompt], 1)


def hf_decode(model, batch: list[list[int]], steps: int) -> float:
    decode_seconds = hf_generate_seconds(model, batch, 1 + steps) - hf_generate_seconds(model, batch, 1)
    return len(batch) * steps / decode_seconds


def best_of(repeats: int, ours, reference) -> tuple[float, float | None]:
    """Highest tokens/s of each side over `repeats` interleaved runs."""
    ours_best, reference_best = 0.0, None
    for _ in range(repeats):
        ours_best = max(ours_best, ours())
        if reference is not None:
            reference_best = max(reference_best or 0.0, reference())
    return ours_best, reference_best


def load_reference(source: Path):
    from transformers import AutoModelForCausalLM

    if source.is_dir():
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file or checkpoint folder (default: embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-transformers", action="store_true", help="time pdserve only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model(args.model)
    reference = None if args.no_transformers else load_reference(loaded.source_path)
    vocab = loaded.config.vocab_size
    long_prompt = prompts(1, args.prompt_tokens, vocab, seed=0)[0]
    ours_prefill(loaded, long_prompt[:64])  # warm-up
    rows = [
        Row(
            f"prefill {args.prompt_tokens} tok",
            *best_of(
                args.repeats,
                lambda: ours_prefill(loaded, long_prompt),
                (lambda: hf_prefill(reference, long_prompt)) if reference else None,
            ),
        )
    ]
    for size in (int(b) for b in args.batches.split(",")):
        batch = prompts(size, args.context, vocab, seed=size)
        ours, theirs = best_of(
            args.repeats,
            lambda: ours_decode(loaded, batch, args.steps),
            (lambda: hf_decode(reference, batch, args.steps)) if reference else None,
        )
        rows.append(Row(f"decode batch {size}", ours, theirs))

    load = os.getloadavg()[0]
    print(f"model {loaded.config.name}, fp32, {args.threads} threads, context {args.context}, "
          f"{args.steps} steps, best of {args.repeats}, load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'tokens/s':<22}{'pdserve':>12}{'transformers':>14}{'ratio':>8}")
    for row in rows:
        print(row.line())


if __name__ == "__main__":
    main()
