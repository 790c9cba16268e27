"""transformers' own model of a checkpoint, for the tests' references, loaded once per machine.

transformers reads a .gguf file through the gguf package, which parses every metadata field
(the tokenizer's 49,152 tokens and merges among them) in Python: about 15 s for the embedded model,
paid by every process and module that asks. So the first load keeps what transformers built, its
config and its dequantized weights, under the cache directory (`$PDSERVE_CACHE_DIR/hf_reference/`),
keyed by the file's path, size and modification time and by the transformers and torch versions;
later loads build the same model from those in about a second. The weights are transformers' own
dequantization, never this project's, so the reference stays independent of the code it checks.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from pdserve.native.build import cache_dir


def load_hf_model(source: Path) -> torch.nn.Module:
    """transformers' float32 model of a checkpoint folder or .gguf file, in eval mode."""
    from transformers import AutoModelForCausalLM

    if source.suffix != ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    folder = _kept(source)
    converted = None if (folder / "weights.pt").exists() else _keep(source, folder)
    return _rebuild(folder) if converted is None else converted


def _kept(source: Path) -> Path:
    import transformers

    stat = source.stat()
    key = f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}:{torch.__version__}"
    return cache_dir() / "hf_reference" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _keep(source: Path, folder: Path) -> torch.nn.Module | None:
    """Load through transformers' GGUF reader and keep the result; one process converts while
    the others wait on the lock, then find it kept (None: rebuild it from there)."""
    from filelock import FileLock
    from transformers import AutoModelForCausalLM

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / "weights.pt").exists():
            return None
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
        folder.mkdir(exist_ok=True)
        model.config.save_pretrained(str(folder))
        partial = folder / f"weights.pt.{os.getpid()}"
        torch.save(model.state_dict(), partial)
        os.replace(partial, folder / "weights.pt")
    return model.eval()


def _rebuild(folder: Path) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True))
    return model.eval()
