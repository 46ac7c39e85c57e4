// Countdowns: every <time data-countdown> shows the time left until its datetime.
(function () {
  "use strict";
  function text(ms) {
    if (ms <= 0) { return "now"; }
    var s = Math.round(ms / 1000), m = Math.floor(s / 60), h = Math.floor(m / 60), d = Math.floor(h / 24);
    if (d) { return "in " + d + " d " + (h % 24) + " h"; }
    if (h) { return "in " + h + " h " + (m % 60) + " min"; }
    if (m) { return "in " + m + " min " + (s % 60) + " s"; }
    return "in " + s + " s";
  }
  function tick() {
    var els = document.querySelectorAll("[data-countdown]");
    for (var i = 0; i < els.length; i++) {
      var at = Date.parse(els[i].getAttribute("data-countdown"));
      if (!isNaN(at)) { els[i].textContent = text(at - Date.now()); }
    }
  }
  tick();
  window.setInterval(tick, 1000);
})();
