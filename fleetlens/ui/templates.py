"""The portal pages' HTML shells (``string.Template``): the frame every page shares and each
page's headings, labelled tables and chart hosts, filled by ``static/app.js`` from the JSON API
(:mod:`fleetlens.ui.pages` serves them)."""

from __future__ import annotations

from string import Template

__all__ = [
    "CAPACITY",
    "CONTROLS",
    "EARLY_OVERVIEW",
    "FAILURE",
    "NOT_FOUND",
    "ONCALL",
    "PLOT_HEAD",
    "PLOT_SCRIPTS",
    "RANK",
    "RUN",
    "RUNS",
    "SHELL",
    "SIGNIN",
]

# The run and rank pages' charts: uPlot, vendored (static/vendor/uplot/README.md), and the
# run page's script; the other pages load neither.
PLOT_HEAD = '<link rel="stylesheet" href="/ui/static/vendor/uplot/uPlot.min.css">'
# The run page's first-paint request, started as soon as the body opens, while the scripts
# load (app.js's getJSON takes the answer): the request and the scripts overlap instead of
# following each other. Skipped for a zoomed range (run.js asks for that itself) and for a
# server that wants a token this tab does not have (the page asks for one first).
EARLY_OVERVIEW = """
<script>(() => {
  const q = new URLSearchParams(location.search), b = document.body;
  const token = sessionStorage.getItem("fleetlens.token");
  if (q.has("fromStep") || q.has("toStep") || (b.dataset.auth === "required" && !token)) return;
  const pts = Math.min(800, Math.max(100, Math.floor(innerWidth / 2)));
  const path = `/v1/runs/${encodeURIComponent(b.dataset.runId)}/overview?points=${pts}`;
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  window.FLEarly = { [path]: fetch(path, { headers }) };
})();</script>"""

PLOT_SCRIPTS = """<script src="/ui/static/vendor/uplot/uPlot.iife.min.js"></script>
<script src="/ui/static/plots.js"></script>"""

SHELL = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · fleetlens</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/style.css">
$head
</head>
<body data-page="$page" data-run-id="$run_attr" data-object-id="$object_attr" data-auth="$auth">
<a class="skip" href="#main">Skip to content</a>$early
<header><nav aria-label="Portal">
<a href="/" class="brand">fleetlens</a>
<a href="/">Runs</a><a href="/compare">Compare</a><a href="/models">Models</a><a
href="/oncall">On-call</a><a href="/capacity">Capacity</a>
</nav><button type="button" id="sign-out" hidden>Sign out</button></header>
<main id="main" tabindex="-1">
<h1>$heading</h1>
<div id="live"><p id="status" role="status" aria-live="polite">Loading…</p>
<span id="age"></span><button type="button" id="pause" aria-pressed="false" hidden>Pause updates
</button></div>
$signin
<div id="content">$body</div>
</main>
<script type="application/json" id="fl-names">$names</script>
<script src="/ui/static/charts.js"></script>
<script src="/ui/static/app.js"></script>
$scripts
</body></html>
""")

# Shown by app.js when the server wants a token (401) or refuses the token's role (403). The
# input has no name, so a submit that app.js did not intercept cannot put the token in a URL.
SIGNIN = """
<section id="signin" aria-labelledby="h-signin" hidden>
<h2 id="h-signin">Sign in</h2>
<form id="signin-form" autocomplete="off" novalidate>
<p id="signin-why">This server requires an API token.</p>
<label for="token">API token</label>
<input id="token" type="password" autocomplete="off" autocapitalize="off" spellcheck="false"
 aria-describedby="signin-help" required>
