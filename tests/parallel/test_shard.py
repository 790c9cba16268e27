"""The transform alone, ranks as threads of the test process (InProcessGroup): every rank's
shard, summed through the in-process collectives, computes the full model's logits."""

from __future__ import annotations

import threading

import pytest
import torch

from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_cache import KVCache
from pdserve.model.loader import load_model
from pdserve.parallel.communicator import InProcessGroup
from pdserve.parallel.shard import TensorParallelError, check_tensor_parallel, rank_config, shard_model

pytestmark = pytest.mark.timeout(120)
BLOCK = 4


def _prefill_batch(length: int, vocab: int) -> ForwardBatch:
    ids = torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(length))
    blocks = tuple(range(-(-length // BLOCK)))
    return ForwardBatch(ids, torch.arange(length), torch.arange(length), (SeqSpan(0, length, length, blocks),),
                        torch.tensor([length // 2, length - 1]))


def _logits(model, config, batch: ForwardBatch) -> torch.Tensor:
    kv = KVCache(config.kv_shape(BLOCK), 32, torch.float32, "cpu")
    return model.forward(batch, kv, TorchAttentionBackend())


def _sharded_logits(path, world: int, batch: ForwardBatch) -> list[torch.Tensor]:
    group, out = InProcessGroup(world, timeout_s=60), [None] * world

    def rank(r: int) -> None:
        shard = shard_model(load_model(str(path)).model, group.communicator(r))
        out[r] = _logits(shard, shard.config, batch)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("name", ["llama_gqa_llama3", "qwen2_bias", "llama_untied"])
def test_two_shards_compute_the_full_logits(tiny_model_dirs, name):
    path = tiny_model_dirs[name]
    full = load_model(str(path))
    batch = _prefill_batch(37, full.config.vocab_size)
    expected = _logits(full.model, full.config, batch)
    for logits in _sharded_logits(path, 2, batch):
        assert logits.shape == expected.shape
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_uneven_vocabulary_is_padded_and_cut(tiny_model_dirs):
    """A vocabulary that does not divide: the last slice padded with zero rows; the untied
    model (4 KV heads) over 4 ranks still computes the full logits."""
    from pdserve.parallel.layers import VocabSlice

    slices = [VocabSlice(10, r, 4) for r in range(4)]
    assert [(s.start, s.end, s.size) for s in slices] == [(0, 3, 3), (3, 6, 3), (6, 9, 3), (9, 10, 3)]
    padded = slices[3].rows(torch.arange(10.0).view(10, 1).expand(10, 2), dim=0)
    assert padded.tolist() == [[9.0, 9.0], [0.0, 0.0], [0.0, 0.0]]
    path = tiny_model_dirs["llama_untied"]
    batch = _prefill_batch(9, 384)
    full = load_model(str(path))
    expected = _logits(full.model, full.config, batch)
    for logits in _sharded_logits(path, 4, batch):
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_a_size_that_does_not_divide_the_kv_heads_names_the_counts(tiny_model_dirs, embedded_gguf_path):
    mistral = load_model(str(tiny_model_dirs["mistral"])).config  # 4 heads over 1 KV head
    with pytest.raises(TensorParallelError, match=r"size 2 must divide mistral's 1 KV heads \(and its 4 attention"):
        check_tensor_parallel(mistral, 2)
    gqa = load_model(str(tiny_model_dirs["llama_gqa_llama3"])).config
    local = rank_config(gqa, 2)
    assert (local.num_heads, local.num_kv_heads, local.vocab_size) == (2, 1, gqa.vocab_size)
