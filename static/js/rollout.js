// The rollout panel (model page and a rollout's page): while a rollout is active, its
// API answer is read every few seconds; when it says something the panel does not
// (another window judged, a step, a pause), the server re-renders the panel. The charts
// plot every judged window, canary against stable, from the same answer.
"use strict";

(function () {
  const M = window.ModelOps;
  const C = window.Charts;
  const panel = document.getElementById("rollout-panel");
  if (!panel) return;
  const chartsBox = document.getElementById("rollout-charts");
  const POLL_MS = 3000;
  const LIMIT = "#9ca3af";
  const page = { verdicts: 0, rollout: null };
  window.rolloutPage = page;  // what the charts draw, for the browser tests and curious humans
  let charts = null;
  let chartKey = null;
  let polling = false;
  let refreshedFor = null;  // the API state a refresh was asked for: asked once, never in a loop

  function shown() {
    const element = panel.querySelector("[data-rollout]");
    if (!element) return null;
    return { id: element.dataset.rollout, url: element.dataset.url, active: element.dataset.active === "true", state: element.dataset.state };
  }

  // The panel's data-state, worked out from the API's answer (console.summaries.rollout_state_key).
  function stateOf(rollout) {
    return [rollout.status, rollout.windows_judged, rollout.current_step, rollout.consecutive_failures, rollout.release_generation].join(":");
  }

  async function poll() {
    const current = shown();
    if (!current) {
      chartsBox.hidden = true;
      return;
    }
    if (polling) return;
    polling = true;
    try {
      const rollout = await read(current.url);
      if (!rollout) return;
      const state = stateOf(rollout);
      if (state !== current.state && state !== refreshedFor) {
        refreshedFor = state;
        M.refreshSoon("rollout-panel", 0);
        ["release-panel", "health", "audit", "live-figures"].forEach((id) => M.refreshSoon(id));
      }
      draw(rollout);
    } finally {
      polling = false;
    }
  }

  async function read(url) {
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      return response.ok ? await response.json() : null;
    } catch (error) {
      return null;  // the console is unreachable: try again at the next poll
    }
  }

  setInterval(() => {
    const current = shown();
    if (current && current.active) poll();
  }, POLL_MS);
  poll();

  // A re-rendered panel may show another rollout, or the same one further on.
  panel.addEventListener("modelops:swapped", () => {
    applyForceChoice();
    poll();
  });
  document.addEventListener("modelops:changed", () => M.refreshSoon("rollout-panel"));

  // ---- charts: one point per judged window, oldest first
  function draw(rollout) {
    const verdicts = [...(rollout.verdicts || [])].reverse();
    page.verdicts = verdicts.length;
    page.rollout = rollout.id;
    chartsBox.hidden = verdicts.length === 0;
    if (!verdicts.length) return;
    const outputs = [...new Set(verdicts.flatMap((verdict) => verdict.signals.map((signal) => signal.name).filter((name) => name.startsWith("output:"))))];
    const key = `${rollout.id}|${rollout.canary_version}|${rollout.stable_version}|${outputs.join(",")}`;
    if (key !== chartKey) {
      if (charts) charts.forEach((chart) => chart.destroy());
      const statistics = new Map(verdicts.flatMap((verdict) => verdict.signals.filter((item) => item.statistic).map((item) => [item.name, item.statistic])));
      charts = build(outputs, statistics, rollout);
      chartKey = key;
    }
    const t = verdicts.map((verdict) => Date.parse(verdict.window_end) / 1000);
    const signal = (verdict, name) => verdict.signals.find((item) => item.name === name) || {};
    const percent = (value) => (value == null ? null : value * 100);
    const errors = (name) => [
      verdicts.map((verdict) => percent(signal(verdict, name).value)),
      verdicts.map((verdict) => percent(signal(verdict, name).stable_value)),
      verdicts.map((verdict) => {
        const { stable_value: stable, threshold } = signal(verdict, name);
        return stable == null || threshold == null ? null : (stable + threshold) * 100;
      }),
    ];
    charts.get("server_errors").chart.setData([t, ...errors("server_errors")]);
    charts.get("client_errors").chart.setData([t, ...errors("client_errors")]);
    charts.get("latency_p99").chart.setData([t, ...["value", "stable_value", "threshold"].map((field) => verdicts.map((verdict) => signal(verdict, "latency_p99")[field] ?? null))]);
    const distribution = outputs.flatMap((name) => [
      verdicts.map((verdict) => signal(verdict, name).value ?? null),
      verdicts.map((verdict) => signal(verdict, name).threshold ?? null),
    ]);
    // One series per line the chart was built with: the placeholder line has no points.
    charts.get("distribution").chart.setData([t, ...(outputs.length ? distribution : [verdicts.map(() => null)])]);
  }

  function build(outputs, statistics, rollout) {
    // Each side in its version's colour, as on every other chart of the model.
    const CANARY = C.versionColor(rollout.canary_version);
    const STABLE = C.versionColor(rollout.stable_version);
    const chart = (name) => chartsBox.querySelector(`[data-chart="${name}"]`);
    const sides = (unit) => [
      { label: `canary v${rollout.canary_version} ${unit}`, color: CANARY },
      { label: `stable v${rollout.stable_version} ${unit}`, color: STABLE },
      { label: "allowed", color: LIMIT, dash: [5, 4], width: 1.5 },
    ];
    const pct = (v) => `${+v.toFixed(2)}`;
    const distribution = outputs.length
      ? outputs.flatMap((name, index) => [
        { label: `${name.slice("output:".length)} ${statistics.get(name) || ""}`.trim(), color: C.colorFor("", index) },
        { label: `${name.slice("output:".length)} threshold`, color: LIMIT, dash: [5, 4], width: 1.5 },
      ])
      : [{ label: "no output compared", color: LIMIT }];
    return new Map([
      ["server_errors", C.line(chart("server_errors"), sides("5xx %"), { format: pct })],
      ["client_errors", C.line(chart("client_errors"), sides("4xx %"), { format: pct })],
      ["latency_p99", C.line(chart("latency_p99"), [
        { label: "canary p99", color: CANARY }, { label: "stable p99", color: STABLE }, { label: "limit", color: LIMIT, dash: [5, 4], width: 1.5 },
      ], { format: (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)) })],
      ["distribution", C.line(chart("distribution"), distribution, { format: (v) => v.toFixed(2) })],
    ]);
  }

  // ---- the start form: the force box speaks only of the version chosen
  function applyForceChoice() {
    M.showForceFor("id_rollout_canary", "rollout-force", "id_rollout_force");
  }
  panel.addEventListener("change", (event) => {
    if (event.target.id === "id_rollout_canary") applyForceChoice();
  });
  applyForceChoice();
})();
