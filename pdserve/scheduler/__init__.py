"""The scheduling core: who runs each step, chunk sizes, preemption. Pure Python, no tensors."""

from pdserve.scheduler.base import Scheduler
from pdserve.scheduler.errors import (
    AdmissionError,
    DuplicateRequestError,
    NotReceivingError,
    PromptTooLongError,
    QueueFullError,
)
from pdserve.scheduler.factory import POLICIES, make_scheduler
from pdserve.scheduler.output import Preemption, ScheduledChunk, SchedulerOutput
from pdserve.scheduler.results import Reservation, SchedulerStats

__all__ = [
    "AdmissionError", "DuplicateRequestError", "NotReceivingError", "POLICIES", "Preemption",
    "PromptTooLongError", "QueueFullError", "Reservation", "ScheduledChunk", "Scheduler",
    "SchedulerOutput", "SchedulerStats", "make_scheduler",
]
