"""Model throughput on CPU: the paged pdserve model against transformers, same prompts,
and every decode figure against the machine's roofline measured in the same run (roofline.py).

    prefill: one prompt of --prompt-tokens tokens, tokens/s of the forward pass
    decode:  batches of --batches sequences at each of --contexts, each with its context already
             in the KV pool, then --steps greedy decode steps; tokens/s = batch x steps / time of
             the steps, for each attention backend of --backends with each weight layout of
             --weight-layouts (dense: `x @ W`, the reference, with torch's small ops; mkl: MKL's
             pre-packed panels; onednn: oneDNN's blocked weight; auto: oneDNN's and, up to 256 rows,
             panels; each packed layout a copy of the model, its norms, SwiGLU and rotary
             positions on --layer-kernels and its decode steps fused where both are native, as the
             engine serves); with --deterministic one column more, `query/deterministic`: the
             deterministic mode's model (every projection in panels at every row count, the query
             attention backend: every row alone over its context, prefill rows too); with
             --kv-dtypes float32,bfloat16 every column again over a half pool (`/kv-bfloat16`:
             --kv-cache-dtype's, half the KV bytes read a step)
    bound:   the smaller of the compute bound (FLOPs / the peak matmul rate on the model's own
             projections, the fastest weight layout's, at that batch or 256 rows) and the memory
             bound (weights + KV read / bandwidth); "of bound" is tokens/s over it

The first line names the CPU (AVX-512 or AVX2-only), the -march the kernels are built for and
torch's vector class, with any limit set on torch's, oneDNN's and MKL's instruction sets
(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 with
PDSERVE_NATIVE_ARCH=x86-64-v3 emulate an AVX2-only part on an AVX-512 one); every column is also
shown over transformers' tokens/s ("/tf") and over the bound.

transformers' prefill is timed with generate(1 new token); its decode with its own loop: the batch
prefilled once into its KV cache, then --steps forward passes of one token per sequence from a
copy of that cache, so both sides time the decode steps alone (taking the difference of two
generate() calls instead drowns four decode steps in the noise of a batch-256 prefill).
Each figure is the best of --repeats runs, all sides and all batches of a context interleaved (a
busy machine slows them alike; every batch's pool is held at once), and each repeat of a decode row
starts by measuring the bound's matmul rates and bandwidth
again (the bound is the best of those), so the bound and the runs see the same moments. With
--random-kv the contexts are random K/V written straight into the pool instead of a prefill (a
decode step costs the same; the prefill of 2,048-token batches takes minutes on a CPU);
transformers is then not timed.

    .venv/bin/python benchmarks/model_throughput.py --threads 1 --batches 1,8,64,128,256 --contexts 128
    .venv/bin/python benchmarks/model_throughput.py --threads 1 --batches 1,8,32 --contexts 2048 \
        --random-kv --no-transformers
    .venv/bin/python benchmarks/model_throughput.py --threads 1 --backends torch-batched --weight-layouts auto \
        --kv-dtypes float32,bfloat16 --batches 64,128,256 --no-prefill     # a half KV pool against float32
    .venv/bin/python benchmarks/model_throughput.py --threads 2 --backends torch-batched --weight-layouts auto \
        --deterministic --batches 1,8,64,128,256 --no-transformers      # deterministic against default
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from benchmarks.roofline import Bound, Roofline  # noqa: E402
from pdserve.attention import make_attention_backend  # noqa: E402
from pdserve.engine.calibration import serving_identity  # noqa: E402
from pdserve.engine.decode_probe import tune_fused_rows  # noqa: E402
from pdserve.attention.batch import ForwardBatch, SeqSpan  # noqa: E402
from pdserve.engine.host_logits import HostLogits  # noqa: E402
from pdserve.kv.kv_cache import KVCache  # noqa: E402
from pdserve.model import LoadedModel, load_model  # noqa: E402
from pdserve.cpu.transform import apply_cpu_paths  # noqa: E402
from pdserve.config import LAYER_KERNELS  # noqa: E402
from pdserve.native.target import cpu_flags, target  # noqa: E402
from pdserve.measurements import ISA_LIMITS, machine  # noqa: E402
from pdserve.sampling.sampler import argmax_rows  # noqa: E402

BLOCK_SIZE = 16
QUERY, DETERMINISTIC = "query", "deterministic"  # the deterministic mode's backend and layout


@dataclass(frozen=True)
class Row:
    name: str
    ours: dict[str, float]  # backend -> tokens/s
    reference: float | None
    bound: Bound | None = None

    def line(self) -> str:
        cells = [f"{self.name:<24}"] + [f"{v:>22.1f}" for v in self.ours.values()]
        cells.append(f"{self.reference:14.1f}" if self.reference else f"{'-':>14}")
        cells += [f"{v / self.reference:>25.2f}x" if self.reference else f"{'-':>26}" for v in self.ours.values()]
        if self.bound is not None:
            cells.append(f"{self.bound.tokens_per_s:10.1f} {self.bound.by:>4}")
            cells += [f"{v / self.bound.tokens_per_s:>28.2f}" for v in self.ours.values()]
        return "".join(cells)


class PagedRunner:
    """Sequences laid out in consecutive blocks; one ForwardBatch per pass."""

    def __init__(self, loaded: LoadedModel, max_tokens: int, batch: int, backend: str = "torch",
                 kv_dtype: torch.dtype = torch.float32):
        self.model = loaded.model
        blocks_per_seq = -(-max_tokens // BLOCK_SIZE)
        self.kv = KVCache(loaded.config.kv_shape(BLOCK_SIZE), blocks_per_seq * batch, kv_dtype, "cpu")
        self.attn = make_attention_backend(backend, "cpu", kv_dtype, deterministic=backend == QUERY,
                                           compute_dtype=torch.float32)
        self.tables = [tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
        self.logits = HostLogits(loaded.config.vocab_size)  # as the engine's model runner reuses one

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
        return self.model(batch, self.kv, self.attn, self.logits.rows(len(last)))


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, vocab, (length - 1,), generator=gen).tolist() for _ in range(count)]


def ours_prefill(loaded: LoadedModel, prompt: list[int], backend: str = "torch") -> float:
    runner = PagedRunner(loaded, len(prompt), 1, backend)
    start = time.perf_counter()
    runner.forward([prompt], [0])
    return len(prompt) / (time.perf_counter() - start)


class Decoder:
    """One batch's pool, filled once (by a prefill, or with random K/V); each `run` decodes
    --steps tokens after the context again, so repeats do not prefill again."""

    def __init__(self, loaded: LoadedModel, batch: list[list[int]], steps: int, backend: str, random_kv: bool,
                 kv_dtype: torch.dtype = torch.float32):
        self.context, self.steps, self.size = len(batch[0]), steps, len(batch)
        self.runner = PagedRunner(loaded, self.context + steps, len(batch), backend, kv_dtype)
        if random_kv:
            self.runner.kv.data.normal_()
            self.first = [row[-1] for row in batch]
        else:
            self.first = self.runner.forward(batch, [0] * len(batch)).argmax(-1).tolist()

    def run(self) -> float:
        next_ids = self.first
        start = time.perf_counter()
        for step in range(self.steps):
            logits = self.runner.forward([[t] for t in next_ids], [self.context + step] * self.size)
            next_ids = argmax_rows(logits).tolist()  # the engine's greedy choice
        return self.size * self.steps / (time.perf_counter() - start)


def hf_generate_seconds(model, batch: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(batch)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def hf_prefill(model, prompt: list[int]) -> float:
    return len(prompt) / hf_generate_seconds(model, [prompt], 1)


class ReferenceDecoder:
    """transformers' own decode loop on one batch: the prompts prefilled once into its KV cache;
    each `run` decodes --steps tokens from a copy of that cache (the copy made before the clock
    starts), so only the decode steps are timed, as on the pdserve side."""

    def __init__(self, model, batch: list[list[int]], steps: int):
        self.model, self.steps, self.size = model, steps, len(batch)
        with torch.inference_mode():
            out = model(torch.tensor(batch), use_cache=True)
        # transformers 5 names the KV cache `cache`; 4.x `past_key_values`
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache, self.first = getattr(out, self.cache_arg), out.logits[:, -1].argmax(-1, keepdim=True)

    def run(self) -> float:
        cache, next_ids = copy.deepcopy(self.cache), self.first
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(self.steps):
                out = self.model(next_ids, use_cache=True, **{self.cache_arg: cache})
                next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        return self.size * self.steps / (time.perf_counter() - start)


def best_of(repeats: int, ours: dict[str, object], reference,
            between: Callable[[], None] | None = None) -> tuple[dict[str, float], float | None]:
    """Highest tokens/s of each side over `repeats` interleaved runs; `between` (the bound's own
    measurement) runs at the start of each repeat."""
    ours_best = {name: 0.0 for name in ours}
    reference_best = None
    for _ in range(repeats):
        if between is not None:
            between()
        for name, run in ours.items():
            ours_best[name] = max(ours_best[name], run())
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


def variants(args) -> list[tuple[str, str, str]]:
    """(attention backend, weight layout, KV pool dtype) of every decode column, in order."""
    columns = [(b, w, d) for d in args.kv_dtypes.split(",") for w in args.weight_layouts.split(",")
               for b in args.backends.split(",")]
    return columns + ([(QUERY, DETERMINISTIC, "float32")] if args.deterministic else [])


def column(backend: str, layout: str, kv_dtype: str) -> str:
    """A column's name: backend/layout, and the KV pool's dtype where it is not float32."""
    return f"{backend}/{layout}" + ("" if kv_dtype == "float32" else f"/kv-{kv_dtype}")


def decode_rows(args, layouts: dict[str, LoadedModel], reference, roofline: Roofline, sizes: list[int],
                context: int) -> list[Row]:
    """The decode rows of one context. Every batch's runs are interleaved with the other batches'
    (all their pools held at once), so that the machine's drifts fall on every batch alike and
    tokens/s from one batch to the next is a ratio measured in one run."""
    ours: dict[int, dict[str, Callable[[], float]]] = {}
    theirs: dict[int, Callable[[], float] | None] = {}
    for size in sizes:
        batch = prompts(size, context, layouts["dense"].config.vocab_size, seed=size)
        ours[size] = {column(b, w, d): Decoder(layouts[w], batch, args.steps, b, args.random_kv, getattr(torch, d)).run
                      for b, w, d in variants(args)}
        theirs[size] = (ReferenceDecoder(reference, batch, args.steps).run
                        if reference and not args.random_kv else None)
    best = {size: dict.fromkeys(ours[size], 0.0) for size in sizes}
    best_reference: dict[int, float | None] = dict.fromkeys(sizes)
    for _ in range(args.repeats):
        for size in sizes:
            runs, reference_run = best_of(1, ours[size], theirs[size], between=lambda: roofline.measure(size))
            best[size] = {name: max(best[size][name], v) for name, v in runs.items()}
            if reference_run is not None:
                best_reference[size] = max(best_reference[size] or 0.0, reference_run)
    return [Row(f"decode b{size} ctx{context}", best[size], best_reference[size],
                roofline.bound(size, context + args.steps // 2)) for size in sizes]


def scaling_line(context: int, sizes: list[int], rows: list[Row]) -> str:
    """Each column's tokens/s at each batch over the batch before (one run, interleaved)."""
    cells = [f"{c}: " + ", ".join(f"b{sizes[i]}/b{sizes[i - 1]} {rows[i].ours[c] / rows[i - 1].ours[c]:.2f}"
                                  for i in range(1, len(rows))) for c in rows[0].ours]
    return f"ctx{context} tokens/s over the batch before: " + "; ".join(cells)


