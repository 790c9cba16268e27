"""Errors raised while reading a model from disk."""

from __future__ import annotations


class ModelLoadError(Exception):
    """The model at a path could not be loaded (missing, corrupt, incomplete or inconsistent)."""


class UnsupportedModelError(ModelLoadError):
    """The files are readable but describe an architecture or feature this project does not run."""
