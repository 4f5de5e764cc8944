"""A broker's pause and stop rules (broker/group_control.py), without sockets: alone, at its own boundary;
with learner ranks, after the iteration whose update says some broker asked."""

from __future__ import annotations

from broker.group_control import GroupControl


def _control(world_size: int) -> GroupControl:
    control = GroupControl()
    control.world_size = world_size
    return control


def test_alone_a_pause_and_a_stop_take_effect_at_the_next_boundary() -> None:
    control = _control(1)
    control.pause()
    assert not control.running.is_set() and not control.pause_pending
    control.resume()
    assert control.running.is_set()
    control.pause()
    control.stop()  # a paused broker alone ends without sampling again
    assert control.stopped and control.running.is_set()


def test_with_ranks_a_pause_waits_for_the_update_that_agrees_on_it() -> None:
    control = _control(2)
    control.pause()
    assert control.running.is_set() and control.pause_pending  # it samples on: PAUSING
    sent = control.requests()
    assert (sent.pause, sent.stop) == (True, False)
    control.agreed(sent, run_pauses=True, run_stops=False)
    assert not control.running.is_set() and not control.pause_pending


def test_with_ranks_another_brokers_pause_or_stop_is_taken_too() -> None:
    control = _control(2)
    sent = control.requests()
    assert (sent.pause, sent.stop) == (False, False)
    control.agreed(sent, run_pauses=True, run_stops=False)
    assert not control.running.is_set()  # paused by broker 1's request, though this one was not asked
    control.resume()
    control.agreed(control.requests(), run_pauses=False, run_stops=True)
    assert control.stopped


def test_with_ranks_a_stop_at_a_boundary_or_while_paused_samples_one_more_iteration() -> None:
    control = _control(2)
    control.pause()
    control.agreed(control.requests(), run_pauses=True, run_stops=False)
    assert not control.running.is_set()
    control.stop()
    assert control.running.is_set() and not control.stopped  # one more iteration, carrying the stop
    assert not control.pause_pending  # reads running while it samples towards the stop
    sent = control.requests()
    assert sent.stop
    control.agreed(sent, run_pauses=sent.pause, run_stops=True)
    assert control.stopped


def test_with_ranks_a_resume_after_the_request_went_out_cancels_that_pause() -> None:
    control = _control(2)
    control.pause()
    sent = control.requests()  # the batch carrying the pause is in the learner...
    control.resume()  # ...when the resume comes
    control.agreed(sent, run_pauses=True, run_stops=False)
    assert control.running.is_set() and not control.pause_pending
    # A pause asked again after that resume is agreed as usual.
    control.pause()
    again = control.requests()
    control.agreed(again, run_pauses=True, run_stops=False)
    assert not control.running.is_set()


def test_with_ranks_no_request_no_change() -> None:
    control = _control(3)
    control.agreed(control.requests(), run_pauses=False, run_stops=False)
    assert control.running.is_set() and not control.stopped and not control.pause_pending
