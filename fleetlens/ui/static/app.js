// fleetlens portal: each page fetches its one JSON document, draws it, and live pages refetch
// it on an interval (no full reload). The run page fetches a second one after its first paint:
// the heatmap and the slowest ranks, below the fold. The token in sessionStorage["fleetlens.token"]
// (this tab only) is sent as a Bearer header, also with the one write a page makes: approving a
// remediation action. A 401, or no token on a server that requires one (body[data-auth=required]),
// shows the sign-in form; a 403 says the token's role may not read the page (an on-call token,
// which reads only the On-call page, is pointed there). The token never goes into a URL.
"use strict";

(() => {
  const F = FLCharts.fmt;
  const body = document.body;
  const page = body.dataset.page;
  const runId = body.dataset.runId;
  const REFRESH_MS = 15000;
  const TOKEN_KEY = "fleetlens.token";
  const status = document.getElementById("status");

  function storedToken() { return sessionStorage.getItem(TOKEN_KEY); }

  function authHeaders() {
    const headers = { Accept: "application/json" };
    const token = storedToken();
    if (token) headers.Authorization = "Bearer " + token;
    return headers;
  }

  // An error that carries the status and the server's message (401: no token or a refused one;
  // 403: the token's role may not do this; 409: a remediation action is no longer pending).
  async function httpError(r, prefix) {
    const doc = await r.json().catch(() => null);
    const why = doc && (doc.detail || doc.error);
    const reason = why ? (typeof why === "string" ? why : JSON.stringify(why)) : "";
    const err = new Error(`${prefix}HTTP ${r.status}${reason ? ": " + reason : ""}`);
    err.status = r.status;
    err.reason = reason;
    return err;
  }

  async function getJSON(path) {
    const r = await fetch(path, { headers: authHeaders() });
    if (!r.ok) throw await httpError(r, `${path}: `);
    return r.json();
  }

  async function post(path) {
    const r = await fetch(path, { method: "POST", headers: authHeaders() });
    if (!r.ok) throw await httpError(r, "");
    return r.json();
  }

  async function send(method, path, payload) {
    const headers = authHeaders();
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(path, { method, headers, body: payload === undefined ? undefined : JSON.stringify(payload) });
    if (!r.ok) throw await httpError(r, "");
    return r.json();
  }

  function text(v) { return v === null || v === undefined ? "–" : String(v); }
  function pct(v) { return v === null || v === undefined || !isFinite(v) ? "–" : (100 * v).toFixed(1) + "%"; }
  function dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s >= 3600) return (s / 3600).toFixed(2) + " h";
    if (s >= 60) return (s / 60).toFixed(1) + " min";
    return s.toFixed(1) + " s";
  }
  function secs(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 0.1) return s.toFixed(3) + " s";
    if (s < 10) return s.toFixed(2) + " s";
    return dur(s);
  }
  function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–"; }
  function enc(s) { return encodeURIComponent(s); }

  // rows: arrays of cells; a cell is text, or {html: Node}, or {th: text} for a row header.
  function fill(tableId, rows, empty) {
    const tb = document.querySelector(`#${tableId} tbody`);
    tb.textContent = "";
    if (!rows.length) {
      const tr = tb.insertRow();
      const td = tr.insertCell();
      td.colSpan = document.querySelectorAll(`#${tableId} thead th`).length || 2;
      td.textContent = empty || "none";
      return;
    }
    for (const row of rows) {
      const tr = tb.insertRow();
      for (const c of row) {
        if (c && c.th !== undefined) {
          const th = document.createElement("th");
          th.scope = "row";
          if (c.node) th.appendChild(c.node); else th.textContent = text(c.th);
          tr.appendChild(th);
        } else if (c && c.node) {
          tr.insertCell().appendChild(c.node);
        } else {
          tr.insertCell().textContent = text(c);
        }
        if (c && c.cls) tr.className = c.cls;
      }
    }
  }

  function link(href, label) {
    const a = document.createElement("a");
    a.href = href; a.textContent = label; return a;
  }

  function cards(hostSel, items) {
    const host = document.querySelector(hostSel + " > div");
    host.textContent = "";
    const dl = document.createElement("dl");
    for (const [k, v] of items) {
      const d = document.createElement("div");
      const dt = document.createElement("dt"); dt.textContent = k;
      const dd = document.createElement("dd"); dd.textContent = v;
      d.append(dt, dd); dl.appendChild(d);
    }
    host.appendChild(dl);
  }

  function hardware(h) {
    if (!h) return "no samples";
    const out = [];
    if (h.throttleReasons) out.push(`throttle 0x${h.throttleReasons.toString(16)}`);
    if (h.smClockRatioMin !== null && h.smClockRatioMin < 0.98) out.push(`SM clock ${pct(h.smClockRatioMin)} of max`);
    if (h.gpuTempMax !== null) out.push(`${h.gpuTempMax.toFixed(0)} °C max`);
    if (h.eccUncorrectable) out.push(`ECC DBE ${h.eccUncorrectable}`);
    if (h.eccCorrectable) out.push(`ECC SBE ${h.eccCorrectable}`);
    if (h.xids && h.xids.length) out.push(`Xid ${h.xids.join(",")}`);
    if (h.nvlinkCrcErrors) out.push(`NVLink CRC ${h.nvlinkCrcErrors}`);
    if (h.pcieReplays) out.push(`PCIe replays ${h.pcieReplays}`);
    if (h.nicErrorsPerS) out.push(`NIC errors ${F(h.nicErrorsPerS)}/s`);
    return out.join("; ") || "nominal";
  }

  function evidence(ev) {
    return (ev || []).map((e) => {
      const parts = [];
      if (e.signal) parts.push(e.signal);
      if (e.metric) parts.push(e.metric);
      if (e.value !== undefined) parts.push(`= ${F(e.value)}`);
      if (e.baseline !== undefined) parts.push(`(baseline ${F(e.baseline)})`);
      if (e.threshold !== undefined) parts.push(`(threshold ${F(e.threshold)})`);
      if (e.reasons) parts.push(e.reasons.join(","));
      return parts.join(" ");
    }).join("; ");
  }

  // ---------------------------------------------------------------- runs list
  async function runsPage() {
    const d = await getJSON("/v1/runs?limit=200");
    fill("runs", d.runs.map((r) => [
      { th: r.runId, node: link(`/runs/${enc(r.runId)}`, r.runId) }, r.project, r.status,
      r.lastStep, r.worldSize, when(r.lastSeen), { node: link(`/runs/${enc(r.runId)}/failure`, "failure page") },
    ]), "no runs yet");
    return false;
  }

  // ---------------------------------------------------------------- run page
  function markersOf(d) {
    const out = [];
    for (const i of d.timeline || []) {
      if (i.step === null || i.step === undefined) continue;
      if (i.source === "metric") out.push({ x: i.step, kind: "metric", lane: "metric", label: `step ${i.step}: ${i.message}` });
      else if (["checkpoint_end", "failure", "hardware_fault", "restart", "job_start", "drain", "config_change", "nan"].includes(i.kind)) {
        out.push({ x: i.step, kind: i.kind, lane: i.kind === "checkpoint_end" ? "checkpoint_end" : "event",
          label: `step ${i.step}: ${i.kind} ${i.message || ""}` });
      }
    }
    for (const a of d.alerts || []) {
      if (a.step !== null && a.step !== undefined) out.push({ x: a.step, kind: "alert", lane: "alert", label: `alert ${a.alertname} at step ${a.step}` });
    }
    return out;
  }

  function scalarChart(id, s, label, dom, markers) {
    const host = document.getElementById(id);
    if (!host) return;
    const pts = (s || []).map((p) => [p.step, typeof p.value === "number" ? p.value : null]);
    const band = (s || []).map((p) => [p.step, typeof p.min === "number" ? p.min : null, typeof p.max === "number" ? p.max : null]);
    FLCharts.line(host, [{ name: label, points: pts, band }], { label: `${label} over steps`, xDomain: dom, markers });
  }

  // MFU as the run's API answers it, or why it is unknown (the config lacks FLOPs or a GPU).
  function mfuText(x) {
    if (!x) return "unknown";
    if (typeof x.value === "number") {
      const hfu = typeof x.hfu === "number" ? ` (HFU ${pct(x.hfu)})` : "";
      return `${pct(x.value)}${hfu}${x.accelerator ? ` on ${x.devices || "?"} × ${x.accelerator}` : ""}`;
    }
    return `unknown: ${x.missing || "not computed"}`;
  }

  async function runPage() {
    const d = await getJSON(`/v1/runs/${enc(runId)}/overview?points=${Math.min(800, Math.max(100, Math.floor(window.innerWidth / 2)))}`);
    const s = d.summary || {}, m = s.metrics || {};
    const g = d.goodput || {}, f = g.factors || {}, bd = g.breakdown || {};
    const eta = d.completion;
    const acts = d.remediations || [];
    const act = acts.find((a) => UNDER_WAY.includes(a.state)) || acts[0];
    cards("#now", [
      ["Status", d.run.status], ["Goodput (job)", pct(f.jobProduct)], ["Runtime goodput", pct(f.runtime)],
      ["Step", text(s.step)], ["Ranks", text(s.worldSize)], ["Step time (slowest rank)", `${F(m.stepTimeMs)} ms`],
      ["Tokens/s", F(m.tokensPerSecond)], ["MFU", mfuText(d.mfu)], ["Tokens consumed", F(s.tokensProcessed)],
      ["Loss", F(m.loss)], ["Est. completion", eta ? `${dur(eta.seconds)} (${F(eta.stepsLeft)} steps left)` : "unknown: no total_steps in the run config"],
    ].concat(act ? [["Remediation", `${act.node} ${stateLabel(act.state)}`]] : []));
    const lines = (bd.lines || []).filter((l) => l.seconds > 0);
    FLCharts.bars(document.getElementById("goodput-bars"), lines.map((l) => ({ label: l.category, value: l.seconds / 3600,
      color: l.category === "productive" ? "#059669" : l.factor === "program" ? "#d97706" : "#dc2626" })),
    { label: "Hours of wall-clock time by category", height: 170 });
    fill("breakdown", lines.map((l) => [{ th: l.category }, dur(l.seconds), pct(l.share), l.factor]));
    fill("factors", [[{ th: "Scheduling" }, pct(f.scheduling)], [{ th: "Runtime" }, pct(f.runtime)],
      [{ th: "Program" }, pct(f.program)], [{ th: "Job (runtime × program)" }, pct(f.jobProduct)]]);
    const ss = d.stepSeries || [];
    const dom = ss.length ? [ss[0].step, ss[ss.length - 1].step] : [0, 1];
    const mk = markersOf(d);
    FLCharts.line(document.getElementById("chart-step"), [
      { name: "step time median", points: ss.map((p) => [p.step, p.p50 * 1000]), band: ss.map((p) => [p.step, p.min * 1000, p.max * 1000]) },
      { name: "step time max", points: ss.map((p) => [p.step, p.max * 1000]), color: "#dc2626", dash: "4,2" },
      { name: "slowest rank compute", points: ss.map((p) => [p.step, p.computeMax === null ? null : p.computeMax * 1000]), color: "#d97706" },
      { name: "mean rank compute", points: ss.map((p) => [p.step, p.computeMean === null ? null : p.computeMean * 1000]), color: "#059669" },
    ], { label: "Step time in ms over steps: median with min-max band, max, slowest and mean rank compute", yLabel: "ms", xDomain: dom, markers: mk, height: 220 });
    const gp = ss.map((p, i) => {
      const next = ss[i + 1];
      const wall = next ? next.t - p.t : null;
      const useful = p.steps * p.p50 * (p.computeMax ? p.computeMean / p.computeMax : 1);
      return [p.step, wall && wall > 0 ? Math.min(1, useful / wall) : null];
    });
    FLCharts.line(document.getElementById("chart-goodput"), [{ name: "goodput", points: gp, color: "#059669" }],
      { label: "Goodput of each step bucket over steps (productive time over wall time)", xDomain: dom, markers: mk });
    const sc = d.scalars || {};
    scalarChart("chart-loss", sc.loss, "loss", dom, mk);
    scalarChart("chart-lr", sc.lr, "learning rate", dom, mk);
    scalarChart("chart-grad_norm", sc.grad_norm, "gradient norm", dom, mk);
    FLCharts.line(document.getElementById("chart-tps"), [{ name: "tokens/s", points: ss.map((p) => [p.step, p.tokensPerSecond]) }],
      { label: "Tokens per second over steps", xDomain: dom, markers: mk });
    FLCharts.strip(document.getElementById("chart-timeline"), mk, { xDomain: dom, label: `Timeline of ${mk.length} events, checkpoints, metric changes and alerts over steps` });

    fill("findings", (d.findings || []).map((x) => [{ th: x.diagnosis }, x.owner, pct(x.confidence),
      `${text(x.startStep)}–${text(x.endStep)}`, x.summary, evidence(x.evidence)]), "no findings");
    const tl = (d.timeline || []).filter((i) => i.kind !== "checkpoint_begin");
    const altl = (d.alerts || []).map((a) => ({ step: a.step, source: "alert", kind: a.alertname, message: a.annotations.summary || "" }));
    fill("timeline", tl.concat(altl).sort((a, b) => (a.step ?? -1) - (b.step ?? -1)).slice(0, 400).map((i) => [
      { th: text(i.step) }, i.source, i.kind, [i.node, i.gpu !== null && i.gpu !== undefined ? `GPU ${i.gpu}` : null, i.rank !== null && i.rank !== undefined ? `rank ${i.rank}` : null].filter(Boolean).join(" ") || "–", i.message || ""]));
    remediationSection(acts, d.generatedAt);
    // First paint is done; the heatmap and the slowest ranks, below the fold, come next.
    body.dataset.painted = "true";
    heatmapSection(await getJSON(`/v1/runs/${enc(runId)}/heatmap?slowest=8`));
    return d.run.status === "RUNNING";
  }

  function heatmapSection(h) {
    if (h.cells && h.cells.length) {
      const canvas = document.getElementById("heatmap");
      const hot = h.hot;
      const label = `Heatmap of compute time, ${h.rows} rows of ${h.ranksPerRow} ranks by ${h.columns} columns of ${h.stepsPerColumn} steps, steps ${h.fromStep}-${h.toStep}` +
        (hot ? `; hottest row: ranks ${hot.rankFrom}-${hot.rankTo}, slowest rank ${hot.rank}` : "");
      FLCharts.heatmap(canvas, h, { label });
      document.getElementById("heat-caption").textContent =
        `Steps ${h.fromStep}–${h.toStep}. Each cell is the maximum compute time of ${h.ranksPerRow} rank(s) over ${h.stepsPerColumn} step(s), coloured by its ratio to the column median (red: 25% or more above).`;
      const hp = document.getElementById("heat-hot");
      if (hot) {
        hp.dataset.rank = hot.rank; hp.dataset.rankFrom = hot.rankFrom; hp.dataset.rankTo = hot.rankTo; hp.dataset.row = hot.row;
        hp.textContent = `Outlined row ${hot.row}: ranks ${hot.rankFrom}–${hot.rankTo}, ${F(hot.ratio)}× the column median; slowest rank ${hot.rank}.`;
      }
    }
    fill("ranks", (h.slowestRanks || []).map((r) => [{ th: r.rank }, r.node, r.gpu, F(r.computeMs),
      r.computeSlowdown ? r.computeSlowdown.toFixed(3) : "–", F(r.commMs), hardware(r.hardware)]));
  }

  // ---------------------------------------------------------------- remediation
  // The controller's phases in order; training is paused from "wait" (the ranks agree on a
  // step boundary) to the end of "warmup" (the first step at the new world size).
  const PHASES = ["detection", "approval", "wait", "checkpoint", "verify", "remove", "rendezvous", "reload", "warmup"];
  const PAUSED = PHASES.slice(2);
  const ACTIVE = ["draining", "removing", "restarting"];
  const UNDER_WAY = ["awaiting_approval"].concat(ACTIVE);
  const APPROVABLE = ["awaiting_approval", "recommended"];  // a recommendation is approved the same way

  function stateLabel(st) { return st.replace(/_/g, " "); }

  // The state, and for an action awaiting approval (or only recommended) a button that approves
  // it with the page's token.
  function stateCell(a, done) {
    const span = document.createElement("span");
    const st = document.createElement("strong");
    st.className = `state state-${a.state}`;
    st.textContent = stateLabel(a.state);
    span.appendChild(st);
    if (a.error) {
      const e = document.createElement("div");
      e.className = "note";
      e.textContent = a.error;
      span.appendChild(e);
    }
    if (!APPROVABLE.includes(a.state)) return { node: span, cls: UNDER_WAY.includes(a.state) ? "pending" : "" };
    const b = document.createElement("button");
    b.type = "button";
    b.className = "approve";
    b.textContent = "Approve";
    b.setAttribute("aria-label", `Approve action #${a.id}: take ${a.node} out of run ${a.runId}${a.tenant && page === "oncall" ? ` of tenant ${a.tenant}` : ""}`);
    const msg = document.createElement("div");
    msg.className = "error";
    msg.setAttribute("role", "alert");
    b.addEventListener("click", async () => {
      // Approving drains a node out of a running job: asked once more, naming both.
      if (!window.confirm(`Take ${a.node} out of run ${a.runId}? The job stops at its next step boundary, `
        + "checkpoints and goes on without the node.")) return;
      b.disabled = true;
      msg.textContent = "";
      try {
        await done(await post(`/v1/remediations/${a.id}/approve`));
      } catch (err) {
        if (err.status === 401) { signIn.show(Boolean(storedToken())); return; }  // revoked meanwhile
        msg.textContent = `Could not approve: ${err.message}`;
        b.disabled = err.status === 409;  // no longer pending: approving again cannot work
      }
    });
    span.append(" ", b, msg);
    return { node: span, cls: "pending" };
  }

  function phaseSeconds(p, now) {
    if (p.seconds !== null) return secs(p.seconds);
    return p.start && now ? `under way, ${secs(Math.max(0, now - p.start))} so far` : "under way";
  }

  function phaseTable(a, now) {
    const phases = Object.entries(a.phases || {});
    const paused = phases.filter(([k, p]) => PAUSED.includes(k) && p.seconds !== null).reduce((t, [, p]) => t + p.seconds, 0);
    const t = document.createElement("table");
    t.className = "phases";
    t.id = `phases-${a.id}`;
    const cap = t.createCaption();
    const head = a.recoveryS !== null ? `: recovery ${secs(a.recoveryS)}${paused > 0 ? ` (training paused ${secs(paused)})` : ""}` : "";
    const list = phases.filter(([k]) => k !== "detection").map(([k, p]) => `${k} ${phaseSeconds(p, now)}`).join(", ");
    cap.textContent = `Action #${a.id} on ${a.node} (${a.reason}), ${stateLabel(a.state)}${head}${list ? ": " + list : ""}. ${a.summary || ""}`;
    const hr = t.createTHead().insertRow();
    for (const h of ["Phase", "Seconds", "Share of the pause"]) {
      const th = document.createElement("th");
      th.scope = "col"; th.textContent = h; hr.appendChild(th);
    }
    const tb = t.createTBody();
    for (const [name, p] of phases) {
      const tr = tb.insertRow();
      const th = document.createElement("th");
      th.scope = "row"; th.textContent = name; tr.appendChild(th);
      tr.insertCell().textContent = phaseSeconds(p, now);
      const cell = tr.insertCell();
      if (!PAUSED.includes(name)) { cell.textContent = "before the pause (training ran on)"; continue; }
      if (p.seconds === null || !(paused > 0)) { cell.textContent = "–"; continue; }
      const share = p.seconds / paused;
      const track = document.createElement("span");
      track.className = "track";
      track.setAttribute("aria-hidden", "true");
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = `${Math.max(0.5, 100 * share).toFixed(1)}%`;
      track.appendChild(bar);
      cell.append(track, ` ${pct(share)}`);
    }
    return t;
  }

  let runActions = [];

  function remediationSection(actions, now) {
    runActions = actions;
    const redraw = (out) => remediationSection(runActions.map((x) => (x.id === out.id ? out : x)), out.updatedAt);
    fill("remediations", actions.map((a) => [{ th: `#${a.id}` }, a.node, a.reason, stateCell(a, redraw),
      when(a.decidedAt), `${text(a.worldBefore)} → ${text(a.worldAfter)}`, `${text(a.stopStep)} → ${text(a.resumeStep)}`,
      text(a.stepsLost), a.recoveryS !== null ? secs(a.recoveryS) : ACTIVE.includes(a.state) ? "under way" : "–",
      (a.checkpoint || {}).verifiedBy || (a.checkpoint || {}).source || "–"]), "no remediation actions");
    const host = document.getElementById("rem-phases");
    host.textContent = "";
    // A table for each action that went past the decision (a recommendation has nothing to time).
    const carried = actions.filter((a) => Object.keys(a.phases || {}).some((k) => PAUSED.includes(k)));
    for (const a of carried.slice(0, 10)) host.appendChild(phaseTable(a, now));
  }

  // ---------------------------------------------------------------- failure page
  async function failurePage() {
    const d = await getJSON(`/v1/runs/${enc(runId)}/failure`);
    const host = document.getElementById("f-status");
    host.textContent = "";
    const p = document.createElement("p");
    p.className = "big";
    p.textContent = d.run.status;
    const w = document.createElement("p");
    w.id = "f-what";
    w.textContent = d.failure ? `${d.failure.kind} at step ${text(d.failure.step)}: ${d.failure.message || ""}${d.failure.node ? ` (${d.failure.node}${d.failure.gpu !== null ? " GPU " + d.failure.gpu : ""})` : ""}`
      : (d.cause ? `Degraded: ${d.cause.summary}` : "No failure recorded.");
    host.append(p, w, link(`/runs/${enc(runId)}`, "Run page"));
    const tr = d.training || {};
    const rows = Object.entries(tr).map(([k, pts]) => [{ th: k }, pts.map((x) => F(typeof x.value === "number" ? x.value : NaN) === "–" ? String(x.value) : F(x.value)).join(" → ")]);
    const st = (d.stepTime || []).map((x) => F(x.max * 1000));
    if (st.length) rows.push([{ th: "step time (ms)" }, st.join(" → ")]);
    fill("f-training", rows, "no training signals");
    fill("f-infra", (d.infrastructure || []).map((r) => [{ th: r.rank }, r.node, r.gpu,
      r.computeSlowdown ? r.computeSlowdown.toFixed(3) : "–", hardware(r.hardware)]));
    const c = document.getElementById("f-cause");
    c.textContent = "";
    if (d.cause) {
      const h = document.createElement("p");
      h.id = "cause-diagnosis";
      h.className = "big";
      h.textContent = d.cause.diagnosis;
      const s = document.createElement("p");
      s.textContent = `${d.cause.summary} Owner: ${d.cause.owner}; confidence ${pct(d.cause.confidence)}. Evidence: ${evidence(d.cause.evidence) || "–"}`;
      c.append(h, s);
    } else c.textContent = "No diagnosis yet.";
    fill("f-related", (d.related || []).filter((i) => i.kind !== "checkpoint_begin").map((i) => [{ th: text(i.step) }, i.kind, i.message || ""]));
    document.getElementById("f-rec").textContent = d.cause ? d.cause.recommendation : "–";
    return d.run.status === "RUNNING";
  }

  // ---------------------------------------------------------------- on-call
  // A token that reads runs gets its tenant's view (jobs by goodput, with links to their runs);
  // an on-call token (view "infra") gets every tenant's nodes, drains, actions and alerts, with
  // a tenant column, run ids as plain text (their pages are closed to it) and no jobs section.
  const INFRA_COLUMNS = {
    nodes: ["Node", "Fatal", "Recoverable", "Tenant: run", "Latest"],
    actions: ["Node", "Tenant", "Run", "State", "Age", "Reason"],
    drains: ["Node", "Tenant", "Run", "Kind", "When", "Message"],
    alerts: ["Alert", "Severity", "Tenant", "Node", "Run", "Summary", "Age", "Acknowledged", "Silence", "Incident"],
    incidents: ["Incident", "Tenant", "Run", "Infrastructure alerts", "Status"],
  };
  const INFRA_CAPTIONS = {
    nodes: "Nodes with fatal or recoverable faults (firing hardware alerts), every tenant",
    drains: "Drain and maintenance events on nodes, every tenant, newest first",
    alerts: "Firing infrastructure alerts (hardware faults, drained nodes), every tenant",
    incidents: "Open incidents of those alerts",
  };

  function columns(tableId, names) {
    const tr = document.querySelector(`#${tableId} thead tr`);
    if (tr.dataset.view === "infra") return;
    tr.dataset.view = "infra";
    tr.textContent = "";
    for (const n of names) {
      const th = document.createElement("th");
      th.scope = "col"; th.textContent = n; tr.appendChild(th);
    }
  }

  function infraView() {
    document.getElementById("jobs").hidden = true;
    document.getElementById("jobs-hidden").hidden = false;
    for (const [id, names] of Object.entries(INFRA_COLUMNS)) columns(id, names);
    for (const [id, cap] of Object.entries(INFRA_CAPTIONS)) document.querySelector(`#${id} caption`).textContent = cap;
  }

  // The alert's name linked to its runbook (annotation runbook_url, the Prometheus convention).
  function alertName(a) {
    const url = a.runbookUrl || (a.annotations && a.annotations.runbook_url);
    return url ? { th: a.alertname, node: link(url, a.alertname) } : { th: a.alertname };
  }

  // Who acknowledged an alert and when, or a button that acknowledges it with the page's token.
  function ackCell(a, now, done) {
    if (a.ackedBy) return `${a.ackedBy}, ${dur(Math.max(0, now - a.ackedAt))} ago`;
    const span = document.createElement("span");
    const b = document.createElement("button");
    b.type = "button";
    b.className = "approve";
    b.textContent = "Acknowledge";
    b.setAttribute("aria-label", `Acknowledge alert ${a.alertname} #${a.id}`);
    const msg = document.createElement("div");
    msg.className = "error";
    msg.setAttribute("role", "alert");
    b.addEventListener("click", async () => {
      b.disabled = true;
      msg.textContent = "";
      try {
        await post(`/v1/alerts/${a.id}/ack`);
        await done();
      } catch (err) {
        if (err.status === 401) { signIn.show(Boolean(storedToken())); return; }
        msg.textContent = `Could not acknowledge: ${err.message}`;
        b.disabled = false;
      }
    });
    span.append(b, msg);
    return { node: span };
  }

  // Silencing an alert: its name and its run (a tenant's view) or its node (on-call's), for a
  // while, with a reason; or the silences already holding it back.
  function silenceCell(a, matchers, done) {
    if (a.silencedBy && a.silencedBy.length) return `silenced (#${a.silencedBy.join(", #")})`;
    const span = document.createElement("span");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "approve";
    open.textContent = "Silence…";
    open.setAttribute("aria-label", `Silence alert ${a.alertname} #${a.id}`);
    const form = document.createElement("form");
    form.className = "inline-form silence-form";
    form.hidden = true;
    const id = `sil-${a.id}`;
    form.innerHTML = `<label for="${id}-for">for</label><select id="${id}-for"><option value="3600">1 hour</option>`
      + `<option value="14400">4 hours</option><option value="86400">24 hours</option></select>`
      + `<label for="${id}-why">because</label><input id="${id}-why" type="text" aria-required="true" size="18">`
      + `<button type="submit">Silence</button>`;
    const msg = document.createElement("div");
    msg.className = "error";
    msg.setAttribute("role", "alert");
    open.addEventListener("click", () => { open.hidden = true; form.hidden = false; form.querySelector("input").focus(); });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      msg.textContent = "";
      const comment = form.querySelector("input").value.trim();
      if (!comment) { msg.textContent = "Say why: whoever is paged next reads it."; return; }
      try {
        await send("POST", "/v1/silences", { matchers, comment, durationSeconds: Number(form.querySelector("select").value) });
        await done();
      } catch (err) {
        if (err.status === 401) { signIn.show(Boolean(storedToken())); return; }
        msg.textContent = `Could not silence: ${err.message}`;
      }
    });
    span.append(open, form, msg);
    return { node: span };
  }

  function silenceRows(silences, now, done) {
    return silences.map((x) => {
      const over = x.endsAt <= now;
      let state = over ? "ended" : x.startsAt > now ? "to come" : "in force";
      if (!over) {
        const b = document.createElement("button");
        b.type = "button";
        b.className = "approve";
        b.textContent = "Expire";
        b.setAttribute("aria-label", `Expire silence #${x.id}`);
        b.addEventListener("click", async () => {
          b.disabled = true;
          try { await send("DELETE", `/v1/silences/${x.id}`); await done(); } catch (err) { b.disabled = false; }
        });
        const span = document.createElement("span");
        span.append(state + " ", b);
        state = { node: span };
      }
      return [{ th: `#${x.id}` }, Object.entries(x.matchers).map(([k, v]) => `${k}=${v}`).join(", "),
        `${when(x.endsAt)} UTC`, x.comment, x.createdBy, state];
    });
  }

  function runLinks(ids) {
    const span = document.createElement("span");
    ids.forEach((r, i) => { if (i) span.append(", "); span.append(link(`/runs/${enc(r)}`, r)); });
    return span;
  }

  function runCell(runId) {
    const span = document.createElement("span");
    span.append(link(`/runs/${enc(runId)}`, runId), " (", link(`/runs/${enc(runId)}/failure`, "failure page"), ")");
    return { node: span };
  }

  async function oncallPage() {
    const d = await getJSON("/v1/portal/oncall");
    const infra = d.view === "infra";
    const since = (t) => dur(Math.max(0, d.generatedAt - t));
    const age = (a) => dur(Math.max(0, d.generatedAt - a.decidedAt));
    const latest = (n) => n.events.length ? `${n.events[0].kind}: ${n.events[0].message}` : "–";
    if (infra) {
      infraView();
      fill("nodes", d.nodes.map((n) => [{ th: n.node }, n.fatal, n.recoverable,
        n.runs.map((r) => `${r.tenant}: ${r.runId}`).join(", "), latest(n)]), "no faults");
      fill("actions", d.remediations.map((a) => [{ th: a.node }, a.tenant, a.runId, stateCell(a, oncallPage), age(a), a.reason]),
        "no drains in progress or actions awaiting approval");
      fill("drains", d.drains.map((e) => [{ th: e.node }, e.tenant, e.runId, e.kind, when(e.time), e.message]), "no drains");
      fill("alerts", d.alerts.map((a) => [alertName(a), a.severity, a.tenant,
        [a.node, a.gpu !== null ? `GPU ${a.gpu}` : null].filter(Boolean).join(" ") || "–", a.runId, a.summary,
        since(a.startsAt), ackCell(a, d.generatedAt, oncallPage),
        silenceCell(a, a.node ? { alertname: a.alertname, node: a.node } : { alertname: a.alertname, run_id: a.runId }, oncallPage),
        text(a.incidentId)]),
      "no firing infrastructure alerts");
      fill("silences", silenceRows(d.silences || [], d.generatedAt, oncallPage), "no silences");
      fill("incidents", d.incidents.map((i) => [{ th: i.id }, i.tenant, i.runId, i.alerts.join("; "), "open"]), "no open incidents");
      return true;
    }
    fill("jobs", d.jobs.map((j) => [{ th: j.runId, node: link(`/runs/${enc(j.runId)}`, j.runId) },
      j.status, (j.below ? "below: " : "") + pct(j.goodput), pct(j.threshold),
      j.spread ? `${pct(j.spread.spread)} (slowest ${F(j.spread.computeMaxMs)} ms vs mean ${F(j.spread.computeMeanMs)} ms)` : "–",
      j.worldSize]), "no jobs");
    document.querySelectorAll("#jobs tbody tr").forEach((tr, i) => { if (d.jobs[i] && d.jobs[i].below) tr.className = "below"; });
    fill("nodes", d.nodes.map((n) => [{ th: n.node }, n.fatal, n.recoverable,
      n.jobs.length ? { node: runLinks(n.jobs) } : "none running", latest(n)]), "no faults");
    fill("actions", (d.remediations || []).map((a) => [{ th: a.node },
      { node: link(`/runs/${enc(a.runId)}#remediation`, a.runId) }, stateCell(a, oncallPage), age(a), a.reason]),
    "no drains in progress or actions awaiting approval");
    fill("drains", d.drains.map((e) => [{ th: text(e.node) }, e.runId, text(e.step), e.message]), "no drains");
    fill("alerts", d.alerts.map((a) => [alertName(a), a.severity, runCell(a.runId),
      a.annotations.summary || "", since(a.startsAt), ackCell(a, d.generatedAt, oncallPage),
      silenceCell(a, { alertname: a.alertname, run_id: a.runId }, oncallPage), text(a.incidentId)]), "no firing alerts");
    fill("silences", silenceRows(d.silences || [], d.generatedAt, oncallPage), "no silences");
    fill("incidents", d.incidents.map((i) => [{ th: i.id }, i.runId, i.title, i.status]), "no open incidents");
    return true;
  }

  // ---------------------------------------------------------------- capacity
  // The period and the price are the URL's (?period=HOURS&price=USD), so a view can be shared.
  function capacityQuery() {
    const q = new URLSearchParams(window.location.search);
    const period = q.has("period") ? q.get("period") : "168";
    const price = q.get("price") || "2";
    const form = document.getElementById("cap-form");
    if (!form.dataset.bound) {
      form.dataset.bound = "true";
      document.getElementById("cap-period").value = period;
      document.getElementById("cap-price").value = Number(price).toFixed(2);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const nq = new URLSearchParams();
        nq.set("period", document.getElementById("cap-period").value);
        nq.set("price", document.getElementById("cap-price").value);
        history.replaceState(null, "", `?${nq}`);
        load();
      });
    }
    const api = new URLSearchParams({ price });
    if (period) api.set("periodHours", period);
    return api;
  }

  async function capacityPage() {
    const d = await getJSON(`/v1/portal/capacity?${capacityQuery()}`);
    document.getElementById("cap-period-text").textContent = `From ${when(d.period.from)} to ${when(d.period.to)} UTC `
      + `(${d.period.asked ? dur(d.period.hours * 3600) : "everything on record"}), ${d.runs} runs`;
    const warn = document.getElementById("cap-warnings");
    warn.textContent = "";
    for (const w of d.warnings || []) {
      const p = document.createElement("p"); p.className = "error"; p.textContent = "Warning: " + w; warn.appendChild(p);
    }
    cards("#cap-now", [["Fleet utilization", pct(d.utilization)], ["Fleet goodput", pct(d.goodput)],
      ["Cost per useful GPU-hour", d.costPerUsefulGpuHour ? `$${d.costPerUsefulGpuHour.toFixed(2)} at $${d.price.toFixed(2)}/GPU-h` : "–"],
      ["Runs", text(d.runs)]].concat(d.oversubscribedGpuHours > 0
      ? [["Oversubscribed", `${F(d.oversubscribedGpuHours)} GPU-h held beyond capacity`]] : []));
    FLCharts.bars(document.getElementById("chart-waterfall"), d.waterfall.map((w) => ({ label: w.step, value: w.gpuHours })),
      { waterfall: true, label: "Waterfall from in-service to useful GPU-hours: scheduling, runtime and program losses" });
    fill("waterfall", d.waterfall.map((w) => [{ th: w.step }, F(w.gpuHours)]));
    const loss = Object.entries(d.lossByCause).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
    FLCharts.bars(document.getElementById("chart-loss-cause"), loss.map(([k, v]) => ({ label: k, value: v, color: "#dc2626" })),
      { label: "GPU-hours lost by cause" });
    fill("loss-cause", loss.map(([k, v]) => [{ th: k }, F(v)]));
    const fails = Object.entries(d.interruptions).map(([k, v]) => [`interruption: ${k}`, v])
      .concat(Object.entries(d.findingsByCause).map(([k, v]) => [`diagnosis: ${k}`, v]));
    fill("failures", fails.map(([k, v]) => [{ th: k }, v]), "no failures");
    fill("pools", d.pools.map((p) => [{ th: p.pool }, pct(p.schedulingGoodput), pct(p.availability),
      F(p.queueWaitSeconds ? p.queueWaitSeconds.p90 : null), p.jobs]), "no pools");
    return true;
  }

  const PAGES = { runs: runsPage, run: runPage, failure: failurePage, oncall: oncallPage, capacity: capacityPage };
  // Pages drawn by another script loaded before this one (static/models.js: compare, models,
  // evaluations): each registers a factory, handed these helpers, that returns its pages.
  for (const make of window.FLPageFactories || []) {
    Object.assign(PAGES, make({ getJSON, fill, link, cards, text, pct, dur, secs, when, enc, F }));
  }

  // ---------------------------------------------------------------- signing in
  // One of three views under the heading: the page's content, the sign-in form, or the 403
  // message. body[data-loaded] says which ("true" or "error", "signin", "forbidden").
  const signIn = (() => {
    const content = document.getElementById("content");
    const section = document.getElementById("signin");
    const form = document.getElementById("signin-form");
    const input = document.getElementById("token");
    const why = document.getElementById("signin-why");
    const error = document.getElementById("signin-error");
    const forbidden = document.getElementById("forbidden");
    const forbiddenWhy = document.getElementById("forbidden-why");
    const forbiddenOncall = document.getElementById("forbidden-oncall");
    const signOut = document.getElementById("sign-out");

    function view(name) {
      content.hidden = name !== "content";
      section.hidden = name !== "signin";
      forbidden.hidden = name !== "forbidden";
      signOut.hidden = !storedToken();
    }

    // refused: the server answered 401 to the stored token, which is then forgotten.
    function show(refused) {
      stop();
      if (refused) sessionStorage.removeItem(TOKEN_KEY);
      view("signin");
      why.textContent = body.dataset.auth === "required" ? "This server requires an API token."
        : "Enter an API token, or reload the page to go on as this server's local user.";
      error.textContent = "";
      // Set after the form is visible, so that screen readers announce it.
      if (refused) error.textContent = "The server answered 401: this token was refused (it is unknown or was revoked). Check it and try again, or ask for a new one.";
      status.textContent = "Sign in to load this page.";
      body.dataset.loaded = "signin";
      input.focus();
    }

    // The role, from the server's message ("role 'oncall' may not read").
    function roleOf(err) {
      const m = /role '([^']+)'/.exec(err.reason || "");
      return m ? m[1] : null;
    }

    function showForbidden(err) {
      stop();
      view("forbidden");
      const oncall = roleOf(err) === "oncall" && page !== "oncall";
      forbiddenOncall.hidden = !oncall;
      forbiddenWhy.textContent = "";
      forbiddenWhy.textContent = `The server answered 403 (${err.reason || "forbidden"}): this token's role may not read this page. `
        + (oncall ? "This page shows runs' contents, which the tenant's viewer, editor and admin roles read; "
          + "an on-call token reads the On-call page (below), or sign in with another token."
          : "The portal's pages need a token with the viewer, editor or admin role (the on-call role reads the On-call page); "
          + "an ingest token only sends telemetry. Sign in with another token.");
      status.textContent = "Not allowed.";
      body.dataset.loaded = "forbidden";
      document.getElementById("h-forbidden").focus();
    }

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = input.value.trim();
      if (!token) {
        error.textContent = "";
        error.textContent = "Enter an API token.";
        input.focus();
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      input.value = "";
      error.textContent = "";
      load();
    });
    document.getElementById("switch-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      show(false);
    });
    // Reloading drops whatever the token let the page draw.
    signOut.addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      window.location.reload();
    });
    return { view, show, showForbidden };
  })();

  let timer = null;
  function stop() { clearTimeout(timer); timer = null; }

  async function load() {
    stop();
    if (body.dataset.auth === "required" && !storedToken()) { signIn.show(false); return; }
    if (body.dataset.loaded !== "true") {  // not a live page's refresh
      delete body.dataset.loaded;
      status.textContent = "Loading…";
    }
    signIn.view("content");
    try {
      const live = await PAGES[page]();
      status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      body.dataset.loaded = "true";
      if (live) timer = setTimeout(load, REFRESH_MS);
    } catch (err) {
      if (err.status === 401) signIn.show(Boolean(storedToken()));
      else if (err.status === 403) signIn.showForbidden(err);
      else {
        status.textContent = `Could not load: ${err.message}`;
        body.dataset.loaded = "error";
      }
    }
  }
  load();
})();
