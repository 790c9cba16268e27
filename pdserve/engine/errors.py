"""Errors an engine raises for a bad request. The services map them to gRPC status codes."""


class InvalidRequestError(ValueError):
    """The request can never be served as given (maps to INVALID_ARGUMENT)."""


class DuplicateRequestError(ValueError):
    """A request with this id is already running (maps to ALREADY_EXISTS)."""


class OverloadedError(RuntimeError):
    """Queues are full (maps to RESOURCE_EXHAUSTED)."""


class EngineFailed(RuntimeError):
    """The engine of this process stopped (a fault in a step, or shutdown): nothing more can run
    here, so callers retry on another worker (maps to UNAVAILABLE)."""
