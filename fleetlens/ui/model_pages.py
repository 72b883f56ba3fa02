"""The portal's comparison, model and evaluation pages: shells whose data come from the API.

``/compare?runs=A,B,C`` (the first is the baseline; ``?left=&right=`` too) draws
``GET /v1/runs/compare`` with each run's loss series overlaid (``/v1/runs/{id}/metrics``).
``/models`` lists the registered models with their aliases; ``/models/{id}`` shows a model's
versions, aliases and every move of them (promotion history), its gate decisions with their
paired statistics, and its evaluations; ``/evaluations/{id}`` an evaluation's metrics,
regressions, latency and cost, and its per-example scores. ``static/models.js`` draws them with
the helpers of ``static/app.js``. Access is the run page's (:mod:`fleetlens.ui.pages`): a model
or evaluation the caller may not see is a 404 when the page's data are fetched.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from .pages import Reader, page

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

COMPARE = """
<form id="cmp-form" class="inline-form" role="search">
<label for="cmp-runs">Runs to compare, comma-separated (the first is the baseline)</label>
<input id="cmp-runs" name="runs" type="text" autocomplete="off" spellcheck="false" size="48">
<button type="submit">Compare</button></form>
<section aria-labelledby="h-concl" id="cmp-conclusion-section">
<h2 id="h-concl">Likely conclusion</h2>
<div id="cmp-conclusion"><p class="note">Name two or more runs above.</p></div></section>
<section aria-labelledby="h-side"><h2 id="h-side">Side by side</h2>
<table id="cmp-side"><caption>Speed, goodput (as each run's page has it) and health</caption>
<thead><tr><th scope="col">Figure</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-over"><h2 id="h-over">Loss over steps, overlaid</h2>
<div id="cmp-chart-loss" class="chart-host"></div>
<table id="cmp-matched"><caption>Scalars at the steps every run logged, last tenth of the range
</caption><thead><tr><th scope="col">Metric</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-cfg"><h2 id="h-cfg">Configuration, dataset and code</h2>
<table id="cmp-config"><caption>What differs (changed keys first)</caption><thead><tr>
<th scope="col">Key</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-evals"><h2 id="h-evals">Evaluations</h2>
<table id="cmp-evals"><caption>Each run's latest completed evaluation, and the change against
the baseline's</caption><thead><tr><th scope="col">Metric</th></tr></thead><tbody></tbody>
</table></section>
"""

MODELS = """
<section aria-labelledby="h-models"><h2 id="h-models">Registered models</h2>
<table id="models"><caption>Models, their versions and where their aliases point</caption>
<thead><tr><th scope="col">Model</th><th scope="col">Versions</th>
<th scope="col">Newest version</th><th scope="col">Registered</th><th scope="col">Aliases</th>
</tr></thead><tbody></tbody></table></section>
"""

MODEL = """
<section aria-labelledby="h-mnow" class="cards" id="model-now"><h2 id="h-mnow">Aliases</h2>
<div></div>
</section>
<section aria-labelledby="h-dec"><h2 id="h-dec">Gate decisions</h2>
<table id="decisions"><caption>Candidates judged against a baseline alias, newest first; each
check with its paired statistics</caption><thead><tr><th scope="col">Decision</th>
<th scope="col">Candidate</th><th scope="col">Baseline</th><th scope="col">Verdict</th>
<th scope="col">Check</th><th scope="col">Candidate value</th><th scope="col">Baseline value</th>
<th scope="col">Difference (interval)</th><th scope="col">Test, p-value, pairs</th>
<th scope="col">Status</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-ver"><h2 id="h-ver">Versions</h2>
<table id="versions"><caption>Versions, oldest first, with the run and checkpoint they came
from</caption><thead><tr><th scope="col">Version</th><th scope="col">Run</th>
<th scope="col">Checkpoint</th><th scope="col">Evaluation</th><th scope="col">Aliases</th>
<th scope="col">Registered</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-hist"><h2 id="h-hist">Promotion history</h2>
<table id="history"><caption>Every move of an alias, newest first</caption><thead><tr>
<th scope="col">When</th><th scope="col">Alias</th><th scope="col">From → to</th>
<th scope="col">Gate decision</th><th scope="col">Override reason</th><th scope="col">By</th>
</tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-mev"><h2 id="h-mev">Evaluations</h2>
<table id="model-evals"><caption>Evaluations of this model's versions, newest first</caption>
<thead><tr><th scope="col">Evaluation</th><th scope="col">Version</th><th scope="col">Suite</th>
<th scope="col">State</th><th scope="col">Regressions</th><th scope="col">Created</th></tr>
</thead><tbody></tbody></table></section>
"""

EVALUATION = """
<section aria-labelledby="h-enow" class="cards" id="eval-now">
<h2 id="h-enow">Evaluation</h2><div></div>
</section>
<section aria-labelledby="h-reg"><h2 id="h-reg">Regressions</h2>
<table id="regressions"><caption>Regressions against the baseline evaluation</caption><thead><tr>
<th scope="col">Kind</th><th scope="col">Metric</th><th scope="col">Value</th>
<th scope="col">Baseline</th><th scope="col">Baseline evaluation</th></tr></thead><tbody></tbody>
</table></section>
<section aria-labelledby="h-met"><h2 id="h-met">Metrics</h2>
<table id="metrics"><caption>Each benchmark's metrics: mean over its examples; latency and cost
per example (performance)</caption><thead><tr><th scope="col">Benchmark</th>
<th scope="col">Metric</th><th scope="col">Mean</th><th scope="col">Detail</th></tr></thead>
<tbody></tbody></table></section>
<section aria-labelledby="h-ex"><h2 id="h-ex">Examples</h2>
<p class="inline-form"><label for="ex-bench">Benchmark</label>
<select id="ex-bench"><option value="">all</option></select></p>
<table id="examples"><caption>Per-example scores</caption><thead><tr>
<th scope="col">Benchmark</th><th scope="col">Example</th></tr></thead><tbody></tbody></table>
<p><button type="button" id="ex-more" hidden>Show more examples</button></p>
</section>
"""


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(request: Request, scope: Reader) -> HTMLResponse:
    return page(request, "compare", "Compare runs", COMPARE, script="models.js", plots=True)


@router.get("/models", response_class=HTMLResponse)
async def models_page(request: Request, scope: Reader) -> HTMLResponse:
    return page(request, "models", "Models", MODELS, script="models.js")


@router.get("/models/{model_id}", response_class=HTMLResponse)
async def model_page(request: Request, model_id: str, scope: Reader) -> HTMLResponse:
    return page(
        request, "model", f"Model {model_id}", MODEL, script="models.js", object_id=model_id
    )


@router.get("/evaluations/{evaluation_id}", response_class=HTMLResponse)
async def evaluation_page(request: Request, evaluation_id: str, scope: Reader) -> HTMLResponse:
    return page(
        request,
        "evaluation",
        f"Evaluation {evaluation_id}",
        EVALUATION,
        script="models.js",
        object_id=evaluation_id,
    )
