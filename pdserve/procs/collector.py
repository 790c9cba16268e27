"""A long-running service's garbage collector, set once its start-up is done: what start-up
allocated (a model, a tokenizer's tables, the imported modules) moved out of the collector's
sight, and young objects collected less often. Otherwise a full collection walks every one of
those objects now and then, pausing the process for tens of milliseconds: a worker's step, or every
stream a router relays."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # allocations (less deallocations) of container objects between young collections


def quiet_collector() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 20)
