// rolloutbus dashboard: fetches the JSON endpoints, draws with uPlot (vendored), refreshes itself.
// Text from agents is untrusted: everything shown goes through esc() or textContent.
"use strict";

const state = { token: null, refreshS: 5, charts: {}, timer: null, picked: null, sqlResult: null, assetsMissing: null };
window.rbCharts = state.charts; // the browser tests read points off the charts
const $ = (id) => document.getElementById(id);
const COLORS = ["#3b7ddd", "#d9480f", "#2e9d5b", "#9c36b5", "#d99a00", "#0b7285", "#c2255c", "#5c940d", "#495057"];

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function fmt(v) {
  if (v === null || v === undefined) return "∅";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : String(parseFloat(v.toPrecision(4)));
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "∅"; }

// ------------------------------------------------------------------------------------------ fetching

function readToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("rolloutbus-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  state.token = sessionStorage.getItem("rolloutbus-token");
}

class Unauthorized extends Error {}

async function api(path, init = {}) {
  const headers = Object.assign({}, init.headers || {});
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const resp = await fetch(path, Object.assign({}, init, { headers }));
  let body = null;
  try { body = await resp.json(); } catch (e) { body = { error: resp.status + " " + resp.statusText }; }
  if (resp.status === 401) {
    showAuth("401 Unauthorized: " + (body.error || "a bearer token is needed"));
    throw new Unauthorized(body.error);
  }
  hideAuth();
  if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
  return body;
}

function showAuth(msg) { $("auth").hidden = false; $("auth-message").textContent = msg; }
function hideAuth() { $("auth").hidden = true; }

// ------------------------------------------------------------------------------------------ charts

// data: {x: [...], "<series>": [...]}; picks: [{key, label, scale}] or null for every key but x.
function chart(id, data, { time = true, picks = null, xLabel = "" } = {}) {
  const el = $(id);
  if (typeof uPlot === "undefined") {
    el.innerHTML = '<p class="none">' + esc(state.assetsMissing || "the charting library (uPlot) did not load") + "</p>";
    el.dataset.points = "0";
    return;
  }
  const keys = picks || Object.keys(data).filter((k) => k !== "x").map((k) => ({ key: k, label: k }));
  const present = keys.filter((p) => Array.isArray(data[p.key]));
  const points = present.reduce((n, p) => n + data[p.key].filter((v) => v !== null && v !== undefined).length, 0);
  el.dataset.points = String(points);
  if (!data.x || data.x.length === 0 || present.length === 0) {
    if (state.charts[id]) { state.charts[id].destroy(); delete state.charts[id]; }
    el.innerHTML = '<p class="none">no data yet</p>';
    return;
  }
  const series = [{ label: xLabel || (time ? "time" : "x") }].concat(present.map((p, i) => ({
    label: p.label || p.key, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
    scale: p.scale || "y", points: { show: data.x.length < 60 },
  })));
  const rows = [data.x].concat(present.map((p) => data[p.key]));
  const sig = JSON.stringify(series.map((s) => s.label + (s.scale || ""))) + (data.x.length === 1 ? "@" + data.x[0] : "");
  const old = state.charts[id];
  if (old && old._sig === sig) { old.setData(rows); return; }
  if (old) old.destroy();
  el.innerHTML = "";
  // One x value: give the axis a fixed room around it instead of letting it span years.
  const one = data.x.length === 1, pad = time ? 60 : 1;
  const scales = { x: one ? { time, auto: false, range: [data.x[0] - pad, data.x[0] + pad] } : { time } };
  const axes = [{}, { scale: "y" }];
  if (present.some((p) => p.scale === "y2")) { scales.y2 = {}; axes.push({ scale: "y2", side: 1, grid: { show: false } }); }
  const u = new uPlot({ width: Math.max(el.clientWidth, 300), height: 220, series, scales, axes, legend: { live: false } }, rows, el);
  u._sig = sig;
  state.charts[id] = u;
}

function table(el, columns, rows, { onPick = null, numeric = null } = {}) {
  if (!rows.length) { el.innerHTML = '<p class="muted">none</p>'; return; }
  const head = "<tr>" + columns.map((c) => "<th>" + esc(c.label || c.key || c) + "</th>").join("") + "</tr>";
  const body = rows.map((r, i) => "<tr class=\"" + (onPick ? "pick" : "") + "\" data-i=\"" + i + "\">" + columns.map((c, j) => {
    const v = Array.isArray(r) ? r[j] : r[c.key || c];
    const num = numeric ? numeric[j] : typeof v === "number";
    return "<td" + (num ? ' class="num"' : "") + ">" + esc(c.render ? c.render(v, r) : fmt(v)) + "</td>";
  }).join("") + "</tr>").join("");
  el.innerHTML = "<table><thead>" + head + "</thead><tbody>" + body + "</tbody></table>";
  if (onPick) el.querySelectorAll("tr.pick").forEach((tr) => tr.addEventListener("click", () => onPick(rows[+tr.dataset.i], tr)));
}

