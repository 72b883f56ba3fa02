// fleetlens charts: bars, a waterfall and an event strip in plain SVG (no dependencies; every
// chart gets role="img" and an aria-label), and the number format and ticks the pages share.
// The run and rank pages' line charts and heatmap are plots.js's (uPlot).
"use strict";

const FLCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2"];
  const MARK = { event: "#6b7280", failure: "#dc2626", hardware_fault: "#dc2626",
    restart: "#d97706", checkpoint_end: "#059669", alert: "#b91c1c", metric: "#7c3aed",
    config: "#2563eb" };

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  function fmt(v) {
    // evidence values are not all numbers: a hang's holds the ranks it waits for
    if (Array.isArray(v)) return v.length ? v.map(fmt).join(",") : "–";
    if (typeof v === "string") return v || "–";
    if (typeof v !== "number" || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1e12) return (v / 1e12).toFixed(1) + "T";
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(2);
    if (a === 0) return "0";
    return v.toPrecision(2);
  }

  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) out.push(t);
    return out;
  }

  function svgFor(host, label, height) {
    host.textContent = "";
    const width = Math.max(280, host.clientWidth || 600);
    const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": label, class: "chart" }, host);
    el("title", {}, svg).textContent = label;
    return { svg, width, height };
  }

  // items: [{label, value, color}]; opts.waterfall: running total with the last bar absolute.
  function bars(host, items, opts) {
    const o = Object.assign({ height: 200 }, opts || {});
    const { svg, width, height } = svgFor(host, o.label || "bar chart", o.height);
    const m = { l: 52, r: 10, t: 10, b: 40 };
    if (!items.length) return svg;
    let run = 0;
    const spans = items.map((it, i) => {
      if (!o.waterfall) return [0, it.value];
      if (i === 0 || i === items.length - 1) { run = it.value; return [0, it.value]; }
      const a = run; run += it.value; return [Math.min(a, run), Math.max(a, run)];
    });
    const hi = Math.max(...spans.map((s) => s[1]), 1e-9);
    const sy = (y) => height - m.b - (y / hi) * (height - m.t - m.b);
    const bw = (width - m.l - m.r) / items.length;
    const axis = el("g", { class: "axis", "aria-hidden": "true" }, svg);
    for (const t of ticks(0, hi, 4)) {
      el("line", { x1: m.l, x2: width - m.r, y1: sy(t), y2: sy(t), class: "grid" }, axis);
      el("text", { x: m.l - 4, y: sy(t) + 3, "text-anchor": "end" }, axis).textContent = fmt(t);
    }
    if (o.yLabel) {  // the unit, written along the y axis
      el("text", { x: 10, y: (m.t + height - m.b) / 2, "text-anchor": "middle", class: "ylabel",
        transform: `rotate(-90 10 ${(m.t + height - m.b) / 2})` }, axis).textContent = o.yLabel;
    }
    items.forEach((it, i) => {
      const [a, b] = spans[i];
      const g = el("g", {}, svg);
      el("rect", { x: m.l + i * bw + 4, y: sy(b), width: Math.max(1, bw - 8),
        height: Math.max(1, sy(a) - sy(b)),
        fill: it.color || (o.waterfall && it.value < 0 ? "#dc2626" : PALETTE[0]) }, g);
      el("title", {}, g).textContent = `${it.label}: ${fmt(it.value)}${o.unit ? " " + o.unit : ""}`;
      el("text", { x: m.l + i * bw + bw / 2, y: height - m.b + 14, "text-anchor": "middle",
        class: "barlabel" }, svg).textContent = it.label.length > 14 ? it.label.slice(0, 13) + "…" : it.label;
    });
    return svg;
  }

  // A strip of event markers over the same step axis as the charts above it.
  function strip(host, markers, opts) {
    const o = Object.assign({ height: 46 }, opts || {});
    const { svg, width, height } = svgFor(host, o.label || "timeline", o.height);
    const m = { l: 52, r: 10 };
    const [x0, x1] = o.xDomain;
    const sx = (x) => m.l + ((x - x0) / (x1 - x0 || 1)) * (width - m.l - m.r);
    const lanes = ["event", "checkpoint_end", "metric", "alert"];
    el("line", { x1: m.l, x2: width - m.r, y1: height - 6, y2: height - 6, class: "grid" }, svg);
    for (const mk of markers) {
      if (mk.x < x0 || mk.x > x1) continue;
      const lane = Math.max(0, lanes.indexOf(mk.lane || "event"));
      const g = el("g", { class: "marker" }, svg);
      el("rect", { x: sx(mk.x) - 2, y: 4 + lane * 9, width: 4, height: 8,
        fill: MARK[mk.kind] || MARK[mk.lane] || MARK.event }, g);
      el("title", {}, g).textContent = mk.label || mk.kind;
    }
    return svg;
  }

  return { bars, strip, fmt, ticks };
})();
