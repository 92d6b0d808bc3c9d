// A page's progress bar (a snapshot build's, a send job's): polls its JSON until it is done.
// The box names the prefix of its parts' ids in data-progress ("build": #build-percent, ...).
(function () {
  "use strict";
  const box = document.querySelector("[data-progress]");
  if (!box || box.dataset.done) return;
  const part = (name) => document.getElementById(`${box.dataset.progress}-${name}`);
  const bar = box.querySelector(".gk-progress-bar");
  const meter = box.querySelector(".gk-progress");
  const text = (name, value) => { part(name).textContent = value; };
  async function poll() {
    let state;
    try {
      const response = await fetch(box.dataset.url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.status >= 400 && response.status < 500) {
        text("stage", `progress unavailable (HTTP ${response.status}): reload the page`);
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      state = await response.json();
    } catch (err) {
      text("stage", `progress unavailable (${err.message}); retrying`);
      setTimeout(poll, 2000);
      return;
    }
    bar.style.width = `${state.progress}%`;
    bar.className = `gk-progress-bar gk-status-${state.status}`;
    meter.setAttribute("aria-valuenow", state.progress);
    text("percent", `${state.progress}%`);
    text("status", state.status);
    text("stage", state.stage);
    const version = part("version");  // a build's
    if (state.version && version) {
      version.innerHTML = "";
      version.append(" · version ", Object.assign(document.createElement("code"), { textContent: state.version }));
    }
    if (state.error) {
      const error = part("error");
      error.textContent = state.error;
      error.hidden = false;
    }
    if (state.done) {
      const links = part("done-links");  // a build's, once it succeeded
      if (links) links.hidden = state.status !== "succeeded";
      const controls = part("controls");  // a send job's buttons
      if (controls) controls.hidden = true;
      return;
    }
    setTimeout(poll, 500);
  }
  poll();
})();
