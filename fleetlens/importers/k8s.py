"""Kubernetes pods and events: ``kubectl get pods,events -o json`` into allocations per job.

The input is the ``v1 List`` kubectl prints (items of kind ``Pod`` and ``Event``; a single Pod or
a ``PodList`` is read too). Pods are grouped into jobs by the label their controller sets
(:data:`JOB_LABELS`, first found), else by their controlling owner, else each pod is its own job;
a job id is ``namespace/name``. Per pod:

- GPUs: ``nvidia.com/gpu`` of its containers' limits (else requests), summed; an init container
  holding more counts instead (the scheduler reserves the larger of the two).
- submit: ``metadata.creationTimestamp``;
- scheduled: the ``PodScheduled`` condition's ``lastTransitionTime`` when ``True``, else the
  time of the pod's ``Scheduled`` event;
- released: the last ``finishedAt`` of its terminated containers, once the pod has Succeeded
  or Failed (NaN while it runs).

A job (a gang) starts when its first pod is bound and is complete when its last one is
(``gang_complete``); a gang some of whose pods were never bound never completes
(``gang_complete`` is +inf): all of its held time is a partial-gang loss. The last
``FailedScheduling`` message of a job's pending pods is kept as its pending reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from ..errors import TraceFormatError
from . import Allocations

__all__ = ["GPU_RESOURCE", "JOB_LABELS", "KubeJobs", "parse_k8s"]

GPU_RESOURCE = "nvidia.com/gpu"
JOB_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "volcano.sh/job-name",
    "scheduling.x-k8s.io/pod-group",
    "pod-group.scheduling.sigs.k8s.io",
    "batch.kubernetes.io/job-name",
    "job-name",
)


@dataclass
class _Pod:
    job: str
    gpus: int
    created: float
    scheduled: float
    end: float
    phase: str


@dataclass(frozen=True)
class KubeJobs:
    allocations: Allocations
    pods: dict[str, int]  # pods per job
    pending_reasons: dict[str, str] = field(default_factory=dict)


def _time(value: Any, where: str) -> float:
    if value in (None, ""):
        return math.nan
    if not isinstance(value, str):
        raise TraceFormatError(f"{where} is {value!r}; expected an RFC 3339 time")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TraceFormatError(
            f"{where} is {value!r}; expected an RFC 3339 time like 2024-05-01T12:00:00Z"
        ) from None


def _quantity(v: Any, where: str) -> int:
    try:
        return int(str(v))
    except ValueError:
        raise TraceFormatError(f"{where} is {v!r}; GPUs are a whole number") from None


def _gpus(spec: Mapping[str, Any], where: str) -> int:
    def of(c: Mapping[str, Any], i: int, kind: str) -> int:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            v = (res.get(part) or {}).get(GPU_RESOURCE)
            if v is not None:
                return _quantity(v, f"{where}.spec.{kind}[{i}].resources.{part}[{GPU_RESOURCE}]")
        return 0

    main = sum(of(c, i, "containers") for i, c in enumerate(spec.get("containers") or []))
    init = [of(c, i, "initContainers") for i, c in enumerate(spec.get("initContainers") or [])]
    return max([main, *init])


def _job(meta: Mapping[str, Any]) -> str:
    ns = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    for key in JOB_LABELS:
        if labels.get(key):
            return f"{ns}/{labels[key]}"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller") and owner.get("name"):
            return f"{ns}/{owner['name']}"
    return f"{ns}/{meta.get('name', '')}"


def _pod(item: Mapping[str, Any], where: str, scheduled_events: dict[str, float]) -> _Pod:
    meta = item.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise TraceFormatError(f"{where}: a Pod without metadata.name")
    status = item.get("status") or {}
    created = _time(meta.get("creationTimestamp"), f"{where}.metadata.creationTimestamp")
    if math.isnan(created):
        raise TraceFormatError(f"{where} (pod {name}): metadata.creationTimestamp is missing")
    scheduled = math.nan
    for i, c in enumerate(status.get("conditions") or []):
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            scheduled = _time(
                c.get("lastTransitionTime"), f"{where}.status.conditions[{i}].lastTransitionTime"
            )
    key = f"{meta.get('namespace') or 'default'}/{name}"
    if math.isnan(scheduled):
        scheduled = scheduled_events.get(key, math.nan)
    phase = str(status.get("phase") or "Unknown")
    end = math.nan
    if phase in ("Succeeded", "Failed"):
        finished = [
            _time(
                (s.get("state") or {}).get("terminated", {}).get("finishedAt"),
                f"{where}.status.containerStatuses[{i}].state.terminated.finishedAt",
            )
            for i, s in enumerate(status.get("containerStatuses") or [])
        ]
        finished = [t for t in finished if not math.isnan(t)]
        if finished:
            end = max(finished)
    return _Pod(_job(meta), _gpus(item.get("spec") or {}, where), created, scheduled, end, phase)


def _event_time(ev: Mapping[str, Any], where: str) -> float:
    for key in ("eventTime", "firstTimestamp", "lastTimestamp"):
        t = _time(ev.get(key), f"{where}.{key}")
        if not math.isnan(t):
            return t
    meta = ev.get("metadata") or {}
    return _time(meta.get("creationTimestamp"), f"{where}.metadata.creationTimestamp")


def _items(doc: Any) -> list[Mapping[str, Any]]:
    if not isinstance(doc, Mapping):
        raise TraceFormatError("expected the JSON object `kubectl get pods,events -o json` prints")
    if doc.get("kind") in ("Pod", "Event"):
        return [doc]
    items = doc.get("items")
    if not isinstance(items, list):
        raise TraceFormatError(
            f"a {doc.get('kind') or 'JSON object'} without `items`; expected the v1 List of "
            "`kubectl get pods,events -o json`"
        )
    return items


def parse_k8s(doc: Any, pool: str = "k8s", gpu_only: bool = True) -> KubeJobs:
    """Jobs' allocation intervals from a parsed ``kubectl get pods,events -o json`` document."""
    items = _items(doc)
    scheduled: dict[str, float] = {}
    failed: dict[str, tuple[float, str]] = {}
    for i, it in enumerate(items):
        if not isinstance(it, Mapping):
            raise TraceFormatError(f"items[{i}] is not an object")
        if it.get("kind") != "Event":
            continue
        obj = it.get("involvedObject") or {}
        if obj.get("kind") != "Pod":
            continue
        key = f"{obj.get('namespace') or 'default'}/{obj.get('name', '')}"
        t = _event_time(it, f"items[{i}]")
        if it.get("reason") == "Scheduled":
            scheduled[key] = min(t, scheduled.get(key, math.inf))
        elif it.get("reason") == "FailedScheduling" and t >= failed.get(key, (-math.inf, ""))[0]:
            failed[key] = (t, str(it.get("message") or ""))
    pods: list[_Pod] = []
    reasons: dict[str, str] = {}
    for i, it in enumerate(items):
        if it.get("kind") not in ("Pod", None) or (it.get("kind") is None and "spec" not in it):
            continue
        p = _pod(it, f"items[{i}]", scheduled)
        if gpu_only and p.gpus == 0:
            continue
        pods.append(p)
        meta = it.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if math.isnan(p.scheduled) and key in failed:
            reasons[p.job] = failed[key][1]
    jobs: dict[str, list[_Pod]] = {}
    for p in pods:
        jobs.setdefault(p.job, []).append(p)
    names = sorted(jobs, key=lambda j: (min(p.created for p in jobs[j]), j))
    rows = []
    for j in names:
        ps = jobs[j]
        sched = [p.scheduled for p in ps]
        ends = [p.end for p in ps]
        bound = [t for t in sched if not math.isnan(t)]
        start = min(bound) if bound else math.nan
        end = max(ends) if all(not math.isnan(t) for t in ends) else math.nan
        # A gang some of whose pods were never bound never completes: +inf, so that all of the
        # time it held GPUs is a partial-gang loss.
        gang = max(bound) if len(bound) == len(ps) else (math.inf if bound else math.nan)
        phases = {p.phase for p in ps}
        state = next(
            (s for s in ("Failed", "Pending", "Running", "Unknown") if s in phases), "Succeeded"
        )
        rows.append(
            (j, sum(p.gpus for p in ps), min(p.created for p in ps), start, gang, end, state)
        )
    k = len(rows)
    gpus = np.array([r[1] for r in rows], dtype=np.int32)
    alloc = Allocations(
        pool=np.array([pool] * k, dtype=object),
        job_id=np.array([r[0] for r in rows], dtype=object),
        run_id=np.array([""] * k, dtype=object),
        gpus=gpus,
        gpu_share=gpus.astype(np.float64),
        submit=np.array([r[2] for r in rows], dtype=np.float64),
        start=np.array([r[3] for r in rows], dtype=np.float64),
        gang_complete=np.array([r[4] for r in rows], dtype=np.float64),
        end=np.array([r[5] for r in rows], dtype=np.float64),
        state=np.array([r[6] for r in rows], dtype=object),
    )
    return KubeJobs(alloc, {j: len(jobs[j]) for j in names}, reasons)
