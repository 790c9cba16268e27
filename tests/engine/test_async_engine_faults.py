"""The fault switch the engine consults before each step: off unless the variable is set, one
fault per appearance of the file."""

from __future__ import annotations

import pytest

from pdserve.engine.faults import INJECT_ENV, FileTrigger, InjectedFault, NoFaults, RequestFault, injector_from_env


def test_unset_means_no_injection():
    assert isinstance(injector_from_env({}), NoFaults)
    injector_from_env({}).check()


def test_the_variable_names_the_trigger_file(tmp_path):
    trigger = injector_from_env({INJECT_ENV: str(tmp_path / "f")})
    assert isinstance(trigger, FileTrigger) and trigger.path == tmp_path / "f"


def test_pid_in_the_path_aims_at_one_process(tmp_path):
    trigger = injector_from_env({INJECT_ENV: str(tmp_path / "fault-{pid}")}, pid=4321)
    assert trigger.path == tmp_path / "fault-4321"


def test_an_absent_file_injects_nothing(tmp_path):
    FileTrigger(tmp_path / "f").check()


def test_an_empty_file_injects_one_fatal_fault_and_is_consumed(tmp_path):
    trigger = FileTrigger(tmp_path / "f")
    trigger.path.touch()
    with pytest.raises(InjectedFault):
        trigger.check()
    assert list(tmp_path.iterdir()) == []
    trigger.check()


def test_a_file_naming_a_request_injects_a_fault_of_that_request(tmp_path):
    trigger = FileTrigger(tmp_path / "f")
    trigger.path.write_text("request chat-7\n")
    with pytest.raises(RequestFault) as caught:
        trigger.check()
    assert caught.value.request_id == "chat-7" and isinstance(caught.value.cause, InjectedFault)


def test_a_pace_file_makes_every_later_step_wait_until_pace_zero(tmp_path):
    slept: list[float] = []
    trigger = FileTrigger(tmp_path / "f", sleep=slept.append)
    trigger.check()
    trigger.path.write_text("pace 0.25\n")
    trigger.check()
    trigger.check()
    assert slept == [0.25, 0.25] and list(tmp_path.iterdir()) == []
    trigger.path.write_text("pace 0")
    trigger.check()
    assert slept == [0.25, 0.25]
