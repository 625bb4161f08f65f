// Background jobs, live. On the Jobs tab each job's row follows the feed's "job"
// messages in place (status, progress bar, counts, rate, ETA); a job the table does not
// show yet, or one whose status changed, re-renders the table from the server (the same
// fragment as on load). On the model page (model.js passes its messages here) a finished
// validation, benchmark or evaluation re-renders the versions and evaluation tables; on a
// version page, its benchmark and evaluation panels.
"use strict";

window.ModelOpsJobs = (function () {
  const M = window.ModelOps;
  const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
  const LABELS = { queued: "Queued", running: "Running", succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" };
  const MEASURES = new Set(["validation", "benchmark", "evaluation"]);
  const seen = new Map();  // job id -> the last status this page acted on

  function count(value) {
    return value == null ? "—" : Math.round(value).toLocaleString("en-US");
  }

  // The templates' duration filter, in JS.
  function duration(seconds) {
    if (seconds == null) return "—";
    if (seconds < 10) return `${seconds.toFixed(1)} s`;
    const whole = Math.round(seconds);
    if (whole < 60) return `${whole} s`;
    if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
    return `${Math.floor(whole / 3600)} h ${Math.floor((whole % 3600) / 60)} min`;
  }

  function counts(job) {
    let text = count(job.done);
    if (job.total != null) text += ` / ${count(job.total)}`;
    if (job.total) text += ` (${Math.min(100, Math.floor((job.done * 100) / job.total))}%)`;
    return text;
  }

  function setText(row, field, text) {
    const cell = row.querySelector(`[data-field="${field}"]`);
    if (cell && cell.textContent !== text) cell.textContent = text;
  }

  function patchRow(row, job) {
    row.dataset.status = job.status;
    const badge = row.querySelector('[data-field="status"]');
    if (badge) {
      badge.className = `badge badge-${job.status}`;
      badge.textContent = LABELS[job.status] || job.status;
    }
    const bar = row.querySelector('[data-field="progress"]');
    if (bar) {
      if (job.total) {
        bar.max = job.total;
        bar.value = Math.min(job.done, job.total);
      } else if (job.status === "running") {
        bar.removeAttribute("value");  // indeterminate until the total is known
      }
    }
    setText(row, "counts", counts(job));
    setText(row, "rate", job.rate_per_s == null ? "—" : `${M.format.rate(job.rate_per_s)}/s`);
    setText(row, "eta", duration(job.eta_s));
  }

  // True the first time this page sees a job in this status (progress messages repeat it).
  function statusChanged(job) {
    const changed = seen.get(job.id) !== job.status;
    seen.set(job.id, job.status);
    return changed;
  }

  // ---- the Jobs tab
  function jobsPage(config) {
    document.querySelectorAll("#jobs-table tr[data-job]").forEach((row) => seen.set(Number(row.dataset.job), row.dataset.status));
    M.live({
      job(message) {
        const job = message.job;
        if (!job || job.model !== config.model) return;
        const row = document.querySelector(`#jobs-table tr[data-job="${job.id}"]`);
        const changed = statusChanged(job);
        if (row) patchRow(row, job);
        // New rows, download links, timings and errors come from the server's fragment.
        if (!row || changed || job.cancel_requested) M.refreshSoon("jobs-table");
        if (job.kind === "evaluation" && changed) M.refreshSoon("datasets");
      },
      open() { M.refreshAll("jobs-table", "datasets"); },
    }, { fallback: () => M.refreshAll("jobs-table", "datasets") });

    // The forms and cancel buttons are posted by console.js; what they changed shows here.
    document.addEventListener("modelops:changed", (event) => {
      const { form, answer } = event.detail;
      if (answer.ok && (form.id === "batch-form" || form.id === "dataset-form")) form.reset();
      M.refreshSoon("jobs-table");
      if (form.id === "dataset-form") M.refreshSoon("datasets");
    });
  }

  // ---- the model page: called by model.js with each job message
  function modelPage(modelName, job) {
    if (!job || job.model !== modelName || !MEASURES.has(job.kind) || !statusChanged(job)) return;
    M.refreshSoon("versions-table");  // a verdict (ready / rejected), or measuring… → numbers
    if (job.kind === "evaluation" || (job.kind === "validation" && FINISHED.has(job.status))) M.refreshSoon("evaluation-table");
    if (job.kind === "validation" && FINISHED.has(job.status)) {
      M.refreshSoon("audit");
      M.refreshSoon("release-panel");  // a version that became ready may now take a canary
    }
  }

  // ---- a version page
  function versionPage(config) {
    M.live({
      job(message) {
        const job = message.job;
        if (!job || job.model !== config.model || job.version !== config.version || !FINISHED.has(job.status) || !statusChanged(job)) return;
        if (job.kind === "benchmark") M.refreshSoon("benchmark");
        if (job.kind === "evaluation") M.refreshSoon("evaluation");
        if (job.kind === "validation") location.reload();  // the whole page follows its status
      },
    });
  }

  const element = document.getElementById("jobs-config");
  const config = element ? JSON.parse(element.textContent) : null;
  if (config && config.page === "jobs") jobsPage(config);
  if (config && config.page === "version") versionPage(config);

  return { modelPage, patchRow, duration };
})();
