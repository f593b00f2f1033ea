// samewise dashboards: reloads the page every data-refresh seconds while it is visible and no
// evidence panel is open. It talks to no other host.
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) {
    return;
  }
  setInterval(function () {
    if (document.visibilityState === "visible" && !document.querySelector("details[open]")) {
      window.location.reload();
    }
  }, seconds * 1000);
})();
