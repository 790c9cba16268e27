"""Why the scheduler refuses a request. Nothing changes in the scheduler when one is raised."""

from __future__ import annotations


class AdmissionError(Exception):
    """Base class: the request was not queued."""


class QueueFullError(AdmissionError):
    """The waiting queue holds `max_waiting` requests; the caller should shed load."""


class DuplicateRequestError(AdmissionError):
    """A live request already has this id."""


class PromptTooLongError(AdmissionError):
    """The prompt leaves no room to generate within max_model_len (or the KV pool)."""


class NotReceivingError(KeyError):
    """mark_received for a request that is not waiting for remote KV."""
