// The dashboard's charts, drawn by Chart.js from the data the page embeds.
(function () {
  "use strict";
  const source = document.getElementById("dashboard-data");
  if (!source || typeof Chart === "undefined") return;
  const data = JSON.parse(source.textContent);
  const style = getComputedStyle(document.documentElement);
  Chart.defaults.color = style.getPropertyValue("--body-fg").trim() || "#333";
  Chart.defaults.borderColor = style.getPropertyValue("--hairline-color").trim() || "#ddd";
  const palette = data.palette || {};  // a colour per reason (limits/reasons.py)
  const colours = ["#5b8bd0", "#3a9b5c", "#e0a030", "#b23b3b", "#8a63c9", "#2aa5a5", "#d0662b", "#777777"];

  if (data.today && document.getElementById("chart-today")) {
    new Chart(document.getElementById("chart-today"), {
      type: "bar",
      data: {
        labels: data.today.segments,
        datasets: Object.entries(data.today.datasets).map(([reason, values]) => ({
          label: reason, data: values, backgroundColor: palette[reason] || "#999",
        })),
      },
      options: { maintainAspectRatio: false, animation: false, scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }
  if (data.history && document.getElementById("chart-history")) {
    new Chart(document.getElementById("chart-history"), {
      type: "bar",
      data: {
        labels: data.history.days.map((d) => d.slice(5)),
        datasets: [
          { label: "admitted", data: data.history.admitted, backgroundColor: palette.allowed },
          { label: "refused", data: data.history.refused, backgroundColor: palette.blocked },
        ],
      },
      options: { maintainAspectRatio: false, animation: false, scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }
  if (data.sizes && data.sizes.values.length && document.getElementById("chart-sizes")) {
    new Chart(document.getElementById("chart-sizes"), {
      type: "doughnut",
      data: { labels: data.sizes.labels, datasets: [{ data: data.sizes.values, backgroundColor: colours }] },
      options: { maintainAspectRatio: false, animation: false, plugins: { legend: { position: "right" } } },
    });
  }
  if (data.waiting && document.getElementById("chart-waiting")) {
    new Chart(document.getElementById("chart-waiting"), {
      type: "bar",
      data: {
        labels: data.waiting.labels,
        datasets: [{ label: "sends released (UTC hour)", data: data.waiting.values, backgroundColor: palette.daily_cap }],
      },
      options: { maintainAspectRatio: false, animation: false, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
    });
  }
  // Refused sends per day, stacked by reason and by campaign (the top ones, the rest together).
  const refused = data.refused;
  const stackedDays = (canvas, datasets) => new Chart(canvas, {
    type: "bar",
    data: { labels: refused.days.map((d) => d.slice(5)), datasets: datasets },
    options: { maintainAspectRatio: false, animation: false, scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
  });
  if (refused && document.getElementById("chart-refused-reasons")) {
    stackedDays(document.getElementById("chart-refused-reasons"), refused.reasons.map((s) => ({
      label: s.label, data: s.values, backgroundColor: palette[s.label] || "#999",
    })));
  }
  if (refused && document.getElementById("chart-refused-campaigns")) {
    stackedDays(document.getElementById("chart-refused-campaigns"), refused.campaigns.map((s, i) => ({
      label: s.label, data: s.values, backgroundColor: colours[i % colours.length],
    })));
  }
  // Topics people switched off and back on per day, stacked by topic (a topic's colour the same
  // in both charts).
  const switches = data.switches;
  const byTopic = (canvas, series) => new Chart(canvas, {
    type: "bar",
    data: {
      labels: switches.days.map((d) => d.slice(5)),
      datasets: series.map((s, i) => ({ label: s.label, data: s.values, backgroundColor: colours[i % colours.length] })),
    },
    options: { maintainAspectRatio: false, animation: false, scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
  });
  if (switches && document.getElementById("chart-switched-off")) {
    byTopic(document.getElementById("chart-switched-off"), switches.off);
  }
  if (switches && document.getElementById("chart-switched-on")) {
    byTopic(document.getElementById("chart-switched-on"), switches.on);
  }
  document.documentElement.dataset.chartsDrawn = "1";
})();
