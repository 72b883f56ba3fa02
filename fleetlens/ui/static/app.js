// fleetlens portal: each page fetches its one JSON document, draws it, and live pages refetch
// it on an interval (no full reload), with backoff after an error, an "updated N s ago" line and
// a pause button. The run and rank pages (run.js, drawn with uPlot through plots.js) register
// themselves in FLApp.pages; the run page fetches a second document after its first paint: the
// heatmap and the slowest ranks, below the fold, refetched on a refresh only while in view. The
// token in sessionStorage["fleetlens.token"] (this tab only) is sent as a Bearer header, also
// with the one write a page makes: approving a remediation action. A 401, or no token on a
// server that requires one (body[data-auth=required]), shows the sign-in form; a 403 says the
// token's role may not read the page (an on-call token, which reads only the On-call page, is
// pointed there). The token never goes into a URL. Times are UTC and say so.
"use strict";

(() => {
  const F = FLCharts.fmt;
  const body = document.body;
  const page = body.dataset.page;
  const runId = body.dataset.runId;
  // ?refresh=SECONDS sets the live pages' interval (default 15 s, at least 1 s).
  const REFRESH_MS = Math.max(1, Number(new URLSearchParams(location.search).get("refresh")) || 15) * 1000;
  const BACKOFF_MS = [1000, 2000, 4000, 8000];  // after 1, 2, 3, 4+ failed refreshes (capped by REFRESH_MS)
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
    // The run page starts its first request before the scripts load (ui/pages.py): taken once.
    const early = window.FLEarly && window.FLEarly[path];
    if (early) delete window.FLEarly[path];
    const r = await (early || fetch(path, { headers: authHeaders() }));
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
  function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–"; }
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
    // Each cell carries its column's name: a table of class "stack" is a card per row on a
    // phone (style.css), every cell labelled, none scrolled out of sight.
    const heads = Array.from(document.querySelectorAll(`#${tableId} thead th`), (h) => h.textContent);
    for (const row of rows) {
      const tr = tb.insertRow();
      row.forEach((c, i) => {
        let cell;
        if (c && c.th !== undefined) {
          cell = document.createElement("th");
          cell.scope = "row";
          if (c.node) cell.appendChild(c.node); else cell.textContent = text(c.th);
          tr.appendChild(cell);
        } else if (c && c.node) {
          cell = tr.insertCell();
          cell.appendChild(c.node);
        } else {
          cell = tr.insertCell();
          cell.textContent = text(c);
        }
        if (heads[i]) cell.dataset.label = heads[i];
        if (c && c.cls) tr.className = c.cls;
      });
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

  // The codes' plain names, from the page (fleetlens/names.py): a finding reads as its name, its
  // code (what the API, alerts and the CLI key on) in the tooltip and in data-code.
  const NAMES = (() => {
    try { return JSON.parse(document.getElementById("fl-names").textContent); } catch (e) { return {}; }
  })();
  function findingName(code) {
    const known = (NAMES.diagnoses || {})[code];
    return known || String(code == null ? "" : code).replace(/\./g, ": ").replace(/_/g, " ");
  }
  function named(code, href) {
    const el = href ? link(href, findingName(code)) : document.createElement("span");
    if (!href) el.textContent = findingName(code);
    el.title = `${code}`;
    el.dataset.code = `${code}`;
    return el;
  }

  // A triggered capture's side-by-side (signal trace_capture), one clause a rank: its compute
  // and its exposed communication (the wait), mean ms a captured step.
  function captureEvidence(e) {
    const steps = e.fromStep === null || e.fromStep === undefined ? "" : ` steps ${e.fromStep}–${e.toStep}`;
    const ranks = (e.ranks || []).map((r) => (r.missing
      ? `rank ${r.rank} ${e.state === "expired" ? "never sent its trace" : "not in yet"}`
      : `rank ${r.rank} compute ${F(r.computeMs)} ms, wait ${F(r.exposedCommMs)} ms`));
    return `trace capture${steps}: ${ranks.join("; ") || "no ranks"}`;
  }

  function evidence(ev) {
    return (ev || []).map((e) => {
      if (e.signal === "trace_capture") return captureEvidence(e);
      const parts = [];
      if (e.signal) parts.push(e.signal);
      if (e.metric) parts.push(e.metric);
      if (e.value !== undefined) parts.push(`= ${F(e.value)}`);
      if (e.baseline !== undefined) parts.push(`(baseline ${F(e.baseline)})`);
      if (e.threshold !== undefined) parts.push(`(threshold ${F(e.threshold)})`);
      if (e.reasons) parts.push(e.reasons.join(","));
      if (e.changes && e.changes.length) parts.push(`coincides with ${e.changes.join(", ")}`);
      return parts.join(" ");
    }).join("; ");
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

  // A button that acts with the page's token, and the alert region that says why it failed.
  function actionButton(label, aria) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "approve";
    b.textContent = label;
    b.setAttribute("aria-label", aria);
    const msg = document.createElement("div");
    msg.className = "error";
    msg.setAttribute("role", "alert");
    return { b, msg };
  }

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
    if (a.runEnded) {  // nothing left to drain: approving would add a drain to a finished run
      const e = document.createElement("div");
      e.className = "note";
      e.textContent = `Not offered: the run has ended (${a.runEnded.toLowerCase()}), no job is left to take ${a.node} out of.`;
      span.appendChild(e);
      return { node: span, cls: "" };
    }
    const { b, msg } = actionButton("Approve",
      `Approve action #${a.id}: take ${a.node} out of run ${a.runId}${a.tenant && page === "oncall" ? ` of tenant ${a.tenant}` : ""}`);
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
      h.append(named(d.cause.diagnosis));
      const s = document.createElement("p");
      s.textContent = `${d.cause.summary} Owner: ${d.cause.owner}; confidence ${pct(d.cause.confidence)}. Evidence: ${evidence(d.cause.evidence) || "–"}`;
      c.append(h, s);
    } else c.textContent = "No diagnosis yet.";
    fill("f-related", (d.related || []).filter((i) => i.kind !== "checkpoint_begin").map((i) => [{ th: text(i.step) }, i.kind, i.message || ""]));
    document.getElementById("f-rec").textContent = d.cause ? d.cause.recommendation : "–";
    return LIVE_STATUSES.includes(d.run.status);
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
    const { b, msg } = actionButton("Acknowledge", `Acknowledge alert ${a.alertname} #${a.id}`);
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
    const { b: open, msg } = actionButton("Silence…", `Silence alert ${a.alertname} #${a.id}`);
    const form = document.createElement("form");
    form.className = "inline-form silence-form";
    form.hidden = true;
    const id = `sil-${a.id}`;
    form.innerHTML = `<label for="${id}-for">for</label><select id="${id}-for"><option value="3600">1 hour</option>`
      + `<option value="14400">4 hours</option><option value="86400">24 hours</option></select>`
      + `<label for="${id}-why">because</label><input id="${id}-why" type="text" aria-required="true" size="18">`
      + `<button type="submit">Silence</button><button type="button" class="cancel">Cancel</button>`;
    open.addEventListener("click", () => { open.hidden = true; form.hidden = false; form.querySelector("input").focus(); });
    // Cancel or Escape: the form closes and nothing is sent; the next refresh redraws.
    const close = () => { form.hidden = true; open.hidden = false; msg.textContent = ""; open.focus(); };
    form.querySelector(".cancel").addEventListener("click", close);
    form.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.preventDefault(); close(); } });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      msg.textContent = "";
      const comment = form.querySelector("input").value.trim();
      if (!comment) { msg.textContent = "Say why: whoever is paged next reads it."; return; }
      try {
        await send("POST", "/v1/silences", { matchers, comment, durationSeconds: Number(form.querySelector("select").value) });
        // Closed before the redraw: a refresh that overtakes it is not held back by this form
        // (it held every redraw while open, so the row never said "silenced").
        form.hidden = true;
        msg.textContent = "silenced";
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
        const { b } = actionButton("Expire", `Expire silence #${x.id}`);
        b.addEventListener("click", async () => {
          b.disabled = true;
          try { await send("DELETE", `/v1/silences/${x.id}`); await done(); } catch (err) { b.disabled = false; }
        });
        const span = document.createElement("span");
        span.append(state + " ", b);
        state = { node: span };
      }
      return [{ th: `#${x.id}` }, Object.entries(x.matchers).map(([k, v]) => `${k}=${v}`).join(", "),
        when(x.endsAt), x.comment, x.createdBy, state];
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

  // Draws (a refresh, or after an approval, acknowledgement or silence) may overlap: only the
  // newest request's answer is drawn, so an older answer cannot undo what a newer one shows.
  // A refresh does not redraw the tables under a silence being written (its reason would be
  // lost): it waits until the silence is sent, which redraws them.
  let oncallDraws = 0;

  async function oncallPage(opts = {}) {
    const mine = ++oncallDraws;
    const d = await getJSON("/v1/portal/oncall");
    if (mine !== oncallDraws) return true;
    if (opts.refreshing && document.querySelector(".silence-form:not([hidden])")) { drawHeld = true; return true; }
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
  // The period, the pool and the price are the URL's (?period=HOURS&pool=NAME&price=USD), so a
  // view can be shared.
  function capacityQuery() {
    const q = new URLSearchParams(window.location.search);
    const period = q.has("period") ? q.get("period") : "168";
    const price = q.get("price") || "2";
    const pool = q.get("pool") || "";
    const form = document.getElementById("cap-form");
    if (!form.dataset.bound) {
      form.dataset.bound = "true";
      document.getElementById("cap-period").value = period;
      document.getElementById("cap-price").value = Number(price).toFixed(2);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const nq = new URLSearchParams();
        nq.set("period", document.getElementById("cap-period").value);
        if (document.getElementById("cap-pool").value) nq.set("pool", document.getElementById("cap-pool").value);
        nq.set("price", document.getElementById("cap-price").value);
        history.replaceState(null, "", `?${nq}`);
        load();
      });
    }
    const api = new URLSearchParams({ price });
    if (period) api.set("periodHours", period);
    if (pool) api.set("pool", pool);
    return api;
  }

  function poolChoices(d) {
    const sel = document.getElementById("cap-pool");
    const have = new Set([...sel.options].map((o) => o.value));
    for (const name of d.poolNames || []) {
      if (have.has(name)) continue;
      const o = document.createElement("option"); o.value = name; o.textContent = name; sel.appendChild(o);
    }
    sel.value = d.pool || "";
  }

  async function capacityPage() {
    const d = await getJSON(`/v1/portal/capacity?${capacityQuery()}`);
    poolChoices(d);
    document.getElementById("cap-period-text").textContent = `From ${when(d.period.from)} to ${when(d.period.to)} UTC `
      + `(${d.period.asked ? dur(d.period.hours * 3600) : "everything on record"}), ${d.runs} runs`
      + (d.pool ? ` of pool ${d.pool}` : ", every pool");
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
    const fails = Object.entries(d.interruptions).map(([k, v]) => [{ th: `interruption: ${k}` }, v])
      .concat(Object.entries(d.findingsByCause).map(([k, v]) => {
        const n = named(k);
        n.prepend("finding: ");
        return [{ th: k, node: n }, v];
      }));
    fill("failures", fails, "no failures");
    fleetOverTime(d.series || [], d.price);
    const jobs = d.jobs || { byStatus: {}, cohorts: [] };
    const waits = d.pools.map((p) => p.queueWaitSeconds && p.queueWaitSeconds.p90).filter((x) => typeof x === "number");
    document.getElementById("cap-jobs-text").textContent =
      `Success rate ${pct(jobs.successRate)} of ${text(jobs.ended)} ended runs (` +
      (Object.entries(jobs.byStatus).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ") || "none") + `); ` +
      `queue wait p90 ${waits.length ? dur(Math.max(...waits)) : "– (no allocation records)"}; ` +
      `spare GPUs at the tightest ${d.spareGpusMin === null || d.spareGpusMin === undefined ? "– (no capacity records)" : F(d.spareGpusMin)}.`;
    fill("cohorts", jobs.cohorts.map((c) => [{ th: c.size }, c.runs, F(c.heldGpuHours), F(c.usefulGpuHours), pct(c.goodput)]), "no runs");
    fill("pools", d.pools.map((p) => [{ th: p.pool }, pct(p.schedulingGoodput), pct(p.availability),
      F(p.queueWaitSeconds ? p.queueWaitSeconds.p90 : null), p.jobs]), "no pools");
    return true;
  }

  // The period bucket by bucket (hours up to two days, then days): the planner's "where did the
  // fleet's time go this week".
  function fleetOverTime(series, price) {
    const x = series.map((b) => b.from);
    const base = { x, xMode: "utc", sync: "fleet-time", height: 180 };
    FLPlots.line(document.getElementById("chart-fleet-share"), Object.assign({}, base, {
      label: "Fleet utilization and goodput per bucket, percent of in-service GPU-hours", yLabel: "%", unit: "%",
      series: [{ name: "utilization", values: series.map((b) => (b.utilization === null ? null : 100 * b.utilization)), color: "#2563eb" },
        { name: "goodput", values: series.map((b) => (b.goodput === null ? null : 100 * b.goodput)), color: "#059669" }],
    }));
    FLPlots.line(document.getElementById("chart-fleet-hours"), Object.assign({}, base, {
      label: "GPU-hours per bucket: in service, held by runs, useful", yLabel: "GPU-hours", unit: "GPU-h",
      series: [{ name: "in service", values: series.map((b) => b.inServiceGpuHours), color: "#9ca3af" },
        { name: "held", values: series.map((b) => b.heldGpuHours), color: "#2563eb" },
        { name: "useful", values: series.map((b) => b.usefulGpuHours), color: "#059669" }],
    }));
    const top = (loss) => {
      const [k, v] = Object.entries(loss).sort((a, b) => b[1] - a[1])[0] || [];
      return k ? `${k} ${F(v)} GPU-h` : "–";
    };
    fill("fleet-series", series.map((b) => [{ th: when(b.from) }, F(b.inServiceGpuHours), F(b.heldGpuHours),
      F(b.usefulGpuHours), pct(b.utilization), pct(b.goodput), top(b.lossByCause),
      b.costPerUsefulGpuHour ? `$${b.costPerUsefulGpuHour.toFixed(2)} at $${price.toFixed(2)}/GPU-h` : "–"]), "no data in this period");
  }

  // A run's page refreshes until the run ends: RUNNING, HUNG (a hang is open), and STALLED (no
  // data for a while; it may come back).
  const LIVE_STATUSES = ["RUNNING", "HUNG", "STALLED"];

  // The unknown run's page is served as such (HTTP 404); nothing to fetch.
  async function notFoundPage() { return false; }

  // The runs list, comparison, model and evaluation pages are models.js's; the run and rank
  // pages run.js's: each registers its pages here.
  const PAGES = { failure: failurePage, oncall: oncallPage, capacity: capacityPage, notfound: notFoundPage };

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

  // ---------------------------------------------------------------- refreshing
  let timer = null;
  let paused = false;
  let live = false;
  let failures = 0;
  let updatedAt = 0;  // ms: when the data shown were fetched
  let drawHeld = false;  // the last refresh fetched but did not redraw (a form is open)
  let dueWhileHidden = false;
  const age = document.getElementById("age");
  const pauseButton = document.getElementById("pause");

  function stop() { clearTimeout(timer); timer = null; }
  function schedule(ms) { stop(); if (!paused) timer = setTimeout(load, ms); }
  function clock(ms) { return new Date(ms).toISOString().slice(11, 19) + " UTC"; }

  function showAge() {
    if (!updatedAt) { age.textContent = ""; return; }
    const s = Math.max(0, Math.round((Date.now() - updatedAt) / 1000));
    const how = paused ? "paused" : live ? (failures ? "retrying" : `live, every ${REFRESH_MS / 1000} s`) : "not live";
    age.textContent = `Updated ${s} s ago (${how})`;
    age.dataset.seconds = String(s);
  }
  setInterval(showAge, 1000);

  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.setAttribute("aria-pressed", String(paused));
    pauseButton.textContent = paused ? "Resume updates" : "Pause updates";
    body.dataset.paused = String(paused);
    if (paused) stop(); else load();
    showAge();
  });

  // A hidden tab skips its refreshes and catches up when shown again.
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && dueWhileHidden) { dueWhileHidden = false; load(); }
  });

  function notFound(err) {
    live = false;
    const c = document.getElementById("content");
    c.textContent = "";
    const h = document.createElement("h2");
    h.textContent = ["run", "rank", "failure"].includes(page) ? "No such run" : "Not found";
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = err.reason || "not found";
    const q = document.createElement("p");
    q.append("It does not exist, or it belongs to a tenant this token does not read. The ", link("/", "runs list"), " shows the runs you can see"
      + (page === "model" || page === "evaluation" ? ", the " : "."), ...(page === "model" || page === "evaluation" ? [link("/models", "models list"), " the models."] : []));
    c.append(h, p, q);
    status.textContent = "Not found.";
    body.dataset.loaded = "notfound";
  }

  async function load() {
    stop();
    if (body.dataset.auth === "required" && !storedToken()) { signIn.show(false); return; }
    if (document.hidden && body.dataset.loaded === "true") { dueWhileHidden = true; return; }
    const refreshing = body.dataset.loaded === "true";
    if (!refreshing) {
      delete body.dataset.loaded;
      status.textContent = "Loading…";
    }
    signIn.view("content");
    try {
      live = await PAGES[page]({ refreshing });
      failures = 0;
      if (!drawHeld) updatedAt = Date.now();
      drawHeld = false;
      status.textContent = `Updated ${clock(updatedAt)}`;
      body.dataset.loaded = "true";
      delete body.dataset.stale;
      pauseButton.hidden = !live;
      if (live) schedule(REFRESH_MS);
    } catch (err) {
      if (err.status === 401) signIn.show(Boolean(storedToken()));
      else if (err.status === 403) signIn.showForbidden(err);
      else if (err.status === 404) notFound(err);
      else {
        // The server is down or failing (a 5xx, a network error): keep what is shown, say how
        // old it is, and try again soon, backing off up to the refresh interval.
        failures += 1;
        const wait = Math.min(REFRESH_MS, BACKOFF_MS[Math.min(failures, BACKOFF_MS.length) - 1]);
        const shown = updatedAt ? ` The data shown are from ${clock(updatedAt)}.` : "";
        status.textContent = `Could not ${updatedAt ? "refresh" : "load"}: ${err.message}. Retrying in ${wait / 1000} s.${shown}`;
        if (updatedAt) body.dataset.stale = "true"; else body.dataset.loaded = "error";
        if (updatedAt) body.dataset.loaded = "true";
        schedule(wait);
      }
    }
    showAge();
  }

  window.FLApp = {
    F, page, runId, body, getJSON, authHeaders, fill, link, text, pct, dur, secs, when, enc, cards, hardware,
    evidence, named, findingName, stateLabel, remediationSection, actions: () => runActions, UNDER_WAY, LIVE_STATUSES,
    pages: PAGES, status,
    // A new view (another step range): loads as a first load does (body[data-loaded] goes away).
    reload: () => { delete body.dataset.loaded; return load(); },
  };
  // run.js (on the run and rank pages) registers its pages before this runs.
  document.addEventListener("DOMContentLoaded", load);
})();
