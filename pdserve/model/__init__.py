"""Model loading and the Llama-family decoder."""

from pdserve.model.config import Architecture, ModelConfig
from pdserve.model.errors import ModelLoadError, UnsupportedModelError
from pdserve.model.loader import LoadedModel, load_model, resolve_model_path

__all__ = [
    "Architecture",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "UnsupportedModelError",
    "load_model",
    "resolve_model_path",
]
