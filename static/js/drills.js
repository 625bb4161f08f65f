// Drills page: a drill changes a release, so a release change re-renders the history.
"use strict";

(function () {
  const M = window.ModelOps;
  M.live({ state() { M.refreshSoon("drills-table", 1000); } }, { fallback: () => M.refreshAll("drills-table"), fallbackEveryMs: 10000 });
  // A drill finishes seconds after its rollback: look again a little later.
  setInterval(() => M.refreshAll("drills-table"), 15000);
})();