// ------------------------------------------------------------------------------------------ panels

function modes(data, what) {
  return Object.keys(data).filter((k) => k.endsWith(":" + what)).map((k) => ({ key: k, label: k.replace(":", " ") }));
}

async function learning() {
  const d = await api("/api/learning");
  chart("chart-by-version", d.by_version, { time: false, xLabel: "version", picks: modes(d.by_version, "reward").concat(modes(d.by_version, "success")) });
  chart("chart-over-time", d.over_time, { picks: modes(d.over_time, "reward").concat(modes(d.over_time, "success")) });
  const steps = { x: d.steps.map((s, i) => i + 1) };
  for (const k of ["loss", "kl", "clip_fraction", "tokens_per_s", "reward_mean"]) steps[k] = d.steps.map((s) => s[k]);
  chart("chart-loss", steps, { time: false, xLabel: "step", picks: [{ key: "loss" }, { key: "kl" }, { key: "clip_fraction", scale: "y2" }] });
  chart("chart-tps", steps, { time: false, xLabel: "step", picks: [{ key: "tokens_per_s", label: "tokens/s" }, { key: "reward_mean", label: "batch reward", scale: "y2" }] });
  table($("versions-now"), ["version", "mode", "rollouts"], d.versions_now);
  table($("latest-versions"), ["name", "version", { key: "created", label: "published", render: when }], d.latest_versions);
  document.querySelectorAll(".bucket").forEach((e) => { e.textContent = d.bucket_s + " s"; });
  return d.rollouts;
}

async function pipeline() {
  const d = await api("/api/pipeline");
  chart("chart-rollouts", d.rollouts, { picks: Object.keys(d.rollouts).filter((k) => k !== "x").map((k) => ({ key: k, label: k.split(":")[0] })) });
  chart("chart-spans", d.spans, { picks: [{ key: "per_bucket", label: "spans" }] });
  chart("chart-latency", d.latency, { picks: [{ key: "p50_s", label: "median" }, { key: "max_s", label: "max" }] });
  chart("chart-dlq", d.dlq, { picks: Object.keys(d.dlq).filter((k) => k !== "x").map((k) => ({ key: k, label: k.split(":")[0] })) });
  table($("dlq-table"), ["source_topic", "stage", "reason", "records", { key: "last_seen", label: "last seen", render: when }], d.dlq_by_reason);
  const lag = $("lag-table");
  if (d.lag.error) lag.innerHTML = '<p class="muted">' + esc(d.lag.error) + "</p>";
  else table(lag, ["group", "topic", "partition", "lag"], d.lag.rows);
  const prod = $("producers-table");
  if (d.producers.error) prod.innerHTML = '<p class="muted">' + esc(d.producers.error) + "</p>";
  else table(prod, ["target", "2xx", "4xx", "503", "5xx", { key: "spans_accepted", label: "spans in" },
                    { key: "spans_rejected", label: "rejected" }, { key: "spool_pending", label: "spool depth" },
                    { key: "kafka_up", label: "kafka up" }, "error"], d.producers.rows);
}

// ------------------------------------------------------------------------------------------ trajectories

async function rollouts() {
  const params = new URLSearchParams(new FormData($("filters")));
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  const d = await api("/api/rollouts?" + params);
  const cols = [{ key: "rollout_id", label: "rollout" }, { key: "task_id", label: "task" }, "mode", "version", "status",
    { key: "final_reward", label: "reward" }, "llm_turns", "agents", { key: "finished", render: when }];
  table($("rollout-list"), cols, d.rollouts, { onPick: (r) => openRollout(r.rollout_id) });
  $("rollout-list").querySelectorAll("tr.pick").forEach((tr, i) => {
    tr.dataset.rollout = d.rollouts[i].rollout_id;
    if (d.rollouts[i].rollout_id === state.picked) tr.classList.add("picked");
  });
}

