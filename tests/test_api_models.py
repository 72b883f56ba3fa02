"""The read API's JSON is its response models: every core read route of a real ``fleetlens
serve``, fed a simulated run with faults, answers JSON that its pydantic model decodes without
loss and that the OpenAPI document's schema for that route accepts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pydantic
import pytest

from fleetlens.api import fleet_models as fm
from fleetlens.api import goodput_models as gm
from fleetlens.api import models as m
from fleetlens.api import scheduler_models as sm
from fleetlens.sim import run_scenario
from fleetlens.testing import Server
from fleetlens.wire import TableBuilder, encode_batch

pytestmark = pytest.mark.e2e

RUN = "api-models"
EMPTY = "api-models-no-steps"
PRICE = 2.5

SCENARIO = f"""
extends: _small
description: "a straggler, a thermal GPU, then NaN and a restart"
job: {{run_id: {RUN}, project: api, steps: 900}}
faults:
  - {{kind: straggler.persistent, step: 100, duration_steps: 700, ranks: [13], magnitude: 0.15}}
  - {{kind: thermal, step: 200, duration_steps: 300, ranks: [41], magnitude: 0.2}}
  - {{kind: instability, step: 600, duration_steps: 30, lr_factor: 10.0}}
"""

# The route as OpenAPI names it, a request of it, and its model.
ROUTES: list[tuple[str, str, type[m.ApiModel]]] = [
    ("/v1/runs", "/v1/runs", m.RunListOut),
    ("/v1/runs/{run_id}", f"/v1/runs/{RUN}", m.RunDetailOut),
    ("/v1/runs/{run_id}/ranks", f"/v1/runs/{RUN}/ranks?limit=64", m.RanksOut),
    ("/v1/runs/{run_id}/timeline", f"/v1/runs/{RUN}/timeline?fromStep=0&toStep=900", m.TimelineOut),
    ("/v1/runs/{run_id}/stragglers", f"/v1/runs/{RUN}/stragglers", m.StragglersOut),
    ("/v1/runs/{run_id}/diagnosis", f"/v1/runs/{RUN}/diagnosis", m.DiagnosisOut),
    ("/v1/runs/{run_id}/goodput", f"/v1/runs/{RUN}/goodput?price={PRICE}", gm.RunGoodputOut),
    ("/v1/fleet/goodput", "/v1/fleet/goodput", fm.FleetGoodputOut),
    ("/v1/scheduler/allocations", "/v1/scheduler/allocations", sm.AllocationsOut),
    ("/v1/scheduler/capacity", "/v1/scheduler/capacity", sm.CapacityOut),
]


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with the scenario played into it and analysed, and a run that has no steps."""
    root = tmp_path_factory.mktemp("api-models")
    scenario = root / "scenario.yaml"
    scenario.write_text(SCENARIO)
    srv = Server(str(root / "data"), env={"FLEETLENS_ANALYSIS_INTERVAL_S": "0.5"}).start()
    try:
        run_scenario(scenario, server=srv.url, speed=0)
        _send_scalar_with_nan(srv)
        _send_run_without_steps(srv)
        deadline = time.monotonic() + 60
        found: set[str] = set()
        while time.monotonic() < deadline:
            found = {f["diagnosis"] for f in srv.get(f"/v1/runs/{RUN}/diagnosis")["findings"]}
            if "straggler.persistent" in found and len(found) >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the analysis found only {found}:\n{srv.log()}")
        yield srv
    finally:
        srv.stop()


def _send_scalar_with_nan(srv: Server) -> None:
    """A scalar that goes NaN at step 700: the timeline lists it with the value "nan"."""
    t0 = srv.get(f"/v1/runs/{RUN}")["firstSeen"]
    steps = list(range(0, 900, 10))
    values = [2.0 - 0.001 * s if s != 700 else float("nan") for s in steps]
    scalars = TableBuilder("scalar").add("step", steps).add("time", [t0 + s for s in steps])
    scalars.add("name", ["val_loss"] * len(steps)).add("value", values)
    ctx = {"run_id": RUN, "job_id": f"{RUN}-a1", "project": "api"}
    status, answer, _ = srv.post(encode_batch({"scalar": scalars.build()}, ctx)[1])
    assert status == 200, answer


def _send_run_without_steps(srv: Server) -> None:
    events = TableBuilder("event")
    events.add("time", [time.time()]).add("kind", ["job_start"]).add("step", [-1])
    events.add("message", [""]).add("attrs", [json.dumps({"config": {"lr": 1e-4}})])
    _, body = encode_batch({"event": events.build()}, {"run_id": EMPTY, "job_id": "e-0"})
    status, answer, _ = srv.post(body)
    assert status == 200, answer


@pytest.fixture(scope="module")
def openapi(played: Server) -> dict[str, Any]:
    doc: dict[str, Any] = played.get("/openapi.json")
    return doc


