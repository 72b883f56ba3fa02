// fleetlens plots: line charts drawn with uPlot (vendored under /ui/static/vendor/uplot/) and the
// rank x step heatmap on a <canvas>. Line charts share a crosshair (charts with the same sync
// key show the hovered x together, and each legend shows the values under it), zoom by dragging
// across the plot (the page decides what a range means: see run.js), take a step or wall-clock
// x axis (UTC or the browser's zone, labelled), a moving mean and a log y scale, and redraw when
// their host is resized. Every chart is a figure with an aria-label that says what it shows.
"use strict";

const FLPlots = (() => {
  // The page's colours (style.css's variables, light or dark), read when a chart is drawn.
  const css = (name, dflt) => getComputedStyle(document.documentElement).getPropertyValue(name).trim() || dflt;
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#4b5563"];
  const MARK = { event: "#6b7280", failure: "#dc2626", hardware_fault: "#dc2626",
    restart: "#d97706", checkpoint_end: "#059669", alert: "#b91c1c", metric: "#7c3aed",
    config: "#2563eb" };
  const fmt = FLCharts.fmt;
  const LOCAL_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  const sized = new Map();  // host -> redraw(width)

  const observer = new ResizeObserver((entries) => {
    for (const e of entries) {
      const redraw = sized.get(e.target);
      const w = Math.floor(e.contentRect.width);
      if (redraw && w > 0 && w !== e.target._flWidth) { e.target._flWidth = w; redraw(w); }
    }
  });

  function watch(host, redraw) {
    host._flWidth = Math.floor(host.clientWidth);
    if (!sized.has(host)) observer.observe(host);
    sized.set(host, redraw);
  }

  function xLabel(mode) {
    if (mode === "utc") return "Wall clock (UTC)";
    if (mode === "local") return `Wall clock (browser local: ${LOCAL_ZONE})`;
    return "Step";
  }

  // A centred moving mean over n points, skipping gaps (null).
  function smooth(values, n) {
    if (!(n > 1)) return values;
    const half = Math.floor(n / 2);
    return values.map((v, i) => {
      if (v === null || v === undefined) return null;
      let s = 0, k = 0;
      for (let j = Math.max(0, i - half); j <= Math.min(values.length - 1, i + half); j++) {
        const w = values[j];
        if (typeof w === "number" && isFinite(w)) { s += w; k++; }
      }
      return k ? s / k : null;
    });
  }

  function clean(values, log) {
    return values.map((v) => (typeof v === "number" && isFinite(v) && (!log || v > 0) ? v : null));
  }

  // host: a div. o: {label, yLabel, unit, x: [..], xMode: "step"|"utc"|"local", series: [{name,
  // values, color, dash, band: [lo[], hi[]], spanGaps (join across nulls: series overlaid on a
  // shared x whose points they do not all have)}], markers: [{x, kind, label}], log, smooth, height,
  // sync, onBrush(x0, x1), yMin, yMax}
  function line(host, o) {
    if (host._flPlot) { host._flPlot.destroy(); host._flPlot = null; }
    host.textContent = "";
    host.setAttribute("role", "figure");
    host.setAttribute("aria-label", o.label);
    const xs = o.x || [];
    const has = o.series.some((s) => s.values.some((v) => typeof v === "number" && isFinite(v)));
    if (!xs.length || !has) {
      const p = document.createElement("p");
      p.className = "empty note";
      p.textContent = "no data in this range";
      host.appendChild(p);
      sized.delete(host);
      return null;
    }
    const unit = o.unit ? ` ${o.unit}` : "";
    const value = (u, v) => (v === null || v === undefined ? "–" : fmt(v) + unit);
    const data = [xs];
    const series = [{ label: xLabel(o.xMode),
      value: (u, v) => (v === null || v === undefined ? "–" : o.xMode === "step" ? String(Math.round(v)) : timeText(v, o.xMode)) }];
    const bands = [];
    o.series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      if (s.band) {
        const hi = data.length;
        data.push(clean(smooth(s.band[1], o.smooth), o.log), clean(smooth(s.band[0], o.smooth), o.log));
        series.push({ label: `${s.name} (bucket max)`, stroke: color + "55", width: 1, value },
          { label: `${s.name} (bucket min)`, stroke: color + "55", width: 1, value });
        bands.push({ series: [hi, hi + 1], fill: color + "22" });
      }
      data.push(clean(smooth(s.values, o.smooth), o.log));
      series.push({ label: s.name, stroke: color, width: 1.5, dash: s.dash, value, spanGaps: s.spanGaps === true });
    });
    const markers = o.markers || [];
    const opts = {
      width: Math.max(280, host.clientWidth || 600),
      height: o.height || 180,
      series,
      bands,
      scales: {
        x: { time: o.xMode !== "step" },
        y: o.log ? { distr: 3 } : { range: (u, lo, hi) => yRange(lo, hi, o) },
      },
      axes: [
        { label: xLabel(o.xMode), labelSize: 18, size: 36, font: "11px system-ui", labelFont: "600 11px system-ui",
          stroke: css("--fg", "#111827"), grid: { stroke: css("--grid", "#eef0f3") }, ticks: { stroke: css("--line", "#e5e7eb") } },
        { label: o.yLabel, labelSize: 18, size: 60, font: "11px system-ui", labelFont: "600 11px system-ui",
          stroke: css("--fg", "#111827"), grid: { stroke: css("--grid", "#eef0f3") }, ticks: { stroke: css("--line", "#e5e7eb") },
          values: (u, ticks) => ticks.map((t) => fmt(t)) },
      ],
      cursor: { sync: { key: o.sync || "fleetlens", setSeries: false }, drag: { x: true, y: false, setScale: false } },
      legend: { live: true },
      hooks: {
        draw: [(u) => drawMarkers(u, markers)],
        setSelect: [(u) => {
          const sel = u.select;
          if (sel.width > 4 && o.onBrush) {
            o.onBrush(u.posToVal(sel.left, "x"), u.posToVal(sel.left + sel.width, "x"));
          }
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        }],
      },
    };
    if (o.xMode === "utc") opts.tzDate = (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC");
    const u = new uPlot(opts, data, host);
    u.over.setAttribute("aria-hidden", "true");
    host._flPlot = u;
    watch(host, (w) => u.setSize({ width: Math.max(280, w), height: opts.height }));
    return u;
  }

  function yRange(lo, hi, o) {
    let a = o.yMin !== undefined ? o.yMin : lo, b = o.yMax !== undefined ? o.yMax : hi;
    if (a === null || b === null) return [0, 1];
    if (a === b) { const d = Math.abs(a) * 0.1 || 1; a -= d; b += d; }
    const pad = (b - a) * 0.05;
    return [o.yMin !== undefined ? a : a - pad, o.yMax !== undefined ? b : b + pad];
  }

  function timeText(t, mode) {
    const d = new Date(t * 1000);
    if (mode === "utc") return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
    return d.toLocaleString() + ` (${LOCAL_ZONE})`;
  }

  function drawMarkers(u, markers) {
    const ctx = u.ctx, top = u.bbox.top, bottom = top + u.bbox.height;
    const left = u.bbox.left, right = left + u.bbox.width;
    ctx.save();
    ctx.lineWidth = 1;
    ctx.setLineDash([3, 3]);
    for (const mk of markers) {
      if (mk.x === null || mk.x === undefined) continue;
      const x = Math.round(u.valToPos(mk.x, "x", true)) + 0.5;
      if (x < left || x > right) continue;
      ctx.strokeStyle = MARK[mk.kind] || MARK.event;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
    }
    ctx.restore();
  }

  // ------------------------------------------------------------------ heatmap
  // Cells coloured by their ratio to the column's median (a slow rank stands out whatever the
  // step time): pale below 1.00x, deepening to red at 1.25x and above. The hot row is outlined
  // only when it stands out (HOT: 10% above the median), not for a 1.01x "hottest" row.
  const HOT = 1.1;
  const M = { l: 58, r: 112, t: 8, b: 38 };

  // On a dark ground (prefers-color-scheme: dark) the scale starts dark and deepens to red, so
  // the page is not a white block with the slow row lost in it.
  const DARK = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)");
  function colour(ratio) {
    const k = Math.max(0, Math.min(1, (ratio - 1) / 0.25));
    if (DARK && DARK.matches) {
      if (ratio < 1) return "#172033";
      return `rgb(${Math.round(45 + 195 * k)},${Math.round(35 + 15 * k)},${Math.round(40 + 5 * k)})`;
    }
    if (ratio < 1) return "#eef2ff";
    return `rgb(255,${Math.round(247 - 200 * k)},${Math.round(237 - 210 * k)})`;
  }

  // data: the /heatmap document. o: {label, onCell(row, col), describe(row, col) -> text}
  function heatmap(canvas, tip, data, o) {
    const draw = (w) => heatmapDraw(canvas, data, o, w);
    const geo = draw(Math.max(360, canvas.parentElement.clientWidth || 600));
    watch(canvas.parentElement, (w) => { canvas._flGeo = draw(Math.max(360, w)); });
    canvas._flGeo = geo;
    if (canvas._flBound) { canvas._flData = { data, o }; return geo; }
    canvas._flBound = true;
    canvas._flData = { data, o };
    const cellAt = (ev) => {
      const g = canvas._flGeo, d = canvas._flData.data;
      const r = canvas.getBoundingClientRect();
      const x = ev.clientX - r.left - M.l, y = ev.clientY - r.top - M.t;
      if (x < 0 || y < 0 || x >= g.w || y >= g.h) return null;
      return { row: Math.min(d.rows - 1, Math.floor(y / g.cellH)), col: Math.min(d.columns - 1, Math.floor(x / g.cw)),
        x: ev.clientX - r.left, y: ev.clientY - r.top };
    };
    canvas.addEventListener("mousemove", (ev) => {
      const c = cellAt(ev);
      if (!c) { tip.hidden = true; canvas.style.cursor = ""; return; }
      tip.textContent = canvas._flData.o.describe(c.row, c.col);
      tip.hidden = false;
      tip.style.left = `${Math.min(c.x + 14, canvas.clientWidth - 260)}px`;
      tip.style.top = `${c.y + 14}px`;
      canvas.style.cursor = "pointer";
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("click", (ev) => {
      const c = cellAt(ev);
      if (c) canvas._flData.o.onCell(c.row, c.col);
    });
    // The keyboard: arrows move over the cells (the tip, and the live region o.say, describe
    // each), Enter opens the cell's rank; PageUp/PageDown move ten rows.
    canvas.tabIndex = 0;
    canvas.addEventListener("keydown", (ev) => {
      const d = canvas._flData.data, g = canvas._flGeo;
      const at = canvas._flCell || { row: d.hot ? d.hot.row : 0, col: d.columns - 1 };
      const move = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1],
        PageUp: [-10, 0], PageDown: [10, 0] }[ev.key];
      if (ev.key === "Enter" && canvas._flCell) { canvas._flData.o.onCell(at.row, at.col); return; }
      if (!move) return;
      ev.preventDefault();
      const c = { row: Math.max(0, Math.min(d.rows - 1, at.row + (canvas._flCell ? move[0] : 0))),
        col: Math.max(0, Math.min(d.columns - 1, at.col + (canvas._flCell ? move[1] : 0))) };
      canvas._flCell = c;
      const text = canvas._flData.o.describe(c.row, c.col);
      tip.textContent = text;
      tip.hidden = false;
      tip.style.left = `${Math.min(M.l + (c.col + 1) * g.cw, canvas.clientWidth - 260)}px`;
      tip.style.top = `${M.t + (c.row + 1) * g.cellH + 4}px`;
      if (canvas._flData.o.say) canvas._flData.o.say(text);
    });
    canvas.addEventListener("blur", () => { tip.hidden = true; });
    return geo;
  }

  function medians(data) {
    const med = [];
    for (let c = 0; c < data.columns; c++) {
      const v = [];
      for (let r = 0; r < data.rows; r++) {
        const x = data.cells[r] && data.cells[r][c];
        if (typeof x === "number") v.push(x);
      }
      v.sort((a, b) => a - b);
      med.push(v.length ? v[Math.floor(v.length / 2)] : null);
    }
    return med;
  }

  function heatmapDraw(canvas, data, o, width) {
    const rows = data.rows, cols = data.columns;
    const w = width - M.l - M.r;
    const cellH = Math.max(2, Math.min(8, Math.floor(520 / Math.max(1, rows))));  // 2 px: a row one can point at
    const h = rows * cellH;
    const height = h + M.t + M.b;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const cw = w / Math.max(1, cols);
    const med = medians(data);
    data.medians = med;
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const x = data.cells[r] && data.cells[r][c];
        ctx.fillStyle = typeof x === "number" && med[c] ? colour(x / med[c]) : css("--track", "#f3f4f6");
        ctx.fillRect(M.l + c * cw, M.t + r * cellH, Math.ceil(cw), cellH);
      }
    }
    const hot = data.hot;
    if (hot && hot.ratio >= HOT) {
      ctx.strokeStyle = DARK && DARK.matches ? "#fca5a5" : "#b91c1c"; ctx.lineWidth = 1.5;
      ctx.strokeRect(M.l - 0.5, M.t + hot.row * cellH - 1, w + 1, cellH + 2);
    }
    // Axes: ranks down the left, steps along the bottom, each with its label.
    ctx.fillStyle = css("--muted", "#4b5563"); ctx.strokeStyle = "#9ca3af"; ctx.lineWidth = 1;
    ctx.font = "10px system-ui"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    const world = rows * data.ranksPerRow;
    for (const t of FLCharts.ticks(0, world - 1, Math.max(2, Math.floor(h / 40)))) {
      const y = M.t + (Math.floor(t / data.ranksPerRow) + 0.5) * cellH;
      ctx.fillText(String(t), M.l - 6, y);
      ctx.beginPath(); ctx.moveTo(M.l - 4, y); ctx.lineTo(M.l, y); ctx.stroke();
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    const span = data.toStep - data.fromStep + 1;
    for (const t of FLCharts.ticks(data.fromStep, data.toStep, Math.max(2, Math.floor(w / 90)))) {
      const x = M.l + ((t - data.fromStep) / span) * w;
      ctx.fillText(String(t), x, M.t + h + 5);
      ctx.beginPath(); ctx.moveTo(x, M.t + h); ctx.lineTo(x, M.t + h + 4); ctx.stroke();
    }
    ctx.font = "600 11px system-ui"; ctx.fillStyle = css("--fg", "#111827");
    ctx.fillText("Step", M.l + w / 2, M.t + h + 20);
    ctx.save(); ctx.translate(12, M.t + h / 2); ctx.rotate(-Math.PI / 2);
    ctx.textBaseline = "middle"; ctx.fillText("Rank", 0, 0); ctx.restore();
    // Colour scale.
    const sx = M.l + w + 16, sh = Math.min(h, 160);
    const grad = ctx.createLinearGradient(0, M.t + sh, 0, M.t);
    for (let k = 0; k <= 10; k++) grad.addColorStop(k / 10, colour(1 + 0.025 * k));
    ctx.fillStyle = grad; ctx.fillRect(sx, M.t, 12, sh);
    ctx.strokeRect(sx + 0.5, M.t + 0.5, 12, sh);
    ctx.font = "10px system-ui"; ctx.fillStyle = css("--muted", "#4b5563"); ctx.textAlign = "left"; ctx.textBaseline = "middle";
    for (const [v, label] of [[1, "≤ 1.00×"], [1.125, "1.125×"], [1.25, "≥ 1.25×"]]) {
      ctx.fillText(label, sx + 16, M.t + sh - ((v - 1) / 0.25) * sh);
    }
    ctx.textBaseline = "top";
    ctx.fillText("× column", sx, M.t + sh + 6);
    ctx.fillText("median", sx, M.t + sh + 18);
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", o.label);
    return { cellH, cw, w, h };
  }

  return { line, heatmap, smooth, HOT, xLabel, timeText };
})();