async function openRollout(rid) {
  state.picked = rid;
  $("rollout-list").querySelectorAll("tr.pick").forEach((tr) => tr.classList.toggle("picked", tr.dataset.rollout === rid));
  const view = $("rollout-view");
  view.innerHTML = '<p class="muted">loading ' + esc(rid) + "…</p>";
  let d;
  try { d = await api("/api/rollout/" + encodeURIComponent(rid)); } catch (e) {
    view.innerHTML = '<div class="error">' + esc(e.message) + "</div>";
    return;
  }
  let html = '<h3 id="rollout-title">rollout ' + esc(rid) + "</h3>";
  for (const a of d.attempts) {
    html += "<div>attempt <b>" + esc(a.attempt_id) + "</b> · task " + esc(a.task_id) + " · " + esc(a.mode) + " · version " + esc(fmt(a.version)) +
      " · status <b>" + esc(a.status) + "</b> · final reward <b class=\"final-reward\">" + esc(fmt(a.final_reward)) + "</b> · " +
      esc(a.spans_seen) + "/" + esc(a.span_count) + " spans · " + esc(a.llm_turns) + " LLM turns" +
      (a.missing_sequence_ids && a.missing_sequence_ids.length ? " · missing " + esc(a.missing_sequence_ids.join(",")) : "") +
      (a.error ? ' · <span class="error">' + esc(a.error) + "</span>" : "") + "</div>";
  }
  for (const g of d.groups) {
    const rows = g.rollout_ids.map((id, i) => (id === rid ? "<b>" : "") + esc(id) + ": reward " + esc(fmt(g.rewards[i])) + ", advantage " +
      esc(fmt(g.advantages[i])) + (id === rid ? "</b>" : "")).join("<br>");
    html += '<div class="group"><b>GRPO group ' + esc(g.group_id) + "</b> (task " + esc(g.task_id) + ", version " + esc(fmt(g.version)) +
      ", " + esc(g.rollouts) + "/" + esc(g.group_size) + " rollouts, mean " + esc(fmt(g.reward_mean)) + ", std " + esc(fmt(g.reward_std)) +
      (g.zero_variance ? ", zero variance" : "") + ", credit " + esc(g.credit) + ")<br>" + rows + "</div>";
  }
  html += '<div id="timeline">';
  for (const s of d.timeline) {
    const failed = s.tool_ok === false || s.status === "ERROR";
    html += '<div class="span ' + esc(s.kind) + (failed ? " failed error" : "") + '" data-seq="' + esc(s.seq) + '">';
    html += '<div class="head">#' + esc(s.seq) + ' <span class="tag">' + esc(s.kind) + "</span>" + esc(s.name) +
      (s.agent ? ' <span class="tag">agent ' + esc(s.agent) + "</span>" : "") + ' <span class="muted">' + esc(fmt(s.duration_ms)) + " ms" +
      (s.version !== null ? " · version " + esc(s.version) : "") + (s.late ? " · late" : "") + "</span></div>";
    if (s.kind === "llm" || s.prompt_tokens || s.response_tokens) {
      html += "<div>" + esc(s.model || "") + " prompt " + esc(s.prompt_tokens) + " tokens → response " + esc(s.response_tokens) + " tokens" +
        (s.logprob_mean !== null ? " · mean logprob " + esc(fmt(s.logprob_mean)) + " (min " + esc(fmt(s.logprob_min)) + ")" : "") + "</div>";
    }
    for (const [k, v] of Object.entries(s.text || {})) html += '<div class="muted">' + esc(k) + "</div><pre class=\"text\">" + esc(v) + "</pre>";
    if (s.logprobs && s.logprobs.length) {
      // One chip per response token: its id and log-probability, darker the more likely the model found it.
      const chips = s.logprobs.map((lp, i) => '<span class="tok" style="background: rgba(37, 99, 235, ' +
        (lp === null ? 0 : Math.exp(lp)).toFixed(2) + ')" title="token ' + (i + 1) + '">' + esc(s.token_ids[i] ?? "?") + " <b>" +
        esc(fmt(lp)) + "</b></span>").join("");
      html += '<details class="tokens"><summary>per-token log-probabilities (' + s.logprobs.length +
        (s.response_tokens > s.logprobs.length ? " of " + esc(s.response_tokens) : "") + ")</summary>" + chips + "</details>";
    }
    if (s.tool) {
      html += '<div class="tool-call">tool <b>' + esc(s.tool) + "</b>(" + esc(s.tool_arguments || "") + ") → " +
        (s.tool_ok === false ? '<span class="error">' + esc(s.tool_error || "failed") + "</span>" : esc(s.tool_result ?? "")) + "</div>";
    }
    if (s.reward !== null) {
      const dims = Object.entries(s.reward_dimensions || {}).map(([k, v]) => k + "=" + fmt(v)).join(", ");
      html += '<div class="reward">reward <b>' + esc(fmt(s.reward)) + "</b>" + (dims ? " (" + esc(dims) + ")" : "") + "</div>";
    }
    if (s.step) {
      html += '<div class="step">step ' + esc(s.step.turn) + ": reward " + esc(fmt(s.step.reward)) + " · return <b>" + esc(fmt(s.step.return)) +
        "</b> · advantage <b>" + esc(fmt(s.step.advantage)) + "</b>" + (s.step.trained ? "" : " · not trained") + "</div>";
    }
    if (s.status_message) html += '<div class="error">' + esc(s.status_message) + "</div>";
    html += "</div>";
  }
  html += "</div>";
  view.innerHTML = html;
}

