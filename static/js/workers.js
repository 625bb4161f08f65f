// Workers page: each report refreshes its worker's age and requests/s; a worker that
// stops reporting fades out as gone, one that said it stopped shows so at once; a new
// worker, a generation change or a change of lifecycle re-renders the table.
"use strict";

(function () {
  const M = window.ModelOps;
  const goneAfterS = JSON.parse(document.getElementById("gone-after-s").textContent);
  const book = M.reportBook(goneAfterS);

  M.live({
    report(message) {
      const previous = book.add(message);
      const row = findRow(message.worker);
      // A row drawn before the worker's first confirmation said "behind" for good: it is asked
      // for again until the server's row says otherwise.
      if (!row || row.classList.contains("gone") || row.classList.contains("behind") || row.dataset.lifecycle !== (message.state || "serving")
          || (previous && previous.generation !== message.generation)) {
        M.refreshSoon("workers-table");
        return;
      }
      if (Number(row.dataset.generation) !== message.generation) M.refreshSoon("workers-table");
      row.querySelector("[data-field=age] time").setAttribute("datetime", message.at);
      const total = (field) => (message.versions || []).reduce((sum, entry) => sum + (entry[field] || 0), 0);
      const requests = total("requests");
      row.querySelector("[data-field=requests_per_s]").textContent = M.format.rate(total("requests_per_s"));
      row.querySelector("[data-field=error_rate]").textContent = M.format.percent(requests ? total("errors") / requests : null);
      row.querySelector("[data-field=client_error_rate]").textContent = M.format.percent(requests ? total("client_errors") / requests : null);
    },
    state() { M.refreshSoon("workers-table", 1500); },  // let workers ack first
  }, { fallback: () => M.refreshAll("workers-table") });

  function findRow(workerId) {
    return [...document.querySelectorAll("#workers-table tr[data-worker]")].find((row) => row.dataset.worker === workerId);
  }

  // Fade a worker out as soon as its last report is too old.
  setInterval(() => {
    document.querySelectorAll("#workers-table tr[data-worker]").forEach((row) => {
      const seen = new Date(row.querySelector("[data-field=age] time").getAttribute("datetime"));
      if (Date.now() - seen.getTime() > goneAfterS * 1000 && !row.classList.contains("gone") && !row.classList.contains("stopped")) {
        row.classList.add("gone");
        row.querySelectorAll("[data-field=requests_per_s], [data-field=error_rate], [data-field=client_error_rate]").forEach((cell) => { cell.textContent = "—"; });
        // The server's row says "gone", without the green "converged" of its last report; asked a
        // moment later, so a browser clock a little ahead does not ask before the server agrees.
        M.refreshSoon("workers-table", 1500);
      }
    });
  }, 1000);
})();
