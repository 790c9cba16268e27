"""A request's trace for tests of the gateway: records what the gateway tells it, exports nothing."""

from __future__ import annotations


class FakeTrace:
    def __init__(self):
        self.job, self.failed, self.finished, self.events = None, None, None, []

    def metadata(self):
        return ()

    def bind(self, job, operation="text_completion"):
        self.job = job

    def fail(self, error, code):
        self.failed = code

    def finish(self, reason, completion):
        self.finished = reason

    def on_event(self, event):
        self.events.append(event)
