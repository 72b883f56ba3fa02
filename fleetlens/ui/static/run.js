// fleetlens run and rank pages: "What's wrong" first, then the run's figures and its charts
// (plots.js), the heatmap and the tables. The chart controls live in the URL with the zoomed
// step range: ?fromStep=&toStep= (dragging across any chart sets it; every chart and table
// follows, and a reload keeps it), ?x=step|utc|local, ?smooth=N, ?log=1, and ?metric=NAME (the
// chart of any metric the run logged).
"use strict";

(() => {
  const A = FLApp;
  const { F, runId, getJSON, fill, link, text, pct, dur, when, enc } = A;
  const params = () => new URLSearchParams(location.search);

  // ---------------------------------------------------------------- URL state
  function range() {
    const p = params();
    const a = Number.parseInt(p.get("fromStep"), 10), b = Number.parseInt(p.get("toStep"), 10);
    return Number.isFinite(a) && Number.isFinite(b) && a >= 0 && b >= a ? { from: a, to: b } : null;
  }
  function rangeQuery() { const r = range(); return r ? `&fromStep=${r.from}&toStep=${r.to}` : ""; }
  function view() {
    const p = params();
    return { x: ["utc", "local"].includes(p.get("x")) ? p.get("x") : "step",
      smooth: Number(p.get("smooth")) || 0, log: p.get("log") === "1" };
  }

  function setParams(changes, push) {
    const p = params();
    for (const [k, v] of Object.entries(changes)) { if (v === null) p.delete(k); else p.set(k, String(v)); }
    const url = `${location.pathname}${p.toString() ? "?" + p : ""}${location.hash}`;
    if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
  }

  // A drag on one chart selects on every chart that shares its crosshair: the same range, set
  // once.
  function setRange(lo, hi) {
    const now = range();
    if (lo === null) {
      if (!now) return;
      setParams({ fromStep: null, toStep: null }, true);
    } else {
      const a = Math.max(0, Math.floor(lo)), b = Math.max(a, Math.ceil(hi));
      if (now && now.from === a && now.to === b) return;
      setParams({ fromStep: a, toStep: b }, true);
    }
    A.reload();
  }
  window.addEventListener("popstate", () => A.reload());

  function controls(redraw) {
    const v = view();
    const xm = document.getElementById("x-mode"), sm = document.getElementById("smooth");
    const lg = document.getElementById("log-y"), reset = document.getElementById("reset-range");
    xm.value = v.x; sm.value = String(v.smooth); lg.checked = v.log;
    if (!xm.dataset.bound) {
      xm.dataset.bound = "true";
      xm.addEventListener("change", () => { setParams({ x: xm.value === "step" ? null : xm.value }); redraw(); });
      sm.addEventListener("change", () => { setParams({ smooth: sm.value === "0" ? null : sm.value }); redraw(); });
      lg.addEventListener("change", () => { setParams({ log: lg.checked ? "1" : null }); redraw(); });
      reset.addEventListener("click", () => setRange(null));
    }
    const r = range();
    reset.hidden = !r;
    document.getElementById("range-text").textContent = r ? `Steps ${r.from}–${r.to} (zoomed)` : "All steps";
  }

  // Step <-> wall clock, through a series' (step, t) points (the buckets' first starts).
  function clockOf(pts) {
    const steps = pts.map((p) => p.step), ts = pts.map((p) => p.t);
    const find = (arr, v) => { let lo = 0, hi = arr.length - 1; while (lo < hi) { const m = (lo + hi + 1) >> 1; if (arr[m] <= v) lo = m; else hi = m - 1; } return lo; };
    return {
      time: (s) => (steps.length ? ts[find(steps, s)] : null),
      step: (t) => (ts.length ? steps[find(ts, t)] : null),
      last: (t) => { if (!ts.length) return null; const i = find(ts, t); return i + 1 < steps.length ? steps[i + 1] - 1 : steps[i]; },
    };
  }

  // ---------------------------------------------------------------- What's wrong
  function where(f) {
    const out = [];
    if (f.ranks && f.ranks.length === 1) out.push(`rank ${f.ranks[0]}`);
    else if (f.ranks && f.ranks.length) out.push(`ranks ${f.ranks[0]}–${f.ranks[f.ranks.length - 1]} (${f.ranks.length})`);
    if (f.nodes && f.nodes.length) out.push(f.nodes.slice(0, 2).join(", ") + (f.nodes.length > 2 ? ` +${f.nodes.length - 2}` : ""));
    const gpus = (f.gpus || []).map((g) => `GPU ${String(g).split(":").pop()}`);
    if (gpus.length) out.push(gpus.slice(0, 2).join(", "));
    return out.join(" · ") || "whole job";
  }

  function costText(c) {
    return `${F(c.gpuHours)} GPU-h · ${c.goodputPoints.toFixed(1)} pts`;
  }

  // Time to result (GET /v1/runs/{id}'s completion): only a RUNNING run has a pace to go by.
  function etaText(eta, status) {
    if (eta && eta.tokensLeft !== null && eta.tokensLeft !== undefined) return `${dur(eta.seconds)} (${F(eta.tokensLeft)} tokens left, about ${F(eta.stepsLeft)} steps)`;
    if (eta) return `${dur(eta.seconds)} (${F(eta.stepsLeft)} steps left to ${F(eta.totalSteps)})`;
    if (status === "RECORDED") return "– (a recording: nothing live)";
    if (!A.LIVE_STATUSES.includes(status)) return "– (the run ended)";
    if (status !== "RUNNING") return `– (${status.toLowerCase()})`;
    return "unknown: no target step count (total_steps, max_steps, train_iters, max_iters) in the run config";
  }

  function evidenceLine(f) {
    const span = document.createElement("span");
    span.className = "oneline";
    const line = A.evidence(f.evidence) || f.summary || "–";
    span.textContent = line;
    span.title = `${f.summary}. Evidence: ${line}`;
    return span;
  }

  function actionCell(f, acts) {
    const span = document.createElement("span");
    const act = acts.find((a) => (f.nodes || []).includes(a.node));
    if (act) span.append(link(`#action-${act.id}`, `action #${act.id}: ${A.stateLabel(act.state)}`), " ");
    const rec = document.createElement("span");
    rec.className = "oneline note";
    rec.textContent = f.action || "";
    rec.title = f.action || "";
    span.appendChild(rec);
    return span;
  }

  function whatsWrong(d) {
    const fs = d.findings || [];
    const acts = d.remediations || [];
    fill("wrong-table", fs.slice(0, 5).map((f) => [
      { th: `${f.rank}` }, { node: A.named(f.diagnosis, `#finding-${f.rank}`) }, where(f),
      `${when(f.since.time)} · step ${f.since.step}`, pct(f.confidence), f.owner,
      { node: evidenceLine(f) }, costText(f.cost), { node: actionCell(f, acts) },
    ]), "No findings: nothing is known to be wrong with this run.");
    document.querySelectorAll("#wrong-table tbody tr").forEach((tr, i) => {
      if (fs[i]) { tr.dataset.key = fs[i].key; tr.title = fs[i].summary; }
    });
    const g = d.goodput || {}, un = g.unattributed;
    const lines = ((g.breakdown || {}).lines || []).filter((l) => l.category !== "productive");
    const lostS = lines.reduce((t, l) => t + l.seconds, 0);
    const note = document.getElementById("wrong-note");
    if (!un) { note.textContent = ""; return; }
    const found = fs.reduce((t, f) => t + f.cost.gpuHours, 0);
    const wall = (g.breakdown || {}).wallSeconds || 0;
    note.textContent = `The run lost ${dur(lostS)} of its ${dur(wall)} (${pct(wall ? lostS / wall : null)}): the findings account for ` +
      `${F(found)} GPU-h, and ${costText(un)} is explained by no finding (${Object.keys(un.seconds).join(", ") || "none"}). ` +
      `A finding's cost is its share of the goodput breakdown's loss lines below; findings plus unexplained add up to them.` +
      (fs.length > 5 ? ` ${fs.length - 5} more findings under Diagnosis.` : "");
  }

  // What-if (GET .../whatif/stragglers): how much faster with each slow worker or stage fixed;
  // asked after the first paint, only when a finding is one the what-if prices.
  async function whatIfNote(d) {
    const note = document.getElementById("whatif-note");
    const priced = (d.findings || []).some((f) => f.kind === "straggler" || ["stage_imbalance", "batch_imbalance"].includes(f.diagnosis));
    if (!note || !priced) { if (note) note.textContent = ""; return; }
    const w = await getJSON(`/v1/runs/${enc(runId)}/whatif/stragglers`);
    if (!w.steps) { note.textContent = ""; return; }
    const types = Object.entries(w.byType || {}).sort((a, b) => b[1] - a[1])
      .map(([k, v]) => `${k} ${pct(w.wallSeconds ? v / w.wallSeconds : null)}`).join(", ");
    const fixes = (w.findings || []).slice(0, 3).map((f) => `${A.findingName(f.diagnosis)} ` +
      `(ranks ${f.ranks.length > 4 ? `${f.ranks[0]}–${f.ranks[f.ranks.length - 1]}` : f.ranks.join(", ")}) ` +
      `${pct(f.speedup)} faster`).join("; ");
    note.textContent = `What-if, steps ${w.fromStep}–${w.toStep}: with every worker, stage, input and transfer at its peers' ` +
      `median the job would run ${pct(w.slowdown)} faster (saved, each alone: ${types}).` + (fixes ? ` Fixed: ${fixes}.` : "");
  }

  // Time to result (GET /v1/projects/{p}/frontier): this run among its project's, to the
  // project's target; shown only when the project has a target and a run that reached it.
  async function frontierSection(d) {
    const sec = document.getElementById("frontier-sec");
    if (!sec || !d.run.project) return;
    const f = await getJSON(`/v1/projects/${enc(d.run.project)}/frontier`);
    const runs = f.runs || [];
    if (!f.targetSteps || !runs.some((x) => x.seconds !== null)) { sec.hidden = true; return; }
    sec.hidden = false;
    document.getElementById("frontier-note").textContent = `Project ${f.project}, target step ` +
      `${F(f.targetSteps)}: ${runs.filter((x) => x.onFrontier).length} of ${runs.length} runs on the frontier.`;
    fill("frontier", runs.map((x) => [{ th: x.runId === runId ? `${x.runId} (this run)` : x.runId }, x.status, text(x.devices),
      x.seconds === null ? "not reached" : `${dur(x.seconds)}${x.estimated ? " (estimated)" : ""}`,
      x.gpuHours === null ? "–" : F(x.gpuHours), x.onFrontier ? "★" : ""]));
  }

  // Memory (GET /v1/runs/{id}/memory): each rank's device or process memory, least headroom
  // first, and the use over steps of the ranks closest to their limit; hidden when the run
  // sent no memory samples.
  const sizeText = (b) => (b === null || b === undefined ? "–" : Math.abs(b) >= 2 ** 30
    ? `${(b / 2 ** 30).toFixed(2)} GiB` : Math.abs(b) >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MiB` : `${(b / 2 ** 10).toFixed(0)} KiB`);
  async function memorySection() {
    const sec = document.getElementById("memory-sec");
    if (!sec) return;
    const m = await getJSON(`/v1/runs/${enc(runId)}/memory?top=6`);
    const pools = m.pools || [];
    if (!pools.length) { sec.hidden = true; return; }
    sec.hidden = false;
    const low = pools[0];
    const per = low.climb && low.climb.perStepBytes;
    document.getElementById("memory-note").textContent = `Least headroom: rank ${low.rank} (${low.pool}), ` +
      `${sizeText(low.headroomBytes)} of ${sizeText(low.limitBytes)} left at its peak` +
      (low.stepsToLimit !== null && per > 0 ? `, climbing ${sizeText(per)} a step: the limit in about ${F(low.stepsToLimit)} steps.` : ".");
    const xs = Array.from(new Set((m.series || []).flatMap((s) => s.steps))).sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const series = (m.series || []).map((s) => {
      const v = xs.map(() => null);
      s.steps.forEach((st, i) => { v[at.get(st)] = s.usedBytes[i] / 2 ** 30; });
      return { name: `rank ${s.rank} ${s.pool}`, values: v, spanGaps: true };  // each rank's own steps
    });
    FLPlots.line(document.getElementById("chart-memory"), { label: "Memory used over steps (GiB), the ranks of least headroom",
      yLabel: "Memory (GiB)", unit: "GiB", height: 200, xMode: "step", x: xs, series });
    fill("memory", pools.slice(0, 50).map((p) => [{ th: text(p.rank) }, p.pool, sizeText(p.usedBytes), sizeText(p.peakBytes),
      sizeText(p.limitBytes), `${sizeText(p.headroomBytes)} (${pct(p.headroomShare)})`,
      p.climb && p.climb.perStepBytes !== null ? `${(p.climb.perStepBytes / 2 ** 20).toFixed(1)} MiB` : "–",
      p.stepsToLimit === null ? "–" : F(p.stepsToLimit)]));
  }

  // Log lines (GET /v1/runs/{id}/logs): searched by text, rank, level and the steps around
  // one; the search lives in the URL (?logq=&logrank=&logaround=&loglevel=), and a finding's
  // "lines around step N" link fills it with the finding's step and first rank.
  const LOG_KEYS = { q: "logq", rank: "logrank", around: "logaround", level: "loglevel" };
  function logsLink(f) {
    const step = f.step ?? f.startStep;
    const a = document.createElement("a");
    a.href = "#logs-sec";
    a.textContent = `lines around step ${step}`;
    a.addEventListener("click", (ev) => {
      ev.preventDefault();
      setParams({ logq: null, logrank: (f.ranks || [])[0] ?? null, logaround: step, loglevel: null }, true);
      logsSection().then(() => document.getElementById("logs-sec").scrollIntoView()).catch(() => {});
    });
    return a;
  }
  async function logsSection() {
    const p = params();
    const form = {};
    for (const [k, key] of Object.entries(LOG_KEYS)) {
      form[k] = p.get(key) || "";
      document.getElementById(`logs-${k}`).value = form[k];
    }
    const qs = Object.entries(form).filter(([, v]) => v !== "").map(([k, v]) => `&${k}=${enc(v)}`).join("");
    const got = await getJSON(`/v1/runs/${enc(runId)}/logs?limit=500${qs}`);
    const lines = got.lines || [];
    document.getElementById("logs-note").textContent = lines.length
      ? `${lines.length}${got.truncated ? " (the first)" : ""} lines` + (form.around !== "" ? `, steps ${got.fromStep}–${got.toStep}` : "")
      : "No lines matched (the SDK sends them with FLEETLENS_LOGS=1).";
    fill("logs", lines.map((x) => [{ th: text(x.step) }, text(x.rank), x.level, x.source, x.message]), "no lines");
  }
  function logsForm() {
    const form = document.getElementById("logs-form");
    if (!form || form.dataset.wired) return;
    form.dataset.wired = "1";
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const changes = {};
      for (const [k, key] of Object.entries(LOG_KEYS)) changes[key] = document.getElementById(`logs-${k}`).value || null;
      setParams(changes, true);
      logsSection().catch(() => {});
    });
  }

  // The measurement contract (GET /v1/runs/{id}'s contract): what the step time, MFU and
  // goodput above were measured on, and the spread of the project's trials of this workload.
  async function contractNote() {
    const c = (await getJSON(`/v1/runs/${enc(runId)}`)).contract;
    const el = document.getElementById("contract-note");
    if (el && c) el.textContent = `Measured on ${c.text}.` + (Object.keys(c.mixed).length ? ` Ranks differ in ${Object.keys(c.mixed).join(", ")}.` : "");
  }

  // ---------------------------------------------------------------- charts
  function markersOf(d) {
    const out = [];
    for (const i of d.timeline || []) {
      if (i.step === null || i.step === undefined) continue;
      if (i.source === "metric") out.push({ step: i.step, kind: "metric", lane: "metric", label: `step ${i.step}: ${i.message}` });
      else if (["checkpoint_end", "failure", "hardware_fault", "restart", "job_start", "drain", "config_change", "nan"].includes(i.kind)) {
        out.push({ step: i.step, kind: i.kind, lane: i.kind === "checkpoint_end" ? "checkpoint_end" : "event",
          label: `step ${i.step}: ${i.kind} ${i.message || ""}` });
      }
    }
    for (const a of d.alerts || []) {
      if (a.step !== null && a.step !== undefined) out.push({ step: a.step, kind: "alert", lane: "alert", label: `alert ${a.alertname} at step ${a.step}` });
    }
    return out;
  }

  let lastDoc = null;

  function runCharts() {
    const d = lastDoc;
    if (!d) return;
    const v = view();
    const ss = d.stepSeries || [];
    const clk = clockOf(ss);
    const xOf = (step) => (v.x === "step" ? step : clk.time(step));
    const brush = (a, b) => (v.x === "step" ? setRange(a, b) : setRange(clk.step(a), clk.last(b)));
    const mk = markersOf(d);
    const marks = mk.map((m) => ({ x: xOf(m.step), kind: m.kind }));
    const base = { xMode: v.x, smooth: v.smooth, log: v.log, markers: marks, onBrush: brush };
    const x = ss.map((p) => xOf(p.step));
    const ms = (k) => ss.map((p) => (p[k] === null ? null : p[k] * 1000));
    FLPlots.line(document.getElementById("chart-step"), Object.assign({}, base, {
      label: "Step time in ms over steps: median with min-max band, max, slowest and mean rank compute",
      yLabel: "Step time (ms)", unit: "ms", height: 240, x,
      series: [
        { name: "step time median", values: ms("p50"), band: [ms("min"), ms("max")] },
        { name: "step time max", values: ms("max"), color: "#dc2626", dash: [4, 2] },
        { name: "slowest rank compute", values: ms("computeMax"), color: "#d97706" },
        { name: "mean rank compute", values: ms("computeMean"), color: "#059669" },
      ] }));
    const gp = ss.map((p, i) => {
      const next = ss[i + 1];
      const wall = next ? next.t - p.t : null;
      const useful = p.steps * p.p50 * (p.computeMax ? p.computeMean / p.computeMax : 1);
      return wall && wall > 0 ? 100 * Math.min(1, useful / wall) : null;
    });
    FLPlots.line(document.getElementById("chart-goodput"), Object.assign({}, base, {
      label: "Goodput of each step bucket over steps (productive time over wall time, %)",
      yLabel: "Goodput (%)", unit: "%", x, yMin: v.log ? undefined : 0, yMax: v.log ? undefined : 100,
      series: [{ name: "goodput", values: gp, color: "#059669" }] }));
    const sc = d.scalars || {};
    for (const [id, key, name] of [["chart-loss", "loss", "loss"], ["chart-lr", "lr", "learning rate"], ["chart-grad_norm", "grad_norm", "gradient norm"]]) {
      const s = sc[key] || [];
      FLPlots.line(document.getElementById(id), Object.assign({}, base, {
        label: `${name} over steps (first value of each bucket, with its min-max band)`, yLabel: `${name} (value)`,
        x: s.map((p) => xOf(p.step)),
        series: [{ name, values: s.map((p) => p.value), band: [s.map((p) => p.min), s.map((p) => p.max)] }] }));
    }
    FLPlots.line(document.getElementById("chart-tps"), Object.assign({}, base, {
      label: "Tokens per second over steps", yLabel: "Tokens per second", unit: "tok/s", x,
      series: [{ name: "tokens/s", values: ss.map((p) => p.tokensPerSecond) }] }));
    const w = d.window || {};
    const dom = ss.length ? [w.fromStep ?? ss[0].step, w.toStep ?? ss[ss.length - 1].step] : [0, 1];
    FLCharts.strip(document.getElementById("chart-timeline"), mk.map((m) => Object.assign({ x: m.step }, m)),
      { xDomain: dom, label: `Timeline of ${mk.length} events, checkpoints, metric changes and alerts over steps ${dom[0]}–${dom[1]}` });
  }

  // ---------------------------------------------------------------- run page
  let heatKey = null;  // the range the heatmap shows
  let heatStale = false;
  let heatInView = false;

  // "tp 4 · pp 4 · dp 8": the sizes over 1, in the frameworks' order.
  function layoutText(l) {
    return ["tp", "cp", "ep", "pp", "vpp", "dp"].filter((a) => l[a] > 1).map((a) => `${a} ${l[a]}`).join(" · ") || "data-parallel";
  }

  async function runPage({ refreshing }) {
    controls(runCharts);
    const pts = Math.min(800, Math.max(100, Math.floor(window.innerWidth / 2)));
    const q = rangeQuery();
    const d = await getJSON(`/v1/runs/${enc(runId)}/overview?points=${pts}${q}`);
    lastDoc = d;
    const s = d.summary || {}, m = s.metrics || {};
    const g = d.goodput || {}, f = g.factors || {}, bd = g.breakdown || {};
    const eta = d.completion;
    const acts = d.remediations || [];
    const act = acts.find((a) => A.UNDER_WAY.includes(a.state)) || acts[0];
    whatsWrong(d);
    A.cards("#now", [
      ["Status", d.run.status], ["Goodput (job)", pct(f.jobProduct)], ["Runtime goodput", pct(f.runtime)],
      ["Step", text(s.step)], ["Ranks", text(s.worldSize ?? (d.run.worldSize || null))], ["Step time (slowest rank)", `${F(m.stepTimeMs)} ms`],
      ["Tokens/s", F(m.tokensPerSecond)], ["MFU", mfuText(d.mfu)], ["Tokens consumed", F(s.tokensProcessed)],
      ["Loss", F(m.loss)], ["Est. completion", etaText(eta, d.run.status)],
    ].concat(d.layout ? [["Parallel layout", layoutText(d.layout)]] : [])
      .concat(act ? [["Remediation", `${act.node} ${A.stateLabel(act.state)}`]] : []));
    // The answer first: the findings and their cost are painted before the charts are drawn
    // (a frame, then the rest), so the first thing a reader sees is what is wrong.
    if (!refreshing) await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
    const lines = (bd.lines || []).filter((l) => l.seconds > 0);
    FLCharts.bars(document.getElementById("goodput-bars"), lines.map((l) => ({ label: l.category, value: l.seconds / 3600,
      color: l.category === "productive" ? "#059669" : l.factor === "program" ? "#d97706" : "#dc2626" })),
    { label: "Hours of wall-clock time by category", height: 170, yLabel: "hours", unit: "h" });
    fill("breakdown", lines.map((l) => [{ th: l.category }, dur(l.seconds), pct(l.share), l.factor]));
    fill("factors", [[{ th: "Scheduling" }, pct(f.scheduling)], [{ th: "Runtime" }, pct(f.runtime)],
      [{ th: "Program" }, pct(f.program)], [{ th: "Job (runtime × program)" }, pct(f.jobProduct)]]);
    runCharts();
    if (!refreshing) whatIfNote(d).catch(() => {});  // an extra line; its failure is not the page's
    if (!refreshing) frontierSection(d).catch(() => {});
    if (!refreshing) contractNote().catch(() => {});
    memorySection().catch(() => {});  // memory climbs: read again on every refresh
    capturesSection().catch(() => {});  // a capture fills in rank by rank: read again too
    logsForm();
    if (!refreshing) logsSection().catch(() => {});

    const r = range();
    const all = d.findings || [];
    const shown = r ? all.filter((x) => x.startStep <= r.to && (x.endStep === null || x.endStep >= r.from)) : all;
    fill("findings", shown.map((x) => [{ th: x.diagnosis, node: A.named(x.diagnosis) }, x.owner, pct(x.confidence),
      `${text(x.startStep)}–${text(x.endStep)}`, x.summary, A.evidence(x.evidence), { node: logsLink(x) }]),
    r ? "no findings in these steps" : "no findings");
    document.querySelectorAll("#findings tbody tr").forEach((tr, i) => { if (shown[i]) tr.id = `finding-${shown[i].rank}`; });
    document.querySelector("#findings caption").textContent = r
      ? `Findings with evidence and owner: ${shown.length} of ${all.length} overlap steps ${r.from}–${r.to}` : "Findings with evidence and owner";
    const tl = (d.timeline || []).filter((i) => i.kind !== "checkpoint_begin");
    const inRange = (st) => !r || (st !== null && st !== undefined && st >= r.from && st <= r.to);
    const altl = (d.alerts || []).filter((a) => inRange(a.step)).map((a) => ({ step: a.step, time: a.startsAt, source: "alert", kind: a.alertname, message: a.annotations.summary || "" }));
    // In the order things happened: a restart resumes at an earlier step than the failure that
    // caused it, so by step it would come first.
    const order = (a, b) => (typeof a.time === "number" && typeof b.time === "number" ? a.time - b.time : (a.step ?? -1) - (b.step ?? -1));
    fill("timeline", tl.concat(altl).sort(order).slice(0, 400).map((i) => [
      { th: text(i.step) }, i.source, i.kind, [i.node, i.gpu !== null && i.gpu !== undefined ? `GPU ${i.gpu}` : null, i.rank !== null && i.rank !== undefined ? `rank ${i.rank}` : null].filter(Boolean).join(" ") || "–", i.message || ""]));
    A.remediationSection(acts, d.generatedAt);
    document.querySelectorAll("#remediations tbody tr").forEach((tr, i) => { if (acts[i]) tr.id = `action-${acts[i].id}`; });
    // First paint is done. The heatmap and the slowest ranks, below the fold, come next: on a
    // refresh only while in view or for a new range (else when scrolled to).
    A.body.dataset.painted = "true";
    await pickedMetric(q);
    if (!refreshing || heatKey !== q || heatInView) await heatSection(q);
    else heatStale = true;
    if (traceKey !== q) await traceSection(q, d.run.status);
    return A.LIVE_STATUSES.includes(d.run.status);
  }

  // Any metric the run logged, picked by name: the names are read once, the picked series for
  // the range shown, on every refresh.
  let metricNames = null;
  async function pickedMetric(q) {
    const sel = document.getElementById("pick-metric");
    if (metricNames === null) {
      const m = await getJSON(`/v1/runs/${enc(runId)}/metrics`).catch(() => ({ metrics: [] }));
      metricNames = (m.metrics || []).map((x) => x.name);
      for (const x of m.metrics || []) {
        const o = document.createElement("option");
        o.value = x.name;
        o.textContent = `${x.name} (${x.points} points, steps ${x.fromStep}–${x.toStep})`;
        sel.appendChild(o);
      }
      sel.addEventListener("change", () => { setParams({ metric: sel.value || null }); pickedMetric(rangeQuery()); });
    }
    const name = params().get("metric") || "";
    sel.value = metricNames.includes(name) ? name : "";
    const host = document.getElementById("chart-pick");
    host.hidden = !sel.value;
    if (!sel.value) return;
    const s = await getJSON(`/v1/runs/${enc(runId)}/metrics?name=${enc(sel.value)}&points=400${q}`);
    const pts = (s.points || []).filter((p) => typeof p.step === "number");
    const v = view();
    host.dataset.metric = sel.value;
    FLPlots.line(host, {
      label: `${sel.value} over steps (first value of each bucket, with its min-max band)`, yLabel: sel.value,
      xMode: "step", smooth: v.smooth, log: v.log, onBrush: setRange, x: pts.map((p) => p.step),
      series: [{ name: sel.value, values: pts.map((p) => p.value), band: [pts.map((p) => p.min), pts.map((p) => p.max)] }],
    });
  }

  // Imported profiler traces (fleetlens traces import): per traced rank, where the device time
  // went, and the kernels and collectives that dominate. Hidden when the run has none; fetched
  // once per range (a trace does not change while the page is open).
  let traceKey = null;
  const share = (v) => (typeof v === "number" ? pct(v / 100) : "–");
  const shareCells = (r) => [share(r.computePct), share(r.commPct), share(r.exposedCommPct), share(r.memcpyPct), share(r.idlePct)];

  // Perfetto's way to open a trace from another site: open its UI, PING it until it answers
  // PONG, then post the file's bytes (docs: "Deep linking to the Perfetto UI"). The window is
  // opened in the click itself, or the browser blocks it.
  const PERFETTO = "https://ui.perfetto.dev";

  // tell: where the button says how it went (a role=status line of its section).
  function perfettoButton(rank, tell = say) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = "Open in Perfetto";
    b.setAttribute("aria-label", `Open rank ${rank}'s trace in Perfetto`);
    b.addEventListener("click", () => { openInPerfetto(rank, tell).catch((e) => tell(`Could not open the trace: ${e.message}`)); });
    return b;
  }

  const say = (t) => { document.getElementById("traces-open").textContent = t; };

  async function openInPerfetto(rank, tell) {
    const win = window.open(PERFETTO);
    if (!win) { tell("The browser blocked the Perfetto window: allow pop-ups for this site."); return; }
    tell(`Loading rank ${rank}'s trace into Perfetto…`);
    const r = await fetch(`/v1/runs/${enc(runId)}/traces/files/${rank}`, { headers: A.authHeaders() });
    if (!r.ok) { tell(`Could not fetch rank ${rank}'s trace: HTTP ${r.status}.`); return; }
    const buffer = await r.arrayBuffer();
    const ping = setInterval(() => win.postMessage("PING", PERFETTO), 100);
    const stop = setTimeout(() => { clearInterval(ping); tell("Perfetto did not answer within a minute."); }, 60000);
    const onMessage = (e) => {
      if (e.origin !== PERFETTO || e.data !== "PONG") return;
      clearInterval(ping); clearTimeout(stop);
      window.removeEventListener("message", onMessage);
      const name = `${runId}-rank${rank}.json.gz`;
      win.postMessage({ perfetto: { buffer, title: `${runId} rank ${rank}`, fileName: name } }, PERFETTO);
      tell(`Rank ${rank}'s trace (${F(buffer.byteLength)} bytes) sent to Perfetto.`);
    };
    window.addEventListener("message", onMessage);
  }

  async function traceSection(q, status) {
    const t = await getJSON(`/v1/runs/${enc(runId)}/traces?limit=1${q}`);
    traceKey = q;
    const sec = document.getElementById("traces");
    sec.hidden = !(t.ranks && t.ranks.length);
    if (sec.hidden) return;
    document.getElementById("traces-note").textContent =
      `${t.ranks.length} traced rank(s), steps ${t.fromStep}–${t.toStep}` +
      (status === "RECORDED" ? ". This run is known only from recordings (traces or dumps): nothing live came from it." : ".");
    const kept = t.ranks.some((r) => r.fileBytes);
    if (!kept) document.getElementById("traces-note").textContent += " Import with --upload-files to open the traces in Perfetto.";
    fill("trace-ranks", t.ranks.slice(0, 256).map((r) => [{ th: r.rank, node: link(rankHref(r.rank), String(r.rank)) }, r.steps,
      F(r.meanStepMs), ...shareCells(r), r.kernels, r.collectives, r.fileBytes ? { node: perfettoButton(r.rank) } : "–"]));
    fill("trace-kernels", (t.topKernels || []).map((k) => [{ th: k.name }, k.category, k.calls, `${F(k.totalMs)} ms`,
      share(k.pctOfStepTime)]), "no kernel in the traces (a CPU-only trace)");
    fill("trace-colls", (t.topCollectives || []).map((c) => [{ th: c.op }, c.calls, `${F(c.totalMs)} ms`, c.ranks]),
      "no collective in the traces");
  }

  // Captured traces (GET /v1/runs/{id}/traces/captures): the few steps a lagging rank and a
  // healthy peer (or the ranks a person named) profiled when asked, side by side, newest first;
  // read again on every refresh (a capture fills in rank by rank), redrawn only when it changed.
  let capturesShown = null;
  const CAPTURES_SHOWN = 3;
  const tellCaptures = (t) => { document.getElementById("captures-open").textContent = t; };

  // The file as a download: a plain link where the browser needs no token, else fetched with
  // the page's token (a navigation would carry none) and saved from memory.
  function downloadLink(rank) {
    const name = `${runId}-rank${rank}.json.gz`;
    const a = link(`/v1/runs/${enc(runId)}/traces/files/${rank}`, "Download");
    a.download = name;
    a.setAttribute("aria-label", `Download rank ${rank}'s trace (${name})`);
    a.addEventListener("click", (ev) => {
      if (!A.authHeaders().Authorization) return;
      ev.preventDefault();
      fetch(a.href, { headers: A.authHeaders() }).then(async (r) => {
        if (!r.ok) { tellCaptures(`Could not fetch rank ${rank}'s trace: HTTP ${r.status}.`); return; }
        const url = URL.createObjectURL(await r.blob());
        const save = document.createElement("a");
        save.href = url; save.download = name;
        save.click();
        setTimeout(() => URL.revokeObjectURL(url), 60000);
      }).catch((e) => tellCaptures(`Could not fetch rank ${rank}'s trace: ${e.message}`));
    });
    return a;
  }

  const heaviest = (items, key) => {
    const top = (items || [])[0];
    if (!top) return "none";
    const span = document.createElement("span");
    const name = document.createElement("span");
    name.className = "name";  // a kernel's name is long: cut, its time always in sight
    name.textContent = top[key];
    span.title = `${top[key]}${top.category ? ` (${top.category})` : ""}: ${F(top.totalMs)} ms in ${top.calls} call(s) over the captured steps`;
    span.append(name, ` · ${F(top.totalMs)} ms`);
    return { node: span };
  };

  // Each line of the side-by-side: its heading, and a rank's cell. A rank whose trace is not in
  // shows why once, on the first line.
  const CAPTURE_LINES = [
    ["Step (ms)", (r) => F(r.stepMs)],
    ["Compute (ms)", (r) => F(r.computeMs)],
    ["Exposed comm (ms)", (r) => F(r.exposedCommMs)],
    ["Idle (ms)", (r) => (r.hostOnly ? "host only" : F(r.idleMs))],
    ["Memcpy (ms)", (r) => F(r.memcpyMs)],
    ["Kernels", (r) => text(r.kernels)],
    ["Collectives", (r) => text(r.collectives)],
    ["Heaviest kernel", (r) => heaviest(r.topKernels, "name")],
    ["Heaviest collective", (r) => heaviest(r.topCollectives, "op")],
  ];

  function captureHeading(c) {
    const ev = c.evidence || {};
    const steps = ev.fromStep === null || ev.fromStep === undefined
      ? `${c.steps} step(s) from step ${c.fromStep} (after ${c.warmup} warm-up)`
      : `steps ${ev.fromStep}–${ev.toStep}`;
    return `Capture #${c.captureId}: ${c.state} · ${c.reason} · ${steps} · requested ${when(c.requestedAt)}`;
  }

  // filesOf: rank -> the newest capture whose trace of it is in (the server keeps one file a
  // rank: an older capture's was replaced).
  function captureTable(c, filesOf) {
    const ranks = (c.evidence || {}).ranks || [];
    const open = c.state === "requested" || c.state === "partial";
    const t = document.createElement("table");
    t.id = `capture-${c.captureId}`;
    t.className = "capture";
    t.createCaption().textContent = `Capture #${c.captureId}, side by side: mean milliseconds a captured step ` +
      "(on the device; a CPU trace's compute is the host's own work), the kernel and collective with the most time " +
      "over the captured steps, and each rank's trace file";
    const hr = t.createTHead().insertRow();
    for (const h of ["Line"].concat(ranks.map((r) => `rank ${r.rank} (${r.role})`))) {
      const th = document.createElement("th");
      th.scope = "col"; th.textContent = h; hr.appendChild(th);
    }
    t.createTBody();
    document.getElementById("captures").appendChild(t);
    const absent = open ? "not in yet" : "never arrived";
    const rows = CAPTURE_LINES.map(([name, cell], i) => [{ th: name }].concat(ranks.map((r) => (r.missing ? (i ? "–" : absent) : cell(r)))));
    rows.push([{ th: "Trace file" }].concat(ranks.map((r) => {
      if (r.missing) return "–";
      if (filesOf.get(r.rank) !== c.captureId) return `replaced by capture #${filesOf.get(r.rank)}'s`;
      const span = document.createElement("span");
      span.append(perfettoButton(r.rank, tellCaptures), " ", downloadLink(r.rank));
      return { node: span };
    })));
    fill(t.id, rows);
  }

  async function capturesSection() {
    if (!document.getElementById("captures-sec")) return;
    const got = await getJSON(`/v1/runs/${enc(runId)}/traces/captures`);
    const key = JSON.stringify(got.captures || []);
    if (key === capturesShown) return;
    capturesShown = key;
    const caps = got.captures || [];
    const host = document.getElementById("captures");
    host.textContent = "";
    document.getElementById("captures-note").textContent = caps.length
      ? `${caps.length} capture(s)${caps.length > CAPTURES_SHOWN ? `, the newest ${CAPTURES_SHOWN} shown` : ""}: ` +
        "each rank profiled a few steps (torch.profiler); its trace opens in Perfetto."
      : "No captures. Start the job with FLEETLENS_TRACE_CAPTURE=1 (fleetlens.torch): when a rank lags, " +
        "it and a healthy peer each profile a few steps, and they show here side by side.";
    const filesOf = new Map();
    for (const c of caps) {  // newest first: the first capture with a rank's trace holds its file
      for (const r of (c.evidence || {}).ranks || []) if (!r.missing && !filesOf.has(r.rank)) filesOf.set(r.rank, c.captureId);
    }
    for (const c of caps.slice(0, CAPTURES_SHOWN)) {
      const h = document.createElement("h3");
      h.textContent = captureHeading(c);
      host.appendChild(h);
      const missing = ((c.evidence || {}).ranks || []).filter((r) => r.missing).map((r) => r.rank);
      if (c.message || (missing.length && c.state !== "requested")) {  // partial or expired
        const p = document.createElement("p");
        p.className = c.state === "expired" ? "error" : "note";
        const which = missing.length ? `${c.state === "expired" ? "Missing" : "Waiting for"}: rank(s) ${missing.join(", ")}.` : "";
        p.textContent = [c.message, which].filter(Boolean).join(" ");
        host.appendChild(p);
      }
      captureTable(c, filesOf);
    }
  }

  function mfuText(x) {
    if (!x) return "unknown";
    if (typeof x.value === "number") {
      const hfu = typeof x.hfu === "number" ? ` (HFU ${pct(x.hfu)})` : "";
      return `${pct(x.value)}${hfu}${x.accelerator ? ` on ${x.devices || "?"} × ${x.accelerator}` : ""}`;
    }
    return `unknown: ${x.missing || "not computed"}`;
  }

  const rankHref = (rank) => `/runs/${enc(runId)}/ranks/${rank}${range() ? "?" + rangeQuery().slice(1) : ""}`;

  async function heatSection(q) {
    const world = lastDoc && lastDoc.summary ? lastDoc.summary.worldSize || 128 : 128;
    const h = await getJSON(`/v1/runs/${enc(runId)}/heatmap?slowest=8&ranks=${Math.min(256, Math.max(1, world))}&steps=160${q}`);
    heatKey = q; heatStale = false;
    A.body.dataset.heatFetches = String(Number(A.body.dataset.heatFetches || 0) + 1);
    const canvas = document.getElementById("heatmap");
    const hp = document.getElementById("heat-hot");
    hp.textContent = ""; delete hp.dataset.rank;
    if (h.cells && h.cells.length) {
      const hot = h.hot && h.hot.ratio >= FLPlots.HOT ? h.hot : null;
      const rows = h.rowRanks || { rank: [], node: [], gpu: [] };
      const label = `Heatmap of compute time, ${h.rows} rows of ${h.ranksPerRow} ranks by ${h.columns} columns of ${h.stepsPerColumn} steps, steps ${h.fromStep}-${h.toStep}` +
        (hot ? `; hottest row: ranks ${hot.rankFrom}-${hot.rankTo}, slowest rank ${hot.rank}` : "; no row stands out");
      FLPlots.heatmap(canvas, document.getElementById("heat-tip"), h, {
        label,
        describe: (row, col) => {
          const r0 = row * h.ranksPerRow, r1 = Math.min(r0 + h.ranksPerRow, h.rows * h.ranksPerRow) - 1;
          const s0 = h.fromStep + col * h.stepsPerColumn, s1 = Math.min(h.toStep, s0 + h.stepsPerColumn - 1);
          const v = h.cells[row][col], med = h.medians[col];
          const who = rows.rank[row] !== undefined ? `rank ${rows.rank[row]}${h.ranksPerRow > 1 ? ` (slowest of ranks ${r0}–${r1} in most cells)` : ""}` : `ranks ${r0}–${r1}`;
          const at = rows.node[row] ? ` on ${rows.node[row]} GPU ${rows.gpu[row]}` : "";
          const val = typeof v === "number" ? `${F(v)} ms compute${med ? ` (${(v / med).toFixed(2)}× the column median)` : ""}` : "no data";
          return `${who}${at} · step${s0 === s1 ? ` ${s0}` : `s ${s0}–${s1}`} · ${val}. Click for the rank's page.`;
        },
        onCell: (row) => { location.href = rankHref(rows.rank[row] ?? row * h.ranksPerRow); },
        say: (t) => { document.getElementById("heat-cell").textContent = t; },
      });
      document.getElementById("heat-caption").textContent =
        `Steps ${h.fromStep}–${h.toStep}. Each cell is the maximum compute time of ${h.ranksPerRow} rank(s) over ${h.stepsPerColumn} step(s), coloured by its ratio to the column median (scale on the right). Hover a cell (or focus the map and use the arrow keys) for its rank, node, GPU, steps and value; click it (or press Enter) for the rank's page.`;
      if (hot) {
        hp.dataset.rank = hot.rank; hp.dataset.rankFrom = hot.rankFrom; hp.dataset.rankTo = hot.rankTo; hp.dataset.row = hot.row;
        hp.append(`Outlined row ${hot.row}: ranks ${hot.rankFrom}–${hot.rankTo}, ${F(hot.ratio)}× the column median; slowest rank `,
          link(rankHref(hot.rank), String(hot.rank)), ".");
      } else if (h.hot) {
        hp.textContent = `No row stands out: the slowest row is ${F(h.hot.ratio)}× the column median (outlined from ${FLPlots.HOT}×).`;
      }
    }
    fill("ranks", (h.slowestRanks || []).map((r) => [{ th: r.rank, node: link(rankHref(r.rank), String(r.rank)) }, r.node, r.gpu, F(r.computeMs),
      r.computeSlowdown ? r.computeSlowdown.toFixed(3) : "–", F(r.commMs), A.hardware(r.hardware)]));
  }

  if (A.page === "run") {
    new IntersectionObserver((entries) => {
      heatInView = entries.some((e) => e.isIntersecting);
      if (heatInView && heatStale) heatSection(rangeQuery()).catch(() => {});
    }).observe(document.getElementById("heat"));
  }

  // ---------------------------------------------------------------- rank page
  let rankDoc = null;

  function rankCharts() {
    const d = rankDoc;
    if (!d) return;
    const v = view();
    const ph = d.phases || [];
    const clk = clockOf(ph);
    const xOf = (step) => (v.x === "step" ? step : clk.time(step));
    const ms = (k) => ph.map((p) => (p[k] === null ? null : p[k] * 1000));
    FLPlots.line(document.getElementById("chart-phases"), {
      label: `Rank ${d.rank}'s phase timings in ms over steps, and the mean rank's compute`,
      yLabel: "Time per step (ms)", unit: "ms", height: 260, x: ph.map((p) => xOf(p.step)), xMode: v.x,
      smooth: v.smooth, log: v.log, sync: "rank-steps",
      onBrush: (a, b) => (v.x === "step" ? setRange(a, b) : setRange(clk.step(a), clk.last(b))),
      series: [
        { name: "step (duration)", values: ms("duration"), color: "#4b5563" },
        { name: "compute", values: ms("compute"), color: "#dc2626" },
        { name: "mean rank compute", values: ms("computeMean"), color: "#059669", dash: [4, 2] },
        { name: "forward", values: ms("forward"), color: "#2563eb" },
        { name: "backward", values: ms("backward"), color: "#7c3aed" },
        { name: "optimizer", values: ms("optimizer"), color: "#0891b2" },
        { name: "comm wait", values: ms("comm"), color: "#d97706" },
        { name: "data wait", values: ms("dataWait"), color: "#9ca3af" },
      ] });
    // Each placement's samples, with a gap between placements (no line across the restart).
    const gap = { t: null, smClock: null, smClockMax: null, temp: null, power: null, fbUsed: null, xid: null };
    const samples = (d.placements || []).flatMap((p, i) => {
      const own = p.samples || [];
      return i && own.length ? [Object.assign({}, gap, { t: own[0].t - 1e-3 })].concat(own) : own;
    });
    const t = samples.map((s) => s.t);
    const gpu = (id, label, yLabel, unit, series) => FLPlots.line(document.getElementById(id), {
      label, yLabel, unit, x: t, xMode: "utc", smooth: v.smooth, log: v.log, sync: "rank-gpu", series });
    gpu("chart-clock", "SM clock of the rank's GPU over time, MHz, with its maximum", "SM clock (MHz)", "MHz",
      [{ name: "max SM clock", values: samples.map((s) => s.smClockMax), color: "#9ca3af", dash: [4, 2] }, { name: "SM clock", values: samples.map((s) => s.smClock), color: "#2563eb" }]);
    gpu("chart-temp", "GPU temperature over time, °C", "Temperature (°C)", "°C", [{ name: "GPU temperature", values: samples.map((s) => s.temp), color: "#dc2626" }]);
    gpu("chart-power", "GPU power over time, W", "Power (W)", "W", [{ name: "power", values: samples.map((s) => s.power), color: "#d97706" }]);
    gpu("chart-mem", "GPU framebuffer memory in use over time, MiB", "Memory in use (MiB)", "MiB", [{ name: "framebuffer used", values: samples.map((s) => s.fbUsed), color: "#7c3aed" }]);
    gpu("chart-xid", "Largest Xid reported by the GPU per time bucket (0: none)", "Xid", "", [{ name: "Xid", values: samples.map((s) => s.xid), color: "#b91c1c" }]);
  }

  async function rankPage() {
    controls(rankCharts);
    const rank = Number(location.pathname.split("/").filter(Boolean).pop());
    const d = await getJSON(`/v1/runs/${enc(runId)}/ranks/${rank}/detail?points=300${rangeQuery()}`);
    rankDoc = d;
    const back = document.getElementById("rank-back");
    back.href = `/runs/${enc(runId)}${range() ? "?" + rangeQuery().slice(1) : ""}`;
    back.textContent = `Back to run ${runId}`;
    const places = d.placements || [];
    const now = places[places.length - 1];
    document.getElementById("rank-where").textContent = now
      ? `Rank ${rank} ran on ${now.node} GPU ${now.gpu}${places.length > 1 ? ` (latest of ${places.length} placements)` : ""}; steps ${text(d.fromStep)}–${text(d.toStep)}.`
      : `Rank ${rank}: no placement recorded; steps ${text(d.fromStep)}–${text(d.toStep)}.`;
    if (d.coords) {  // where it sits in the parallel layout, and whom it is judged against
      const c = d.coords, l = d.layout;
      const parts = [["pipeline stage", "pp"], ["data-parallel replica", "dp"], ["context-parallel rank", "cp"],
        ["tensor-parallel rank", "tp"]].filter(([, a]) => l[a] > 1).map(([name, a]) => `${name} ${c[a]} of ${l[a]}`);
      document.getElementById("rank-where").textContent +=
        ` In the parallel layout (${layoutText(l)}): ${parts.join(", ")}; compared with the ${l.world / l.pp} ranks of its stage.`;
    }
    fill("placements", places.map((p) => {
      const xids = [...new Set((p.samples || []).map((s) => s.xid).filter((x) => x > 0))];
      return [{ th: p.jobId || "–" }, p.node, p.gpu, when(p.time), xids.length ? xids.map((x) => `Xid ${x}`).join(", ") : "none"];
    }), "no placement recorded for this rank");
    rankCharts();
    await rankTrace(rank);
    return false;
  }

  async function rankTrace(rank) {
    const t = await getJSON(`/v1/runs/${enc(runId)}/traces?rank=${rank}&limit=2000${rangeQuery()}`);
    const sec = document.getElementById("rank-traces");
    sec.hidden = !(t.steps && t.steps.length);
    if (sec.hidden) return;
    const stepPct = (s, ms) => (s.durationMs > 0 && typeof ms === "number" ? pct(ms / s.durationMs) : "–");
    fill("rank-trace-steps", t.steps.map((s) => [{ th: s.step }, F(s.durationMs), stepPct(s, s.computeMs), stepPct(s, s.commMs),
      stepPct(s, s.exposedCommMs), stepPct(s, s.memcpyMs), stepPct(s, s.idleMs), s.kernels, s.source]));
  }

  A.pages.run = runPage;
  A.pages.rank = rankPage;
})();
