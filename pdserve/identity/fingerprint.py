"""A model's fingerprint, without torch (the router computes its own): its weights (xxh3-128 over
the weight files' bytes: the .gguf file, or a folder's *.safetensors), its architecture (every
field of its configuration but its name) and its tokenizer (a folder's tokenizer files, or a GGUF
file's `tokenizer.*` metadata).

The weights' digest reads every byte once per machine: it is kept in the cache folder
(`$PDSERVE_CACHE_DIR/fingerprints/`, beside the built kernels), keyed by each file's path, size
and modification time, so a later start reads nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import xxhash

from pdserve.checkpoint.source import read_model_config, resolve_model_path
from pdserve.kept_file import keep_file
from pdserve.native.build import cache_dir

log = logging.getLogger(__name__)
CHUNK = 8 << 20
# In the key of a kept fingerprint: bumped whenever what a digest covers changes, so that a machine
# never pairs a digest it kept from older code with one computed anew elsewhere.
DIGEST_VERSION = 3  # 3: a gemma3 GGUF's end-of-generation ids take in <end_of_turn>
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")


@dataclass(frozen=True)
class ModelFingerprint:
    weights: str
    architecture: str
    tokenizer: str

    def differences(self, other: "ModelFingerprint") -> tuple[str, ...]:
        """The fields that differ, by name."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name))


def model_fingerprint(model: str | None, cache: Path | None = None) -> ModelFingerprint:
    """The fingerprint of the model at `model` (None: the embedded one); kept in the cache folder,
    keyed by every file it reads (path, size, modification time)."""
    source = resolve_model_path(model)
    weights = _weight_files(source)
    read = [*weights, *(source / n for n in ("config.json", *TOKENIZER_FILES) if source.is_dir() and (source / n).is_file())]
    stats = [(str(f.resolve()), f.stat()) for f in read]
    key = xxhash.xxh3_128_hexdigest(json.dumps([DIGEST_VERSION, *((p, s.st_size, s.st_mtime_ns) for p, s in stats)])
                                    .encode())
    kept = (cache or cache_dir()) / "fingerprints" / f"{key}.json"
    try:
        return ModelFingerprint(**json.loads(kept.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    architecture = xxhash.xxh3_128_hexdigest(json.dumps(_architecture(read_model_config(model)), sort_keys=True,
                                                        default=str).encode())
    fingerprint = ModelFingerprint(_files_digest(weights), architecture, _tokenizer_digest(source))
    try:
        keep_file(kept, lambda f: json.dump(dataclasses.asdict(fingerprint), f))
    except OSError as exc:  # a read-only cache: computed again at the next start
        log.info("fingerprint not kept in %s: %s", kept.parent, exc)
    return fingerprint


def _architecture(config) -> dict:
    """What the architecture digest covers: every configuration field but the name, a field at
    its default left out, so that a field added later (with a default) changes no digest of a
    model that does not use it: workers before and after such a change still pair."""
    digest = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if f.name != "name" and value != default:
            digest[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return digest


def _weight_files(source: Path) -> list[Path]:
    if source.is_dir():
        return sorted(source.glob("*.safetensors")) or sorted(source.glob("*.bin"))
    return [source]


def _tokenizer_digest(source: Path) -> str:
    digest = xxhash.xxh3_128()
    if source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                digest.update(name.encode() + b"\0" + (source / name).read_bytes())
    else:
        from pdserve.checkpoint.gguf_file import read_gguf_metadata

        metadata = read_gguf_metadata(source)
        for key in sorted(k for k in metadata if k.startswith("tokenizer.")):
            digest.update(f"{key}={metadata[key]!r}".encode())
    return digest.hexdigest()


def _files_digest(files: list[Path]) -> str:
    """xxh3-128 over the files' bytes, in order."""
    digest = xxhash.xxh3_128()
    for path in files:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()
