"""One job attempt, one job id on all its ranks: torchrun's restart count is each agent's own.

An elastic agent whose worker failed (exit 75 at a drain) counts a restart; one that restarted
its worker because a node left does not. The ranks of the resumed attempt then read 1 and 0
from ``TORCHELASTIC_RESTART_COUNT``; they agree on the highest through the agent's store (a
real ``TCPStore``, ranks as threads), and each attempt takes a number past the one before.
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetlens.sdk.agree import agree_attempt
from fleetlens.testing import free_port

pytestmark = pytest.mark.unit
torch_dist = pytest.importorskip("torch.distributed")


def _attempt(port: int, counts: list[int]) -> list[int]:
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    with ThreadPoolExecutor(len(counts)) as pool:
        futures = [pool.submit(agree_attempt, c, len(counts), env) for c in counts]
        return [f.result(timeout=30) for f in futures]


def test_ranks_of_one_attempt_agree_on_the_highest_restart_count_attempt_after_attempt() -> None:
    port = free_port()
    # The agent's store: it outlives the attempts, as torchrun's does.
    store = torch_dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10)
    )
    try:
        assert _attempt(port, [0, 0, 0]) == [0, 0, 0]
        # node-c drained: node-a's worker exited 75 (a restart), node-b's agent restarted its
        # worker for the membership change (none). Both ranks are attempt 1, in either order.
        assert _attempt(port, [1, 0]) == [1, 1]
        # Then node-b's worker fails and node-a's agent restarts its own for the change: the
        # counts read 1 and 1, the number the attempt before took; this one is attempt 2.
        assert _attempt(port, [1, 1]) == [2, 2]
        assert _attempt(port, [1, 2]) == [3, 3]
        # Both fail at once: the next number, at the same world size as the one before.
        assert _attempt(port, [3, 3]) == [4, 4]
    finally:
        del store


def test_in_a_store_of_its_own_the_rank_that_read_0_first_waits_for_its_peer() -> None:
    """torchrun may give an attempt a new store (the drill's resumed attempt had none of the
    keys of the one before): node-a's worker, restarted for the change, read 0 and asked
    first; it waits for node-b's, which failed and read 1."""
    port = free_port()
    store = torch_dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=10)
    )
    try:
        assert _attempt(port, [0, 1]) == [1, 1]
    finally:
        del store


def test_without_a_store_a_rank_keeps_its_own_count() -> None:
    assert agree_attempt(3, 2, {}) == 3
    assert agree_attempt(1, 1, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}) == 1
