"""``Client``: the fleetlens HTTP API from Python (notebooks, scripts, the CLI, the simulator).

    from fleetlens.client import Client

    with Client() as fl:                       # $FLEETLENS_SERVER, $FLEETLENS_TOKEN or defaults
        fl.runs()                              # [{"runId": ..., "status": ..., ...}, ...]
        fl.ranks("run-7", to_step=500)         # per-rank timing, slowest compute first
        fl.ranks("run-7", as_="pandas")        # the same rows as a DataFrame (needs pandas)
        fl.stragglers("run-7", as_="arrow")    # as a pyarrow Table (needs pyarrow)
        fl.goodput("run-7")["factors"]

The server and the token are resolved here and nowhere else: an explicit argument, then
``FLEETLENS_SERVER`` / ``FLEETLENS_TOKEN``, then ``http://127.0.0.1:8480`` and no token. Pass
``token=""`` to send no token whatever the environment says (a third-party receiver).

Methods that answer rows take ``as_``: ``"records"`` (a list of dicts, the default), ``"pandas"``,
``"arrow"``, or ``"json"`` (the server's whole document, as the CLI's ``--json`` prints it).

Errors are the package's own: :class:`fleetlens.errors.TransportError` when the server cannot be
reached, :class:`APIError` (a ``FleetlensError``) carrying ``status`` and the server's ``message``
when it answers 4xx/5xx, and :class:`APINotFound` (also a ``NotFound``) for a 404.

httpx is imported when the first client is made, so ``import fleetlens`` stays stdlib + msgspec.
"""

from __future__ import annotations

import base64
import json as _json
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from .config import DEFAULT_PORT
from .errors import APIError, APINotFound, ConfigError, FleetlensError, TransportError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_SERVER",
    "APIError",
    "APINotFound",
    "Client",
    "WindowFigures",
    "resolve_server",
    "resolve_token",
    "to_table",
]

DEFAULT_SERVER = f"http://127.0.0.1:{DEFAULT_PORT}"

As = Literal["records", "pandas", "arrow", "json"]


