"""KV memory: block pools, the prefix cache, and the manager that assigns blocks to requests.

Pure Python bookkeeping; the KV tensors themselves live in pdserve/kv/kv_cache.py.
"""

from pdserve.kv.block_pool import Allocated, Allocation, BlockPool, BlockState, BlockStateError, OutOfBlocks
from pdserve.kv.manager import BlockHold, KVManager, KVStats, SwapPlan, SwapResult
from pdserve.kv.no_prefix_cache import NoPrefixCache
from pdserve.kv.prefix_cache import InsertResult, MatchResult, PrefixCache
from pdserve.kv.prefix_caches import make_prefix_cache
from pdserve.kv.radix_cache import RadixPrefixCache

__all__ = [
    "Allocated", "Allocation", "BlockHold", "BlockPool", "BlockState", "BlockStateError",
    "InsertResult", "KVManager", "KVStats", "MatchResult", "NoPrefixCache", "OutOfBlocks",
    "PrefixCache", "RadixPrefixCache", "SwapPlan", "SwapResult", "make_prefix_cache",
]
