// The FAST dashboard: status every 2 s, each iteration's metrics as server-sent events, and the
// run's controls. Steering calls carry the token typed in the field (or given once as #token=...
// in the URL, which is then removed from the address bar and kept in this tab's sessionStorage).
"use strict";

const $ = (id) => document.getElementById(id);
const series = { throughput: [], eta: [], efficiency: [], return: [], length: [] };
let lastIteration = 0;
let source = null;

function takeTokenFromUrl() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem("fast-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  $("token").value = sessionStorage.getItem("fast-token") || "";
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "-";
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en");
  return Number(value).toPrecision(digits);
}

function addPoint(metrics) {
  if (metrics.iteration <= lastIteration) return;
  lastIteration = metrics.iteration;
  const x = metrics.iteration;
  series.throughput.push([x, metrics.effective_throughput]);
  series.eta.push([x, metrics.validity]);
  series.efficiency.push([x, metrics.time_efficiency]);
  series.return.push([x, metrics.episode_return_mean]);
  series.length.push([x, metrics.episode_length_mean]);
  for (const points of Object.values(series)) if (points.length > 2000) points.shift();
  drawAll();
}

function draw(canvas, points) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * ratio; canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const shown = points.filter((p) => p[1] !== null && p[1] !== undefined);
  ctx.fillStyle = "#5a6573"; ctx.font = "11px system-ui";
  if (shown.length === 0) { ctx.fillText("waiting for the first iteration", 8, height / 2); return; }
  const xs = shown.map((p) => p[0]), ys = shown.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const left = 46, bottom = height - 16;
  const px = (x) => left + (x - x0) / (x1 - x0) * (width - left - 8);
  const py = (y) => 6 + (1 - (y - y0) / (y1 - y0)) * (bottom - 6);
  ctx.strokeStyle = "#dde1e6"; ctx.beginPath(); ctx.moveTo(left, 6); ctx.lineTo(left, bottom); ctx.lineTo(width - 8, bottom); ctx.stroke();
  ctx.fillText(fmt(y1), 2, 14); ctx.fillText(fmt(y0), 2, bottom);
  ctx.fillText(String(x0), left, height - 3); ctx.fillText(String(x1), width - 40, height - 3);
  ctx.strokeStyle = "#1565c0"; ctx.lineWidth = 1.5; ctx.beginPath();
  shown.forEach((p, i) => (i ? ctx.lineTo(px(p[0]), py(p[1])) : ctx.moveTo(px(p[0]), py(p[1]))));
  ctx.stroke();
}

function drawAll() {
  for (const [name, points] of Object.entries(series)) draw($("chart-" + name), points);
}

function showStatus(status) {
  $("state").textContent = status.state; $("state").dataset.state = status.state;
  $("mode").textContent = `mode ${status.mode}`;
  $("iteration").textContent = status.iteration + (status.iterations_total ? ` / ${status.iterations_total}` : "");
  $("version").textContent = status.policy_version;
  $("slots").textContent = status.num_slots;
  const last = status.last_metrics;
  if (last) {
    $("throughput").textContent = fmt(last.effective_throughput);
    $("eta").textContent = fmt(last.validity);
    $("efficiency").textContent = fmt(last.time_efficiency);
    $("return").textContent = fmt(last.episode_return_mean);
    $("length").textContent = fmt(last.episode_length_mean);
  }
  const s = status.settings, p = status.pending_settings;
  if (s) {
    const alpha = (x) => fmt(x.alpha) + (x.alpha_auto ? " (auto)" : "");
    const mode = (x) => (x.mode || "?") + (x.mode_auto ? " (auto)" : "");
    $("settings").textContent = `in force: mode ${mode(s)}, alpha ${alpha(s)}, t_max ${s.t_max}, ` +
      `samples ${s.samples_per_iteration}` +
      (p ? ` (next: mode ${p.mode_auto ? "auto" : p.mode}, alpha ${p.alpha_auto ? "auto" : fmt(p.alpha)}, ` +
        `t_max ${p.t_max})` : "");
    if (document.activeElement !== $("alpha") && !$("alpha").value) $("alpha").value = s.alpha;
    if (document.activeElement !== $("tmax") && !$("tmax").value) $("tmax").value = s.t_max;
  }
  const rows = status.simulators.map((sim) => `<tr><td>${escapeHtml(sim.address)}</td><td>${escapeHtml(sim.env_id)}</td>` +
    `<td>${sim.num_slots}</td><td>${sim.draining ? "draining" : sim.up ? "yes" : "no"}</td><td>${sim.faults}</td>` +
    `<td>${sim.readmissions}</td><td>${fmt((sim.step_latency_s || 0) * 1000)}</td>` +
    `<td>${fmt((sim.reset_latency_s || 0) * 1000)}</td><td>${escapeHtml(sim.last_error)}</td></tr>`);
  $("simulators").tBodies[0].innerHTML = rows.join("");
  $("problem").textContent = status.error || "";
  showRanks(status);
}

