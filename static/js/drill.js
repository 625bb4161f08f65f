// A drill's page: while the drill runs, or its roll forward is not made yet, the server
// re-renders the page's fragment every few seconds; once it has settled, nothing changes.
"use strict";

(function () {
  const M = window.ModelOps;
  const box = document.getElementById("drill-detail");
  if (!box) return;
  const REFRESH_MS = 2000;
  const settled = () => Boolean(box.querySelector('[data-settled="true"]'));
  if (settled()) return;
  const timer = setInterval(() => {
    if (settled()) clearInterval(timer);
    else M.refreshAll("drill-detail");
  }, REFRESH_MS);
})();
