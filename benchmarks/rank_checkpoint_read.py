"""Bytes each tensor-parallel rank reads of the embedded GGUF (its own slice plus the replicated
norms), at size 1 and 3: `python benchmarks/rank_checkpoint_read.py`."""

import torch
from pdserve.parallel.checkpoint_slices import GGUFSlices
from pdserve.parallel.shard_load import build_shard
from pdserve.parallel.communicator import InProcessGroup
import pdserve.checkpoint.embedded as e
path = e.embedded_model_path()
full = GGUFSlices(path)
total = sum(t.data.nbytes for n, t in full._tensors.items() if n != "rope_freqs.weight")
for world in (1, 3):
    for rank in range(world):
        s = GGUFSlices(path)
        build_shard(s, str(path), "cpu", torch.float32, InProcessGroup(world).communicator(rank))
        print(f"size {world} rank {rank}: read {s.bytes_read:,} of {total:,} stored tensor bytes ({s.bytes_read/total:.3f})")
