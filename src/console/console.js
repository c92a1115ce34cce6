// outbox-relay console: asks before a one-click requeue in the list, and refreshes the
// overview's live view every 2 s. Pages work without it (bulk actions have confirmation
// pages of their own).
document.addEventListener("submit", function (e) {
  var ask = e.target.getAttribute("data-confirm");
  if (ask && !window.confirm(ask)) e.preventDefault();
});
(function () {
  var live = document.getElementById("live");
  if (!live) return;
  var body = live.querySelector("tbody");
  var tick = document.getElementById("live-tick");
  function refresh() {
    fetch("/live.json", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (j) {
        // The server escaped every value; the rows are its own markup.
        body.innerHTML = j.rows;
        tick.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { tick.textContent = "not updating (logged out or relay stopped)"; });
  }
  setInterval(refresh, 2000);
})();
