// Live progress on the request page: poll the JSON feed while work is pending, and
// reload once when the request reaches a state with new things to show.
(function () {
  "use strict";
  var panel = document.getElementById("job-panel");
  if (!panel) { return; }
  var url = panel.dataset.progressUrl;
  var initial = panel.dataset.status;
  var pending = ["approved", "scheduled", "in_progress"];
  if (pending.indexOf(initial) < 0) { return; }
  var live = document.getElementById("job-live");
  if (live) { live.hidden = false; }
  var lastStage = null;

  function duration(seconds) {
    var s = Math.round(seconds), m = Math.floor(s / 60), h = Math.floor(m / 60);
    if (h) { return h + " h " + (m % 60) + " min"; }
    if (m) { return m + " min " + (s % 60) + " s"; }
    return s + " s";
  }
  function setText(id, text) {
    var el = document.getElementById(id);
    if (el) { el.textContent = text; }
  }

  function tick() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return schedule(5000); }
        var job = data.job;
        if (job) {
          if (lastStage === null && !document.getElementById("job-bar")) { return window.location.reload(); }
          var bar = document.getElementById("job-bar");
          if (bar) { bar.style.width = job.percent + "%"; }
          setText("job-percent", Math.round(job.percent) + "%");
          setText("job-eta", job.eta_seconds ? "about " + duration(job.eta_seconds) + " left" : "");
          setText("job-stage", job.stage.replace(/_/g, " "));
          setText("job-steps", job.total ? "· step " + job.step + " of " + job.total : "");
          setText("job-outcome", job.outcome_text);
          if (job.outcome !== "running" && lastStage !== null && lastStage !== job.stage) { return window.location.reload(); }
          var items = document.querySelectorAll("#job-stages li");
          for (var i = 0; i < items.length; i++) {
            items[i].className = job.stage === "done" ? "done" : job.stage_index === null ? "" :
              (i + 1 < job.stage_index ? "done" : (i + 1 === job.stage_index ? "current" : ""));
          }
          lastStage = job.stage;
        }
        if (data.status !== initial && pending.indexOf(data.status) < 0) { return window.location.reload(); }
        if (data.status !== initial) { setText("status-badge", data.status.replace(/_/g, " ")); }
        schedule(2000);
      })
      .catch(function () { schedule(5000); });
  }
  function schedule(ms) { window.setTimeout(tick, ms); }
  schedule(1500);
})();
