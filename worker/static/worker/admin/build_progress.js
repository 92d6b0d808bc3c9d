// The build page's progress bar: polls the build's JSON until it succeeds or fails.
(function () {
  "use strict";
  const box = document.getElementById("build-progress");
  if (!box || box.dataset.done) return;
  const bar = box.querySelector(".gk-progress-bar");
  const meter = box.querySelector(".gk-progress");
  const text = (id, value) => { document.getElementById(id).textContent = value; };
  async function poll() {
    let build;
    try {
      const response = await fetch(box.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.status >= 400 && response.status < 500) {
        text("build-stage", `progress unavailable (HTTP ${response.status}): reload the page`);
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      build = await response.json();
    } catch (err) {
      text("build-stage", `progress unavailable (${err.message}); retrying`);
      setTimeout(poll, 2000);
      return;
    }
    bar.style.width = `${build.progress}%`;
    bar.className = `gk-progress-bar gk-status-${build.status}`;
    meter.setAttribute("aria-valuenow", build.progress);
    text("build-percent", `${build.progress}%`);
    text("build-status", build.status);
    text("build-stage", build.stage);
    if (build.version) {
      document.getElementById("build-version").innerHTML = "";
      document.getElementById("build-version").append(" · version ", Object.assign(document.createElement("code"), { textContent: build.version }));
    }
    if (build.error) {
      const error = document.getElementById("build-error");
      error.textContent = build.error;
      error.hidden = false;
    }
    if (build.done) {
      document.getElementById("build-done-links").hidden = build.status !== "succeeded";
      return;
    }
    setTimeout(poll, 500);
  }
  poll();
})();
