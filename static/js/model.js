// Model page: live figures and charts per version from the worker reports, fragments
// re-rendered when the release changes, the drill timer, and the upload with progress.
"use strict";

(function () {
  const M = window.ModelOps;
  const C = window.Charts;
  const config = JSON.parse(document.getElementById("live-config").textContent);
  const book = M.reportBook(config.gone_after_s);
  (config.workers || []).forEach((worker) => book.seed(worker, worker.seen_s_ago));
  const BATCH_WINDOW_S = 60;
  const VERDICT_POLL_MS = 1000;
  const VERDICT_WAIT_MS = 10 * 60 * 1000;  // INSPECTION_TIMEOUT_S and a queue ahead of it
  const RELEASE_PARTS = ["release-panel", "rollout-panel", "health", "live-figures", "versions-table", "audit"];

  const FIELDS = ["requests_per_s", "p50_ms", "p99_ms", "error_rate", "client_error_rate", "queue_depth"];
  // The charts draw ``history``: the past the series API answered (``past``, up to its
  // ``end``), then the live reports recorded since (``recent``), cut to the chosen range.
  const history = { t: [], series: new Map() };  // version -> {requests_per_s: [], ...}
  const past = { t: [], series: new Map(), end: 0 };
  const recent = { t: [], series: new Map() };
  const batches = new Map();  // version -> [{at, buckets}]
  const markers = [];  // release markers [{t, generation, label}], oldest first
  const picker = document.getElementById("chart-range");
  let range = picker ? C.rangePicker(picker, (chosen) => { range = chosen; chartKey = null; loadPast(); }) : "15m";
  let charts = null;
  let chartKey = null;
  let liveSince = 0;
  let loading = 0;
  let chartedGeneration = currentGeneration();  // the model's generation the markers know of
  // What the charts draw, for the browser tests and curious humans: the composed history,
  // the markers, and each chart's own data and series colours.
  window.modelPage = {
    history, markers, range: () => range, loaded: 0,
    charts: () => Object.fromEntries([...(charts || new Map())].map(([name, { chart }]) => [name, {
      data: chart.data, series: chart.series.slice(1).map((s) => ({ label: s.label, color: s._stroke || (typeof s.stroke === "function" ? s.stroke(chart, 1) : s.stroke) })),
    }])),
  };
  const windowS = () => C.RANGE_SPANS_S[range];

  // ---- what the page currently shows (the server-rendered fragments are the truth)
  function currentGeneration() {
    const element = document.querySelector("#release-panel [data-generation]");
    return element ? Number(element.dataset.generation) : 0;
  }

  function versionRows() {
    return [...document.querySelectorAll("#live-table tr[data-version]")].map((row) => ({
      version: Number(row.dataset.version), role: row.dataset.role, row,
    }));
  }

  function refreshRelease() {
    RELEASE_PARTS.forEach((id) => M.refreshSoon(id));
  }

  // ---- the live feed
  M.live({
    report(message) {
      const previous = book.add(message);
      for (const entry of message.versions || []) {
        if (entry.model === config.model) addBatches(entry.version, entry.batch_size_buckets);
      }
      // A worker moved to another generation, or one this page had not heard from reports:
      // convergence and roles changed, and the health headline counts the workers still converging.
      if (!previous || previous.generation !== message.generation) ["release-panel", "health"].forEach((id) => M.refreshSoon(id));
    },
    state(message) {
      const mine = message.models && message.models[config.model];
      if (!mine || mine.generation !== currentGeneration()) refreshRelease();
      // A traffic change of this model: its marker (and the figures up to it) come from the series API.
      if (mine && mine.generation !== chartedGeneration) {
        chartedGeneration = mine.generation;
        loadPast();
      }
      drill.sawState(mine, message);
    },
    job(message) {
      if (window.ModelOpsJobs) window.ModelOpsJobs.modelPage(config.model, message.job);
    },
    open() {
      liveSince = Date.now();
      refreshRelease();  // catch up on whatever happened while the feed was off
      if (window.modelPage.loaded) loadPast();  // a reconnect: fill the charts' gap too
      M.refreshSoon("evaluation-table");
    },
    close() { liveSince = 0; },
  }, { fallback: () => M.refreshAll(...RELEASE_PARTS, "model-drills", "evaluation-table") });

  // ---- once a second: table cells, history, charts
  function tick() {
    const rows = versionRows();
    // Until reports had time to arrive, the server's figures are better than nothing.
    if (!liveSince || Date.now() - liveSince < 1500) {
      draw(rows);
      return;
    }
    const figures = book.figures(config.model);
    const workers = book.fresh().length;
    document.getElementById("live-note").textContent = workers
      ? `per second, summed over ${workers} live worker${workers === 1 ? "" : "s"}`
      : "no worker is reporting";
    if ([...figures.keys()].some((version) => !rows.some((row) => row.version === version))) M.refreshSoon("live-figures");
    rows.forEach((row) => M.fillRow(row.row, figures.get(row.version)));
    record(figures, rows);
    draw(rows);
  }
  setInterval(tick, 1000);
  tick();
  loadPast();

  function record(figures, rows) {
    const versions = new Set([...rows.map((row) => row.version), ...figures.keys(), ...recent.series.keys()]);
    recent.t.push(Date.now() / 1000);
    for (const version of versions) {
      if (!recent.series.has(version)) recent.series.set(version, emptySeries(recent.t.length - 1));
      const figure = figures.get(version);
      const series = recent.series.get(version);
      series.requests_per_s.push(figure ? figure.requests_per_s : null);
      series.p50_ms.push(figure ? figure.p50_ms : null);
      series.p99_ms.push(figure ? figure.p99_ms : null);
      series.error_rate.push(figure && figure.error_rate != null ? figure.error_rate * 100 : null);
      series.client_error_rate.push(figure && figure.client_error_rate != null ? figure.client_error_rate * 100 : null);
      series.queue_depth.push(figure ? figure.queue_depth : null);
    }
    const cutoff = Date.now() / 1000 - Math.max(windowS(), BATCH_WINDOW_S);
    while (recent.t.length && recent.t[0] < cutoff) {
      recent.t.shift();
      recent.series.forEach((series) => Object.values(series).forEach((values) => values.shift()));
    }
    compose();
  }

  function emptySeries(length) {
    return Object.fromEntries(FIELDS.map((field) => [field, new Array(length).fill(null)]));
  }

  // ---- the past, from the series API: on load, on another range, on a traffic change
  async function loadPast() {
    const ticket = ++loading;
    const body = await C.fetchSeries(config.model, range);
    if (!body || ticket !== loading) return;  // failed, or overtaken by a newer request
    past.t = body.t;
    past.end = body.end;
    past.series = new Map(body.versions.map((entry) => [entry.version, {
      requests_per_s: entry.requests_per_s, p50_ms: entry.p50_ms, p99_ms: entry.p99_ms, queue_depth: entry.queue_depth,
      error_rate: entry.error_rate.map((v) => (v == null ? null : v * 100)),
      client_error_rate: entry.client_error_rate.map((v) => (v == null ? null : v * 100)),
    }]));
    body.versions.forEach((entry) => {
      if (!(batches.get(entry.version) || []).length) batches.set(entry.version, [{ at: body.end * 1000, buckets: entry.batch_size_buckets }]);
    });
    markers.splice(0, markers.length, ...body.markers);
    window.modelPage.loaded += 1;
    compose();
    draw(versionRows());
  }

  // history = past, then what live reports added after it, inside the range
  function compose() {
    const cutoff = Date.now() / 1000 - windowS();
    const fromPast = past.t.map((t, i) => i).filter((i) => past.t[i] >= cutoff);
    const fromRecent = recent.t.map((t, i) => i).filter((i) => recent.t[i] > past.end && recent.t[i] >= cutoff);
    history.t = [...fromPast.map((i) => past.t[i]), ...fromRecent.map((i) => recent.t[i])];
    const versions = [...new Set([...past.series.keys(), ...recent.series.keys()])].sort((a, b) => a - b);
    history.series = new Map(versions.map((version) => {
      const older = past.series.get(version) || {};
      const newer = recent.series.get(version) || {};
      return [version, Object.fromEntries(FIELDS.map((field) => [field, [
        ...fromPast.map((i) => (older[field] ? older[field][i] : null)),
        ...fromRecent.map((i) => (newer[field] ? newer[field][i] : null)),
      ]]))];
    }));
  }

  function addBatches(version, cumulative) {
    const now = Date.now();
    const window = batches.get(version) || [];
    window.push({ at: now, buckets: cumulative || {} });
    while (window.length && window[0].at < now - BATCH_WINDOW_S * 1000) window.shift();
    batches.set(version, window);
  }

  // ---- charts: rebuilt when the set of versions or their roles change. Versions no
  // longer in the table but in the range's history are drawn too, without a role.
  function chartRows(rows) {
    const listed = new Set(rows.map((row) => row.version));
    const gone = [...history.series.keys()].filter((version) => !listed.has(version)).map((version) => ({ version, role: "" }));
    return [...rows, ...gone].sort((a, b) => a.version - b.version);
  }

  function draw(tableRows) {
    const rows = chartRows(tableRows);
    const key = `${range}|${rows.map((row) => `${row.version}:${row.role}`).join(",")}`;
    if (key !== chartKey) {
      if (charts) charts.forEach((chart) => chart.destroy());
      charts = buildCharts(rows);
      chartKey = key;
    }
    const column = (field) => rows.map((row) => (history.series.get(row.version) || {})[field] || []);
    charts.get("requests_per_s").chart.setData([history.t, ...column("requests_per_s")]);
    charts.get("latency").chart.setData([history.t, ...rows.flatMap((row) => {
      const series = history.series.get(row.version) || {};
      return [series.p50_ms || [], series.p99_ms || []];
    })]);
    charts.get("error_rate").chart.setData([history.t, ...rows.flatMap((row) => {
      const series = history.series.get(row.version) || {};
      return [series.error_rate || [], series.client_error_rate || []];
    })]);
    charts.get("queue_depth").chart.setData([history.t, ...column("queue_depth")]);
    drawBatches(rows);
    document.getElementById("charts").dataset.points = String(history.t.length);
  }

  function buildCharts(rows) {
    const label = (row) => `v${row.version}${row.role ? " " + row.role : ""}`;
    const each = rows.map((row) => ({ label: label(row), color: C.versionColor(row.version) }));
    const latency = rows.flatMap((row) => [
      { label: `${label(row)} p50`, color: C.versionColor(row.version), dash: [5, 4], width: 1.5 },
      { label: `${label(row)} p99`, color: C.versionColor(row.version) },
    ]);
    const errors = rows.flatMap((row) => [
      { label: `${label(row)} 5xx`, color: C.versionColor(row.version) },
      { label: `${label(row)} 4xx`, color: C.versionColor(row.version), dash: [5, 4], width: 1.5 },
    ]);
    const chart = (name) => document.querySelector(`#charts [data-chart="${name}"]`);
    const live = { windowS, markers: () => markers };
    return new Map([
      ["requests_per_s", C.line(chart("requests_per_s"), each, { format: M.format.rate, ...live })],
      ["latency", C.line(chart("latency"), latency, { format: (v) => (v < 10 ? v.toFixed(1) : v.toFixed(0)), ...live })],
      ["error_rate", C.line(chart("error_rate"), errors, { format: (v) => `${+v.toFixed(2)}`, ...live })],
      ["queue_depth", C.line(chart("queue_depth"), each, { format: (v) => String(Math.round(v * 10) / 10), ...live })],
    ]);
  }

  function drawBatches(rows) {
    const counts = rows.map((row) => {
      const total = {};
      (batches.get(row.version) || []).forEach((entry) => C.addBuckets(total, entry.buckets));
      return C.bucketCounts(total);
    });
    const { labels, values } = C.shares(counts);
    const series = rows.map((row, index) => ({ label: `v${row.version}${row.role ? " " + row.role : ""}`, color: C.versionColor(row.version), values: values[index] }))
      .filter((s) => s.values.some((value) => value > 0));
    C.bars(document.querySelector('#charts [data-chart="batch_sizes"]'), labels, series);
  }

  // ---- 100% to a canary makes it the only route, and another version in the live canary's
  // place takes that canary out: each confirmed first, as Promote is. The presets and the
  // exact field both lead here; the dialogs' own buttons go through.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!form.matches(".split-form")) return;
    const submitter = event.submitter;
    if (submitter && (submitter.name === "confirmed_weight" || submitter.name === "confirmed_replace")) return;
    const typed = form.elements.weight ? form.elements.weight.value.trim().replace(/\s*%$/, "") : "";
    // Whole numbers only, as the server's field: Number() read "1e2" as 100 and asked to confirm 100%.
    const asked = submitter && submitter.name === "preset" ? Number(submitter.value) : /^\d+$/.test(typed) ? Number(typed) : null;
    const weight = asked !== null && asked <= 100 ? asked : null;  // else the server names what it refuses
    const version = form.elements.canary_version.value;
    const dialog = weight === 100 ? document.getElementById("full-share-dialog")
      : weight !== null && replacedBy(form, version).length ? document.getElementById("replace-canary-dialog") : null;
    if (!dialog || !dialog.showModal) return;  // without dialogs the server asks instead
    event.preventDefault();
    event.stopImmediatePropagation();  // before console.js posts it
    // The dialog's button sends the form without the preset pressed: the share goes in the
    // field, and back to what was typed there if the dialog is cancelled (a 50 left in it
    // applied 50% with no question once the live canary's version was chosen again).
    const share = form.elements.weight;
    if (share) {
      const typedBefore = share.value;
      share.value = String(weight);
      dialog.addEventListener("close", () => { if (dialog.returnValue !== "sent") share.value = typedBefore; }, { once: true });
    }
    dialog.returnValue = "";
    const replaced = replacedBy(form, version).map((live) => `v${live.version} ${live.weight}%`).join(", ");
    dialog.querySelectorAll("[data-full-version], [data-replace-version]").forEach((element) => { element.textContent = `v${version}`; });
    dialog.querySelectorAll("[data-replace-weight]").forEach((element) => { element.textContent = `${weight}%`; });
    dialog.querySelectorAll("[data-replaced]").forEach((element) => { element.textContent = replaced; });
    dialog.querySelectorAll("[data-replaced-clause]").forEach((element) => { element.hidden = !replaced; });
    // Where the chosen version was evaluated worse than the stable one, and only it.
    dialog.querySelectorAll("[data-worse-for]").forEach((element) => { element.hidden = element.dataset.worseFor !== version; });
    dialog.showModal();
  }, true);

  // A dialog's own button sends the form: its share stays in the field until the answer.
  document.addEventListener("submit", (event) => {
    const dialog = event.submitter && event.submitter.closest("dialog");
    if (dialog && event.target.matches(".split-form")) dialog.returnValue = "sent";
  }, true);

  // The split's weighted canaries, "2:10,3:10" as the panel writes them.
  function liveCanaries(form) {
    return (form.dataset.liveCanaries || "").split(",").filter(Boolean).map((entry) => {
      const [version, weight] = entry.split(":");
      return { version, weight };
    });
  }

  function replacedBy(form, version) {
    return liveCanaries(form).filter((live) => live.version !== version);
  }

  // The pressed preset and the "now N" placeholder speak of the live canary's version only:
  // with v3 chosen they told of v2's 50%, and a click on another preset replaced v2.
  function matchSharesToChoice() {
    const form = document.getElementById("split-form");
    if (!form || !form.elements.canary_version) return;
    const live = liveCanaries(form);
    const chosen = live.length === 1 && live[0].version === form.elements.canary_version.value ? live[0] : null;
    form.querySelectorAll("button.preset").forEach((button) => {
      if (chosen && button.value === chosen.weight) button.setAttribute("aria-pressed", "true");
      else button.removeAttribute("aria-pressed");
    });
    if (form.elements.weight && live.length) form.elements.weight.placeholder = chosen ? `now ${chosen.weight}` : "0-100";
  }
  document.addEventListener("change", (event) => { if (event.target.id === "id_canary_version") matchSharesToChoice(); });
  document.addEventListener("modelops:swapped", matchSharesToChoice);
  matchSharesToChoice();

  // Health words come from the server (recent roll-ups, the rollout's verdict): keep them fresh.
  // The release panel too, settled or not: it moves when a report names another generation,
  // and a worker killed while converged sends none, so "✓ All 2 live workers" stayed until a reload.
  setInterval(() => M.refreshAll("health", "release-panel"), 10000);

  // ---- the split form's force box: only the version chosen (console.js showForceFor)
  const applySplitForce = () => M.showForceFor("id_canary_version", "split-force", "id_split_force");
  document.addEventListener("change", (event) => { if (event.target.id === "id_canary_version") applySplitForce(); });
  document.addEventListener("modelops:swapped", applySplitForce);
  applySplitForce();

  // ---- traffic actions answered in place (console.js posts them)
  document.addEventListener("modelops:submitting", (event) => {
    if (event.detail.form.dataset.enhance === "drill") drill.start();
  });
  document.addEventListener("modelops:changed", (event) => {
    if (event.detail.form.dataset.enhance === "drill") drill.finish(event.detail.answer);
    refreshRelease();
    M.refreshSoon("model-drills");
  });

  // ---- the drill: a timer while the server waits for every worker's ack
  // Progress counts the workers the server waits for: those that reported within
  // drill_silent_s when it started (a worker frozen a few seconds before is one, and fails
  // the drill unless it follows), never one whose last report said it stopped. One that
  // falls silent stays counted, as not following. The page knows the workers the server
  // listed at render (config.workers) and those it heard from since. A worker follows once it reports this model's part of the rollback's state
  // by the model's digest (at the rollback's generation or later: another model may fail
  // there, or change after), or, from a worker whose reports carry no model digests, the
  // rollback's state by its digest or a later generation.
  const drill = (function () {
    const box = document.getElementById("drill-status");
    let started = 0;
    let timer = null;
    let target = null;  // {generation, digest, modelDigest} of the state the rollback made
    let waitedFor = [];  // worker ids

    function start() {
      started = performance.now();
      target = null;
      const span = Math.max(config.drill_silent_s, config.gone_after_s);
      waitedFor = book.seenWithin(span).filter((report) => report.state !== "stopped").map((report) => report.worker);
      box.hidden = false;
      box.classList.remove("done");
      box.scrollIntoView({ block: "nearest" });  // it sits below the panel: its timer was never in sight
      timer = setInterval(render, 100);
      render();
    }

    function sawState(mine, state) {
      if (timer && mine && target === null && mine.generation === state.generation) {
        target = { generation: state.generation, digest: state.digest, modelDigest: mine.digest };
      }
    }

    function follows(report) {
      const models = report.models;
      if (models && target.modelDigest !== undefined) {
        // A later generation counts only with this model's entry as the rollback made it:
        // one that kept the canary here, or a later release of the model, does not.
        return report.generation >= target.generation && models[config.model] === target.modelDigest;
      }
      return report.generation > target.generation || (report.generation === target.generation && report.digest === target.digest);
    }

    function render() {
      const elapsed = ((performance.now() - started) / 1000).toFixed(1);
      const fresh = new Set(book.fresh().map((report) => report.worker));
      const reports = waitedFor.map((worker) => book.latest.get(worker));
      const followed = target === null ? 0 : reports.filter((report) => report && follows(report)).length;
      const silent = waitedFor.filter((worker) => !fresh.has(worker)).length;
      let waiting = "rolling back…";
      if (target !== null) {
        waiting = `${followed} of ${waitedFor.length} worker${waitedFor.length === 1 ? "" : "s"} serve generation ${target.generation}`;
        if (silent) waiting += `; ${silent} not reporting`;
      }
      box.innerHTML = "";
      const clock = document.createElement("span");
      clock.className = "timer";
      clock.textContent = `${elapsed} s`;
      box.append(clock, ` Drill running: ${waiting}`);
    }

    function finish(answer) {
      clearInterval(timer);
      timer = null;
      const elapsed = ((performance.now() - started) / 1000).toFixed(2);
      box.classList.add("done");
      // A drill refused before it ran (stale page, another drill) did not "finish": its answer says why.
      box.textContent = answer.ok ? `Drill finished after ${elapsed} s in this browser. ${answer.data.message || ""}` : (answer.data.message || "");
    }

    return { start, sawState, finish };
  })();

  // ---- upload: drag and drop or the file picker, with progress and the verdict
  const form = document.getElementById("upload-form");
  if (form) setUpUpload(form);

  function setUpUpload(form) {
    const zone = document.getElementById("dropzone");
    const input = document.getElementById("id_artifact");
    input.addEventListener("change", () => { if (input.files.length) upload(input.files[0]); });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (input.files.length) upload(input.files[0]);
    });
    ["dragenter", "dragover"].forEach((name) => zone.addEventListener(name, (event) => {
      event.preventDefault();
      zone.classList.add("dragging");
    }));
    ["dragleave", "drop"].forEach((name) => zone.addEventListener(name, () => zone.classList.remove("dragging")));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      if (event.dataTransfer.files.length) upload(event.dataTransfer.files[0]);
    });

    function upload(file, options = {}) {
      const description = options.description ?? form.elements.description.value;
      const tooLong = descriptionTooLong(description);
      if (tooLong) {
        input.value = "";  // choosing the same file again is a change, and uploads it
        verdict("refused", [tooLong]);
        return;
      }
      const body = new FormData();
      body.append("artifact", file, file.name);
      body.append("description", description);
      if (options.allowDuplicate) body.append("allow_duplicate", "true");
      const request = new XMLHttpRequest();
      request.open("POST", form.dataset.api);
      request.setRequestHeader("X-CSRFToken", M.csrfToken);
      request.setRequestHeader("Accept", "application/json");
      request.upload.onprogress = (event) => progress(file, event);
      request.upload.onload = () => verdict("working", [`Sent ${file.name}. Validating in ONNX Runtime…`]);
      request.onload = () => answered(request, file, body.get("description"));
      request.onerror = () => verdict("refused", ["The upload was interrupted: the console could not be reached."]);
      verdict("working", [`Sending ${file.name}…`]);
      request.send(body);
    }

    // Before the file is sent: the server refuses a longer description only once the whole artifact has arrived.
    function descriptionTooLong(description) {
      const maxChars = Number(form.elements.description.dataset.maxChars);
      const chars = [...description].length;  // code points, as the server counts them
      if (chars <= maxChars) return "";
      return `Not sent: the description has ${chars} characters, more than the ${maxChars} a version takes. Shorten it, then choose the file again.`;
    }

    function progress(file, event) {
      const box = document.getElementById("upload-progress");
      box.hidden = false;
      const percent = event.lengthComputable ? Math.round((event.loaded / event.total) * 100) : 0;
      box.querySelector("progress").value = percent;
      document.getElementById("upload-progress-text").textContent = `${percent}% of ${(file.size / 1024).toFixed(0)} KiB`;
    }

    function answered(request, file, description) {
      document.getElementById("upload-progress").hidden = true;
      input.value = "";  // choosing the same file again is a change, and uploads it
      // Only a stored upload clears the form: a refusal (not ONNX, too large, identical to
      // a version) emptied the description typed for it, to be typed again at each retry.
      if (request.status === 202) form.reset();
      let body = {};
      try { body = JSON.parse(request.responseText); } catch (error) { body = {}; }
      if (request.status === 409 && body.existing_version) {
        duplicate(file, body, () => upload(file, { allowDuplicate: true, description }));
      } else if (request.status === 202) {
        verdict("working", [`v${body.number} is stored; validating it in ONNX Runtime…`], body);
        refreshRelease();
        awaitVerdict(body.number, Date.now());
      } else {
        verdict("refused", [`Refused (HTTP ${request.status}): ${file.name}: ${body.error || "the console gave no reason"}`]);
        M.refreshSoon("audit");
      }
    }
  }

  // Identical bytes: say which version has them, link it, and offer the copy explicitly.
  function duplicate(file, body, uploadCopy) {
    const box = document.getElementById("upload-result");
    box.className = "upload-result refused duplicate";
    const words = `Not uploaded: ${file.name} is identical to version ${body.existing_version} (the same sha256); nothing was stored.`;
    const text = Object.assign(document.createElement("p"), { textContent: words });
    const link = Object.assign(document.createElement("a"), { href: body.page_url, textContent: `Open v${body.existing_version}` });
    const copy = Object.assign(document.createElement("button"), { type: "button", className: "button small copy-anyway", textContent: "Upload as a copy anyway" });
    copy.addEventListener("click", () => { copy.disabled = true; uploadCopy(); });
    box.replaceChildren(text, link, copy);
  }

  // The validation runs after the 202: ask for the version until it is judged.
  function awaitVerdict(number, startedAt) {
    fetch(`${form.dataset.api}${number}/`, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : {}))
      .catch(() => ({}))
      .then((version) => {
        if (version.status === "ready") {
          verdict(inputsDiffer(version) ? "working" : "ok", describeVersion(version), version);
          refreshRelease();
        } else if (version.status === "rejected") {
          verdict("refused", [`v${number} was rejected: ${version.status_reason || "no reason given"}`], version);
          refreshRelease();
          M.refreshSoon("audit");
        } else if (Date.now() - startedAt < VERDICT_WAIT_MS) {
          setTimeout(() => awaitVerdict(number, startedAt), VERDICT_POLL_MS);
        } else {
          verdict("working", [`v${number} is still validating; the versions table shows its verdict when it is in.`], version);
        }
      });
  }

  function describeVersion(version) {
    const spec = (items) => (items || []).map((item) => `${item.name} ${item.datatype} [${(item.shape || []).map((d) => (d == null ? "?" : d)).join(", ")}]`).join(", ");
    const checks = ((version.validation_report || {}).checks || []).filter((check) => check.ok).length;
    const lines = [
      `✓ v${version.number} is ready: validated and registered.`,
      `Inputs ${spec(version.signature && version.signature.inputs)} → outputs ${spec(version.signature && version.signature.outputs)}; opset ${version.opset}; ${checks} checks passed; sha256 ${String(version.sha256).slice(0, 12)}.`,
    ];
    const differ = inputsDiffer(version);
    if (differ) {  // said here: it was only in the audit and the canary list, under a green "ready"
      lines.splice(1, 0, `⚠ Its inputs differ from stable v${differ.stable_version}'s (${(differ.differences || []).join("; ")}): `
        + `clients of v${differ.stable_version} would be refused, so traffic to it needs Force with a reason.`);
    }
    return lines;
  }

  function inputsDiffer(version) {
    const compatibility = (version.validation_report || {}).compatibility;
    return compatibility && compatibility.compatible === false ? compatibility : null;
  }

  function verdict(kind, lines, version) {
    const box = document.getElementById("upload-result");
    box.className = `upload-result ${kind}`;
    box.replaceChildren(...lines.map((text) => Object.assign(document.createElement("p"), { textContent: text })));
    if (version && version.number) {
      const link = Object.assign(document.createElement("a"), { href: `versions/${version.number}/`, textContent: `Open v${version.number}` });
      box.append(link);
    }
  }
})();
