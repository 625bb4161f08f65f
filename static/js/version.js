// Version page: the "try it" form answered in place, and the per-minute roll-up charts.
"use strict";

(function () {
  const M = window.ModelOps;
  const C = window.Charts;

  // ---- try it: the console forwards the request to a serving worker (no CORS).
  const form = document.getElementById("try-form");
  const result = document.getElementById("try-result");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    result.innerHTML = '<p class="hint">Sending…</p>';
    const answer = await M.post(form.action, new FormData(form));
    button.disabled = false;
    result.innerHTML = answer.data.html || `<p class="error-text">${answer.data.message || "No answer."}</p>`;
  });

  // ---- roll-ups: one point per minute from VersionMetricMinute rows
  const rows = JSON.parse(document.getElementById("rollup-data").textContent);
  const charts = document.getElementById("rollup-charts");
  if (!rows.length || !charts) return;
  const chart = (name) => charts.querySelector(`[data-chart="${name}"]`);
  const t = rows.map((row) => row.t);
  const color = C.colorFor("stable", 0);

  C.line(chart("requests_per_s"), [{ label: "requests/s", color }], { format: M.format.rate })
    .chart.setData([t, rows.map((row) => row.requests / 60)]);
  C.line(chart("latency"), [
    { label: "p50", color, dash: [5, 4], width: 1.5 },
    { label: "p99", color: "#e8590c" },
  ], { format: (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)) })
    .chart.setData([t, rows.map((row) => C.quantileMs(row.latency_buckets, 0.5)), rows.map((row) => C.quantileMs(row.latency_buckets, 0.99))]);
  const share = (count, row) => (row.requests ? (count / row.requests) * 100 : null);
  C.line(chart("error_rate"), [
    { label: "5xx %", color: "#c62828" },
    { label: "4xx %", color: "#9a6700", dash: [5, 4], width: 1.5 },
  ], { format: (v) => `${+v.toFixed(2)}` })
    .chart.setData([t, rows.map((row) => share(row.errors, row)), rows.map((row) => share(row.client_errors || 0, row))]);

  const batches = rows.reduce((total, row) => C.addBuckets(total, row.batch_size_buckets), {});
  const { labels, values } = C.shares([C.bucketCounts(batches)]);
  C.bars(chart("batch_sizes"), labels, [{ label: "all minutes shown", color, values: values[0] }]);

  const requests = rows.reduce((sum, row) => sum + row.requests, 0);
  const errors = rows.reduce((sum, row) => sum + row.errors, 0);
  const clientErrors = rows.reduce((sum, row) => sum + (row.client_errors || 0), 0);
  const latency = rows.reduce((sum, row) => sum + row.latency_sum_s, 0);
  document.getElementById("rollup-summary").textContent =
    `${requests} requests over ${rows.length} minute${rows.length === 1 ? "" : "s"}; mean latency ${requests ? M.format.ms((latency / requests) * 1000) : "—"}; ${errors} answered 5xx, ${clientErrors} answered 4xx.`;
})();
