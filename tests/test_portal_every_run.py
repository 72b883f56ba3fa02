"""Every page of every kind of run, in Chromium, with no page error.

One server holds a run of every shipped simulator scenario (the two long ones shortened to a
few thousand steps) and every run the CLI makes from the real recordings in tests/data/real
(Megatron-DeepSpeed and Megatron-LM logs, Kineto traces, NCCL Flight Recorder dumps). The run,
rank and failure pages of each must load ("true", not "error"), with no JavaScript error, no
console error and no failed request. Before: a hang run's page never rendered (its evidence held
a list where the page formatted a number).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetlens.sim.library import list_scenarios, load_scenario, run_scenario
from fleetlens.testing import Server, wait_passes

from .test_cli import fleetlens_cmd

pytestmark = pytest.mark.e2e

REAL = Path(__file__).resolve().parent / "data" / "real"
FR = "nccl_flight_recorder/nvidia_resiliency_ext_16rank"
LONG = {"healthy_24h": 600, "mixed_54d": 2000, "demo": 1200}  # steps kept of the long ones
IMPORTS = {
    "real-meg-ds-3d": ("import", "megatron",
                       "training_logs/bigscience_megatron_deepspeed/meg_ds_3d_gpt2_perf_n16-ds-on.out"),
    "real-meg-tp4-pp8": ("import", "megatron",
                         "training_logs/bigscience_megatron_deepspeed/meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out"),
    "real-meg-golden": ("import", "megatron", "training_logs/megatron_lm_ci_golden_values/"
                        "gpt3_15b_8t_release__golden_values_dev_dgx_h100.json"),
    "real-kineto-w128": ("traces", "import", "kineto_traces/hta/trace_filter_world128"),
    "real-kineto-w16": ("traces", "import", "kineto_traces/hta/world16_a100_80gb/rank0.json.gz"),
    "real-kineto-amd": ("traces", "import",
                        "kineto_traces/hta/amd_rocm/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    "real-pp-1f1b": ("traces", "import", "--as-run", "../recorded/torch_pipelining_pp2_dp2"),
    "real-fr-gpu-error": ("fr", "import", f"{FR}/gpu_error_1st"),
    "real-fr-lock-gil": ("fr", "import", f"{FR}/lock_gil_1st"),
}  # fmt: skip
LAYOUT = "real-meg-tp4-pp8"  # a Megatron log's tp 4 x pp 8: its layout shows on the pages
PIPE = "real-pp-1f1b"  # a 1F1B job's traces: its stage imbalance priced by the what-if


@pytest.fixture(scope="module")
def every_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[str]]]:
    srv = Server(str(tmp_path_factory.mktemp("every") / "data")).start()
    try:
        runs = []
        for name in sorted(list_scenarios()):
            scn = load_scenario(name)
            if name in LONG:
                scn = dataclasses.replace(scn, job=dataclasses.replace(scn.job, steps=LONG[name]))
            runs.append(run_scenario(scn, server=srv.url, speed=0).truth.run_id)
        for run, (*command, path) in IMPORTS.items():
            done = fleetlens_cmd(*command, str(REAL / path), "--run", run, "--server", srv.url,
                                 timeout=300)  # fmt: skip
            assert done.returncode == 0, (run, done.stderr[-2000:])
            runs.append(run)
        wait_passes(srv, 2, timeout=300)  # the findings are on the pages
        yield srv, runs
    finally:
        srv.stop()


def _errors_of(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"JavaScript: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"failed {r.url}"))
    return errors


def test_the_run_rank_and_failure_pages_of_every_run_load_without_an_error(
    every_run: tuple[Server, list[str]], browser: Any
) -> None:
    srv, runs = every_run
    assert len(runs) == len(list_scenarios()) + len(IMPORTS)
    listed = {r["runId"] for r in srv.get("/v1/runs?limit=1000")["runs"]}
    assert set(runs) <= listed, set(runs) - listed
    broken, pages = [], 0
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        for run in runs:
            for path in (f"/runs/{run}", f"/runs/{run}/ranks/0", f"/runs/{run}/failure"):
                page = ctx.new_page()
                errors = _errors_of(page)
                page.goto(srv.url + path)
                page.wait_for_selector("body[data-loaded]", timeout=60_000)
                state = page.get_attribute("body", "data-loaded")
                if path == f"/runs/{run}":  # the heatmap and traces below the fold, too
                    page.wait_for_selector("body[data-painted=true]", timeout=60_000)
                    page.locator("#heatmap").scroll_into_view_if_needed()
                    page.wait_for_load_state("networkidle")
                if run == LAYOUT and state == "true" and not path.endswith("/failure"):
                    # the parallel layout, on the run and rank pages
                    at = "#now" if path == f"/runs/{run}" else "#rank-where"
                    want = "tp 4 · pp 8" if at == "#now" else "pipeline stage 0 of 8"
                    if want not in page.inner_text(at):
                        broken.append(f"{path}: {want!r} not in {page.inner_text(at)!r}")
                if run == PIPE and path == f"/runs/{run}" and state == "true":
                    page.wait_for_function("document.getElementById('whatif-note').textContent")
                    note = page.inner_text("#whatif-note")
                    if "Uneven pipeline stages (ranks 2, 3)" not in note:
                        broken.append(f"{path}: the stage imbalance is not priced: {note!r}")
                if state != "true" or errors:
                    broken.append(f"{path}: {state}: {page.inner_text('#status')!r} {errors}")
                pages += 1
                page.close()
    finally:
        ctx.close()
    assert pages == 3 * len(runs)
    assert broken == [], "\n".join(broken)