def cpu_line() -> str:
    """The CPU, its vector class, what the kernels are built for and what torch, oneDNN and MKL may use."""
    flags = cpu_flags()
    vectors = "AVX-512" if "avx512f" in flags else "AVX2-only" if "avx2" in flags else "no AVX2"
    limits = [f"{name}={os.environ[name]}" for name in ("ATEN_CPU_CAPABILITY", *ISA_LIMITS) if os.environ.get(name)]
    return (f"cpu {machine()['cpu']} ({vectors}); kernels -march={target()}; torch {torch.backends.cpu.get_cpu_capability()}"
            + (f"; limited by {' '.join(limits)}" if limits else ""))


def print_header(args, loaded: LoadedModel) -> None:
    columns = [column(*v) for v in variants(args)]
    print(cpu_line())
    print(f"model {loaded.config.name}, fp32, {args.threads} threads, {args.steps} steps, best of {args.repeats}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs{', random KV' if args.random_kv else ''}")
    print(f"{'tokens/s':<24}" + "".join(f"{c:>22}" for c in columns) + f"{'transformers':>14}"
          + "".join(f"{c + ' /tf':>26}" for c in columns)
          + f"{'bound':>10}{'by':>5}" + "".join(f"{c + ' /bound':>28}" for c in columns), flush=True)


