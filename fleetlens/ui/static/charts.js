// fleetlens charts: a line chart with bands, a heatmap on <canvas>, bars and a waterfall.
// Plain SVG and canvas, no dependencies; every chart gets role="img" and an aria-label.
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
    if (v === null || v === undefined || !isFinite(v)) return "–";
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

  function num(v) {
    return typeof v === "number" && isFinite(v) ? v : null;
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

  // series: [{name, color, points: [[x, y]], band: [[x, lo, hi]], dash}]
  // opts: {label, yLabel, height, markers: [{x, kind, label}], xDomain: [lo, hi], log}
  function line(host, series, opts) {
    const o = Object.assign({ height: 180 }, opts || {});
    const { svg, width, height } = svgFor(host, o.label || "line chart", o.height);
    const m = { l: 52, r: 10, t: 10, b: 22 };
    let xs = [], ys = [];
    for (const s of series) {
      for (const p of s.points || []) { if (num(p[1]) !== null) { xs.push(p[0]); ys.push(p[1]); } }
      for (const b of s.band || []) {
        if (num(b[1]) !== null && num(b[2]) !== null) { xs.push(b[0]); ys.push(b[1], b[2]); }
      }
    }
    if (!xs.length) {
      el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, svg)
        .textContent = "no data";
      return svg;
    }
    const x0 = o.xDomain ? o.xDomain[0] : Math.min(...xs);
    const x1 = o.xDomain ? o.xDomain[1] : Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 + 1e-9; y1 += Math.abs(y1) * 0.1 + 1e-9; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = (x) => m.l + ((x - x0) / (x1 - x0 || 1)) * (width - m.l - m.r);
    const sy = (y) => height - m.b - ((y - y0) / (y1 - y0)) * (height - m.t - m.b);
    const axis = el("g", { class: "axis", "aria-hidden": "true" }, svg);
    for (const t of ticks(y0, y1, 4)) {
      el("line", { x1: m.l, x2: width - m.r, y1: sy(t), y2: sy(t), class: "grid" }, axis);
      el("text", { x: m.l - 4, y: sy(t) + 3, "text-anchor": "end" }, axis).textContent = fmt(t);
    }
    for (const t of ticks(x0, x1, 6)) {
      el("text", { x: sx(t), y: height - 6, "text-anchor": "middle" }, axis).textContent = fmt(t);
    }
    if (o.yLabel) {
      el("text", { x: 4, y: m.t + 2, class: "ylabel", "dominant-baseline": "hanging" }, axis)
        .textContent = o.yLabel;
    }
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      if (s.band && s.band.length) {
        const ok = s.band.filter((b) => num(b[1]) !== null && num(b[2]) !== null);
        const top = ok.map((b) => `${sx(b[0]).toFixed(1)},${sy(b[2]).toFixed(1)}`);
        const bot = ok.slice().reverse().map((b) => `${sx(b[0]).toFixed(1)},${sy(b[1]).toFixed(1)}`);
        el("polygon", { points: top.concat(bot).join(" "), fill: color, "fill-opacity": 0.15,
          stroke: "none" }, svg);
      }
      if (s.points && s.points.length) {
        let d = "", pen = false;
        for (const p of s.points) {
          if (num(p[1]) === null) { pen = false; continue; }
          d += `${pen ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`;
          pen = true;
        }
        el("path", { d, fill: "none", stroke: color, "stroke-width": 1.5,
          "stroke-dasharray": s.dash || "none" }, svg);
      }
    });
    for (const mk of o.markers || []) {
      if (mk.x < x0 || mk.x > x1) continue;
      const g = el("g", { class: "marker" }, svg);
      el("line", { x1: sx(mk.x), x2: sx(mk.x), y1: m.t, y2: height - m.b,
        stroke: MARK[mk.kind] || MARK.event, "stroke-dasharray": "3,3" }, g);
      el("title", {}, g).textContent = mk.label || mk.kind;
    }
    if (series.length > 1 || o.legend) legend(host, series);
    return svg;
  }

  function legend(host, series) {
    const ul = document.createElement("ul");
    ul.className = "legend";
    series.forEach((s, i) => {
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = s.color || PALETTE[i % PALETTE.length];
      li.append(sw, document.createTextNode(s.name + (s.band ? " (band)" : "")));
      ul.appendChild(li);
    });
    host.appendChild(ul);
  }

  // Heatmap of rows x columns; each cell coloured by its ratio to its column's median, so a
  // slow rank bucket stands out whatever the step time. hot: {row} is outlined.
  function heatmap(canvas, data, opts) {
    const o = Object.assign({ cellH: 0 }, opts || {});
    const rows = data.rows, cols = data.columns, cells = data.cells || [];
    const width = Math.max(300, canvas.parentElement.clientWidth || 600);
    const cellH = o.cellH || Math.max(1, Math.min(6, Math.floor(420 / Math.max(1, rows))));
    const height = rows * cellH;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const cw = width / Math.max(1, cols);
    const med = [];
    for (let c = 0; c < cols; c++) {
      const v = [];
      for (let r = 0; r < rows; r++) { const x = cells[r] && cells[r][c]; if (num(x) !== null) v.push(x); }
      v.sort((a, b) => a - b);
      med.push(v.length ? v[Math.floor(v.length / 2)] : null);
    }
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const x = cells[r] && cells[r][c];
        if (num(x) === null || !med[c]) { ctx.fillStyle = "#f3f4f6"; }
        else { ctx.fillStyle = color((x / med[c] - 1) / 0.25); }
        ctx.fillRect(c * cw, r * cellH, Math.ceil(cw), cellH);
      }
    }
    if (data.hot) {
      ctx.strokeStyle = "#111827"; ctx.lineWidth = 1;
      ctx.strokeRect(0.5, data.hot.row * cellH - 0.5, width - 1, cellH + 1);
    }
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", o.label || "heatmap");
    return { cellH, cw };
  }

  // 0 -> pale, 1 -> deep red (a quarter above the column median), clamped.
  function color(t) {
    const k = Math.max(0, Math.min(1, t));
    const r = 255, g = Math.round(247 - 200 * k), b = Math.round(237 - 210 * k);
    return k <= 0 ? "#eef2ff" : `rgb(${r},${g},${b})`;
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
    items.forEach((it, i) => {
      const [a, b] = spans[i];
      const g = el("g", {}, svg);
      el("rect", { x: m.l + i * bw + 4, y: sy(b), width: Math.max(1, bw - 8),
        height: Math.max(1, sy(a) - sy(b)),
        fill: it.color || (o.waterfall && it.value < 0 ? "#dc2626" : PALETTE[0]) }, g);
      el("title", {}, g).textContent = `${it.label}: ${fmt(it.value)}`;
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

  return { line, heatmap, bars, strip, fmt, color };
})();
