// Shared by every signed-in page: the live feed, fragment refreshes, dialogs,
// enhanced forms and relative times. Pages add their own small file on top.
"use strict";

window.ModelOps = (function () {
  const liveStatus = document.getElementById("live-status");
  const csrfToken = document.querySelector("meta[name=csrf-token]").content;
  const ENABLE_AFTER_CHANGE_MS = 5000;  // a changed form's buttons, when no refreshed copy replaced it
  const RETRY_FIRST_MS = 1000, RETRY_MAX_MS = 15000;  // a fragment whose refresh failed
  // A fragment unanswered this long has /healthz asked; /healthz unanswered this long is a
  // console that does not answer (it takes no request slot and checks nothing: a running
  // console answers it in milliseconds, however busy).
  const SLOW_ANSWER_MS = 5000, PROBE_TIMEOUT_MS = 5000;

  // ---- fragments: the server renders the same template on load and on refresh.
  const pending = new Set();

  // Never pull the rug from under someone typing, choosing or confirming. A text field of a
  // form not touched since it was drawn or sent holds nothing to lose (the swap gives it its
  // focus back): the release panel stayed on the old split, "✓ converged" included, for as
  // long as the cursor stayed in the Share box after Enter.
  function isBusy(element) {
    const active = document.activeElement;
    if (element.querySelector("dialog[open]")) return true;
    if (!element.contains(active) || !active.matches("input, select, textarea")) return false;
    return active.tagName === "SELECT" || !active.form || active.form.dataset.touched === "true";
  }

  async function refresh(element) {
    if (isBusy(element)) {
      pending.add(element);  // retried below once they are done
      noteIfOutdated(element);
      return;
    }
    const ticket = (element.refreshTicket = (element.refreshTicket || 0) + 1);
    const html = await fetchFragment(element.dataset.fragment);
    if (ticket !== element.refreshTicket) return;  // overtaken by a newer one
    if (html === null) {
      // Asked again later: the event that asked for it (a worker's report naming another
      // generation) comes once, and the fragment would show the old news until the next.
      element.retryMs = Math.min((element.retryMs || RETRY_FIRST_MS / 2) * 2, RETRY_MAX_MS);
      setTimeout(() => { if (ticket === element.refreshTicket) refresh(element); }, element.retryMs);
      return;
    }
    element.retryMs = 0;
    // The same as last time: nothing to swap. The release panel refreshes every 10 s, and a
    // swap moves keyboard focus and can swallow a click pressed across it.
    if (html === element.lastFragment) return;
    if (isBusy(element)) {
      pending.add(element);  // they opened a dialog or started typing while we fetched
      noteIfOutdated(element, html);
      return;
    }
    element.lastFragment = html;
    swap(element, html);
  }

  // The release panel held back while someone chooses in it showed the old split, and its
  // "✓ converged", for as long as they did: it says so when the traffic changed meanwhile
  // (a change sent from it is refused as stale anyway). The swap that follows removes it.
  async function noteIfOutdated(element, html) {
    const shown = element.dataset.fragment === "release-panel" && element.querySelector("[data-generation]");
    if (!shown) return;
    const fresh = html === undefined ? await fetchFragment(element.dataset.fragment) : html;
    const now = fresh && new DOMParser().parseFromString(fresh, "text/html").querySelector("[data-generation]");
    if (!now || now.dataset.generation === shown.dataset.generation || !element.contains(shown)) return;
    let note = element.querySelector(".outdated-note");
    if (!note) {
      note = Object.assign(document.createElement("p"), { className: "outdated-note message message-warning" });
      note.setAttribute("role", "status");
      element.prepend(note);
    }
    note.textContent = `The traffic changed while this panel was open: generation ${now.dataset.generation} is in force now, `
      + `not ${shown.dataset.generation} as shown. Leave the form to see it; a change sent from here would be refused as stale.`;
  }

  async function fetchFragment(name) {
    const url = new URL(location.href);
    url.searchParams.set("fragment", name);
    // A console that hangs (frozen, or its host gone without a reset) fails no fetch: this one
    // would wait for minutes while the page went on saying "✓ converged". Past a few seconds
    // /healthz, which answers at once from a running console, is asked whether it is there.
    const slow = setTimeout(probe, SLOW_ANSWER_MS);
    try {
      const response = await fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (response.redirected) location.reload();  // signed out meanwhile: let the login page say so
      // 502/504: a proxy in front found no console. A 503 is the console answering (busy, or
      // its database away: the page says so when reloaded); counted, it flapped with /healthz.
      if (response.status === 502 || response.status === 504) unanswered();
      else if (response.ok) answered();
      return response.ok && !response.redirected ? await response.text() : null;
    } catch (error) {
      unanswered();
      return null;
    } finally {
      clearTimeout(slow);
    }
  }

  // ---- whether the console answers this page. One that cannot reach it kept showing what it
  // last heard, "✓ All 1 live worker serve generation 58" included, for as long as the stack
  // was down (serving with it): said at once in red, its green marks struck through, and
  // asked again every few seconds until the console answers. The fragments' own retries
  // then bring the page up to date (refreshing them all at once here doubled the load on a
  // console that had just come back).
  const PROBE_EVERY_MS = 5000;
  let unreachableSince = null, prober = null;

  function unanswered() {
    if (unreachableSince !== null) return;
    unreachableSince = new Date();
    document.body.dataset.unreachable = "true";
    flash("error", `The console has not answered since ${unreachableSince.toLocaleTimeString()}: what this page shows `
      + "(workers, convergence, figures) is from before then, and serving may be down too. Asking again every few seconds.", "reach");
    prober = setInterval(probe, PROBE_EVERY_MS);
  }

  function answered() {
    if (unreachableSince === null) return;
    unreachableSince = null;
    delete document.body.dataset.unreachable;
    clearInterval(prober);
    prober = null;
    flash("success", "The console answers again: this page catches up with its next refreshes.", "reach");
  }

  // /healthz: the console process answers (/readyz would also fail while only Redis is away,
  // which pages survive, and the page flipped red and green at every live-feed reconnect).
  async function probe() {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), PROBE_TIMEOUT_MS);
    try {
      const response = await fetch("/healthz", { cache: "no-store", credentials: "same-origin", signal: controller.signal });
      if (response.ok) answered();
      else unanswered();
    } catch (error) {
      unanswered();  // refused, offline, or not answered within PROBE_TIMEOUT_MS (aborted)
    } finally {
      clearTimeout(timer);
    }
  }

  function swap(element, html) {
    const focused = focusSelector(element);
    const edits = editsIn(element);
    element.innerHTML = html;
    restoreEdits(element, edits);
    tickAges(element);
    const again = focused && element.querySelector(focused);
    if (again) again.focus();  // keyboard users keep their place
    element.dispatchEvent(new CustomEvent("modelops:swapped", { bubbles: true }));
  }

  setInterval(() => pending.forEach((element) => {
    if (!isBusy(element)) {
      pending.delete(element);
      refresh(element);
    }
  }), 500);

  // A choice made in a form and not sent yet survives a refresh of the fragment holding it:
  // the fresh copy would silently put the form back to its defaults, and the next click would
  // send what nobody chose (a rollout of another version). Hidden fields take the server's
  // fresh values (expected_generation is how the server refuses a stale form).
  document.addEventListener("input", markEdited, true);
  document.addEventListener("change", markEdited, true);
  function markEdited(event) {
    const form = event.target.form;
    if (form) form.dataset.touched = "true";
    if (form && form.id) form.dataset.edited = "true";
  }

  function editableFields(form) {
    return [...form.elements].filter((field) => field.name && !["hidden", "submit", "button", "file"].includes(field.type));
  }

  // A form with an id keeps what was typed in it across a swap until it is sent and
  // accepted: the dialogs' forms have ids for it, so a rollback refused as stale (someone
  // changed the traffic meanwhile) no longer throws away the reason typed for it.
  function editsIn(element) {
    return [...element.querySelectorAll("form[data-edited][id]")].map((form) => ({
      id: form.id,
      fields: editableFields(form).map((field) => ({ name: field.name, value: field.value, checked: field.checked })),
    }));
  }

  function restoreEdits(element, edits) {
    edits.forEach(({ id, fields }) => {
      const form = element.querySelector(`form#${CSS.escape(id)}`);
      if (!form) return;  // the form is gone (a rollout started meanwhile): nothing to keep
      form.dataset.edited = "true";
      form.dataset.touched = "true";
      const fresh = editableFields(form);
      fields.forEach(({ name, value, checked }) => {
        fresh.filter((field) => field.name === name).forEach((field) => {
          if (field.type === "radio" || field.type === "checkbox") {
            if (field.value === value) field.checked = checked;
          } else if (field.tagName !== "SELECT" || [...field.options].some((option) => option.value === value)) {
            field.value = value;
          }
        });
      });
    });
  }

  function focusSelector(element) {
    const active = document.activeElement;
    if (!element.contains(active) || active === element) return null;
    if (active.id) return `#${CSS.escape(active.id)}`;
    if (!active.name) return null;
    const value = active.value ? `[value="${CSS.escape(active.value)}"]` : "";
    return `${active.tagName.toLowerCase()}[name="${CSS.escape(active.name)}"]${value}`;
  }

  function refreshAll(...ids) {
    return Promise.all(ids.map((id) => document.getElementById(id)).filter(Boolean).map(refresh));
  }

  // Coalesce bursts (several workers acking within a second) into one request each.
  const timers = {};
  function refreshSoon(id, delayMs = 250) {
    clearTimeout(timers[id]);
    timers[id] = setTimeout(() => refreshAll(id), delayMs);
  }

  // ---- the live feed: /ws/live/ sends worker reports and desired-state changes.
  function live(handlers, { fallback, fallbackEveryMs = 5000 } = {}) {
    let backoffMs = 500;
    let poller = null;
    const startPolling = () => { if (fallback && !poller) poller = setInterval(fallback, fallbackEveryMs); };
    const stopPolling = () => { clearInterval(poller); poller = null; };

    function connect() {
      setStatus("connecting", "Live feed connecting");
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const socket = new WebSocket(`${scheme}://${location.host}/ws/live/`);
      socket.onopen = () => {
        backoffMs = 500;
        stopPolling();
        setStatus("on", "Live");
        if (handlers.open) handlers.open();
      };
      socket.onmessage = (event) => {
        const message = JSON.parse(event.data);
        const handler = handlers[message.kind];
        if (handler) handler(message);
      };
      socket.onclose = () => {
        if (handlers.close) handlers.close();
        probe();  // a console that stopped closes the feed first: say so now, not at the next refresh
        setStatus("off", "Live feed off: refreshing every few seconds");
        startPolling();
        setTimeout(connect, backoffMs);
        backoffMs = Math.min(backoffMs * 2, 15000);
      };
    }
    connect();
  }

  function setStatus(state, text) {
    if (!liveStatus) return;
    liveStatus.hidden = false;
    liveStatus.dataset.state = state;
    liveStatus.textContent = text;
  }

  // ---- messages
  // A message with a subject (a form's data-subject: "rollout", "traffic") replaces the
  // earlier ones of that subject: "Rollout paused" must not stay under "Rollout resumed".
  function flash(level, text, subject) {
    const box = document.getElementById("messages");
    const line = document.createElement("p");
    line.className = `message message-${level}`;
    line.setAttribute("role", level === "error" ? "alert" : "status");
    const words = document.createElement("span");
    words.textContent = text;
    const close = document.createElement("button");
    Object.assign(close, { type: "button", className: "message-close", textContent: "×" });
    close.setAttribute("aria-label", "Dismiss this message");
    close.dataset.dismiss = "";
    line.append(words, close);
    if (subject) {
      line.dataset.subject = subject;
      box.querySelectorAll(`[data-subject="${CSS.escape(subject)}"]`).forEach((earlier) => earlier.remove());
    }
    box.prepend(line);
    while (box.children.length > 3) box.lastElementChild.remove();
    if (level === "success") removeLater(line);
    settleMessages();
    return line;
  }

  // ---- a traffic change's message said "Workers are converging." for its whole 12 s, and
  // on a reload, long after the release panel beside it said "✓ All 2 live workers serve
  // generation 6" (or "Not converged: op-w2 silent"). It follows the panel until that
  // generation settles: the sentence becomes what the panel says, a warning while the
  // panel says it has not converged (kept until dismissed), a success again once it has
  // (a stopped worker that comes back), or "Generation H has replaced it since".
  const CONVERGING = "Workers are converging.";
  const SETTLED_MESSAGE_MS = 12000;

  // A success goes SETTLED_MESSAGE_MS after it became one, not after the line was made: a
  // change's message that was a warning meanwhile (a stopped worker) and turned back to a
  // success near its first 12 s was removed by the first timer as it turned, unread. A
  // success turned into a warning stays until dismissed.
  function removeLater(line) {
    clearTimeout(line.removal);
    line.removal = setTimeout(() => { if (line.classList.contains("message-success")) line.remove(); }, SETTLED_MESSAGE_MS);
  }

  function settleMessages() {
    const panel = document.getElementById("release-panel");
    const shown = panel && panel.querySelector("[data-generation]");
    const convergence = panel && panel.querySelector("#convergence");
    if (!shown || !convergence) return;
    const current = Number(shown.dataset.generation);
    document.querySelectorAll("#messages .message > span").forEach((words) => {
      const line = words.closest(".message");
      if (!line.dataset.follows) {
        const at = words.textContent.indexOf(CONVERGING);
        const named = words.textContent.match(/^Generation (\d+):|\(generation (\d+)\)/);
        if (at < 0 || !named) return;
        line.dataset.follows = named[1] || named[2];
        line.dataset.head = words.textContent.slice(0, at);
        line.dataset.tail = words.textContent.slice(at + CONVERGING.length);
      }
      const generation = Number(line.dataset.follows);
      if (generation > current) return;  // the panel has not caught up yet
      const say = (sentence) => { words.textContent = line.dataset.head + sentence + line.dataset.tail; };
      const level = (name) => {
        if (line.classList.contains(`message-${name}`)) return;
        line.classList.remove("message-success", "message-warning");
        line.classList.add(`message-${name}`);
        if (name === "success") removeLater(line);
      };
      if (generation < current) {
        say(`Generation ${current} has replaced it since.`);
        delete line.dataset.follows;
        return;
      }
      if (!convergence.hasAttribute("data-unsettled")) {
        const ok = convergence.querySelector(".ok-text");
        say(ok ? ok.textContent.trim() : "Workers have converged.");
        level("success");
        delete line.dataset.follows;
        return;
      }
      const said = convergence.querySelector(".warn-text");
      const saying = said ? said.textContent.trim() : "";
      if (!saying || saying.startsWith("Converging")) return;  // still on its way: the sentence is true
      say(saying);
      level("warning");
    });
  }
  document.addEventListener("modelops:swapped", settleMessages);
  settleMessages();

  // ---- POST with the session's CSRF token; JSON answers from the page twins.
  async function post(url, body) {
    let response;
    try {
      response = await fetch(url, {
        method: "POST", body, credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrfToken },
      });
    } catch (error) {
      return { ok: false, status: 0, data: { level: "error", message: "The console could not be reached: reload to see what happened." } };
    }
    let data;
    try {
      data = await response.json();
    } catch (error) {
      data = { level: "error", message: response.status === 403 ? "Your role may not do this." : `The console answered ${response.status}.` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  // ---- dialogs: a link to a confirmation page opens the same content in place.
  const DOUBLE_CLICK_MS = 600;
  let dialogSubmittedAt = 0;
  document.addEventListener("click", (event) => {
    const opener = event.target.closest("[data-dialog]");
    if (opener) {
      // The second click of a double-click on a dialog's submit button lands on the button that
      // opened it, under the dialog just closed: the dialog opened again over a panel not yet
      // refreshed ("Roll back to v1" after the rollback), and its click was refused as stale.
      if (Date.now() - dialogSubmittedAt < DOUBLE_CLICK_MS) {
        event.preventDefault();
        return;
      }
      const dialog = document.getElementById(opener.dataset.dialog);
      if (dialog && dialog.showModal) {
        event.preventDefault();
        dialog.showModal();
      }
      return;
    }
    const dismiss = event.target.closest("[data-dismiss]");
    if (dismiss) {
      dismiss.closest(".message").remove();
      return;
    }
    const closer = event.target.closest("[data-close]");
    if (closer && closer.closest("dialog")) {
      event.preventDefault();
      closer.closest("dialog").close();
    }
  });

  // ---- enhanced forms: same POST, answered in place, so live charts keep their history.
  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!form.matches("form[data-enhance]")) return;
    event.preventDefault();
    const body = new FormData(form, event.submitter);  // before disabling: a disabled submitter sends nothing
    const buttons = form.querySelectorAll("button");
    buttons.forEach((button) => { button.disabled = true; });
    // The dialog holding the form, or holding the button that submitted it (a confirmation inside the form).
    const dialog = form.closest("dialog") || (event.submitter && event.submitter.closest("dialog"));
    if (dialog) {
      dialog.close();
      dialogSubmittedAt = Date.now();
    }
    // Announced on the document: a live refresh may replace the form while it is posted.
    document.dispatchEvent(new CustomEvent("modelops:submitting", { detail: { form } }));
    const answer = await post(form.action, body);
    if (answer.ok) {  // sent: the refresh that follows shows the server's form again (a copy swapped in meanwhile too)
      delete form.dataset.edited;
      delete form.dataset.touched;
      if (form.id) document.querySelectorAll(`form#${CSS.escape(form.id)}`).forEach((copy) => delete copy.dataset.edited);
      // This copy still holds the generation the change just replaced: a second click here would
      // be refused as stale, in red, over the change's own success. Its buttons wait for the
      // refreshed form (with the new generation), or come back after a while if none comes.
      setTimeout(() => buttons.forEach((button) => { button.disabled = false; }), ENABLE_AFTER_CHANGE_MS);
    } else {
      buttons.forEach((button) => { button.disabled = false; });
    }
    flash(answer.data.level || (answer.ok ? "success" : "error"), answer.data.message, form.dataset.subject);
    document.dispatchEvent(new CustomEvent("modelops:changed", { detail: { form, answer } }));
  });

  // ---- a force box (inputs that differ, a version that cannot load) speaks only of the
  // version chosen, and hides with its tick cleared when that version needs no force: it
  // warned of v3 in red while v2 was chosen.
  function showForceFor(selectId, boxId, tickId) {
    const select = document.getElementById(selectId);
    const box = document.getElementById(boxId);
    if (!select || !box) return;
    let any = false;
    box.querySelectorAll("[data-force-for]").forEach((line) => {
      line.hidden = line.dataset.forceFor !== select.value;
      any = any || !line.hidden;
    });
    box.hidden = !any;
    const tick = document.getElementById(tickId);
    if (!any && tick) tick.checked = false;
  }

  // ---- "12 s ago", kept current without a reload.
  function ago(date) {
    const seconds = Math.max(0, (Date.now() - date.getTime()) / 1000);
    if (seconds < 60) return `${Math.floor(seconds)} s ago`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return `${Math.floor(seconds / 86400)} d ago`;
  }

  // "in 42 s" until a moment, "due now" once it has passed.
  function until(date) {
    const seconds = (date.getTime() - Date.now()) / 1000;
    if (seconds <= 0) return "due now";
    if (seconds < 60) return `in ${Math.ceil(seconds)} s`;
    if (seconds < 3600) return `in ${Math.ceil(seconds / 60)} min`;
    return `in ${Math.ceil(seconds / 3600)} h`;
  }

  function tickAges(root = document) {
    root.querySelectorAll("time[data-ago]").forEach((element) => {
      element.textContent = ago(new Date(element.getAttribute("datetime")));
    });
    root.querySelectorAll("time[data-until]").forEach((element) => {
      element.textContent = until(new Date(element.getAttribute("datetime")));
    });
  }
  setInterval(tickAges, 1000);

  // ---- number formats shared by the live tables (the templates' filters, in JS).
  const format = {
    rate: (value) => (value == null ? "—" : value < 10 ? value.toFixed(1) : value.toFixed(0)),
    ms: (value) => (value == null ? "—" : value < 100 ? `${value.toFixed(1)} ms` : `${value.toFixed(0)} ms`),
    percent: (fraction) => {
      if (fraction == null) return "—";
      const value = fraction * 100;
      return Number.isInteger(value) ? `${value}%` : `${value.toFixed(2)}%`;
    },
    count: (value) => (value == null ? "—" : String(Math.round(value))),
  };

  // ---- live figures: the latest report of each worker, summed per (model, version);
  // the server's live_figures() does the same for the first render. Quantiles of
  // different workers cannot be merged exactly, so the worst worker's is shown.
  function reportBook(goneAfterS) {
    const latest = new Map();

    function add(message) {
      const previous = latest.get(message.worker);
      latest.set(message.worker, { ...message, receivedAt: Date.now() });
      return previous;
    }

    // A report the page did not receive (the server's, at render), heard ``agoS`` seconds
    // ago; one received since is newer and stays.
    function seed(report, agoS) {
      if (!latest.has(report.worker)) latest.set(report.worker, { ...report, receivedAt: Date.now() - agoS * 1000 });
    }

    function seenWithin(seconds) {
      const cutoff = Date.now() - seconds * 1000;
      return [...latest.values()].filter((report) => report.receivedAt >= cutoff);
    }

    function fresh() { return seenWithin(goneAfterS); }

    function figures(modelName) {
      const totals = new Map();
      for (const report of fresh()) {
        for (const entry of report.versions || []) {
          if (modelName && entry.model !== modelName) continue;
          const key = modelName ? entry.version : entry.model;
          totals.set(key, addFigures(totals.get(key), entry));
        }
      }
      totals.forEach((total) => {
        total.error_rate = total.requests ? total.errors / total.requests : null;
        total.client_error_rate = total.requests ? total.client_errors / total.requests : null;
      });
      return totals;
    }

    return { add, seed, fresh, seenWithin, figures, latest };
  }

  // errors are 5xx answers, client_errors 4xx: both counted, shown side by side.
  function addFigures(total, entry) {
    total = total || { requests_per_s: 0, requests: 0, errors: 0, client_errors: 0, queue_depth: 0, p50_ms: null, p99_ms: null };
    for (const field of ["requests_per_s", "requests", "errors", "client_errors", "queue_depth"]) total[field] += entry[field] || 0;
    for (const field of ["p50_ms", "p99_ms"]) {
      if (entry[field] != null) total[field] = total[field] == null ? entry[field] : Math.max(total[field], entry[field]);
    }
    return total;
  }

  // Write figures into cells marked data-field="name" under a row.
  function fillRow(row, figures) {
    const text = {
      requests_per_s: figures ? format.rate(figures.requests_per_s) : "—",
      p50_ms: format.ms(figures && figures.p50_ms),
      p99_ms: format.ms(figures && figures.p99_ms),
      error_rate: format.percent(figures && figures.error_rate),
      client_error_rate: format.percent(figures && figures.client_error_rate),
      queue_depth: figures ? format.count(figures.queue_depth) : "—",
    };
    row.querySelectorAll("[data-field]").forEach((cell) => {
      if (cell.dataset.field in text) cell.textContent = text[cell.dataset.field];
    });
  }

  return { refresh, refreshAll, refreshSoon, live, flash, post, format, ago, csrfToken, reportBook, fillRow, showForceFor };
})();