// ------------------------------------------------------------------------------------------ SQL

async function runSql() {
  const sql = $("sql-text").value;
  $("sql-status").textContent = "running…";
  $("sql-error").hidden = true;
  try {
    const d = await api("/api/sql", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ sql }) });
    state.sqlResult = d;
    $("sql-status").textContent = d.row_count + " rows in " + d.elapsed_s + " s" + (d.truncated ? " (first " + d.rows.length + " shown)" : "");
    table($("sql-result"), d.columns, d.rows, { numeric: d.numeric });
  } catch (e) {
    if (e instanceof Unauthorized) return;
    state.sqlResult = null;
    $("sql-status").textContent = "refused";
    $("sql-error").hidden = false;
    $("sql-error").textContent = e.message;
    $("sql-result").innerHTML = "";
  }
}

function chartSql() {
  const d = state.sqlResult;
  if (!d || !d.rows.length) return;
  const time = d.temporal[0];
  const x = d.rows.map((r) => (time ? Date.parse(r[0]) / 1000 : r[0]));
  if (!time && !d.numeric[0]) { $("sql-status").textContent = "to chart, make the first column a number or a time"; return; }
  const order = x.map((v, i) => i).sort((a, b) => x[a] - x[b]);
  const data = { x: order.map((i) => x[i]) };
  const picks = [];
  d.columns.forEach((c, j) => { if (j > 0 && d.numeric[j]) { data[c] = order.map((i) => d.rows[i][j]); picks.push({ key: c }); } });
  chart("chart-sql", data, { time, picks, xLabel: d.columns[0] });
}

// ------------------------------------------------------------------------------------------ refresh

async function refresh() {
  const errors = [];
  let n = null;
  for (const [name, f] of [["learning", learning], ["pipeline", pipeline], ["trajectories", rollouts]]) {
    try { const r = await f(); if (name === "learning") n = r; } catch (e) {
      if (e instanceof Unauthorized) { $("status").textContent = "401: token needed"; return; }
      errors.push(name + ": " + e.message);
    }
  }
  // The same cause (ClickHouse down) fails every panel: say it once.
  const said = [...new Set(errors.map((e) => e.replace(/^\w+: /, "")))];
  $("status").textContent = (said.length ? said.join(" · ") + " · " : "") + (n !== null ? n + " rollouts · " : "") +
    "updated " + new Date().toLocaleTimeString() + " (every " + state.refreshS + " s)";
  document.body.dataset.refreshed = String(Date.now());
}

async function main() {
  readToken();
  $("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("auth-token").value;
    sessionStorage.setItem("rolloutbus-token", state.token);
    start();
  });
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); rollouts().catch((e) => { $("status").textContent = e.message; }); });
  $("sql-run").addEventListener("click", runSql);
  $("sql-chart").addEventListener("click", chartSql);
  window.addEventListener("hashchange", () => { if (/token=/.test(location.hash)) { readToken(); start(); } });
  start();
}

async function start() {
  try {
    const cfg = await api("/api/config");
    state.refreshS = cfg.refresh_s;
    state.assetsMissing = cfg.assets_missing;
    if (cfg.assets_missing) { $("assets").hidden = false; $("assets").textContent = cfg.assets_missing; }
  } catch (e) {
    if (!(e instanceof Unauthorized)) $("status").textContent = e.message;
    return;
  }
  if (state.timer) clearInterval(state.timer);
  await refresh();
  state.timer = setInterval(refresh, state.refreshS * 1000);
}

main();