def print_roofline(roofline: Roofline) -> None:
    rates = ", ".join(f"b{b} {rate / 1e9:.0f}" for b, rate in roofline.measured_rates().items())
    print(f"roofline: read bandwidth {roofline.bandwidth / 1e9:.1f} GB/s; matmul GFLOP/s on the model's "
          f"projections: {rates}; load average now {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file or checkpoint folder (default: embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--batches", default="1,8,64,128,256")
    parser.add_argument("--contexts", "--context", dest="contexts", default="128", help="context lengths, e.g. 128,2048")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backends", default="torch,torch-batched", help="pdserve attention backends to time")
    parser.add_argument("--weight-layouts", default="dense,mkl,onednn",
                        help="projection weight layouts to time (see --weight-layout; each packed one where "
                             "its library can)")
    parser.add_argument("--layer-kernels", default="auto", choices=LAYER_KERNELS,
                        help="the packed layouts' small ops (see --layer-kernels; dense keeps torch's)")
    parser.add_argument("--deterministic", action="store_true",
                        help="a column more: the deterministic mode's model and attention (query/deterministic)")
    parser.add_argument("--random-kv", action="store_true", help="random K/V as the context instead of a prefill")
    parser.add_argument("--kv-dtypes", default="float32",
                        help="KV pool dtypes to time each column with (float32, bfloat16, float16: "
                             "--kv-cache-dtype's half pools below the float32 model)")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill row")
    parser.add_argument("--no-transformers", action="store_true", help="time pdserve only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model(args.model)
    reference = None if args.no_transformers else load_reference(loaded.source_path)
    names = args.weight_layouts.split(",") + ([DETERMINISTIC] if args.deterministic else [])
    layouts = weight_layouts(loaded, names, args.layer_kernels)
    roofline = Roofline([m.model for m in layouts.values()], loaded.config)
    print_header(args, loaded)
    if not args.no_prefill:
        print(prefill_row(args, layouts, reference).line(), flush=True)
    sizes = [int(b) for b in args.batches.split(",")]
    for context in (int(c) for c in args.contexts.split(",")):
        rows = decode_rows(args, layouts, reference, roofline, sizes, context)
        for row in rows:
            print(row.line(), flush=True)
        if len(rows) > 1:
            print(scaling_line(context, sizes, rows), flush=True)
    print_roofline(roofline)


def weight_layouts(loaded: LoadedModel, names: list[str], kernels: str) -> dict[str, LoadedModel]:
    """layout -> the model in it; each packed layout is a copy of the dense model, packed, its small
    ops on `kernels`."""
    layouts = {"dense": loaded}
    for name in (n for n in names if n != "dense"):
        model = copy.deepcopy(loaded.model)
        # as the engine serves (raises where the library cannot pack)
        exact = name == DETERMINISTIC
        chosen = apply_cpu_paths(model, "auto" if exact else name, kernels, "cpu", torch.float32, exact)
        if name in ("auto", DETERMINISTIC):  # and for as many rows as the engine measures the fused step faster
            kv = KVCache(loaded.config.kv_shape(BLOCK_SIZE), 256, torch.float32, "cpu")
            attn = make_attention_backend("torch-batched", "cpu", torch.float32, deterministic=exact)
            tune_fused_rows(model, kv, attn, {**serving_identity(loaded.source_path, model, torch.float32),
                                              "deterministic": exact})
        fused = model.fused_decode.max_rows if model.fused_decode else 0
        print(f"{name}: {chosen}; decode steps fused up to {fused} rows", flush=True)
        layouts[name] = dataclasses.replace(loaded, model=model)
    return layouts


def prefill_row(args, layouts: dict[str, LoadedModel], reference) -> Row:
    """The prefill of each weight layout (the attention backends compute a prefill alike, but for
    the deterministic mode's, which attends each row alone)."""
    long_prompt = prompts(1, args.prompt_tokens, layouts["dense"].config.vocab_size, seed=0)[0]
    backend = {w: QUERY if w == DETERMINISTIC else "torch" for w in layouts}
    for w, loaded in layouts.items():
        ours_prefill(loaded, long_prompt[:64], backend[w])  # warm-up
    ours, theirs = best_of(
        args.repeats,
        {w: (lambda loaded=loaded, w=w: ours_prefill(loaded, long_prompt, backend[w]))
         for w, loaded in layouts.items()},
        (lambda: hf_prefill(reference, long_prompt)) if reference else None,
    )
    return Row(f"prefill {args.prompt_tokens} tok", {column(b, w, d): ours[w] for b, w, d in variants(args)}, theirs)

if __name__ == "__main__":
    main()