// A run of several learner ranks with a broker each: a row per broker and per rank, and the totals.
function showRanks(status) {
  const brokers = status.brokers || [], ranks = status.ranks || [], totals = status.totals;
  $("ranks-section").hidden = brokers.length < 2 && ranks.length < 2;
  if ($("ranks-section").hidden) return;
  const cell = (value) => `<td>${escapeHtml(value === 0 ? "0" : value)}</td>`;
  const brokerRows = brokers.map((b) => "<tr>" + [b.name, b.address, b.up ? "yes" : "no",
    b.run ? b.run.state : "", b.run ? b.run.iteration : "", b.run ? b.run.policy_version : "",
    b.run ? b.run.num_slots : "", b.run && b.run.last_metrics ? fmt(b.run.last_metrics.effective_throughput) : "",
    b.run ? b.run.valid_steps_total : "", b.up ? b.run.error : b.unavailable].map(cell).join("") + "</tr>");
  if (totals) {
    const differ = [totals.states_differ && "states differ", totals.policy_versions_differ && "versions differ"];
    brokerRows.push("<tr><th>total</th>" + [`${totals.brokers_answered} of ${totals.brokers} answered`, "",
      totals.state || "", "", totals.policy_version ?? "", totals.num_slots, fmt(totals.effective_throughput),
      totals.valid_steps_total, differ.filter(Boolean).join(", ")].map(cell).join("") + "</tr>");
  }
  $("brokers").tBodies[0].innerHTML = brokerRows.join("");
  $("ranks").tBodies[0].innerHTML = ranks.map((r) => "<tr>" + [r.name, r.address, r.up ? "yes" : "no",
    r.status ? r.status.policy_version : "", r.status ? r.status.device : "",
    r.status ? r.status.updates_this_process : "", r.up ? "" : r.unavailable].map(cell).join("") + "</tr>").join("");
}

function escapeHtml(text) {
  return String(text || "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function refresh() {
  try {
    const answer = await fetch("/v1/status");
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.detail || answer.statusText);
    showStatus(body);
    if (!source && body.state !== "done" && body.state !== "failed") listen();
  } catch (error) {
    $("state").textContent = "unreachable"; $("state").dataset.state = "unreachable";
    $("problem").textContent = String(error.message || error);
  }
}

async function loadHistory() {
  try {
    const answer = await fetch("/v1/metrics/history?since=0&limit=1000");
    if (answer.ok) (await answer.json()).forEach(addPoint);
  } catch (error) { /* the status line says why */ }
}

function listen() {
  source = new EventSource(`/v1/events?since=${lastIteration}`);
  source.addEventListener("iteration", (event) => addPoint(JSON.parse(event.data)));
  source.addEventListener("end", () => { source.close(); source = null; });
  source.onerror = () => { if (source && source.readyState === EventSource.CLOSED) source = null; };
}

async function send(method, path, body) {
  const token = $("token").value.trim();
  sessionStorage.setItem("fast-token", token);
  const init = { method, headers: { Authorization: `Bearer ${token}` } };
  if (body) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  try {
    const answer = await fetch(path, init);
    const reply = await answer.json();
    $("answer").textContent = answer.ok ? (reply.note || "accepted") : `refused (${answer.status}): ${reply.detail}`;
  } catch (error) {
    $("answer").textContent = `failed: ${error.message || error}`;
  }
  refresh();
}

$("pause").onclick = () => send("POST", "/v1/run/pause");
$("resume").onclick = () => send("POST", "/v1/run/resume");
$("stop").onclick = () => { if (confirm("Stop the run after the current iteration?")) send("POST", "/v1/run/stop"); };
$("apply").onclick = () => {
  const body = {};
  if ($("mode").value) body.mode = $("mode").value;
  if ($("alpha").value) body.alpha = Number($("alpha").value);
  if ($("tmax").value) body.t_max = Number($("tmax").value);
  send("PATCH", "/v1/config", body);
};
window.addEventListener("resize", drawAll);

takeTokenFromUrl();
drawAll();
loadHistory().then(refresh);
setInterval(refresh, 2000);
