"""Compares three constrained-decoding grammar engines on CPU with the embedded SmolLM2 tokenizer.

For llguidance, xgrammar and outlines-core, on three JSON schemas of increasing complexity (flat;
nested with an array of objects; optional fields, number bounds and a string pattern), each with one
valid instance tokenized by the project's tokenizer, it measures:
  - compile ms: JSON schema -> the engine's grammar object, first and second time (xgrammar caches;
    llguidance builds its lexer lazily, so part of its cost shows up in the first masks instead);
  - mask us mean/max: one [1, V/32] int32 bitmask per token along the instance, on fresh matchers
    (`--passes` of them), the EOS position included;
  - batch-64 ms/step: 64 matchers spread over the instance, each taking one token a step (a finished
    one starts again); the median of the steps' [64, V/32] bitmask fills (llguidance LLExecutor,
    xgrammar BatchGrammarMatcher, outlines-core a Python loop: it has no batch API);
  - accepted: every instance token is in the mask and consumed, and the final state allows and takes
    EOS (outlines-core never consumes EOS: its guide must be finished); the batch rows are checked
    against each matcher's next token too.
The process's first mask per engine (one-time lazy set-up) is printed apart, not in the table.
Then each package's wheel size, installed size and declared dependencies.

xgrammar and outlines-core are optional (a row says "not installed"). To make them importable without
touching the virtualenv (xgrammar declares triton and transformers; triton is not needed on CPU):
    .venv/bin/pip download --no-deps -d /tmp/xg xgrammar==0.2.9 outlines-core==0.2.14
    .venv/bin/pip install --no-deps --target /tmp/grammar-cmp /tmp/xg/xgrammar-*.whl \
        /tmp/xg/outlines_core-*.whl apache-tvm-ffi
    PYTHONPATH=/tmp/grammar-cmp .venv/bin/python benchmarks/grammar_engines.py
With llguidance alone:
    .venv/bin/python benchmarks/grammar_engines.py [--passes 5] [--steps 50] [--batch 64] [--threads N]
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.metadata
import json
import os
import sys
import time
import zipfile
from dataclasses import dataclass
from typing import Any, Protocol

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from pdserve.tokenizer import Tokenizer, load_tokenizer  # noqa: E402
from pdserve.tokenizer.gguf_tokenizer import byte_alphabet  # noqa: E402

WHEEL_DIR = "/tmp/xg"


@dataclass(frozen=True)
class Case:
    name: str
    schema: dict[str, Any]
    instance: dict[str, Any]


FLAT = Case(
    "flat",
    {"type": "object",
     "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                    "role": {"enum": ["admin", "editor", "viewer"]}},
     "required": ["name", "age", "role"], "additionalProperties": False},
    {"name": "Ada Lovelace", "age": 36, "role": "editor"},
)
NESTED = Case(
    "nested",
    {"type": "object",
     "properties": {
         "order_id": {"type": "string"},
         "customer": {"type": "object",
                      "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                      "required": ["name", "email"], "additionalProperties": False},
         "items": {"type": "array", "minItems": 1,
                   "items": {"type": "object",
                             "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"},
                                            "price": {"type": "number"}},
                             "required": ["sku", "quantity", "price"], "additionalProperties": False}},
         "paid": {"type": "boolean"}},
     "required": ["order_id", "customer", "items", "paid"], "additionalProperties": False},
    {"order_id": "A-10293", "customer": {"name": "Grace Hopper", "email": "grace@example.com"},
     "items": [{"sku": "KB-01", "quantity": 2, "price": 49.5}, {"sku": "MS-7", "quantity": 1, "price": 19.99},
               {"sku": "USB-C", "quantity": 3, "price": 7.25}],
     "paid": True},
)
BOUNDED = Case(
    "optional+bounds",
    {"type": "object",
     "properties": {
         "sensor_id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
         "temperature_c": {"type": "number", "minimum": -40, "maximum": 85},
         "humidity_pct": {"type": "integer", "minimum": 0, "maximum": 100},
         "battery": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
         "label": {"type": "string", "maxLength": 32},
         "location": {"type": "object",
                      "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                     "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                      "required": ["lat", "lon"], "additionalProperties": False},
         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
     "required": ["sensor_id", "temperature_c", "humidity_pct"], "additionalProperties": False},
    {"sensor_id": "KX-0042", "temperature_c": 21.5, "humidity_pct": 48,
     "location": {"lat": 52.52, "lon": 13.405}, "tags": ["roof", "north"]},
)
CASES = (FLAT, NESTED, BOUNDED)


# --- engines: compile a schema, make matchers, fill bitmask rows, consume tokens ---------------------------

class Engine(Protocol):
    name: str
    modules: tuple[str, ...]  # what must import for the engine to run

    def compile(self, schema: dict[str, Any]) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None: ...
    def batch_fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None: ...
    def consume(self, m: Any, token: int) -> bool: ...


class LLGuidance:
    name, modules = "llguidance", ("llguidance", "llguidance.torch")

    def __init__(self, tok: Tokenizer, threads: int) -> None:
        import llguidance
        import llguidance.torch
        self.ll, self.llt = llguidance, llguidance.torch
        self.lltok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                                            eos_token=list(tok.eos_token_ids))
        self.executor = llguidance.LLExecutor(num_threads=threads)

    def compile(self, schema: dict[str, Any]) -> str:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        self.matcher(grammar)  # the matcher's constructor is where the grammar is compiled and checked
        return grammar

    def matcher(self, grammar: str) -> Any:
        m = self.ll.LLMatcher(self.lltok, grammar)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        self.llt.fill_next_token_bitmask(m, bitmask, row)

    def batch_fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def consume(self, m: Any, token: int) -> bool:
        return m.consume_token(token) and not m.is_error()


class XGrammar:
    name, modules = "xgrammar", ("xgrammar", "transformers")

    def __init__(self, tok: Tokenizer, threads: int) -> None:
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.xgr = xgrammar
        # from_huggingface accepts the backend but only sees get_vocab(): the 16 special tokens
        # (<|im_start|>, <repo_name>, ...) would be allowed inside JSON strings. So take its detected
        # vocab type and build the info from the vocabulary with those entries blanked (= special).
        detected = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tok.backend),
                                                           vocab_size=tok.vocab_size,
                                                           stop_token_ids=list(tok.eos_token_ids))
        vocab = [""] * tok.vocab_size
        for text, i in tok.backend.get_vocab(with_added_tokens=True).items():
            if i not in tok.special_token_ids or i in tok.eos_token_ids:
                vocab[i] = text
        self.info = xgrammar.TokenizerInfo(vocab, detected.vocab_type, vocab_size=tok.vocab_size,
                                           stop_token_ids=list(tok.eos_token_ids),
                                           add_prefix_space=detected.add_prefix_space)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=threads)
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=threads)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        m.fill_next_token_bitmask(bitmask, row)

    def batch_fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def consume(self, m: Any, token: int) -> bool:
        return m.accept_token(token)


class OutlinesCore:
    name, modules = "outlines-core", ("outlines_core",)

    def __init__(self, tok: Tokenizer, threads: int) -> None:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema
        self.oc, self.to_regex = outlines_core, build_regex_from_schema
        # Vocabulary wants each token's bytes (not its byte-level spelling) and no EOS in the map;
        # the special tokens are left out so that they are never allowed.
        self.eos = eos = tok.eos_token_ids[0]
        byte_of = {ch: b for b, ch in enumerate(byte_alphabet())}
        tokens: dict[bytes, list[int]] = {}
        for text, i in tok.backend.get_vocab(with_added_tokens=True).items():
            if i not in tok.special_token_ids:
                tokens.setdefault(bytes(byte_of[ch] for ch in text), []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, tokens)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.oc.Index(self.to_regex(json.dumps(schema)), self.vocab)

    def matcher(self, index: Any) -> Any:
        return self.oc.Guide(index)

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        m.write_mask_into(bitmask[row].data_ptr(), bitmask.shape[1], bitmask.element_size())

    def batch_fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        for row, m in enumerate(matchers):
            self.fill(m, bitmask, row)

    def consume(self, m: Any, token: int) -> bool:
        if token == self.eos:  # Index.next_state never takes EOS: the guide ends where it is final
            return m.is_finished()
        try:
            m.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True


ENGINES = (LLGuidance, XGrammar, OutlinesCore)


# --- measurements -------------------------------------------------------------------------------------------

@dataclass
class Row:
    engine: str
    case: str
    compile_ms: tuple[float, float] = (0.0, 0.0)
    mask_us: tuple[float, float] = (0.0, 0.0)
    batch_ms: float = 0.0
    accepted: str = ""


def ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def time_compile(engine: Engine, schema: dict[str, Any]) -> tuple[Any, tuple[float, float]]:
    times = []
    for _ in range(2):
        t0 = time.perf_counter_ns()
        compiled = engine.compile(schema)
        times.append(ms_since(t0))
    return compiled, (times[0], times[1])


def walk(engine: Engine, compiled: Any, ids: list[int], eos: int, bitmask: torch.Tensor) -> tuple[list[float], str]:
    """Mask microseconds at every position of one fresh matcher, and what went wrong (or "yes")."""
    m = engine.matcher(compiled)
    times = []
    for pos, token in enumerate([*ids, eos]):
        bitmask.zero_()
        t0 = time.perf_counter_ns()
        engine.fill(m, bitmask, 0)
        times.append(ms_since(t0) * 1e3)
        what = "EOS" if pos == len(ids) else f"token {pos} ({token})"
        if not allowed(bitmask, 0, token):
            return times, f"no: {what} masked out"
        if not engine.consume(m, token):
            return times, f"no: {what} rejected"
    return times, "yes"


def time_batch(engine: Engine, compiled: Any, ids: list[int], eos: int, bitmask: torch.Tensor,
               steps: int) -> tuple[float, str]:
    """Median ms per [batch, V/32] fill; matcher k starts k*len/batch tokens in and takes one token a step."""
    seq, batch = [*ids, eos], bitmask.shape[0]
    positions = [k * len(ids) // batch for k in range(batch)]
    matchers = [engine.matcher(compiled) for _ in range(batch)]
    for m, pos in zip(matchers, positions):
        for token in ids[:pos]:
            engine.consume(m, token)
    times, bad = [], 0
    for _ in range(steps):
        bitmask.zero_()
        t0 = time.perf_counter_ns()
        engine.batch_fill(matchers, bitmask)
        times.append(ms_since(t0))
        for k in range(batch):
            token = seq[positions[k]]
            bad += not allowed(bitmask, k, token)
            if token == eos:  # the sequence is done: start it again
                matchers[k], positions[k] = engine.matcher(compiled), 0
            else:
                engine.consume(matchers[k], token)
                positions[k] += 1
    return sorted(times)[steps // 2], "" if bad == 0 else f"; batch: {bad} rows masked out the next token"


def warm_up(engine: Engine, tok: Tokenizer) -> float:
    """Ms of the process's first mask (one-time lazy set-up), kept out of the per-schema figures."""
    compiled = engine.compile({"type": "string"})
    bitmask = torch.zeros((2, (tok.vocab_size + 31) // 32), dtype=torch.int32)
    t0 = time.perf_counter_ns()
    engine.fill(engine.matcher(compiled), bitmask, 0)
    first_ms = ms_since(t0)
    engine.batch_fill([engine.matcher(compiled), engine.matcher(compiled)], bitmask)  # starts any thread pool
    return first_ms


def measure(engine: Engine, case: Case, tok: Tokenizer, args: argparse.Namespace) -> Row:
    row = Row(engine.name, case.name)
    ids = tok.encode(json.dumps(case.instance), add_special_tokens=False)
    eos = tok.eos_token_ids[0]
    try:
        compiled, row.compile_ms = time_compile(engine, case.schema)
    except Exception as e:  # an engine that cannot compile the schema gets its error in the table
        row.accepted = f"compile error: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
        return row
    width = (tok.vocab_size + 31) // 32
    bitmask = torch.zeros((1, width), dtype=torch.int32)
    samples, verdicts = [], []
    for _ in range(args.passes):
        times, verdict = walk(engine, compiled, ids, eos, bitmask)
        samples += times
        verdicts.append(verdict)
    row.mask_us = (sum(samples) / len(samples), max(samples))
    row.accepted = next((v for v in verdicts if v != "yes"), "yes")
    batch_mask = torch.zeros((args.batch, width), dtype=torch.int32)
    row.batch_ms, batch_verdict = time_batch(engine, compiled, ids, eos, batch_mask, args.steps)
    row.accepted += batch_verdict
    return row


# --- packages -----------------------------------------------------------------------------------------------

def wheel_path(dist_name: str) -> str | None:
    found = glob.glob(os.path.join(WHEEL_DIR, f"{dist_name.replace('-', '_')}-*.whl"))
    return found[0] if found else None


def package_info(dist_name: str) -> tuple[str, str, str, list[str]]:
    """Version, wheel MB, installed MB and the dependencies that are not behind an extra."""
    wheel = wheel_path(dist_name)
    wheel_mb = f"{os.path.getsize(wheel) / 2**20:.1f}" if wheel else "-"
    try:
        dist = importlib.metadata.distribution(dist_name)
        version, requires = dist.version, dist.requires or []
        installed = sum(f.size or 0 for f in dist.files or [])
        installed_mb = f"{installed / 2**20:.1f}"
    except importlib.metadata.PackageNotFoundError:
        if wheel is None:
            return "not found", "-", "-", []
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        version = next(line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Version:"))
        requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
        installed_mb = "not installed"
    return version, wheel_mb, installed_mb, [r for r in requires if "extra ==" not in r]


# --- output -------------------------------------------------------------------------------------------------

def print_table(rows: list[Row], batch: int) -> None:
    print(f"{'engine':<14}{'schema':<17}{'compile ms':>18}{'mask us':>18}{f'batch-{batch}':>11}  accepted")
    print(f"{'':<14}{'':<17}{'first':>10}{'second':>8}{'mean':>10}{'max':>8}{'ms/step':>11}")
    for r in rows:
        if not r.case:
            print(f"{r.engine:<14}{'-':<17}{r.accepted}")
        elif r.accepted.startswith("compile error"):
            print(f"{r.engine:<14}{r.case:<17}{'':>47}  {r.accepted}")
        else:
            print(f"{r.engine:<14}{r.case:<17}{r.compile_ms[0]:>10.2f}{r.compile_ms[1]:>8.2f}"
                  f"{r.mask_us[0]:>10.1f}{r.mask_us[1]:>8.0f}{r.batch_ms:>11.2f}  {r.accepted}")


def print_packages() -> None:
    print(f"\n{'package':<16}{'version':<16}{'wheel MB':>9}{'installed MB':>14}  declared dependencies (no extras)")
    for dist in ("llguidance", "xgrammar", "outlines-core", "apache-tvm-ffi"):
        version, wheel_mb, installed_mb, requires = package_info(dist)
        print(f"{dist:<16}{version:<16}{wheel_mb:>9}{installed_mb:>14}  {', '.join(requires) or '(none)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=5, help="fresh matchers walked per schema for mask times")
    parser.add_argument("--steps", type=int, default=50, help="batch fills timed per schema")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads of the batch APIs and of xgrammar's compiler (default: all CPUs)")
    args = parser.parse_args()
    tok = load_tokenizer(None)
    print(f"tokenizer: embedded SmolLM2, vocab {tok.vocab_size}, EOS {tok.eos_token_ids}; {args.threads} threads; "
          f"instances: " + ", ".join(f"{c.name} {len(tok.encode(json.dumps(c.instance), add_special_tokens=False))}"
                                     for c in CASES) + " tokens")
    rows: list[Row] = []
    for cls in ENGINES:
        t0 = time.perf_counter_ns()
        try:
            for module in cls.modules:
                importlib.import_module(module)
        except ImportError as e:
            rows.append(Row(cls.name, "", accepted=f"not installed ({e.name})"))
            continue
        import_ms, t0 = ms_since(t0), time.perf_counter_ns()
        engine = cls(tok, args.threads)
        setup_ms = ms_since(t0)
        print(f"{cls.name}: import {import_ms:.0f} ms, tokenizer setup {setup_ms:.0f} ms, "
              f"first mask in the process {warm_up(engine, tok):.2f} ms")
        rows += [measure(engine, case, tok, args) for case in CASES]
    print()
    print_table(rows, args.batch)
    print_packages()


if __name__ == "__main__":
    main()
