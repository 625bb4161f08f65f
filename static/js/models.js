// Models page: requests/s, p99 and errors per model from the live feed every second;
// the rows themselves (split, health, convergence) are re-rendered by the server when
// a release changes or a worker moves to another generation.
"use strict";

(function () {
  const M = window.ModelOps;
  const table = document.getElementById("models-table");
  const book = M.reportBook(Number(table.dataset.goneAfterS));
  let liveSince = 0;

  M.live({
    report(message) {
      const previous = book.add(message);
      if (!previous || previous.generation !== message.generation) M.refreshSoon("models-table");
    },
    state() { M.refreshSoon("models-table"); },
    open() { liveSince = Date.now(); M.refreshSoon("models-table"); },
    close() { liveSince = 0; },
  }, { fallback: () => M.refreshAll("models-table") });

  setInterval(() => {
    if (!liveSince || Date.now() - liveSince < 1500) return;
    const byModel = book.figures(null);
    table.querySelectorAll("tr[data-model]").forEach((row) => M.fillRow(row, byModel.get(row.dataset.model)));
  }, 1000);

  // Health words (error rate, convergence) come from the server; keep them fresh.
  setInterval(() => { if (liveSince) M.refreshAll("models-table"); }, 10000);
})();