def resolve_server(server: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The server URL: ``server``, else ``$FLEETLENS_SERVER``, else the loopback default."""
    env = os.environ if environ is None else environ
    return str(server or env.get("FLEETLENS_SERVER") or DEFAULT_SERVER).rstrip("/")


def resolve_token(token: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The bearer token: ``token`` (``""`` = none), else ``$FLEETLENS_TOKEN``, else none."""
    if token is not None:
        return token
    env = os.environ if environ is None else environ
    return env.get("FLEETLENS_TOKEN", "")


class WindowFigures(msgspec.Struct, frozen=True, rename="camel"):
    """Of a run's ``metrics`` (``GET /v1/runs/{id}``: the latest value of every scalar by name,
    and the window's figures): the slowest rank's median step time and the tokens a second over
    the window, and the latest loss; None where the run has none."""

    step_time_ms: float | None = None
    tokens_per_second: float | None = None
    loss: float | None = None

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> WindowFigures:
        return msgspec.convert(metrics, cls)


class _DumpFile(msgspec.Struct):
    """A Flight Recorder dump as sent: its file name and its bytes, base64."""

    name: str
    data: str


class _FlightRecorderIn(msgspec.Struct, rename="camel", omit_defaults=True):
    """``POST /v1/runs/{id}/flight-recorder``'s body: the dumps, the job that wrote them."""

    files: list[_DumpFile]
    job_id: str = ""


def _quote(part: str) -> str:
    return urllib.parse.quote(str(part), safe="")


def _message(resp: httpx.Response) -> str:
    """The server's words: FastAPI's ``detail`` (or ``error``) when JSON, else the body."""
    text = resp.text
    try:
        body = _json.loads(text)
    except ValueError:
        return text[:2000]
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if key in body:
                value = body[key]
                return value if isinstance(value, str) else _json.dumps(value)
    return text[:2000]


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None


def to_table(rows: Iterable[Mapping[str, Any]], as_: As = "records") -> Any:
    """Rows as ``as_``: a list of dicts, a pandas DataFrame or a pyarrow Table."""
    records = [dict(r) for r in rows]
    if as_ in ("records", "json"):
        return records
    if as_ == "pandas":
        try:
            import pandas as pd  # type: ignore[import-untyped, import-not-found, unused-ignore]
        except ImportError as exc:
            raise FleetlensError("as_='pandas' needs pandas: pip install pandas") from exc
        return pd.DataFrame.from_records(records)
    if as_ == "arrow":
        try:
            import pyarrow as pa
        except ImportError as exc:
            raise FleetlensError("as_='arrow' needs pyarrow: pip install pyarrow") from exc
        return pa.Table.from_pylist(records)
    raise FleetlensError(f"as_={as_!r}; expected records, pandas, arrow or json")


class Client:
    """A connection to one fleetlens server; thread-safe, keeps its connections alive.

    ``service`` names another HTTP receiver this client speaks to (the alert notifiers use it
    for Alertmanager and webhooks, always with ``token=""``), for its error messages.
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        environ: Mapping[str, str] | None = None,
        service: str = "",
    ) -> None:
        import httpx

        self.service = service
        self.server = resolve_server(server, environ)
        self.token = resolve_token(token, environ)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def __repr__(self) -> str:
        return f"Client({self.server!r}, token={'set' if self.token else 'none'})"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- transport --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request; raises TransportError (unreachable) or APIError (4xx/5xx)."""
        import httpx

        query = {k: v for k, v in (params or {}).items() if v is not None}
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        try:
            resp = self._http.request(
                method,
                path,
                params=query or None,
                json=json,
                content=content,
                headers=dict(headers or {}),
                **extra,
            )
        except httpx.InvalidURL as exc:
            raise ConfigError(f"{method} {path}: not a valid URL ({exc})") from exc
        except httpx.HTTPError as exc:
            why = str(exc) or type(exc).__name__
            if self.service:
                raise TransportError(
                    f"cannot reach {self.service} at {self.server} ({why})"
                ) from exc
            raise TransportError(
                f"cannot reach the fleetlens server at {self.server} ({why}); start one with "
                "`fleetlens serve` or name it (--server URL, $FLEETLENS_SERVER)"
            ) from exc
        if resp.status_code >= 400:
            cls = APINotFound if resp.status_code == 404 else APIError
            raise cls(method, str(resp.url), resp.status_code, _message(resp), _retry_after(resp))
        return resp

    def get(self, path: str, **params: Any) -> Any:
        """``GET path?params`` (None values left out); the decoded JSON."""
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: Any = None) -> Any:
        """``POST path`` with ``body`` as JSON (no body when None); the decoded JSON or None."""
        resp = self.request("POST", path, json=body)
        return resp.json() if resp.content else None

    def delete(self, path: str) -> Any:
        resp = self.request("DELETE", path)
        return resp.json() if resp.content else None

    def ingest(self, body: bytes, *, gzip: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        """POST one encoded batch (MessagePack; gzip-compressed when ``gzip``) to the collector."""
        headers = {"Content-Type": "application/msgpack"}
        if gzip:
            headers["Content-Encoding"] = "gzip"
        resp = self.request("POST", "/v1/ingest", content=body, headers=headers, timeout=timeout)
        return dict(resp.json())

    # -- the API ----------------------------------------------------------------------------

    def _rows(self, doc: dict[str, Any], key: str, as_: As) -> Any:
        return doc if as_ == "json" else to_table(doc[key], as_)

    def runs(
        self, project: str | None = None, limit: int | None = None, as_: As = "records"
    ) -> Any:
        """Runs, most recently active first."""
        return self._rows(self.get("/v1/runs", project=project, limit=limit), "runs", as_)

    def run(self, run_id: str) -> dict[str, Any]:
        """One run: status, step, tokens, step time, tokens/s, latest scalars, config."""
        return dict(self.get(f"/v1/runs/{_quote(run_id)}"))

    def ranks(
        self,
        run_id: str,
        *,
        sort: str = "compute",
        order: str = "desc",
        from_step: int | None = None,
        to_step: int | None = None,
        limit: int | None = None,
        as_: As = "records",
    ) -> Any:
        """Per rank over a step window: compute, wait, step time, with node, GPU and rack."""
        doc = self.get(
            f"/v1/runs/{_quote(run_id)}/ranks",
            sort=sort,
            order=order,
            fromStep=from_step,
            toStep=to_step,
            limit=limit,
        )
        return self._rows(doc, "ranks", as_)

    def timeline(
        self,
        run_id: str,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        as_: As = "records",
    ) -> Any:
        """Events and metric changes (LR moves, spikes, NaN) in step order."""
        doc = self.get(f"/v1/runs/{_quote(run_id)}/timeline", fromStep=from_step, toStep=to_step)
        return self._rows(doc, "items", as_)

    def goodput(
        self,
        run_id: str,
        *,
        price: float | None = None,
        scheduling: float | None = None,
        accelerator: str | None = None,
        dtype: str | None = None,
        ceilings: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """Where the run's time went, its goodput factors, equation 4 measured and predicted,
        MFU/HFU/MBU, checkpoint and cost advice, and each lever's gain at its ceiling."""
        caps = ",".join(f"{k}={v}" for k, v in ceilings.items()) if ceilings else None
        return dict(
            self.get(
                f"/v1/runs/{_quote(run_id)}/goodput",
                price=price,
                scheduling=scheduling,
                accelerator=accelerator,
                dtype=dtype,
                ceilings=caps,
            )
        )

    def whatif(self, run_id: str, change: dict[str, Any]) -> dict[str, Any]:
        """A change (``after``, ``ratios``, ``terms``; optional ``scheduling``, ``from``/``to``,
        ``accelerator``) judged by the product of its ratios against the run's factors."""
        return dict(self.post(f"/v1/runs/{_quote(run_id)}/whatif", change))

    def fleet_goodput(
        self,
        *,
        pool: str | None = None,
        since: float | None = None,
        until: float | None = None,
        as_: As = "records",
    ) -> Any:
        """Scheduling goodput, availability and queue waits per pool."""
        doc = self.get("/v1/fleet/goodput", pool=pool, **{"from": since, "to": until})
        return self._rows(doc, "pools", as_)

    def stragglers(self, run_id: str, *, as_: As = "records") -> Any:
        """The run's straggler findings with rank -> node -> GPU and evidence."""
        return self._rows(self.get(f"/v1/runs/{_quote(run_id)}/stragglers"), "stragglers", as_)

    def diagnosis(self, run_id: str, *, as_: As = "records") -> Any:
        """The run's findings: root cause, owner, confidence, evidence."""
        return self._rows(self.get(f"/v1/runs/{_quote(run_id)}/diagnosis"), "findings", as_)

    def straggler_whatif(
        self, run_id: str, from_step: int | None = None, to_step: int | None = None
    ) -> dict[str, Any]:
        """How much faster the run would be with each type, worker or stage at its peers'
        median, and with each finding fixed (``GET /v1/runs/{id}/whatif/stragglers``)."""
        path = f"/v1/runs/{_quote(run_id)}/whatif/stragglers"
        return dict(self.get(path, fromStep=from_step, toStep=to_step))

    def flight_recorder(
        self,
        run_id: str,
        files: Iterable[str | os.PathLike[str] | tuple[str, bytes]],
        *,
        job_id: str | None = None,
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        """Send a job's NCCL Flight Recorder dumps (paths, or ``(name, bytes)``) as PyTorch wrote
        them; the answer names the stuck collectives and the missing ranks, stored as findings.
        A file's rank is the number that ends its name (``nccl_trace_rank_12``)."""
        sent = []
        for f in files:
            if isinstance(f, tuple):
                name, data = f
            else:
                with open(f, "rb") as fh:
                    data = fh.read()
                name = os.path.basename(os.fspath(f))
            sent.append(_DumpFile(name, base64.b64encode(data).decode("ascii")))
        body = msgspec.to_builtins(_FlightRecorderIn(sent, job_id or ""))
        path = f"/v1/runs/{_quote(run_id)}/flight-recorder"
        return dict(self.request("POST", path, json=body, timeout=timeout).json())

    def metrics(
        self,
        run_id: str,
        name: str,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        points: int | None = None,
        as_: As = "records",
    ) -> Any:
        """One scalar series (``step``, ``value``, ``min``, ``max``, ``mean`` per point)."""
        doc = self.get(
            f"/v1/runs/{_quote(run_id)}/metrics",
            name=name,
            fromStep=from_step,
            toStep=to_step,
            points=points,
        )
        return self._rows(doc, "points", as_)

    def compare(self, baseline: str, other: str, *more: str) -> dict[str, Any]:
        """Config, dataset and code diff, speed, goodput, loss and a likely cause."""
        return dict(self.get("/v1/runs/compare", runs=",".join((baseline, other, *more))))

    def alerts(
        self,
        *,
        state: str | None = None,
        run_id: str | None = None,
        limit: int | None = None,
        as_: As = "records",
    ) -> Any:
        """Alerts on job impact, newest first (``state``: firing or resolved)."""
        doc = self.get("/v1/alerts", state=state, runId=run_id, limit=limit)
        return self._rows(doc, "alerts", as_)

    def incidents(
        self,
        *,
        state: str | None = None,
        since: float | None = None,
        run_id: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        as_: As = "records",
    ) -> Any:
        """Incidents, newest first: alerts grouped per run and failures no alert raised, with
        diagnosis, owner, nodes and ranks (``state``: open, closed or unalerted)."""
        doc = self.get(
            "/v1/incidents", state=state, since=since, runId=run_id, limit=limit, offset=offset
        )
        return self._rows(doc, "incidents", as_)

    def preserved(
        self, run_id: str, *, limit: int | None = None, offset: int | None = None
    ) -> dict[str, Any]:
        """A run's preserved failure windows: when, why, bounds, rows kept per table."""
        path = f"/v1/runs/{_quote(run_id)}/preserved"
        return dict(self.get(path, limit=limit, offset=offset))

    def preserved_rows(
        self,
        run_id: str,
        window_id: int,
        table: str = "steps",
        *,
        limit: int | None = None,
        offset: int | None = None,
        as_: As = "records",
    ) -> Any:
        """The rows of ``table`` kept in one failure window, in time order, a page at a time."""
        path = f"/v1/runs/{_quote(run_id)}/preserved/{int(window_id)}"
        doc = self.get(path, table=table, limit=limit, offset=offset)
        return self._rows(doc, "rows", as_)
