// Chart helpers for the model page (live, per second) and the version page (per
// minute): uPlot line charts with release markers, colours per version, a small SVG grouped-bar chart for batch sizes, and the
// histogram arithmetic both need.
"use strict";

window.Charts = (function () {
  const ROLE_COLORS = { stable: "#2f6fdf", canary: "#e8590c", shadow: "#8b5cf6", warm: "#64748b" };
  const SPARE_COLORS = ["#0d9488", "#a21caf", "#ca8a04", "#475569", "#be123c"];
  // A version's colour follows its number, not its role, so v2 keeps its colour when it
  // goes from canary to stable. The same list is .vc-0 … .vc-7 in console.css; each is dark
  // enough for white split-bar labels (WCAG AA).
  const VERSION_COLORS = ["#2f6fdf", "#c2410c", "#0f766e", "#7c3aed", "#a16207", "#be123c", "#475569", "#4d7c0f"];
  const MARKER_COLOR = "#374151";
  const HEIGHT = 170;
  const AXIS = { stroke: "#5d6875", grid: { stroke: "#eef1f4", width: 1 }, ticks: { stroke: "#dce1e7", width: 1 } };

  function colorFor(role, index) {
    return ROLE_COLORS[role] || SPARE_COLORS[index % SPARE_COLORS.length];
  }

  function versionColor(version) {
    return VERSION_COLORS[(Math.max(Number(version) || 1, 1) - 1) % VERSION_COLORS.length];
  }

  // A uPlot line chart whose width follows its container; y starts at 0. ``windowS`` (a
  // number or a function answering one) makes it a live chart of that many seconds ending
  // now; ``markers`` answers the release markers [{t, label}] to draw as vertical lines.
  function line(container, series, { format = (v) => String(v), time = true, windowS = null, markers = null } = {}) {
    container.innerHTML = "";
    const span = () => (typeof windowS === "function" ? windowS() : windowS);
    const options = {
      width: Math.max(container.clientWidth, 200),
      height: HEIGHT,
      scales: {
        // A live chart shows a fixed window ending now, so it scrolls and is never blank-dated.
        x: windowS ? { time, range: () => { const now = Date.now() / 1000; return [now - span(), now]; } } : { time },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] } },
      axes: [
        windowS ? { ...AXIS, space: 70, values: (u, ticks) => ticks.map((tick) => clockTime(tick, span() > 3600)) } : { ...AXIS },
        { ...AXIS, size: 52, values: (u, values) => values.map(format) },
      ],
      series: [
        { value: (u, v) => (v == null ? "—" : new Date(v * 1000).toLocaleTimeString()) },
        ...series.map((s) => ({
          // uPlot's default shows points only where data is sparse (a lone minute).
          label: s.label, stroke: s.color, width: s.width || 2, dash: s.dash, spanGaps: false, value: (u, v) => (v == null ? "—" : format(v)),
        })),
      ],
      cursor: { drag: { x: false, y: false } },
      // The figures table beside the charts carries the numbers; the legend names the lines.
      legend: { live: false },
      hooks: markers ? { draw: [(u) => drawMarkers(u, markers() || [])] } : {},
    };
    const data = [[], ...series.map(() => [])];
    const chart = new uPlot(options, data, container);
    const observer = new ResizeObserver(() => chart.setSize({ width: Math.max(container.clientWidth, 200), height: HEIGHT }));
    observer.observe(container);
    return { chart, destroy: () => { observer.disconnect(); chart.destroy(); } };
  }

  // A dashed vertical line per release inside the x range, its label at the top in the
  // first row where it overlaps no other label (drawn left of its line near the right
  // edge, and kept inside the plot); a label with no free row keeps only its line. Every
  // line is drawn before any label, so no later line strikes through a label, and the
  // newest markers choose their rows first: with releases seconds apart, "v3 1%" … "v3 100%"
  // took the rows and "rollback to v3 50%", the one that matters at 3 am, lost its label.
  // What was drawn is kept on the chart (``markerLayout``) for the browser tests.
  const MARKER_ROWS = 4;

  function drawMarkers(u, markers) {
    const [min, max] = [u.scales.x.min, u.scales.x.max];
    const ratio = window.devicePixelRatio || 1;
    const { ctx } = u;
    const { left, top, width, height } = u.bbox;
    const rowHeight = 13 * ratio;
    const rows = Array.from({ length: MARKER_ROWS }, () => []);  // [[from, to], ...] taken per row
    const shown = markers.filter((marker) => marker.t >= min && marker.t <= max).sort((a, b) => a.t - b.t)
      .map((marker) => ({ marker, x: Math.round(u.valToPos(marker.t, "x", true)) }));
    const layout = { lines: [], labels: [], unlabelled: [] };
    ctx.save();
    ctx.font = `${11 * ratio}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    ctx.strokeStyle = MARKER_COLOR;
    ctx.lineWidth = ratio;
    ctx.setLineDash([4 * ratio, 3 * ratio]);
    shown.forEach(({ marker, x }) => {
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      layout.lines.push({ label: marker.label, x });
    });
    ctx.setLineDash([]);
    [...shown].reverse().forEach(({ marker, x }) => {
      const textWidth = ctx.measureText(marker.label).width;
      let textX = x + 3 * ratio + textWidth > left + width ? x - 3 * ratio - textWidth : x + 3 * ratio;
      textX = Math.max(left + 2 * ratio, Math.min(textX, left + width - 2 * ratio - textWidth));
      const span = [textX - 2 * ratio, textX + textWidth + 2 * ratio];
      const row = rows.findIndex((taken) => taken.every(([from, to]) => span[1] < from || span[0] > to));
      if (row < 0) {
        layout.unlabelled.push(marker.label);
        return;
      }
      rows[row].push(span);
      const textY = top + 2 * ratio + row * rowHeight;
      ctx.fillStyle = "rgba(255, 255, 255, 0.85)";
      ctx.fillRect(span[0], textY - ratio, span[1] - span[0], rowHeight);
      ctx.fillStyle = MARKER_COLOR;
      ctx.fillText(marker.label, textX, textY);
      layout.labels.push({ label: marker.label, box: [span[0], textY - ratio, span[1], textY - ratio + rowHeight], plot: [left, top, left + width, top + height] });
    });
    ctx.restore();
    u.markerLayout = layout;
  }

  function clockTime(seconds, minutesOnly = false) {
    const parts = minutesOnly ? { hour: "2-digit", minute: "2-digit" } : { hour: "2-digit", minute: "2-digit", second: "2-digit" };
    return new Date(seconds * 1000).toLocaleTimeString([], { ...parts, hour12: false });
  }

  // Cumulative Prometheus-style {le: count} -> ascending [{bound, count}] per bucket.
  function bucketCounts(cumulative) {
    const entries = Object.entries(cumulative || {})
      .map(([le, count]) => [le === "+Inf" ? Infinity : Number(le), Number(count)])
      .sort((a, b) => a[0] - b[0]);
    let previous = 0;
    return entries.map(([bound, count]) => {
      const own = Math.max(count - previous, 0);
      previous = Math.max(count, previous);
      return { bound, count: own };
    });
  }

  // Upper bound (ms) of the bucket holding quantile q: the workers' own method.
  function quantileMs(cumulative, q) {
    const entries = Object.entries(cumulative || {})
      .map(([le, count]) => [le === "+Inf" ? Infinity : Number(le), Number(count)])
      .sort((a, b) => a[0] - b[0]);
    const total = entries.length ? entries[entries.length - 1][1] : 0;
    if (total <= 0) return null;
    let previousBound = 0;
    for (const [bound, count] of entries) {
      if (count >= q * total) return (bound === Infinity ? previousBound : bound) * 1000;
      previousBound = bound;
    }
    return null;
  }

  function addBuckets(total, cumulative) {
    for (const [le, count] of Object.entries(cumulative || {})) total[le] = (total[le] || 0) + Number(count);
    return total;
  }

  // Batch-size bucket (previous, bound] as words: "1", "3-4", ">256".
  function bucketLabel(bound, previous) {
    if (bound === Infinity) return `>${previous}`;
    const lower = Math.floor(previous) + 1;
    return lower >= bound ? String(bound) : `${lower}–${bound}`;
  }

  // Grouped bars in SVG: groups along x (buckets), one bar per series; values 0..1.
  function bars(container, labels, series) {
    const width = Math.max(container.clientWidth, 200);
    const pad = { left: 40, right: 8, top: 10, bottom: 24 };
    const plotW = width - pad.left - pad.right;
    const plotH = HEIGHT - pad.top - pad.bottom;
    if (!labels.length || !series.length) {
      container.innerHTML = '<div class="chart-empty">No batches yet</div>';
      return;
    }
    const groupW = plotW / labels.length;
    const barW = Math.max(Math.min((groupW * 0.8) / series.length, 28), 2);
    const parts = [];
    for (const tick of [0, 0.5, 1]) {
      const y = pad.top + plotH * (1 - tick);
      parts.push(`<line x1="${pad.left}" x2="${width - pad.right}" y1="${y}" y2="${y}" stroke="#eef1f4"/>`);
      parts.push(`<text x="${pad.left - 6}" y="${y + 4}" text-anchor="end">${tick * 100}%</text>`);
    }
    labels.forEach((label, g) => {
      const groupX = pad.left + g * groupW + (groupW - barW * series.length) / 2;
      series.forEach((s, i) => {
        const value = s.values[g] || 0;
        const h = plotH * value;
        const x = groupX + i * barW;
        parts.push(`<rect x="${x.toFixed(1)}" y="${(pad.top + plotH - h).toFixed(1)}" width="${(barW - 1).toFixed(1)}" height="${h.toFixed(1)}" fill="${s.color}"><title>${escapeText(s.label)}, batch ${label}: ${(value * 100).toFixed(1)}%</title></rect>`);
      });
      parts.push(`<text x="${(pad.left + g * groupW + groupW / 2).toFixed(1)}" y="${HEIGHT - 6}" text-anchor="middle">${label}</text>`);
    });
    container.innerHTML = `<svg class="bars" width="${width}" height="${HEIGHT}" role="img" aria-label="Batch size distribution">${parts.join("")}</svg><div class="bars-legend"></div>`;
    container.querySelector(".bars-legend").append(...series.map(legendItem));
  }

  // Swatch colours set through the DOM: the Content-Security-Policy refuses style="" in HTML.
  function legendItem(s) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = s.color;
    item.append(swatch, s.label);
    return item;
  }

  // Share of batches per bucket for each series; trailing buckets no series used are cut.
  function shares(countsBySeries) {
    const bounds = [...new Set(countsBySeries.flatMap((counts) => counts.map((b) => b.bound)))].sort((a, b) => a - b);
    const used = bounds.filter((bound) => countsBySeries.some((counts) => counts.some((b) => b.bound === bound && b.count > 0)));
    const last = used.length ? bounds.indexOf(used[used.length - 1]) : -1;
    const shown = bounds.slice(0, last + 1);
    const labels = shown.map((bound, i) => bucketLabel(bound, i ? shown[i - 1] : 0));
    const values = countsBySeries.map((counts) => {
      const total = counts.reduce((sum, b) => sum + b.count, 0);
      return shown.map((bound) => {
        const bucket = counts.find((b) => b.bound === bound);
        return total && bucket ? bucket.count / total : 0;
      });
    });
    return { labels, values };
  }

  // ---- the past: GET /api/models/{name}/series/ (registry/fleet/series.py)
  const RANGE_SPANS_S = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400 };

  async function fetchSeries(model, range, version = null) {
    const url = new URL(`/api/models/${encodeURIComponent(model)}/series/`, location.origin);
    url.searchParams.set("range", range);
    if (version != null) url.searchParams.set("version", version);
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      return response.ok ? await response.json() : null;
    } catch (error) {
      return null;  // unreachable: the charts keep what they have
    }
  }

  // The range buttons (templates/console/fragments/range_picker.html): one pressed at a time.
  function rangePicker(group, onChange) {
    const buttons = [...group.querySelectorAll("button[data-range]")];
    const pressed = () => (buttons.find((button) => button.getAttribute("aria-pressed") === "true") || buttons[0]).dataset.range;
    group.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-range]");
      if (!button || button.dataset.range === pressed()) return;
      buttons.forEach((other) => other.setAttribute("aria-pressed", String(other === button)));
      group.dataset.range = button.dataset.range;
      onChange(button.dataset.range);
    });
    group.dataset.range = pressed();
    return pressed();
  }

  function escapeText(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }

  return { colorFor, versionColor, line, fetchSeries, rangePicker, RANGE_SPANS_S, bars, shares, bucketCounts, quantileMs, addBuckets };
})();