<button type="submit">Sign in</button>
<p id="signin-error" class="error" role="alert"></p>
<p id="signin-help" class="note">Tokens come from whoever runs this server:
<code>fleetlens tokens create --data DIR --tenant TENANT --role viewer</code> prints one, once
(the role <code>editor</code> or <code>admin</code> also reads; an admin can also create one with
<code>POST /v1/tokens</code>). The token is kept in this browser tab only and forgotten when the
tab closes; <b>Sign out</b> forgets it now.</p>
</form></section>
<section id="forbidden" aria-labelledby="h-forbidden" hidden>
<h2 id="h-forbidden" tabindex="-1">This token may not read this page</h2>
<p id="forbidden-why" class="error" role="alert"></p>
<p id="forbidden-oncall" hidden>The on-call role reads the <a href="/oncall">On-call page</a>:
nodes with faults, drains and infrastructure alerts of every tenant.</p>
<p><button type="button" id="switch-token">Use another token</button></p>
</section>
"""

RUNS = """
<form id="runs-filter" class="inline-form" role="search">
<label for="runs-q">Search</label>
<input id="runs-q" type="search" placeholder="run id or project" autocomplete="off" size="24">
<fieldset class="inline-form"><legend>Status</legend>
<label><input type="checkbox" name="status" value="RUNNING"> running</label>
<label><input type="checkbox" name="status" value="HUNG"> hung</label>
<label><input type="checkbox" name="status" value="STALLED"> stalled</label>
<label><input type="checkbox" name="status" value="FINISHED"> finished</label>
<label><input type="checkbox" name="status" value="FAILED"> failed</label>
<label><input type="checkbox" name="status" value="STOPPED"> stopped</label>
<label><input type="checkbox" name="status" value="RECORDED"> recorded</label></fieldset>
<button type="submit">Apply</button></form>
<section aria-labelledby="h-runs"><h2 id="h-runs">Runs</h2>
<table id="runs"><caption>Runs, most recently active first</caption><thead><tr>
<th scope="col">Run</th></tr></thead><tbody></tbody></table>
<p class="inline-form"><button type="button" id="runs-prev">Previous</button>
<span id="runs-range"></span><button type="button" id="runs-next">Next</button></p>
<p class="inline-form"><button type="button" id="runs-compare" disabled>Compare ticked runs</button>
<span id="runs-picked" role="status"></span></p></section>
"""

# The charts' controls (run and rank pages): what the x axis shows, smoothing, log scale and
# the zoomed step range (kept in the URL as ?fromStep=&toStep=).
CONTROLS = """<div id="chart-controls" class="controls" role="group" aria-label="Chart controls">
<label>X axis <select id="x-mode"><option value="step">Step</option>
<option value="utc">Wall clock (UTC)</option><option value="local">Wall clock (browser local)
</option></select></label>
<label>Smoothing <select id="smooth"><option value="0">off</option>
<option value="5">moving mean of 5 points</option><option value="21">moving mean of 21 points
</option></select></label>
<label><input type="checkbox" id="log-y"> Log scale (y)</label>
<span id="range-text"></span><button type="button" id="reset-range" hidden>Show all steps</button>
<span class="note">Drag across a chart to zoom to a step range; every chart and table follows.
</span></div>"""

RUN = """
<section aria-labelledby="h-wrong" id="wrong"><h2 id="h-wrong">What's wrong</h2>
<table id="wrong-table" class="stack">
<caption>Findings, most costly first: each one's share of the time the
run lost (the breakdown's loss lines), in GPU-hours and goodput points</caption><thead><tr>
<th scope="col">#</th><th scope="col">Finding</th><th scope="col">Where</th>
<th scope="col">Since (UTC)</th><th scope="col">Confidence</th><th scope="col">Owner</th>
<th scope="col">Evidence</th><th scope="col">Cost</th><th scope="col">Action</th></tr></thead>
<tbody></tbody></table><p id="wrong-note" class="note"></p>
<p id="whatif-note" class="note"></p></section>
<section aria-labelledby="h-now" class="cards" id="now"><h2 id="h-now">Now</h2><div></div>
<p id="contract-note" class="note"></p></section>
<section aria-labelledby="h-frontier" id="frontier-sec" hidden><h2 id="h-frontier">Time to result
</h2><p id="frontier-note"></p>
<table id="frontier"><caption>The project's runs: time from their first record to the target
and the GPU-hours held to get there; ★ on the efficiency frontier (no run both sooner and
cheaper)</caption><thead><tr><th scope="col">Run</th><th scope="col">Status</th>
<th scope="col">Devices</th><th scope="col">Time to result</th><th scope="col">GPU-hours</th>
<th scope="col">Frontier</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-memory" id="memory-sec" hidden><h2 id="h-memory">Memory</h2>
<p id="memory-note"></p><div id="chart-memory" class="chart-host"></div>
<table id="memory" class="stack"><caption>Each rank's memory, least headroom first: the use at
the last sample, the peak, the limit (the device's capacity, the process's limit), the headroom
and the climb over the newest samples</caption><thead><tr><th scope="col">Rank</th>
<th scope="col">Pool</th><th scope="col">Used</th><th scope="col">Peak</th>
<th scope="col">Limit</th><th scope="col">Headroom</th><th scope="col">Climb a step</th>
<th scope="col">Steps to the limit</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-goodput">
<h2 id="h-goodput">Goodput: where the time went (whole run)</h2>
<div class="row"><div id="goodput-bars" class="chart-host"></div>
<table id="factors"><caption>The three factors</caption><tbody></tbody></table></div>
<table id="breakdown"><caption>Breakdown of wall-clock time</caption><thead><tr>
<th scope="col">Category</th><th scope="col">Time</th><th scope="col">Share</th>
<th scope="col">Factor</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-charts" id="charts"><h2 id="h-charts">Training over steps</h2>
$controls
<h3>Step time (median with min–max band, max; slowest and mean rank compute)</h3>
<div id="chart-step" class="chart-host"></div>
<h3>Goodput over time (productive share of each bucket)</h3>
<div id="chart-goodput" class="chart-host"></div>
<h3>Loss</h3><div id="chart-loss" class="chart-host"></div>
<h3>Learning rate</h3><div id="chart-lr" class="chart-host"></div>
<h3>Gradient norm</h3><div id="chart-grad_norm" class="chart-host"></div>
<h3>Tokens per second</h3><div id="chart-tps" class="chart-host"></div>
<h3><label for="pick-metric">Any logged metric</label></h3>
<select id="pick-metric"><option value="">choose one of the run's metrics</option></select>
<div id="chart-pick" class="chart-host" hidden></div>
<h3>Timeline (events by step)</h3><div id="chart-timeline" class="chart-host timeline-strip"></div>
</section>
<section aria-labelledby="h-heat" id="heat"><h2 id="h-heat">Rank × step heatmap of compute time</h2>
<p id="heat-caption"></p><div class="heat-host"><canvas id="heatmap"></canvas>
<div id="heat-tip" class="tip" hidden></div></div>
<p id="heat-cell" class="sr" aria-live="polite"></p>
<p id="heat-hot" class="hot"></p></section>
<section aria-labelledby="h-ranks"><h2 id="h-ranks">Slowest ranks</h2>
<table id="ranks"><caption>Slowest ranks by compute time over the heatmap window</caption>
<thead><tr><th scope="col">Rank</th><th scope="col">Node</th><th scope="col">GPU</th>
<th scope="col">Compute (ms)</th><th scope="col">× median</th><th scope="col">Comm wait (ms)</th>
<th scope="col">Hardware evidence</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-diag"><h2 id="h-diag">Diagnosis</h2>
<table id="findings" class="stack">
<caption>Findings with evidence and owner</caption><thead><tr>
<th scope="col">Diagnosis</th><th scope="col">Owner</th><th scope="col">Confidence</th>
<th scope="col">Steps</th><th scope="col">Summary</th><th scope="col">Evidence</th>
<th scope="col">Log lines</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-rem" id="remediation"><h2 id="h-rem">Remediation</h2>
<table id="remediations" class="stack">
<caption>Actions that took (or would take) a node out of the run, newest
first</caption><thead><tr><th scope="col">Action</th><th scope="col">Node</th>
<th scope="col">Reason</th><th scope="col">State</th><th scope="col">Decided at (UTC)</th>
<th scope="col">World before → after</th><th scope="col">Stop → resume step</th>
<th scope="col">Steps lost</th><th scope="col">Recovery</th>
<th scope="col">Checkpoint verified by</th></tr></thead><tbody></tbody></table>
<div id="rem-phases"></div></section>
<section aria-labelledby="h-traces" id="traces" hidden><h2 id="h-traces">Profiler traces</h2>
<p id="traces-note"></p>
<table id="trace-ranks"><caption>Where each traced rank's step time went on the device (imported
Kineto traces)</caption><thead><tr><th scope="col">Rank</th><th scope="col">Steps</th>
<th scope="col">Step (ms)</th><th scope="col">Compute</th><th scope="col">Comm</th>
<th scope="col">Exposed comm</th><th scope="col">Memcpy</th><th scope="col">Idle</th>
<th scope="col">Kernels</th><th scope="col">Collectives</th><th scope="col">Trace</th></tr>
</thead><tbody></tbody></table><p id="traces-open" role="status" aria-live="polite"></p>
<table id="trace-kernels"><caption>Heaviest kernels, every traced rank summed</caption><thead><tr>
<th scope="col">Kernel</th><th scope="col">Kind</th><th scope="col">Calls</th>
<th scope="col">Device time</th><th scope="col">Share of step time</th></tr></thead>
<tbody></tbody></table>
<table id="trace-colls"><caption>Heaviest collectives (enter to exit), every traced rank
summed</caption><thead><tr><th scope="col">Operation</th><th scope="col">Calls</th>
<th scope="col">Time</th><th scope="col">Ranks</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-captures" id="captures-sec"><h2 id="h-captures">Captured traces</h2>
<p id="captures-note" class="note"></p><div id="captures"></div>
<p id="captures-open" role="status" aria-live="polite"></p></section>
<section aria-labelledby="h-tl"><h2 id="h-tl">Correlated timeline</h2>
<table id="timeline"><caption>Events, config and metric changes, alerts, checkpoints,
restarts</caption><thead><tr><th scope="col">Step</th><th scope="col">Source</th>
<th scope="col">Kind</th><th scope="col">Where</th><th scope="col">Message</th></tr></thead>
<tbody></tbody></table></section>
<section aria-labelledby="h-logs" id="logs-sec"><h2 id="h-logs">Log lines</h2>
<form id="logs-form" role="search" aria-label="Search the log lines">
<label>Text <input id="logs-q" type="search" maxlength="1000"></label>
<label>Rank <input id="logs-rank" type="number" min="0"></label>
<label>Around step <input id="logs-around" type="number" min="-1"></label>
<label>Level <select id="logs-level"><option value="">any</option><option>DEBUG</option>
<option>INFO</option><option>WARNING</option><option>ERROR</option><option>CRITICAL</option>
</select></label> <button type="submit">Search</button></form>
<p id="logs-note" class="note" role="status" aria-live="polite"></p>
<table id="logs" class="stack"><caption>What the ranks wrote (Python logging, stdout, stderr),
each line with the step its rank was at, oldest first</caption><thead><tr>
<th scope="col">Step</th><th scope="col">Rank</th><th scope="col">Level</th>
<th scope="col">Source</th><th scope="col">Line</th></tr></thead><tbody></tbody></table></section>
""".replace("$controls", CONTROLS)

RANK = """
<p id="rank-where" class="big"></p><p><a id="rank-back" href="#">Back to the run</a></p>
<section aria-labelledby="h-place"><h2 id="h-place">Where it ran</h2>
<table id="placements"><caption>The rank's node and GPU in each job attempt (a restart may move
it), with the Xids its GPU reported there</caption><thead><tr><th scope="col">Job attempt</th>
<th scope="col">Node</th><th scope="col">GPU</th><th scope="col">Placed at (UTC)</th>
<th scope="col">Xids</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-phases" id="charts"><h2 id="h-phases">Phase timings over steps</h2>
$controls
<h3>This rank's phases (ms, mean per bucket) and the mean rank's compute</h3>
<div id="chart-phases" class="chart-host"></div></section>
<section aria-labelledby="h-rtrace" id="rank-traces" hidden>
<h2 id="h-rtrace">Its profiler trace</h2>
<table id="rank-trace-steps"><caption>Where each traced step's time went on this rank's device
(imported Kineto trace)</caption><thead><tr><th scope="col">Step</th>
<th scope="col">Step (ms)</th>
<th scope="col">Compute</th><th scope="col">Comm</th><th scope="col">Exposed comm</th>
<th scope="col">Memcpy</th><th scope="col">Idle</th><th scope="col">Kernels</th>
<th scope="col">File</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-gpu"><h2 id="h-gpu">Its GPU's samples (wall clock, UTC)</h2>
<h3>SM clock (MHz) and its maximum</h3><div id="chart-clock" class="chart-host"></div>
<h3>Temperature (°C)</h3><div id="chart-temp" class="chart-host"></div>
<h3>Power (W)</h3><div id="chart-power" class="chart-host"></div>
<h3>Framebuffer memory in use (MiB)</h3><div id="chart-mem" class="chart-host"></div>
<h3>Xid (largest per bucket; 0: none)</h3><div id="chart-xid" class="chart-host"></div>
</section>
""".replace("$controls", CONTROLS)

NOT_FOUND = Template("""
<section aria-labelledby="h-missing"><h2 id="h-missing">No such run</h2>
<p class="error">$why</p>
<p>It does not exist, or it belongs to a tenant this token does not read. The
<a href="/">runs list</a> shows the runs you can see.</p></section>
""")

FAILURE = """
<section aria-labelledby="h-state"><h2 id="h-state">Status</h2><div id="f-status"></div></section>
<section aria-labelledby="h-train"><h2 id="h-train">Training signals before it</h2>
<table id="f-training"><caption>Values in the steps before the failure</caption><thead><tr>
<th scope="col">Signal</th><th scope="col">Values (oldest → newest)</th></tr></thead>
<tbody></tbody></table></section>
<section aria-labelledby="h-infra"><h2 id="h-infra">Infrastructure signals</h2>
<table id="f-infra"><caption>Ranks implicated, with their GPU and host evidence</caption><thead>
<tr><th scope="col">Rank</th><th scope="col">Node</th><th scope="col">GPU</th>
<th scope="col">Compute × median</th><th scope="col">Hardware evidence</th></tr></thead>
<tbody></tbody></table></section>
<section aria-labelledby="h-cause"><h2 id="h-cause">Likely cause</h2>
<div id="f-cause"></div></section>
<section aria-labelledby="h-rel"><h2 id="h-rel">Related events</h2>
<table id="f-related"><caption>Events around the failing step</caption><thead><tr>
<th scope="col">Step</th><th scope="col">Kind</th><th scope="col">Message</th></tr></thead>
<tbody></tbody></table></section>
<section aria-labelledby="h-rec"><h2 id="h-rec">Recommendation</h2><p id="f-rec"></p></section>
"""

ONCALL = """
<section aria-labelledby="h-jobs" id="jobs-section"><h2 id="h-jobs">Live jobs by goodput</h2>
<p id="jobs-hidden" class="note" hidden>Not shown to the on-call role: jobs' goodput and
per-rank spread are their runs' contents, which the tenant's viewers, editors and admins read.
</p>
<table id="jobs" class="stack">
<caption>Jobs running (or hung), lowest goodput first; below threshold marked
</caption><thead>
<tr><th scope="col">Run</th><th scope="col">Status</th><th scope="col">Goodput</th>
<th scope="col">Threshold</th><th scope="col">Per-rank spread</th><th scope="col">Ranks</th>
</tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-nodes"><h2 id="h-nodes">Nodes with faults</h2>
<table id="nodes" class="stack">
<caption>Nodes with fatal or recoverable faults (fault events and firing
hardware alerts), with the live jobs they hurt</caption><thead><tr>
<th scope="col">Node</th><th scope="col">Fatal</th><th scope="col">Recoverable</th>
<th scope="col">Live jobs on it</th><th scope="col">Latest</th></tr></thead><tbody></tbody>
</table></section>
<section aria-labelledby="h-drains"><h2 id="h-drains">Drains</h2>
<table id="actions" class="stack">
<caption>Drains in progress: remediation actions recommended or awaiting
approval, or taking a node out (draining, removing, restarting)</caption><thead><tr>
<th scope="col">Node</th><th scope="col">Run</th><th scope="col">State</th>
<th scope="col">Age</th><th scope="col">Reason</th></tr></thead><tbody></tbody></table>
<table id="drains"><caption>Drain and maintenance events, newest first</caption><thead><tr>
<th scope="col">Node</th><th scope="col">Run</th><th scope="col">Step</th>
<th scope="col">Message</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-alerts"><h2 id="h-alerts">Firing alerts and incidents</h2>
<table id="alerts" class="stack">
<caption>Firing alerts, each linked to its runbook</caption><thead><tr>
<th scope="col">Alert</th><th scope="col">Severity</th><th scope="col">Run</th>
<th scope="col">Summary</th><th scope="col">Age</th><th scope="col">Acknowledged</th>
<th scope="col">Silence</th><th scope="col">Incident</th></tr></thead><tbody></tbody></table>
<table id="silences" class="stack">
<caption>Silences in force, to come, or ended in the last day: the alerts
they match keep firing but notify no one</caption><thead><tr><th scope="col">Silence</th>
<th scope="col">Matchers</th><th scope="col">Until</th><th scope="col">Comment</th>
<th scope="col">By</th><th scope="col">State</th></tr></thead><tbody></tbody></table>
<table id="incidents" class="stack">
<caption>Open incidents</caption><thead><tr><th scope="col">Incident</th>
<th scope="col">Run</th><th scope="col">Title</th><th scope="col">Status</th></tr></thead>
<tbody></tbody></table></section>
"""

CAPACITY = """
<form id="cap-form" class="inline-form"><label for="cap-period">Period</label>
<select id="cap-period"><option value="24">last 24 hours</option>
<option value="168">last 7 days</option><option value="720">last 30 days</option>
<option value="">everything on record</option></select>
<label for="cap-pool">Pool</label>
<select id="cap-pool"><option value="">every pool</option></select>
<label for="cap-price">Price of a GPU-hour ($)</label>
<input id="cap-price" type="number" min="0.01" step="0.01" value="2.00" inputmode="decimal">
<button type="submit">Apply</button></form>
<p id="cap-period-text" class="note"></p>
<div id="cap-warnings" role="alert"></div>
<section aria-labelledby="h-util" class="cards" id="cap-now"><h2 id="h-util">Fleet</h2><div></div>
</section>
<section aria-labelledby="h-time" id="cap-time"><h2 id="h-time">The fleet over time</h2>
<h3>Utilization and goodput (share of in-service GPU-hours)</h3>
<div id="chart-fleet-share" class="chart-host"></div>
<h3>GPU-hours: in service, held by runs, useful</h3>
<div id="chart-fleet-hours" class="chart-host"></div>
<table id="fleet-series"><caption>The period bucket by bucket (UTC): where the GPU-hours
went</caption><thead><tr><th scope="col">From</th><th scope="col">In service</th>
<th scope="col">Held</th><th scope="col">Useful</th><th scope="col">Utilization</th>
<th scope="col">Goodput</th><th scope="col">Largest loss</th>
<th scope="col">Cost per useful GPU-hour</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-jobs" id="cap-jobs"><h2 id="h-jobs">Jobs</h2>
<p id="cap-jobs-text"></p>
<table id="cohorts"><caption>Runs by size: GPU-hours held and useful, and goodput (many short
jobs or a few large ones)</caption><thead><tr><th scope="col">Size</th><th scope="col">Runs</th>
<th scope="col">Held (GPU-h)</th><th scope="col">Useful (GPU-h)</th>
<th scope="col">Goodput</th></tr></thead><tbody></tbody></table></section>
<section aria-labelledby="h-wf"><h2 id="h-wf">Goodput waterfall (GPU-hours)</h2>
<div id="chart-waterfall" class="chart-host"></div>
<table id="waterfall"><caption>From in-service GPU-hours to useful GPU-hours</caption><thead>
<tr><th scope="col">Step</th><th scope="col">GPU-hours</th></tr></thead><tbody></tbody></table>
</section>
<section aria-labelledby="h-loss"><h2 id="h-loss">Loss by cause (GPU-hours)</h2>
<div id="chart-loss-cause" class="chart-host"></div>
<table id="loss-cause"><caption>GPU-hours lost, by cause</caption><thead><tr>
<th scope="col">Cause</th><th scope="col">GPU-hours</th></tr></thead><tbody></tbody></table>
</section>
<section aria-labelledby="h-fail"><h2 id="h-fail">Failures by cause</h2>
<table id="failures"><caption>Interruptions and diagnoses, by cause</caption><thead><tr>
<th scope="col">Cause</th><th scope="col">Count</th></tr></thead><tbody></tbody></table>
</section>
<section aria-labelledby="h-pools"><h2 id="h-pools">Pools</h2>
<table id="pools"><caption>Scheduling goodput and queue wait per pool</caption><thead><tr>
<th scope="col">Pool</th><th scope="col">Scheduling goodput</th><th scope="col">Availability</th>
<th scope="col">Queue wait p90 (s)</th><th scope="col">Jobs</th></tr></thead><tbody></tbody>
</table></section>
"""
