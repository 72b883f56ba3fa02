"""Spools whose process is gone are adopted by the next process bound for the same collector.

The e2e side (a rank killed with kill -9 and a rank whose exit flush missed, both while the
collector was down, sent by a later run) is in test_sdk_server.py; here the rules, on real
directories and real ``flock`` locks (a lock held through another open file is one held by
another process, as far as ``flock`` is concerned).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from fleetlens.sdk.orphans import LOCK, OWNER, claim, owner_digest, remove_if_empty, sweep
from fleetlens.sdk.spool import Spool

pytestmark = pytest.mark.unit

OWNER_A = owner_digest("http://collector:8480", "tok")


def _orphan(root: Path, name: str, batches: int, owner: str = OWNER_A) -> list[str]:
    """A spool left by a process that is gone: its batch ids, oldest first. The process's end
    is what the kernel does at it, kill -9 included: its lock's descriptor closed."""
    spool = Spool(str(root / name), 1 << 20, owner=owner)
    for i in range(batches):
        assert spool.put(i % 4, f"{name}-{i}", bytes(100 + i), 1)
    assert spool._claim_fd is not None and spool._claim_fd >= 0
    os.close(spool._claim_fd)
    return [f"{name}-{i}" for i in range(batches)]


def _replayed(spool: Spool) -> list[str]:
    ids = []
    while (got := spool.oldest()) is not None:
        ids.append(got[0].batch_id)
        spool.delete(got[0])
    return ids


def test_a_gone_process_spool_is_moved_in_oldest_first_and_its_directory_removed(
    tmp_path: Path,
) -> None:
    ids = _orphan(tmp_path, "run-a-0", 5)
    live = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    assert live.put(0, "mine", b"x" * 10, 1)

    assert sweep(live, OWNER_A) == (1, 5)
    assert not (tmp_path / "run-a-0").exists()
    # The adopted batches are older than this process's own: they go first, bytes intact.
    first = live.oldest()
    assert first is not None and first[0].batch_id == ids[0] and first[1] == bytes(100)
    assert _replayed(live) == [*ids, "mine"]
    # Nothing left to adopt, and this process's own directory is never taken for an orphan.
    assert sweep(live, OWNER_A) == (0, 0)
    assert (tmp_path / "run-b-0" / OWNER).read_text() == OWNER_A


def test_a_live_process_spool_is_left_alone(tmp_path: Path) -> None:
    other = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert other.put(1, "theirs", b"y" * 10, 1)  # made and claimed: its lock is held
    live = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    assert sweep(live, OWNER_A) == (0, 0)
    assert len(other) == 1 and len(live) == 0
    assert _replayed(other) == ["theirs"]


def test_only_batches_bound_for_the_same_collector_and_token_are_adopted(tmp_path: Path) -> None:
    _orphan(tmp_path, "other-token-0", 2, owner_digest("http://collector:8480", "tok2"))
    _orphan(tmp_path, "other-server-0", 2, owner_digest("http://elsewhere:8480", "tok"))
    _orphan(tmp_path, "older-sdk-0", 2)
    os.unlink(tmp_path / "older-sdk-0" / OWNER)  # no owner said: an older SDK's, or the relay's
    ids = _orphan(tmp_path / "elsewhere", "run-a-0", 2)
    os.symlink(tmp_path / "elsewhere" / "run-a-0", tmp_path / "planted")
    live = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)

    assert sweep(live, OWNER_A) == (0, 0)
    for name in ("other-token-0", "other-server-0", "older-sdk-0", "elsewhere/run-a-0"):
        assert len(list((tmp_path / name).glob("*.batch"))) == 2, name
    assert len(ids) == 2


def test_adoption_stops_where_the_spool_is_full_and_the_rest_waits(tmp_path: Path) -> None:
    ids = _orphan(tmp_path, "run-a-0", 6)  # 100..105 bytes each
    # At most half the spool is given to what others left: the other half is this run's own.
    live = Spool(str(tmp_path / "run-b-0"), 620, owner=OWNER_A)
    assert sweep(live, OWNER_A) == (1, 3)
    left = sorted(p.name for p in (tmp_path / "run-a-0").glob("*.batch"))
    assert len(left) == 3 and (tmp_path / "run-a-0" / OWNER).exists()
    assert _replayed(live) == ids[:3]
    assert sweep(live, OWNER_A) == (1, 2)  # oldest first: 103 and 104 bytes fit, 105 waits
    assert _replayed(live) == ids[3:5]
    assert sweep(live, OWNER_A) == (1, 1)
    assert not (tmp_path / "run-a-0").exists()
    assert _replayed(live) == ids[5:]


def test_a_rank_restarted_into_its_directory_keeps_it(tmp_path: Path) -> None:
    ids = _orphan(tmp_path, "run-a-0", 3)
    # The same run and rank started again: it claims the directory it replays from.
    again = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert len(again) == 3
    live = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    assert sweep(live, OWNER_A) == (0, 0)
    assert _replayed(again) == ids
    assert (tmp_path / "run-a-0" / LOCK).exists()


