"""An insert interrupted by a crash is settled at startup without rewriting what is stored.

The engine writes a table and then each of its materialized views; a kill can fall anywhere in
that. The ledger's settle must leave every view equal to what it computes of the table, and it
must do it by reading and adding, not by mutations over every group the insert touched (those
held a restart for minutes after a kill inside a large insert).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetlens.collector.ledger import Ledger, batch_key
from fleetlens.store.batch import StringColumn
from fleetlens.store.chdb_store import ChdbStore
from fleetlens.store.telemetry import Part, merged_table

pytestmark = pytest.mark.unit

_STEP_VIEWS = ("steps_by_step", "rollup_steps_10s", "rollup_steps_1m")


def _steps(run: str, batch: str, steps: int, ranks: int) -> Part:
    ctx = {"tenant": "default", "run_id": run, "job_id": "j"}
    n = steps * ranks
    rng = np.random.default_rng(len(batch))
    cols: dict[str, Any] = {
        "step": np.repeat(np.arange(steps, dtype=np.int64), ranks),
        "rank": np.tile(np.arange(ranks, dtype=np.int32), steps),
        "time": 1.7e9 + np.repeat(np.arange(steps, dtype=np.float64) * 0.7, ranks),
        "duration": rng.uniform(0.4, 0.9, n),
        "tokens": np.full(n, 1000, dtype=np.int64),
    }
    return (ctx, cols, n, batch_key(ctx, batch, "step", "d"))


def _scalars(run: str, batch: str, steps: int) -> Part:
    ctx = {"tenant": "default", "run_id": run, "job_id": "j"}
    names = ["loss", "lr"]
    n = steps * len(names)
    cols: dict[str, Any] = {
        "step": np.repeat(np.arange(steps, dtype=np.int64), len(names)),
        "rank": np.zeros(n, dtype=np.int32),
        "time": 1.7e9 + np.repeat(np.arange(steps, dtype=np.float64), len(names)),
        "name": StringColumn(names, np.tile(np.arange(2, dtype=np.int32), steps)),
        "value": np.linspace(3.0, 1.0, n),
    }
    return (ctx, cols, n, batch_key(ctx, batch, "scalar", "d"))


def _mutations(store: ChdbStore) -> int:
    t = store.query("SELECT count() AS n FROM system.mutations WHERE database = 'fleetlens'")
    return int(t.column("n")[0].as_py())


def _view_equals_its_table(store: ChdbStore) -> None:
    """Every view of the store holds exactly what it computes of its table."""
    for view in store._views:
        names = [n for n, _ in view.keys]
        cols = [view.count_column]
        if "sum_duration" in view.select:
            cols.append("sum_duration")
        if "v_sum" in view.select:
            cols.append("v_sum")
        have = store.query(
            f"SELECT {view.key_names}, {', '.join(f'sum({c}) AS {c}' for c in cols)} "
            f"FROM fleetlens.{view.target} GROUP BY {view.key_names} ORDER BY {view.key_names}"
        ).to_pylist()
        want = store.query(
            f"SELECT * FROM ({view._select('fleetlens')}) ORDER BY {view.key_names}"
        ).to_pylist()
        assert len(have) == len(want), view.target
        for h, w in zip(have, want, strict=True):
            assert [h[k] for k in names] == [w[k] for k in names], view.target
            for c in cols:
                assert h[c] == pytest.approx(w[c]), (view.target, c)


@pytest.mark.parametrize(
    "missed", [(), ("steps_by_step",), (*_STEP_VIEWS, "rollup_scalars_10s", "rollup_scalars_1m")]
)
def test_a_large_interrupted_insert_is_settled_without_rewriting_groups(
    tmp_path: Path, missed: tuple[str, ...]
) -> None:
    store = ChdbStore(str(tmp_path / "t"))
    path = str(tmp_path / "t" / "ingest.ledger")
    try:
        ledger = Ledger(path, store.settle)
        earlier = _steps("r", "earlier", 50, 8)  # committed before: its groups overlap
        ledger.intend([("step", earlier[3], earlier[2])])
        store.insert_rows("step", merged_table("step", [earlier]))
        ledger.commit()
        big = _steps("r", "big", 5000, 8)  # 40,000 rank-steps over 5,000 distinct steps
        scalars = _scalars("r", "big", 5000)
        ledger.intend([("step", big[3], big[2]), ("scalar", scalars[3], scalars[2])])
        # The kill fell after the tables' inserts and before these views' (detached, they
        # miss exactly this insert, as the engine stopped between the two would).
        for view in missed:
            store.command(f"DETACH TABLE fleetlens.{view}_mv")
        store.insert_rows("step", merged_table("step", [big]))
        store.insert_rows("scalar", merged_table("scalar", [scalars]))
        for view in missed:
            store.command(f"ATTACH TABLE fleetlens.{view}_mv")
        ledger.close()
        before = _mutations(store)
        ledger = Ledger(path, store.settle)
        assert ledger.recovered == 2 and ledger.stored(big[3]) and ledger.stored(scalars[3])
        assert _mutations(store) == before  # settled by reading and adding, nothing rewritten
        _view_equals_its_table(store)
        first = store.query(
            "SELECT name, argMinMerge(first) AS v FROM fleetlens.rollup_scalars_1m "
            "GROUP BY name ORDER BY name"
        ).to_pylist()
        assert [(r["name"], r["v"]) for r in first] == [
            ("loss", 3.0),
            ("lr", pytest.approx(3.0 - 2.0 / 9999)),
        ]
    finally:
        store.close()
