"""The Llama-family model, its torch reference and its loaders (a checkpoint's files and config
are read by pdserve/checkpoint/)."""

from pdserve.model.loader import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
