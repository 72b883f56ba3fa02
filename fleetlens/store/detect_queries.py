"""Window queries that feed the detection analyses, bound to one tenant.

Each returns arrays (or a few rows) for one run and job attempt over a step or time window; the
analyses in :mod:`fleetlens.analysis` turn them into findings. Aliases carry a prefix because
ClickHouse resolves a bare column name inside an aggregate to a same-named alias.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .ddl import COMPUTE_SQL
from .device_queries import DeviceQueries
from .telemetry import TelemetryStore

__all__ = [
    "DetectQueries",
    "JobSpan",
    "Placement",
    "StepMatrix",
    "by_arrival",
    "by_placed_span",
    "rank_cap",
]

Arr = np.ndarray[Any, Any]
T = TypeVar("T")
log = logging.getLogger("fleetlens.analyzer")


def by_arrival(compute: Arr, backward: Arr, comm: Arr) -> Arr:
    """Compute judged by each rank's arrival where a step's phases hold its waiting.

    A job timed by phases alone (another framework, no hook: no rank measured ``comm``) has its
    ranks' wait for each other inside the phase that synchronizes them: in DDP ``backward``,
    where the all-reduce ends. Every rank leaves that phase together, so the last to arrive
    spent least in it. Its compute is then what came before the phase plus the step's shortest
    backward (the one holding the least waiting): the slow rank keeps its longer forward, the
    others lose their wait. Steps where some rank measured its wait, or with fewer than two
    backward times, are left as they are."""
    rows = np.isnan(comm).all(axis=1) & (np.isfinite(backward).sum(axis=1) >= 2)
    if not rows.any():
        return compute
    out = compute.copy()
    bw = backward[rows]
    with np.errstate(all="ignore"):
        shortest = np.nanmin(bw, axis=1, keepdims=True)
    out[rows] = np.where(np.isfinite(bw), compute[rows] - bw + shortest, compute[rows])
    return out


def rank_cap(world: int, distinct: int) -> int:
    """How wide a per-rank array of a job may be: its world (ranks reported per step, or
    declared) or a few times the distinct ranks seen, never what one stray rank number says."""
    return max(world, 4 * distinct + 1024)


def by_placed_span(
    placed: dict[str, list[tuple[float, float]]], nodes: list[str], t0: float, t1: float
) -> dict[tuple[float, float], list[str]]:
    """``nodes`` grouped by the part of [t0, t1] during which the run was placed on each
    (:meth:`DetectQueries.placed`); a node the run was not on then is left out."""
    out: dict[tuple[float, float], list[str]] = {}
    for n in sorted(set(nodes)):
        for a, b in placed.get(n, []):
            lo, hi = max(t0, a), min(t1, b)
            if lo <= hi:
                out.setdefault((lo, hi), []).append(n)
    return out


@dataclass(frozen=True)
class JobSpan:
    job_id: str
    first_step: int
    last_step: int
    start: float
    end: float
    world: int


@dataclass
class StepMatrix:
    steps: Arr  # (S,)
    world: int
    compute: Arr  # (S, W)
    comm: Arr
    data_wait: Arr
    start: Arr  # (S,) first start of the step
    end: Arr  # (S,) last end of the step

    def rows(self, lo: int, hi: int) -> StepMatrix:
        """Its steps ``lo..hi`` (views, as read-only as the arrays they are cut from)."""
        a, b = (int(i) for i in np.searchsorted(self.steps, [lo, hi + 1]))
        cut = slice(a, b)
        return StepMatrix(
            self.steps[cut],
            self.world,
            self.compute[cut],
            self.comm[cut],
            self.data_wait[cut],
            self.start[cut],
            self.end[cut],
        )


@dataclass
class Placement:
    node: list[str]
    gpu: Arr
    rack: list[str]
    switch: list[str]
    nvlink_domain: list[str]

    def of(self, rank: int) -> tuple[str, int, str]:
        if 0 <= rank < len(self.node):
            return self.node[rank], int(self.gpu[rank]), self.rack[rank]
        return "", -1, ""


class DetectQueries(DeviceQueries):
    """The windows the analysis loop reads for one tenant: attempts, step matrices, placement,
    heartbeats, events, scalars, collectives, and (:class:`DeviceQueries`) the devices'.

    An instance is one read (the loop makes one a run and pass): a step window or a placement
    asked again of it is the one it loaded (read-only), so the stages of a pass judge the same
    rows, and the window is read once, not once a stage."""

    _MEMO = 8  # windows kept: the stages of one pass ask for two or three

    def __init__(self, telemetry: TelemetryStore, tenant: str) -> None:
        super().__init__(telemetry, tenant)
        self._memo: dict[tuple[Any, ...], Any] = {}

    def _once(self, key: tuple[Any, ...], load: Callable[[], T]) -> T:
        """What ``load`` read for ``key``, read the first time this reader is asked."""
        if key not in self._memo:
            if len(self._memo) >= self._MEMO:
                del self._memo[next(iter(self._memo))]
            self._memo[key] = value = load()
            return value
        kept: T = self._memo[key]
        return kept

    def jobs(self, run_id: str) -> list[JobSpan]:
        rows = self.r.table(
            "SELECT j_job, min(j_step) AS lo, max(j_step) AS hi, min(j_start) AS t0, "
            "max(j_end) AS t1, max(j_ranks) AS w FROM ("
            " SELECT job_id AS j_job, step AS j_step, sum(ranks) AS j_ranks, min(start) AS j_start,"
            " max(end) AS j_end FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} GROUP BY job_id, step)"
            " GROUP BY j_job ORDER BY t0",
            run=run_id,
        ).to_pylist()
        return [
            JobSpan(
                r["j_job"], int(r["lo"]), int(r["hi"]), float(r["t0"]), float(r["t1"]), int(r["w"])
            )
            for r in rows
        ]

    def step_matrix(self, run_id: str, job_id: str, lo: int, hi: int, world: int) -> StepMatrix:
        """Per-rank compute, comm and data wait of steps ``lo..hi`` of one attempt: the rows of
        a wider window of this pass that holds them (one read for the pass's windows, the
        analyzer's :func:`fleetlens.services.analyzer.analyze_run`), or read."""

        def load() -> StepMatrix:
            wide = self._holding(run_id, job_id, lo, hi, world)
            if wide is not None:
                return wide.rows(lo, hi)
            m = self._step_matrix(run_id, job_id, lo, hi, world)
            for a in (m.steps, m.compute, m.comm, m.data_wait, m.start, m.end):
                a.setflags(write=False)
            return m

        return self._once(("steps", run_id, job_id, lo, hi, world), load)

    def _holding(self, run_id: str, job_id: str, lo: int, hi: int, world: int) -> StepMatrix | None:
        """A window read of the attempt covering ``lo..hi`` and exactly ``world`` wide: its rows
        are what a read of ``lo..hi`` gives (a wider one had ranks past the world in some of
        its steps, which a narrower read might not have)."""
        for key, m in self._memo.items():
            held = key[:3] == ("steps", run_id, job_id) and key[3] <= lo and hi <= key[4]
            if held and isinstance(m, StepMatrix) and key[5] == world == m.world:
                return m
        return None

    def _step_matrix(self, run_id: str, job_id: str, lo: int, hi: int, world: int) -> StepMatrix:
        tab = self.r.table(
            f"SELECT step, rank, {COMPUTE_SQL} AS m_compute, comm, data_wait, backward, time, "
            "duration "
            "FROM {db}.steps WHERE run_id = {run:String} "
            "AND job_id = {job:String} AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            job=job_id,
            lo=lo,
            hi=hi,
        )
        if not tab.num_rows:
            e = np.empty(0)
            return StepMatrix(
                np.empty(0, dtype=np.int64),
                world,
                np.empty((0, world)),
                np.empty((0, world)),
                np.empty((0, world)),
                e,
                e,
            )
        step = tab.column("step").to_numpy()
        rank = tab.column("rank").to_numpy().astype(np.int64)
        # Columns are ranks 0..W-1, so W comes from the ranks, but never from one absurd rank:
        # the matrix is at most the distinct ranks seen (x4, +1024 for sparse reporters) wide.
        cap = rank_cap(world, len(np.unique(rank)))
        keep = (rank >= 0) & (rank < cap)
        cols = {c: tab.column(c).to_numpy() for c in ("m_compute", "comm", "data_wait", "backward")}
        t = tab.column("time").to_numpy()
        e = t + tab.column("duration").to_numpy()
        if not keep.all():
            log.warning(
                "run %s job %s: %d rows with ranks outside 0..%d left out of the analysis",
                run_id,
                job_id,
                int((~keep).sum()),
                cap - 1,
            )
            step, rank, t, e = step[keep], rank[keep], t[keep], e[keep]
            cols = {c: v[keep] for c, v in cols.items()}
            if not len(step):
                return self._step_matrix(run_id, job_id, 1, 0, world)
        steps = np.unique(step)
        w = max(world, int(rank.max()) + 1 if len(rank) else 0)
        si = np.searchsorted(steps, step)
        shape = (len(steps), w)

        def grid(name: str) -> Arr:
            m = np.full(shape, np.nan)
            m[si, rank] = cols[name]
            return m

        start = np.full(len(steps), np.inf)
        end = np.full(len(steps), -np.inf)
        np.minimum.at(start, si, t)
        np.maximum.at(end, si, e)
        comm = grid("comm")
        compute = by_arrival(grid("m_compute"), grid("backward"), comm)
        return StepMatrix(steps, w, compute, comm, grid("data_wait"), start, end)

    def next_step(self, run_id: str, job_id: str, after: int) -> int | None:
        """The first step of the attempt after ``after`` (None: none), to skip a gap of steps."""
        rows = self.r.table(
            "SELECT min(step) AS n_step, count() AS n_rows FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " AND step > {after:Int64}",
            run=run_id,
            job=job_id,
            after=after,
        ).to_pylist()
        return int(rows[0]["n_step"]) if rows and rows[0]["n_rows"] else None

    def placement(self, run_id: str, job_id: str, world: int) -> Placement:

        def load() -> Placement:
            p = self._placement(run_id, job_id, world)
            p.gpu.setflags(write=False)
            return p

        return self._once(("placement", run_id, job_id, world), load)

    def _placement(self, run_id: str, job_id: str, world: int) -> Placement:
        rows = self.r.table(
            "SELECT rank AS p_rank, argMax(node_id, time) AS p_node, argMax(gpu, time) AS p_gpu,"
            " argMax(rack, time) AS p_rack, argMax(switch, time) AS p_switch,"
            " argMax(nvlink_domain, time) AS p_nvl FROM {db}.placement"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " GROUP BY rank",
            run=run_id,
            job=job_id,
        ).to_pylist()
        # One label per column of the attempt's step matrix (``world`` wide): a placed rank
        # beyond it (a worker of a wider formation that never stepped) has no column to label.
        cap = world if world > 0 else rank_cap(world, len(rows))
        rows = [r for r in rows if 0 <= int(r["p_rank"]) < cap]
        n = max([world] + [int(r["p_rank"]) + 1 for r in rows])
        node, rack, sw, nvl = [""] * n, [""] * n, [""] * n, [""] * n
        gpu = np.full(n, -1, dtype=np.int64)
        for r in rows:
            i = int(r["p_rank"])
            node[i], gpu[i], rack[i] = r["p_node"], int(r["p_gpu"]), r["p_rack"]
            sw[i], nvl[i] = r["p_switch"], r["p_nvl"]
        return Placement(node, gpu, rack, sw, nvl)

    def heartbeats(self, run_id: str, job_id: str) -> dict[int, tuple[float, int, str, float]]:
        """The newest heartbeat of each rank of an attempt: rank -> (time, step, phase, since)."""
        rows = self.r.table(
            "SELECT rank AS h_rank, max(time) AS h_time, argMax(step, time) AS h_step,"
            " argMax(phase, time) AS h_phase, argMax(since, time) AS h_since FROM {db}.heartbeats"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " GROUP BY rank",
            run=run_id,
            job=job_id,
        ).to_pylist()
        return {
            int(r["h_rank"]): (
                float(r["h_time"]),
                int(r["h_step"]),
                str(r["h_phase"]),
                float(r["h_since"]),
            )
            for r in rows
        }

    def beat_interval(self, run_id: str, job_id: str) -> float | None:
        """How often the attempt's ranks beat: the median over ranks of each one's mean gap
        between heartbeats (None while no rank has beaten three times)."""
        rows = self.r.table(
            "SELECT (max(time) - min(time)) / (count() - 1) AS b_gap FROM {db}.heartbeats"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " GROUP BY rank HAVING count() >= 3",
            run=run_id,
            job=job_id,
        ).column("b_gap")
        gaps = [float(g) for g in rows.to_pylist() if g is not None and g > 0]
        return float(np.median(gaps)) if gaps else None

    def events(self, run_id: str, limit: int = 20_000) -> list[dict[str, Any]]:
        rows = self.r.table(
            "SELECT time, job_id, kind, step, rank, node_id, gpu, message, attrs FROM {db}.events"
            " WHERE run_id = {run:String}"
            " ORDER BY time LIMIT {limit:UInt32}",
            run=run_id,
            limit=limit,
        ).to_pylist()
        for r in rows:
            try:
                r["attrs"] = json.loads(r["attrs"] or "{}")
            except ValueError:
                r["attrs"] = {}
        return list(rows)

    def environments(self, run_id: str, job_id: str) -> list[dict[str, Any]]:
        """The environment each rank of attempt ``job_id`` reported at its start (its
        ``job_start`` event), whatever the run's other events."""
        return self.job_start(run_id, job_id)[1]

    def checkpoint_ends(self, run_id: str, limit: int = 10_000) -> list[dict[str, Any]]:
        """The run's newest ``limit`` ``checkpoint_end`` reports (time, job, step, rank and
        attributes), in time order: what ``analysis.timeline.save_pauses`` reads."""
        rows: list[dict[str, Any]] = self.r.table(
            "SELECT time, job_id, kind, step, rank, attrs FROM {db}.events"
            " WHERE run_id = {run:String} AND kind = 'checkpoint_end'"
            " ORDER BY time DESC LIMIT {limit:UInt32}",
            run=run_id,
            limit=limit,
        ).to_pylist()
        return rows[::-1]

    def job_start(self, run_id: str, job_id: str) -> tuple[float | None, list[dict[str, Any]]]:
        """When attempt ``job_id`` started (its ranks' earliest ``job_start`` event; None
        without one) and the environment each rank reported then."""
        rows = self.r.table(
            "SELECT time, attrs FROM {db}.events WHERE run_id = {run:String}"
            " AND job_id = {job:String} AND kind = 'job_start' LIMIT 100000",
            run=run_id,
            job=job_id,
        ).to_pylist()
        out = []
        for r in rows:
            try:
                env = json.loads(r["attrs"] or "{}").get("environment")
            except (ValueError, AttributeError):
                continue
            if isinstance(env, dict):
                out.append(env)
        return (min(float(r["time"]) for r in rows) if rows else None), out

    def scalars(
        self, run_id: str, names: list[str], lo: int, hi: int, job_id: str = ""
    ) -> dict[str, tuple[Arr, Arr]]:
        """Per name, (steps, values) of ``lo..hi``. A step logged more than once (by several
        ranks, or by two attempts: a restart replays the steps since its checkpoint) takes the
        value of attempt ``job_id`` first, then of the lowest rank, then the earliest: one
        value whatever the order the rows are read in."""
        tab = self.r.table(
            "SELECT name, step, argMin(value, (job_id != {job:String}, rank, time)) AS v"
            " FROM {db}.scalars WHERE run_id = {run:String}"
            " AND name IN {names:Array(String)} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " GROUP BY name, step ORDER BY name, step",
            run=run_id,
            names=names,
            lo=lo,
            hi=hi,
            job=job_id,
        )
        out: dict[str, tuple[Arr, Arr]] = {}
        if not tab.num_rows:
            return out
        nm = np.asarray(tab.column("name").to_pylist(), dtype=object)
        st, v = tab.column("step").to_numpy(), tab.column("v").to_numpy()
        for n in names:
            sel = nm == n
            if sel.any():
                out[n] = (st[sel], v[sel])
        return out

    def rank_scalars(
        self, run_id: str, job_id: str, names: list[str], lo: int, hi: int
    ) -> dict[str, tuple[Arr, Arr, Arr]]:
        """Per-rank values of ``names`` over steps ``lo..hi`` of one attempt: name -> (steps,
        ranks, values), ordered by step."""
        tab = self.r.table(
            "SELECT name, step, rank, value FROM {db}.scalars"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " AND name IN {names:Array(String)} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
            " ORDER BY name, step, rank",
            run=run_id,
            job=job_id,
            names=names,
            lo=lo,
            hi=hi,
        )
        out: dict[str, tuple[Arr, Arr, Arr]] = {}
        if not tab.num_rows:
            return out
        nm = np.asarray(tab.column("name").to_pylist(), dtype=object)
        st, rk = tab.column("step").to_numpy(), tab.column("rank").to_numpy().astype(np.int64)
        v = tab.column("value").to_numpy().astype(np.float64)
        for n in names:
            sel = nm == n
            if sel.any():
                out[n] = (st[sel], rk[sel], v[sel])
        return out

    def collectives(self, run_id: str, job_id: str, lo: int, hi: int) -> dict[str, Arr]:
        tab = self.r.table(
            "SELECT step, seq, rank, enter, exit FROM {db}.collectives"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " AND step BETWEEN {lo:Int64} AND {hi:Int64}",
            run=run_id,
            job=job_id,
            lo=lo,
            hi=hi,
        )
        names = ("step", "seq", "rank", "enter", "exit")
        if not tab.num_rows:
            return {c: np.empty(0) for c in names}
        return {c: tab.column(c).to_numpy() for c in names}

    def step_at(self, run_id: str, job_id: str, t: float) -> int | None:
        """The step of an attempt that was running at time ``t`` (the last one begun by then)."""
        rows = self.r.table(
            "SELECT max(a_step) AS a_step, count() AS a_n FROM ("
            " SELECT step AS a_step, min(start) AS a_start FROM {db}.steps_by_step"
            " WHERE run_id = {run:String} AND job_id = {job:String}"
            " GROUP BY step) WHERE a_start <= {t:Float64}",
            run=run_id,
            job=job_id,
            t=t,
        ).to_pylist()
        return int(rows[0]["a_step"]) if rows and rows[0]["a_n"] else None
