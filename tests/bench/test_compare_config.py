"""The configurations `--compare` starts parse as `pdserve up` command lines with the intended flags."""

from __future__ import annotations

from pathlib import Path

from pdserve.bench.compare import MIXED_CONFIGS, NO_PREFIX_CACHE, CompareOptions, up_argv
from pdserve.stats import Slo
from pdserve.cli.main import build_parser

OPTS = CompareOptions(None, None, 0, None, 100.0, Slo(), 512, 512, 256, 60.0, Path("x"), False)


def test_every_configuration_is_a_valid_up_command():
    parsed = {c.name: build_parser().parse_args(up_argv(c, OPTS)) for c in (*MIXED_CONFIGS, NO_PREFIX_CACHE)}
    assert [(parsed[c.name].mode, parsed[c.name].policy) for c in MIXED_CONFIGS] == [
        ("colocated", "fcfs"), ("colocated", "decode-first"), ("colocated", "chunked"), ("disaggregated", "chunked")]
    for args in parsed.values():
        assert (args.prefill_workers, args.decode_workers, args.port) == (1, 1, 0)
        assert (args.kv_blocks, args.token_budget, args.max_chunk_tokens) == (512, 512, 256)
    assert parsed[NO_PREFIX_CACHE.name].no_prefix_cache
    assert not any(parsed[c.name].no_prefix_cache for c in MIXED_CONFIGS)
