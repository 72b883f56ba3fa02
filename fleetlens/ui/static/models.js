// fleetlens portal: the runs list, the comparison, model and evaluation pages, the runbooks.
// Loaded after app.js, whose helpers (fetch with the tab's token, tables, formatting) it uses;
// it registers its pages in FLApp.pages before app.js draws the page body[data-page] names.
"use strict";

(() => {
  const { getJSON, fill, link, cards, text, pct, secs, when, enc, F, findingName } = FLApp;
  const objectId = document.body.dataset.objectId;
  // counts as counts (40, not 40.00)
  const num = (v) => (typeof v === "number" && Number.isInteger(v) ? v.toLocaleString("en-US") : F(v));

  // A table whose columns are the things compared: the first header, then one per name (a
  // link when given one).
  function head(tableId, first, names, href) {
    const tr = document.querySelector(`#${tableId} thead tr`);
    tr.textContent = "";
    for (const [i, n] of [first, ...names].entries()) {
      const th = document.createElement("th");
      th.scope = "col";
      if (i > 0 && href) th.appendChild(link(href(n), n)); else th.textContent = n;
      tr.appendChild(th);
    }
  }

  function list(items) {
    const ul = document.createElement("ul");
    for (const x of items) { const li = document.createElement("li"); li.textContent = x; ul.appendChild(li); }
    return ul;
  }

  // ---------------------------------------------------------------- runs list
  // Triage: the server searches, filters, sorts and pages (/v1/portal/runs); the state is the
  // URL's (?q=&status=RUNNING,FAILED&sort=goodput&order=asc&offset=50), so a view can be shared
  // and survives a reload. A column's header sorts by it (again: the other way).
  const RUN_COLS = [
    ["Run", "runId"], ["Project", null], ["Status", "status"], ["Goodput", "goodput"],
    ["Step time", "stepTime"], ["Findings", "findings"], ["Alerts firing", "alerts"],
    ["Duration", "duration"], ["Step", null], ["Ranks", "worldSize"], ["Last seen (UTC)", "lastSeen"],
    ["Failure page", null], ["Compare", null],
  ];
  const PAGE = 50;

  function runsState() {
    const q = new URLSearchParams(window.location.search);
    return { q: q.get("q") || "", status: (q.get("status") || "").split(",").filter(Boolean),
      sort: q.get("sort") || "lastSeen", order: q.get("order") || "desc", offset: Number(q.get("offset") || 0) };
  }

  function setRunsState(st) {
    const q = new URLSearchParams();
    if (st.q) q.set("q", st.q);
    if (st.status.length) q.set("status", st.status.join(","));
    if (st.sort !== "lastSeen" || st.order !== "desc") { q.set("sort", st.sort); q.set("order", st.order); }
    if (st.offset) q.set("offset", String(st.offset));
    history.pushState(null, "", q.toString() ? `?${q}` : window.location.pathname);
    runsPage();
  }

  function bindRuns() {
    const form = document.getElementById("runs-filter");
    if (form.dataset.bound) return;
    form.dataset.bound = "true";
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const st = runsState();
      st.q = document.getElementById("runs-q").value.trim();
      st.status = [...form.querySelectorAll("input[name=status]:checked")].map((x) => x.value);
      st.offset = 0;
      setRunsState(st);
    });
    document.getElementById("runs-prev").addEventListener("click", () => { const st = runsState(); st.offset = Math.max(0, st.offset - PAGE); setRunsState(st); });
    document.getElementById("runs-next").addEventListener("click", () => { const st = runsState(); st.offset += PAGE; setRunsState(st); });
    window.addEventListener("popstate", () => runsPage());
    document.getElementById("runs-compare").addEventListener("click", () => {
      window.location.href = "/compare?runs=" + picked().map(enc).join(",");
    });
  }

  // Runs ticked for compare, in the order ticked (the first is the baseline); kept for the tab so
  // that paging or filtering the list does not lose them.
  const PICKS = "fleetlens.comparePicks";
  const picked = () => { try { return JSON.parse(sessionStorage.getItem(PICKS) || "[]"); } catch (e) { return []; } };
  function showPicks() {
    const runs = picked();
    const b = document.getElementById("runs-compare");
    b.disabled = runs.length < 2;
    document.getElementById("runs-picked").textContent = runs.length
      ? `Ticked: ${runs.join(", ")}${runs.length < 2 ? " (tick one more)" : ""}` : "Tick two or more runs to compare them.";
  }
  function pickBox(runId) {
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "pick";
    box.value = runId;
    box.checked = picked().includes(runId);
    box.setAttribute("aria-label", `Compare ${runId}`);
    box.addEventListener("change", () => {
      const runs = picked().filter((r) => r !== runId);
      if (box.checked) runs.push(runId);
      sessionStorage.setItem(PICKS, JSON.stringify(runs));
      showPicks();
    });
    return box;
  }

  let runsDraws = 0;  // only the newest request's answer is drawn (see app.js's on-call page)

  async function runsPage() {
    const mine = ++runsDraws;
    bindRuns();
    const st = runsState();
    document.getElementById("runs-q").value = st.q;
    document.querySelectorAll("#runs-filter input[name=status]").forEach((x) => { x.checked = st.status.includes(x.value); });
    const api = new URLSearchParams({ sort: st.sort, order: st.order, offset: String(st.offset), limit: String(PAGE) });
    if (st.q) api.set("q", st.q);
    if (st.status.length) api.set("status", st.status.join(","));
    const d = await getJSON(`/v1/portal/runs?${api}`);
    if (mine !== runsDraws) return true;
    const tr = document.querySelector("#runs thead tr");
    tr.textContent = "";
    for (const [label, key] of RUN_COLS) {
      const th = document.createElement("th");
      th.scope = "col";
      if (key) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "sort";
        b.textContent = label + (st.sort === key ? (st.order === "desc" ? " ▼" : " ▲") : "");
        b.addEventListener("click", () => {
          const ns = runsState();
          ns.order = ns.sort === key && ns.order === "desc" ? "asc" : "desc";
          ns.sort = key;
          ns.offset = 0;
          setRunsState(ns);
        });
        th.appendChild(b);
        if (st.sort === key) th.setAttribute("aria-sort", st.order === "desc" ? "descending" : "ascending");
      } else th.textContent = label;
      tr.appendChild(th);
    }
    fill("runs", d.runs.map((r) => [
      { th: r.runId, node: link(`/runs/${enc(r.runId)}`, r.runId) }, r.project, r.status, pct(r.goodput),
      r.stepTimeMs === null ? "–" : `${F(r.stepTimeMs)} ms`,
      r.findingsCount ? `${r.findingsCount}: ${Object.keys(r.findings).map(findingName).join(", ")}` : "none",
      r.alertsFiring, secs(r.durationSeconds), text(r.lastStep), text(r.worldSize), when(r.lastSeen),
      { node: link(`/runs/${enc(r.runId)}/failure`, "failure page") }, { node: pickBox(r.runId) },
    ]), st.q || st.status.length ? "no run matches" : "no runs yet");
    const caption = `Runs, ${st.sort === "lastSeen" && st.order === "desc" ? "most recently active first" : `by ${st.sort} (${st.order === "desc" ? "highest" : "lowest"} first)`}`
      + (d.sortedWithin !== null ? `, among the ${d.sortedWithin} most recently active` : "");
    document.querySelector("#runs caption").textContent = caption;
    document.getElementById("runs-range").textContent = d.total
      ? `${d.offset + 1}–${d.offset + d.runs.length} of ${d.total}` : "";
    document.getElementById("runs-prev").disabled = d.offset === 0;
    document.getElementById("runs-next").disabled = d.offset + d.runs.length >= d.total;
    showPicks();
    return true;
  }

  // ---------------------------------------------------------------- compare
  function runsOfUrl() {
    const q = new URLSearchParams(window.location.search);
    const runs = (q.get("runs") || "").split(",").map((s) => s.trim()).filter(Boolean);
    if (!runs.length) for (const k of ["left", "right"]) if (q.get(k)) runs.push(q.get(k));
    return runs;
  }

  const SIDE = [
    ["Last step", (s) => text(s.lastStep)],
    ["Step time, median (slowest rank)", (s) => secs(s.stepTimeMedianSeconds)],
    ["Tokens/s", (s) => F(s.tokensPerSecond)],
    ["MFU", (s) => pct(s.mfu)],
    ["Goodput (job), as the run page has it", (s) => pct(s.goodput)],
    ["Runtime goodput", (s) => pct(s.runtimeGoodput)],
    ["Productive share of the span", (s) => pct(s.productiveShare)],
    ["Straggler spread", (s) => pct(s.stragglerSpread)],
    ["Slow-step share", (s) => pct(s.slowStepShare)],
    ["Health", (s) => (s.health.issues || []).join("; ") || "healthy"],
    ["Dataset", (s) => text(s.dataset)],
    ["Code", (s) => text(s.code)],
  ];

  // Each run's series of the metric on one chart: the x axis is every step any run has a point
  // at, and each line joins its own points across the others'.
  async function overlay(runs, metric) {
    const host = document.getElementById("cmp-chart-loss");
    const series = await Promise.all(runs.map((r) => getJSON(
      `/v1/runs/${enc(r)}/metrics?name=${enc(metric)}&points=400`).catch(() => ({ points: [] }))));
    const x = [...new Set(series.flatMap((s) => (s.points || []).map((p) => p.step)))].sort((a, b) => a - b);
    const at = new Map(x.map((step, i) => [step, i]));
    const values = series.map((s) => {
      const v = new Array(x.length).fill(null);
      for (const p of s.points || []) if (typeof p.value === "number") v[at.get(p.step)] = p.value;
      return v;
    });
    host.dataset.series = String(runs.length);
    document.getElementById("h-over").textContent = `${metric} over steps, overlaid`;
    FLPlots.line(host, { label: `${metric} of ${runs.join(", ")} over steps`, yLabel: metric, xMode: "step",
      x, height: 240, series: runs.map((r, i) => ({ name: i === 0 ? `${r} (baseline)` : r, values: values[i], spanGaps: true })) });
  }

  async function comparePage() {
    const form = document.getElementById("cmp-form");
    const input = document.getElementById("cmp-runs");
    if (!form.dataset.bound) {
      form.dataset.bound = "true";
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const runs = input.value.split(",").map((s) => s.trim()).filter(Boolean);
        window.location.search = "?runs=" + runs.map(enc).join(",");
      });
    }
    const runs = runsOfUrl();
    input.value = runs.join(", ");
    if (runs.length < 2) return false;
    const d = await getJSON(`/v1/runs/compare?runs=${runs.map(enc).join(",")}`);
    const concl = document.getElementById("cmp-conclusion");
    concl.textContent = "";
    for (const c of d.conclusions) {
      const art = document.createElement("article");
      art.className = "conclusion";
      const h3 = document.createElement("h3");
      h3.textContent = `${c.run} against ${d.baseline}: ` + (c.cause === "none" ? "no regression" : `likely ${c.cause}`);
      art.append(h3, list(c.lines));
      concl.appendChild(art);
    }
    const runHref = (r) => `/runs/${enc(r)}`;
    head("cmp-side", "Figure", d.runs, runHref);
    fill("cmp-side", SIDE.map(([label, f]) => [{ th: label }, ...d.side.map(f)]));
    const metrics = Object.keys(d.matchedSteps);
    head("cmp-matched", "Metric", d.runs, runHref);
    fill("cmp-matched", metrics.map((m) => [{ th: m }, ...d.runs.map((r) => F(d.matchedSteps[m].tail[r]))]),
      "no scalar logged at the same steps by every run");
    head("cmp-config", "Key", d.runs, runHref);
    const cfg = d.config.map((c) => [{ th: c.key }, ...c.values.map((v) => (v === undefined ? "–" : JSON.stringify(v)))]);
    for (const k of ["dataset", "code"]) if (d[k].changed) cfg.push([{ th: k }, ...d[k].values.map(text)]);
    fill("cmp-config", cfg, "the same configuration, dataset and code");
    head("cmp-evals", "Metric", d.runs, runHref);
    const ev = d.evaluations;
    fill("cmp-evals", ev ? Object.entries(ev.metrics).map(([m, x]) => [{ th: m },
      ...x.values.map((v, i) => (v === null ? "–" : F(v) + (i && x.deltas[i] !== null ? ` (${x.deltas[i] >= 0 ? "+" : ""}${F(x.deltas[i])})` : "")))])
      : [], "no completed evaluation of these runs");
    const metric = metrics.includes("loss") ? "loss" : metrics[0];
    if (metric) await overlay(d.runs, metric);
    return false;
  }

  // ---------------------------------------------------------------- models
  async function modelsPage() {
    const d = await getJSON("/v1/models");
    const by = new Map();
    for (const v of d.models) {
      if (!by.has(v.modelId)) by.set(v.modelId, []);
      by.get(v.modelId).push(v);
    }
    const ids = [...by.keys()];
    const aliases = await Promise.all(ids.map((id) => getJSON(`/v1/models/${enc(id)}/aliases`)));
    fill("models", ids.map((id, i) => {
      const versions = by.get(id);
      const newest = versions[versions.length - 1];
      const al = Object.entries(aliases[i].aliases).map(([a, v]) => `${a} → ${v}`).join(", ");
      return [{ th: id, node: link(`/models/${enc(id)}`, id) }, versions.length, newest.version,
        when(newest.createdAt), al || "none"];
    }), "no model registered yet: POST /v1/models registers a version from a run's checkpoint");
    return false;
  }

  function interval(c) {
    if (c.difference === null || c.difference === undefined) return "–";
    const iv = c.interval ? ` [${F(c.interval[0])}, ${F(c.interval[1])}]` : "";
    return `${c.difference >= 0 ? "+" : ""}${F(c.difference)}${iv}`;
  }

  function decisionRows(decisions) {
    const rows = [];
    for (const d of decisions) {
      const verdict = d.passed ? "passed" : `failed: ${(d.failed || []).join(", ")}`;
      const checks = d.checks && d.checks.length ? d.checks : [null];
      checks.forEach((c, i) => {
        const first = i === 0;
        rows.push([first ? { th: d.decisionId } : { th: "" },
          first ? `v${d.version} (${text(d.candidateEvaluation)})` : "",
          first ? `${d.baselineAlias} → ${d.baselineVersion ? "v" + d.baselineVersion : "none"}` : "",
          first ? verdict : "",
          c ? c.metric : "no checks", c ? F(c.candidate) : "", c ? F(c.baseline) : "", c ? interval(c) : "",
          c ? `${c.test}${c.pValue !== null && c.pValue !== undefined ? `, p = ${F(c.pValue)}` : ""}, ${c.paired} pairs` : "",
          c ? c.status : ""]);
      });
    }
    return rows;
  }

  async function modelPage() {
    const id = objectId;
    const [vs, al, dec, ev] = await Promise.all([
      getJSON(`/v1/models?modelId=${enc(id)}`), getJSON(`/v1/models/${enc(id)}/aliases`),
      getJSON(`/v1/models/${enc(id)}/gates`), getJSON(`/v1/evaluations?modelId=${enc(id)}`),
    ]);
    const alias = Object.entries(al.aliases);
    cards("#model-now", alias.length ? alias.map(([a, v]) => [a, `v${v}`]) : [["Aliases", "none yet"]]);
    const pointing = (v) => alias.filter(([, x]) => x === v).map(([a]) => a).join(", ") || "–";
    fill("versions", vs.models.map((v) => [{ th: `v${v.version}` }, { node: link(`/runs/${enc(v.runId)}`, v.runId) },
      text(v.checkpointId), v.evaluationId ? { node: link(`/evaluations/${enc(v.evaluationId)}`, v.evaluationId) } : "–",
      pointing(v.version), when(v.createdAt)]), "no versions");
    fill("decisions", decisionRows(dec.decisions), "no gate decision yet: POST /v1/gates judges a candidate");
    fill("history", al.history.slice().reverse().map((m) => [{ th: when(m.at) }, m.alias,
      `${m.from ? "v" + m.from : "–"} → v${m.to}`, text(m.decisionId), m.override ? text(m.reason) : "–", text(m.actor)]),
    "no alias has moved yet");
    fill("model-evals", ev.evaluations.map((e) => [{ th: e.evaluationId, node: link(`/evaluations/${enc(e.evaluationId)}`, e.evaluationId) },
      e.modelVersion ? `v${e.modelVersion}` : "–", `${e.suite.name}@${e.suite.version}`, e.state,
      (e.regressions || []).map((r) => `${r.kind}: ${r.metric}`).join("; ") || "none", when(e.createdAt)]),
    "no evaluation of this model yet");
    return ev.evaluations.some((e) => !["COMPLETED", "FAILED", "CANCELLED"].includes(e.state));
  }

  // ---------------------------------------------------------------- evaluation
  // Per-example scores, one row per example and a column per metric; a metric's header sorts
  // by it (again: the other way), so the examples a model got wrong come first.
  const PAGE_ROWS = 200;
  const ex = { rows: [], metrics: [], sort: null, desc: false, shown: PAGE_ROWS };

  function pivot(rows) {
    const by = new Map();
    for (const r of rows) {
      const key = `${r.benchmark}\u0000${r.exampleId}`;
      if (!by.has(key)) by.set(key, { benchmark: r.benchmark, exampleId: r.exampleId, values: {}, rationale: "", prompt: "", output: "", reference: "" });
      const x = by.get(key);
      x.values[r.metric] = r.value;
      for (const k of ["rationale", "prompt", "output", "reference"]) if (r[k]) x[k] = r[k];
    }
    // Example ids in their natural order (2 before 10), as the benchmark numbers them.
    const natural = new Intl.Collator(undefined, { numeric: true });
    return [...by.values()].sort((a, b) => natural.compare(a.benchmark, b.benchmark) || natural.compare(a.exampleId, b.exampleId));
  }

  // A long text in one line of the table, the whole of it on hover.
  function clipped(t) {
    const span = document.createElement("span");
    span.className = "oneline";
    span.textContent = t || "–";
    if (t) span.title = t;
    return { node: span };
  }

  function drawExamples() {
    const bench = document.getElementById("ex-bench").value;
    let rows = ex.rows.filter((x) => !bench || x.benchmark === bench);
    const metrics = ex.metrics.filter((m) => rows.some((x) => m in x.values));
    if (ex.sort && metrics.includes(ex.sort)) {
      const k = ex.sort, sign = ex.desc ? -1 : 1;
      rows = rows.slice().sort((a, b) => sign * ((a.values[k] ?? Infinity) - (b.values[k] ?? Infinity)));
    }
    const tr = document.querySelector("#examples thead tr");
    tr.textContent = "";
    for (const name of ["Benchmark", "Example", "Prompt", "Output", "Reference", ...metrics, "Rationale"]) {
      const th = document.createElement("th");
      th.scope = "col";
      if (metrics.includes(name)) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "sort";
        b.textContent = name + (ex.sort === name ? (ex.desc ? " ▼" : " ▲") : "");
        b.addEventListener("click", () => { ex.desc = ex.sort === name ? !ex.desc : false; ex.sort = name; drawExamples(); });
        th.appendChild(b);
        if (ex.sort === name) th.setAttribute("aria-sort", ex.desc ? "descending" : "ascending");
      } else th.textContent = name;
      tr.appendChild(th);
    }
    fill("examples", rows.slice(0, ex.shown).map((x) => [{ th: x.benchmark }, x.exampleId,
      clipped(x.prompt), clipped(x.output), clipped(x.reference),
      ...metrics.map((m) => num(x.values[m])), text(x.rationale || null)]), "no example");
    document.querySelector("#examples caption").textContent =
      `Per-example scores: ${rows.length} of ${ex.rows.length} examples` + (rows.length > ex.shown ? `, first ${ex.shown} shown` : "");
    document.getElementById("ex-more").hidden = rows.length <= ex.shown;
  }

  async function evaluationPage() {
    const id = objectId;
    const [e, got] = await Promise.all([getJSON(`/v1/evaluations/${enc(id)}`),
      getJSON(`/v1/evaluations/${enc(id)}/examples?limit=200000`)]);
    const p = e.progress || {};
    cards("#eval-now", [
      ["State", e.state], ["Model", e.modelId ? `${e.modelId} v${e.modelVersion}` : "–"], ["Run", text(e.runId || null)],
      ["Suite", `${e.suite.name}@${e.suite.version}`], ["Answered", e.cacheHit ? `from the cache (${e.cachedFrom})` : "computed"],
      ["Progress", p.examples ? `${num(p.examplesDone)} of ${num(p.examples)} examples, ${p.shardsDone} of ${p.shards} shards` : "–"],
      ["Created", when(e.createdAt)], ["Completed", when(e.completedAt)],
    ].concat(e.error ? [["Error", e.error]] : []));
    fill("regressions", (e.regressions || []).map((r) => [{ th: r.kind }, r.metric, F(r.candidate), F(r.baseline),
      r.baselineEvaluation ? { node: link(`/evaluations/${enc(r.baselineEvaluation)}`, r.baselineEvaluation) } : "–"]),
    "no regression against the baseline");
    const rows = [];
    for (const [b, ms] of Object.entries(e.metrics || {})) {
      for (const [m, v] of Object.entries(ms)) {
        const detail = Object.entries(v).filter(([k]) => k !== "mean").map(([k, x]) => `${k} ${Array.isArray(x) ? x.map(num).join("–") : num(x)}`);
        rows.push([{ th: b }, m, F(v.mean), detail.join(", ") || "–"]);
      }
    }
    fill("metrics", rows, "no metrics yet");
    ex.rows = pivot(got.examples);
    ex.metrics = [...new Set(got.examples.map((x) => x.metric))];
    const sel = document.getElementById("ex-bench");
    if (!sel.dataset.bound) {
      sel.dataset.bound = "true";
      for (const b of [...new Set(ex.rows.map((x) => x.benchmark))]) {
        const o = document.createElement("option"); o.value = b; o.textContent = b; sel.appendChild(o);
      }
      sel.addEventListener("change", () => { ex.shown = PAGE_ROWS; drawExamples(); });
      document.getElementById("ex-more").addEventListener("click", () => { ex.shown += PAGE_ROWS; drawExamples(); });
    }
    drawExamples();
    return !["COMPLETED", "FAILED", "CANCELLED"].includes(e.state);
  }

  // The runbooks page is drawn by the server (ui/runbook_page.py): nothing to fetch.
  const runbooksPage = async () => false;

  Object.assign(FLApp.pages, { runs: runsPage, compare: comparePage, models: modelsPage, model: modelPage,
    evaluation: evaluationPage, runbooks: runbooksPage });
})();