def test_a_rank_restarted_while_a_sweep_empties_its_directory_claims_it_at_its_next_write(
    tmp_path: Path,
) -> None:
    _orphan(tmp_path, "run-a-0", 2)
    # A sweep of another process has taken the gone rank's lock and is moving its batches out
    # when the same run and rank starts again: the new process does not wait for it.
    sweeper = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    held = os.open(tmp_path / "run-a-0" / LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    again = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert len(again) == 2  # it indexes what is there, without the lock, and goes on
    assert sweeper.adopt(str(tmp_path / "run-a-0")) == 2 and remove_if_empty(
        str(tmp_path / "run-a-0")
    )
    os.close(held)
    # Its next write makes the directory again and claims it: a sweep leaves it alone.
    assert again.oldest() is None  # the moved batches are forgotten, the sweeper sends them
    assert again.put(1, "after", b"z" * 10, 1)
    assert (tmp_path / "run-a-0" / OWNER).read_text() == OWNER_A
    other = Spool(str(tmp_path / "run-c-0"), 1 << 20, owner=OWNER_A)
    assert sweep(other, OWNER_A) == (0, 0)
    assert _replayed(again) == ["after"]


def test_a_finished_run_lets_go_of_its_spool_removing_it_when_empty(tmp_path: Path) -> None:
    empty = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert empty.put(1, "sent", b"x", 1)
    _replayed(empty)
    empty.release()
    assert not (tmp_path / "run-a-0").exists()
    # What is left is another run's to send, in this process too.
    left = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    assert left.put(1, "unsent", b"y", 1)
    left.release()
    later = Spool(str(tmp_path / "run-c-0"), 1 << 20, owner=OWNER_A)
    assert sweep(later, OWNER_A) == (1, 1)
    assert _replayed(later) == ["unsent"] and not (tmp_path / "run-b-0").exists()


def test_many_empty_gone_spools_are_cleared_over_sweeps(tmp_path: Path) -> None:
    """Every rank that spooled and then sent it all leaves an empty claimed directory when it
    is killed: more than a sweep looks at (64) are cleared by the sweeps after it, and the
    batches behind them reached."""
    for i in range(70):
        directory = tmp_path / f"empty-{i:02d}-0"
        directory.mkdir()
        fd = claim(str(directory), OWNER_A)
        assert fd is not None
        os.close(fd)
    ids = _orphan(tmp_path, "zz-run-0", 1)
    live = Spool(str(tmp_path / "live-0"), 1 << 20, owner=OWNER_A)
    swept = []
    while (got := sweep(live, OWNER_A)) != (0, 0):
        swept.append(got)
    assert sum(d for d, _ in swept) == 71 and sum(b for _, b in swept) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live-0"]
    assert _replayed(live) == ids


def test_a_planted_fifo_or_symlink_never_blocks_nor_misleads_a_sweep(tmp_path: Path) -> None:
    ids = _orphan(tmp_path, "run-a-0", 1)
    fifo_dir = tmp_path / "run-f-0"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / OWNER)  # a read would wait for a writer that never comes
    lock_dir = tmp_path / "run-l-0"
    lock_dir.mkdir()
    (lock_dir / OWNER).write_text(OWNER_A)
    os.mkfifo(lock_dir / LOCK)
    live = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    got: list[tuple[int, int]] = []
    worker = threading.Thread(target=lambda: got.append(sweep(live, OWNER_A)), daemon=True)
    worker.start()
    worker.join(60)  # a sweep blocked on a FIFO would never end
    assert got == [(1, 1)]
    assert _replayed(live) == ids
    assert fifo_dir.exists() and lock_dir.exists()


def test_a_rank_found_held_claims_its_directory_at_its_next_replay(tmp_path: Path) -> None:
    ids = _orphan(tmp_path, "run-a-0", 2)
    held = os.open(tmp_path / "run-a-0" / LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a listing's or a sweep's moment
    again = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert len(again) == 2
    os.close(held)
    first = again.oldest()  # replaying, it claims the directory: no sweep takes it from now on
    assert first is not None and first[0].batch_id == ids[0]
    other = Spool(str(tmp_path / "run-b-0"), 1 << 20, owner=OWNER_A)
    assert sweep(other, OWNER_A) == (0, 0)
    assert _replayed(again) == ids


def test_a_batch_larger_than_half_the_spool_goes_alone_into_an_empty_one(tmp_path: Path) -> None:
    gone = Spool(str(tmp_path / "run-a-0"), 1 << 20, owner=OWNER_A)
    assert gone.put(1, "big", bytes(200), 1) and gone.put(1, "small", bytes(10), 1)
    assert gone._claim_fd is not None
    os.close(gone._claim_fd)
    live = Spool(str(tmp_path / "run-b-0"), 300, owner=OWNER_A)
    assert sweep(live, OWNER_A) == (1, 1)  # alone: the small one waits for room
    assert _replayed(live) == ["big"]
    assert sweep(live, OWNER_A) == (1, 1)
    assert _replayed(live) == ["small"] and not (tmp_path / "run-a-0").exists()
