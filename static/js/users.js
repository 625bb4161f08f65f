// Users pages: the copy button beside a password or token shown once.
"use strict";

(function () {
  for (const button of document.querySelectorAll("[data-copy]")) {
    const field = document.getElementById(button.dataset.copy);
    button.hidden = false; // without a script, the field is still selectable by hand
    button.addEventListener("click", async () => {
      field.select();
      try {
        await navigator.clipboard.writeText(field.value);
        button.textContent = "Copied";
      } catch (error) {
        button.textContent = "Press Ctrl+C"; // clipboard refused (no HTTPS): the text is selected
      }
    });
  }
})();
