// Version page: the "try it" form answered in place, and the charts of its traffic.
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
    if (answer.data.html) {
      result.innerHTML = answer.data.html;  // rendered and escaped by the console's template
    } else {
      // The words may echo what was typed (a worker's 400 names an input): text, never markup.
      const words = document.createElement("p");
      words.className = "error-text";
      words.textContent = answer.data.message || answer.data.error || "No answer.";
      result.replaceChildren(words);
    }
  });

  // ---- the version's traffic over the chosen range (GET /api/models/{name}/series/),
  // with a marker per traffic change; batch sizes and the summary from the 6-hour roll-ups.
  const rows = JSON.parse(document.getElementById("rollup-data").textContent);
  const charts = document.getElementById("rollup-charts");
  if (!rows.length || !charts) return;
  const chart = (name) => charts.querySelector(`[data-chart="${name}"]`);
  const number = Number(charts.dataset.version);
  const color = C.versionColor(number);
  const page = { t: [], series: null, markers: [], range: "6h", loaded: 0 };
  window.versionPage = page;  // what the charts draw, for the browser tests and curious humans
  const picker = document.getElementById("chart-range");
  page.range = C.rangePicker(picker, (chosen) => { page.range = chosen; load(); });
  const live = { windowS: () => C.RANGE_SPANS_S[page.range], markers: () => page.markers };
  const lines = {
    requests_per_s: C.line(chart("requests_per_s"), [{ label: `v${number} requests/s`, color }], { format: M.format.rate, ...live }),
    latency: C.line(chart("latency"), [
      { label: "p50", color, dash: [5, 4], width: 1.5 },
      { label: "p99", color },
    ], { format: (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)), ...live }),
    error_rate: C.line(chart("error_rate"), [
      { label: "5xx %", color },
      { label: "4xx %", color, dash: [5, 4], width: 1.5 },
    ], { format: (v) => `${+v.toFixed(2)}`, ...live }),
  };
  let loading = 0;

  async function load() {
    const ticket = ++loading;
    const body = await C.fetchSeries(charts.dataset.model, page.range, number);
    if (!body || ticket !== loading) return;
    const mine = body.versions.find((entry) => entry.version === number) || {};
    const column = (field, scale = 1) => (mine[field] || body.t.map(() => null)).map((v) => (v == null ? null : v * scale));
    page.t = body.t;
    page.series = { requests_per_s: column("requests_per_s"), p50_ms: column("p50_ms"), p99_ms: column("p99_ms"),
      error_rate: column("error_rate", 100), client_error_rate: column("client_error_rate", 100) };
    page.markers = body.markers;
    page.loaded += 1;
    lines.requests_per_s.chart.setData([page.t, page.series.requests_per_s]);
    lines.latency.chart.setData([page.t, page.series.p50_ms, page.series.p99_ms]);
    lines.error_rate.chart.setData([page.t, page.series.error_rate, page.series.client_error_rate]);
  }
  load();
  setInterval(load, 15000);  // the newest bucket fills, and the window moves on
  // A traffic change arrives over the live feed: its marker comes with the next load.
  let chartedGeneration = null;
  M.live({ state(message) {
    const mine = message.models && message.models[charts.dataset.model];
    if (mine && mine.generation !== chartedGeneration && !page.markers.some((marker) => marker.generation === mine.generation)) load();
    if (mine) chartedGeneration = mine.generation;
  } });

  const batches = rows.reduce((total, row) => C.addBuckets(total, row.batch_size_buckets), {});
  const { labels, values } = C.shares([C.bucketCounts(batches)]);
  C.bars(chart("batch_sizes"), labels, [{ label: `v${number}, last 6 hours`, color, values: values[0] }]);

  const requests = rows.reduce((sum, row) => sum + row.requests, 0);
  const errors = rows.reduce((sum, row) => sum + row.errors, 0);
  const clientErrors = rows.reduce((sum, row) => sum + (row.client_errors || 0), 0);
  const latency = rows.reduce((sum, row) => sum + row.latency_sum_s, 0);
  document.getElementById("rollup-summary").textContent =
    `${requests} requests over ${rows.length} minute${rows.length === 1 ? "" : "s"}; mean latency ${requests ? M.format.ms((latency / requests) * 1000) : "—"}; ${errors} answered 5xx, ${clientErrors} answered 4xx.`;
})();
