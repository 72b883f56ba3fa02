"""A straggler judged by its arrival when phases hold the waiting (no rank measured ``comm``)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetlens.store.detect_queries import by_arrival

pytestmark = pytest.mark.unit

NAN = np.nan


def test_the_last_to_arrive_keeps_its_compute_and_the_others_lose_their_wait() -> None:
    # forward 30 ms on ranks 0, 1 and 45 ms on rank 2; local backward 60 ms; every rank leaves
    # the all-reduce at 45 + 60 ms: ranks 0, 1 waited 15 ms inside their backward.
    forward, optimizer = np.array([[0.030, 0.030, 0.045]]), 0.010
    backward = np.array([[0.075, 0.075, 0.060]])
    compute = forward + backward + optimizer  # what the phases alone say: all 0.115
    comm = np.full((1, 3), NAN)
    got = by_arrival(compute, backward, comm)
    np.testing.assert_allclose(got, [[0.100, 0.100, 0.115]])
    assert int(np.argmax(got)) == 2


def test_steps_whose_wait_was_measured_are_left_alone() -> None:
    compute = np.array([[0.1, 0.1, 0.13], [0.1, 0.1, 0.13]])
    backward = np.array([[0.06, 0.07, 0.06], [0.06, 0.07, 0.06]])
    comm = np.array([[0.03, 0.03, 0.0], [NAN, NAN, NAN]])
    got = by_arrival(compute, backward, comm)
    np.testing.assert_allclose(got[0], compute[0])  # measured: compute already excludes it
    np.testing.assert_allclose(got[1], [0.1, 0.09, 0.13])


def test_a_step_with_one_backward_time_is_left_alone() -> None:
    compute = np.array([[0.1, NAN]])
    got = by_arrival(compute, np.array([[0.06, NAN]]), np.full((1, 2), NAN))
    np.testing.assert_allclose(got, compute)
