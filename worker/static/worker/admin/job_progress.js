// A send job's progress bar: polls the job's JSON until it is done, cancelled or failed.
(function () {
  "use strict";
  const box = document.getElementById("job-progress");
  if (!box || box.dataset.done) return;
  const bar = box.querySelector(".gk-progress-bar");
  const meter = box.querySelector(".gk-progress");
  const text = (id, value) => { document.getElementById(id).textContent = value; };
  async function poll() {
    let job;
    try {
      const response = await fetch(box.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.status >= 400 && response.status < 500) {
        text("job-stage", `progress unavailable (HTTP ${response.status}): reload the page`);
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      job = await response.json();
    } catch (err) {
      text("job-stage", `progress unavailable (${err.message}); retrying`);
      setTimeout(poll, 2000);
      return;
    }
    bar.style.width = `${job.progress}%`;
    bar.className = `gk-progress-bar gk-status-${job.status}`;
    meter.setAttribute("aria-valuenow", job.progress);
    text("job-percent", `${job.progress}%`);
    text("job-status", job.status);
    text("job-stage", job.stage);
    if (job.error) {
      const error = document.getElementById("job-error");
      error.textContent = job.error;
      error.hidden = false;
    }
    if (job.done) {
      const controls = document.getElementById("job-controls");
      if (controls) controls.hidden = true;
      return;
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