def _schema_of(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    ok = openapi["paths"][path]["get"]["responses"]["200"]
    schema: dict[str, Any] = ok["content"]["application/json"]["schema"]
    return schema


def _validator(openapi: dict[str, Any], path: str) -> Any:
    """A JSON Schema validator of the route's answer, its ``$ref`` resolved in the document."""
    schema = {**_schema_of(openapi, path), "components": openapi["components"]}
    return jsonschema_rs.Draft202012Validator(schema)


@pytest.mark.parametrize(("path", "_request", "model"), ROUTES, ids=[r[0] for r in ROUTES])
def test_openapi_documents_the_route_s_model_in_camel_case(
    openapi: dict[str, Any], path: str, _request: str, model: type[m.ApiModel]
) -> None:
    assert _schema_of(openapi, path) == {"$ref": f"#/components/schemas/{model.__name__}"}
    props = openapi["components"]["schemas"][model.__name__]["properties"]
    assert set(props) == {f.alias or name for name, f in model.model_fields.items()}
    assert not [k for k in props if "_" in k], props
    # the models refuse keys they do not declare, and the document says so
    assert openapi["components"]["schemas"][model.__name__]["additionalProperties"] is False


@pytest.mark.parametrize(("path", "request_", "model"), ROUTES, ids=[r[0] for r in ROUTES])
def test_the_route_answers_its_model_and_its_openapi_schema(
    played: Server, openapi: dict[str, Any], path: str, request_: str, model: type[m.ApiModel]
) -> None:
    doc = played.get(request_)
    errors = [str(e) for e in _validator(openapi, path).iter_errors(doc)]
    assert not errors, errors
    decoded = model.model_validate(doc)  # extra keys refused, required keys demanded
    # lossless: the model gives back exactly the JSON, keys, values and number types
    again = json.loads(decoded.model_dump_json(by_alias=True, exclude_unset=True))
    assert again == doc
    assert _types(again) == _types(doc)


def _types(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _types(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_types(v) for v in x]
    return type(x).__name__


def test_the_data_reaches_every_branch_of_the_models(played: Server) -> None:
    """The answers above carry what the models' optional parts describe (else the schema
    checks would pass on thin data)."""
    run = played.get(f"/v1/runs/{RUN}")
    assert run["steps"] > 0 and run["window"]["toStep"] == run["step"]
    assert run["jobIds"] and len(run["jobIds"]) == run["jobs"] >= 2  # NaN, then a restart
    assert {"loss", "stepTimeMs", "tokensPerSecond"} <= set(run["metrics"])
    ranks = played.get(f"/v1/runs/{RUN}/ranks?limit=64")
    assert ranks["sort"] == "compute" and ranks["order"] == "desc" and len(ranks["ranks"]) == 64
    assert all(r["hardware"] is not None for r in ranks["ranks"])
    thermal = played.get(f"/v1/runs/{RUN}/ranks?fromStep=250&toStep=450&limit=64")["ranks"]
    hw = {r["rank"]: r["hardware"] for r in thermal}
    assert hw[41]["gpuTempMax"] > max(h["gpuTempMax"] for r, h in hw.items() if r != 41)
    items = played.get(f"/v1/runs/{RUN}/timeline?fromStep=0&toStep=900")["items"]
    assert {i["source"] for i in items} == {"event", "metric"}
    assert any(i["source"] == "metric" and i["value"] == "nan" for i in items)
    stragglers = played.get(f"/v1/runs/{RUN}/stragglers")["stragglers"]
    assert [13] in [s["ranks"] for s in stragglers]
    diagnosis = played.get(f"/v1/runs/{RUN}/diagnosis")
    assert sum(diagnosis["owners"].values()) == len(diagnosis["findings"])
    goodput = played.get(f"/v1/runs/{RUN}/goodput?price={PRICE}")
    assert {"checkpoint", "costPerUsefulHour", "chargebackPerUsefulHour"} <= set(goodput["advice"])
    seconds = sum(line["seconds"] for line in goodput["breakdown"]["lines"])
    assert seconds == pytest.approx(goodput["breakdown"]["wallSeconds"], rel=1e-9)
    assert played.get("/v1/fleet/goodput")["pools"]


def test_keys_a_route_leaves_out_stay_out(played: Server, openapi: dict[str, Any]) -> None:
    """A run without steps: no speed window, no sort of its (empty) ranks; no advice on cost
    without a price. The answers still meet their schemas."""
    run = played.get(f"/v1/runs/{EMPTY}")
    assert "window" not in run and run["steps"] == 0 and run["step"] is None
    assert run["config"] == {"lr": 1e-4}
    ranks = played.get(f"/v1/runs/{EMPTY}/ranks")
    assert ranks == {"runId": EMPTY, "fromStep": None, "toStep": None, "ranks": []}
    timeline = played.get(f"/v1/runs/{EMPTY}/timeline?fromStep=3")
    assert timeline == {"runId": EMPTY, "fromStep": 3, "toStep": None, "items": []}
    advice = played.get(f"/v1/runs/{RUN}/goodput")["advice"]
    assert "costPerUsefulHour" not in advice and "chargebackPerUsefulHour" not in advice
    for path, doc in [
        ("/v1/runs/{run_id}", run),
        ("/v1/runs/{run_id}/ranks", ranks),
        ("/v1/runs/{run_id}/timeline", timeline),
    ]:
        assert _validator(openapi, path).is_valid(doc), (path, doc)


def test_a_key_the_model_does_not_declare_or_a_missing_one_is_refused(played: Server) -> None:
    run = played.get(f"/v1/runs/{RUN}")
    with pytest.raises(pydantic.ValidationError, match="extra_forbidden"):
        m.RunDetailOut.model_validate({**run, "undeclared": 1})
    with pytest.raises(pydantic.ValidationError, match="missing"):
        m.RunDetailOut.model_validate({k: v for k, v in run.items() if k != "tokensProcessed"})
    rank = played.get(f"/v1/runs/{RUN}/ranks?limit=1")["ranks"][0]
    with pytest.raises(pydantic.ValidationError, match="extra_forbidden"):
        m.RankOut.model_validate({**rank, "hardware": {**rank["hardware"], "fanRpm": 1.0}})
