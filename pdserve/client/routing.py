"""Which router a client's call goes to: its first target, then the next one each time a stream
goes on elsewhere after its router went away (pdserve.client.calls), under the call's one deadline."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence

from pdserve.client.calls import Opener
from pdserve.client.options import ClientOptions
from pdserve.client.wire import resumed, samples_of, with_id


class Routing:
    def __init__(self, stubs: Sequence, options: ClientOptions):
        self.stubs = list(stubs)
        self.options = options
        self._turns = itertools.count()  # new streams start at each router in turn

    def calls(self, request, timeout_s: float | None) -> tuple[Opener, int]:
        """How the stream's calls are made, and how many times it may fail over. With several
        routers, a request without an id gets one (a stream is continued by its id)."""
        several = len(self.stubs) > 1 and samples_of(request) == 1
        if several:
            request = with_id(request, uuid.uuid4().hex)
        first, timeout = next(self._turns), self.options.deadline(timeout_s)
        deadline = None if timeout is None else time.monotonic() + timeout

        def open_call(attempt: int, tokens: Sequence[int] | None):
            stub = self.stubs[(first + attempt) % len(self.stubs)]
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            return stub.Generate(request if tokens is None else resumed(request, tokens), timeout=left,
                                 metadata=self.options.metadata())

        return open_call, self.options.failovers if several else 0
