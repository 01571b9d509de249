// Lakeshore dashboard: vanilla JS over API v1. The token lives in sessionStorage only.
"use strict";

const TOKEN_KEY = "lakeshore.token";
const STATES = ["scheduled", "pending", "running", "succeeded", "failed", "dead", "cancelled"];
const REFRESH_MS = 2000;
let skew = 0;          // plane clock minus this browser's, in seconds
let me = null;         // identity from /v1/hello
let timer = null;
let logCursor = 0;

// --- small helpers -----------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}
const now = () => Date.now() / 1000 + skew;
function ago(t) {
  if (t === null || t === undefined) return "—";
  const d = Math.max(0, now() - t);
  if (d < 60) return d.toFixed(d < 10 ? 1 : 0) + " s";
  if (d < 3600) return Math.floor(d / 60) + " min " + Math.floor(d % 60) + " s";
  return (d / 3600).toFixed(1) + " h";
}
const when = (t) => (t ? new Date((t - skew) * 1000).toLocaleTimeString() : "—");
const stateTag = (st) => h("span", { class: "state " + st }, st);
function toast(text) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.hidden = false;
  clearTimeout(toast.t);
  toast.t = setTimeout(() => (el.hidden = true), 3000);
}

// --- the API -------------------------------------------------------------------------------
class ApiError extends Error {}
async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY),
                    Accept: "application/json" };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const data = res.status === 204 ? null : await res.json().catch(() => null);
  if (res.status === 401) { logout("The token was refused: sign in again."); throw new ApiError("401"); }
  if (!res.ok) throw new ApiError((data && data.error && data.error.message) || res.statusText);
  return data;
}
async function act(label, fn) {
  try { await fn(); toast(label); refresh(); } catch (e) { toast("Refused: " + e.message); }
}

// --- sign in and out --------------------------------------------------------------------------
function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  clearTimeout(timer);
  document.getElementById("view").replaceChildren();
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}
async function start() {
  try {
    const hello = await api("GET", "/v1/hello");
    me = hello.identity;
    skew = hello.time - Date.now() / 1000;
  } catch (e) {
    if (!(e instanceof ApiError && e.message === "401")) logout("Cannot reach the plane: " + e.message);
    return;
  }
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = me.role + " · " + me.queues.join(", ");
  if (!location.hash) location.hash = "#/queues";
  refresh();
}

// --- routing and refresh -------------------------------------------------------------------------
const views = { queues: queuesView, queue: queueView, running: runningView,
                daemons: daemonsView, inv: invocationView };
let rendering = false, again = false;
async function refresh() {
  clearTimeout(timer);
  if (!me) return;
  if (rendering) { again = true; return; }
  const typing = document.activeElement && document.activeElement.closest("#view input");
  if (typing) { timer = setTimeout(refresh, REFRESH_MS); return; }  // keep what is typed
  const [name, arg] = location.hash.replace(/^#\//, "").split("/").map(decodeURIComponent);
  const view = views[name] || queuesView;
  for (const a of document.querySelectorAll("nav a"))
    a.classList.toggle("active", a.dataset.tab === name);
  rendering = true;
  try {
    const nodes = await view(arg);
    if (me && nodes) document.getElementById("view").replaceChildren(...[nodes].flat());
  } catch (e) {
    if (!(e instanceof ApiError && e.message === "401"))
      document.getElementById("view").replaceChildren(h("p", { class: "error" }, String(e.message)));
  } finally {
    rendering = false;
  }
  if (again) { again = false; return refresh(); }
  if (me) timer = setTimeout(refresh, REFRESH_MS);
}
window.addEventListener("hashchange", () => refresh());
let logText = "", logFor = null;

// --- charts (hand-drawn SVG) ------------------------------------------------------------------------
function chart(title, series, opts) {
  const W = 600, H = 150, P = 28, n = series[0].values.length;
  const max = Math.max(1e-9, ...series.flatMap((x) => x.values.map((v) => v || 0)));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const y = (v) => H - P - ((H - 2 * P) * v) / max;
  for (const f of [0, 0.5, 1]) {
    svg.append(s("line", { x1: P, x2: W - 4, y1: y(max * f), y2: y(max * f), stroke: "#e3e6ea" }));
    const t = s("text", { x: 2, y: y(max * f) + 4, "font-size": 10, fill: "#6a737d" });
    t.textContent = opts.fmt(max * f);
    svg.append(t);
  }
  const step = (W - P - 4) / n;
  series.forEach((ser, k) => {
    if (opts.bars) {
      const bw = Math.max(1, step / series.length - 1);
      ser.values.forEach((v, i) => {
        if (!v) return;
        svg.append(s("rect", { x: P + i * step + k * bw, y: y(v), width: bw, height: H - P - y(v),
                               fill: ser.color }));
      });
    } else {
      const pts = ser.values.map((v, i) => (v === null ? null : `${P + (i + 0.5) * step},${y(v)}`));
      let run = [];
      for (const p of [...pts, null]) {
        if (p) { run.push(p); continue; }
        if (run.length === 1) {
          const [cx, cy] = run[0].split(",");
          svg.append(s("circle", { cx, cy, r: 2, fill: ser.color }));
        } else if (run.length) {
          svg.append(s("polyline", { points: run.join(" "), fill: "none", stroke: ser.color,
                                     "stroke-width": 2 }));
        }
        run = [];
      }
    }
  });
  const label = s("text", { x: W - 4, y: H - 8, "font-size": 10, fill: "#6a737d", "text-anchor": "end" });
  label.textContent = "now";
  const first = s("text", { x: P, y: H - 8, "font-size": 10, fill: "#6a737d" });
  first.textContent = "-" + Math.round(opts.window / 60) + " min";
  svg.append(label, first);
  return h("div", { class: "card chart" }, h("h2", {}, title),
    h("div", { class: "legend" }, series.map((x) => h("span", {}, h("i", { style: "background:" + x.color }), x.name))),
    svg);
}
function sumSeries(queues, key) {
  const n = queues.length ? queues[0][key].length : 60;
  const out = new Array(n).fill(0);
  for (const q of queues) q[key].forEach((v, i) => (out[i] += v || 0));
  return out;
}
function meanQueueTime(queues) {
  const n = queues.length ? queues[0].queue_time_mean.length : 60;
  const out = [];
  for (let i = 0; i < n; i++) {
    let sum = 0, w = 0;
    for (const q of queues) {
      const m = q.queue_time_mean[i];
      if (m !== null) { const k = q.succeeded[i] + q.failed[i] || 1; sum += m * k; w += k; }
    }
    out.push(w ? sum / w : null);
  }
  return out;
}
function maxQueueTime(queues) {
  const n = queues.length ? queues[0].queue_time_max.length : 60;
  const out = [];
  for (let i = 0; i < n; i++) {
    const xs = queues.map((q) => q.queue_time_max[i]).filter((v) => v !== null);
    out.push(xs.length ? Math.max(...xs) : null);
  }
  return out;
}
const secs = (v) => (v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : (v * 1000).toFixed(0) + "m") + "s";

// --- pages ---------------------------------------------------------------------------------------------
async function queuesView() {
  const [{ queues }, stats] = await Promise.all([api("GET", "/v1/queues"), api("GET", "/v1/stats")]);
  const rows = queues.map((q) => h("tr", { "data-queue": q.name },
    h("td", {}, h("a", { href: "#/queue/" + encodeURIComponent(q.name) }, q.name),
      q.paused ? h("span", { class: "state failed", style: "margin-left:.4rem" }, "paused") : null),
    h("td", {}, q.kind),
    STATES.map((st) => h("td", { class: "num", "data-state": st }, q.counts[st] || 0)),
    h("td", {}, h("button", { class: q.paused ? "primary" : "",
      onclick: () => act(q.paused ? "Resumed " + q.name : "Paused " + q.name,
        () => api("PATCH", "/v1/queues/" + encodeURIComponent(q.name), { paused: !q.paused })) },
      q.paused ? "Resume" : "Pause"))));
  const table = h("div", { class: "card" }, h("h1", {}, "Queues"),
    queues.length ? h("table", { id: "queues" },
      h("thead", {}, h("tr", {}, h("th", {}, "queue"), h("th", {}, "kind"),
        STATES.map((st) => h("th", { class: "num" }, st)), h("th", {}, ""))),
      h("tbody", {}, rows)) : h("p", { class: "muted" }, "No queues yet."));
  const qs = stats.queues;
  const charts = h("div", { class: "grid" },
    chart("Throughput per minute", [
      { name: "succeeded", color: "#2f8f46", values: sumSeries(qs, "succeeded") },
      { name: "failed", color: "#c0392b", values: sumSeries(qs, "failed") },
      { name: "submitted", color: "#9aa5b1", values: sumSeries(qs, "submitted") },
    ], { bars: true, window: stats.window, fmt: (v) => v.toFixed(v < 10 ? 1 : 0) }),
    chart("Queue time (due → claimed)", [
      { name: "mean", color: "#1d4e89", values: meanQueueTime(qs) },
      { name: "max", color: "#b7791f", values: maxQueueTime(qs) },
    ], { bars: false, window: stats.window, fmt: secs }));
  return [table, charts];
}

async function queueView(name) {
  const state = new URLSearchParams(location.hash.split("?")[1] || "").get("state");
  const q = await api("GET", "/v1/queues/" + encodeURIComponent(name.split("?")[0]));
  const qname = q.queue.name;
  const query = "queue=" + encodeURIComponent(qname) + "&limit=200" + (state ? "&state=" + state : "");
  const { invocations } = await api("GET", "/v1/invocations?" + query);
  invocations.sort((a, b) => b.created_at - a.created_at);
  const filters = h("p", { class: "actions" }, h("a", { href: "#/queue/" + encodeURIComponent(qname) }, "all"),
    STATES.map((st) => h("a", { href: `#/queue/${encodeURIComponent(qname)}?state=${st}` },
      `${st} (${q.queue.counts[st] || 0})`)));
  return h("div", { class: "card" }, h("h1", {}, "Queue " + qname + (state ? " · " + state : "")), filters,
    h("table", { id: "invocations" }, h("thead", {}, h("tr", {}, ["id", "state", "attempt", "priority", "submitted", "worker"].map((x) => h("th", {}, x)))),
      h("tbody", {}, invocations.map((inv) => h("tr", { "data-id": inv.id },
        h("td", { class: "mono" }, h("a", { href: "#/inv/" + encodeURIComponent(inv.id) }, inv.id)),
        h("td", {}, stateTag(inv.state)), h("td", { class: "num" }, `${inv.attempt}/${inv.max_attempts}`),
        h("td", { class: "num" }, inv.priority), h("td", {}, ago(inv.created_at) + " ago"),
        h("td", { class: "mono" }, inv.worker || "—"))))));
}

async function runningView() {
  const { queues } = await api("GET", "/v1/queues");
  const busy = queues.filter((q) => q.counts.running > 0);
  const lists = await Promise.all(busy.map((q) =>
    api("GET", "/v1/invocations?state=running&limit=500&queue=" + encodeURIComponent(q.name))));
  const running = lists.flatMap((x) => x.invocations).sort((a, b) => a.started_at - b.started_at);
  return h("div", { class: "card" }, h("h1", {}, `Running (${running.length})`),
    running.length ? h("table", { id: "running" },
      h("thead", {}, h("tr", {}, ["id", "queue", "worker", "progress", "age", "attempt", ""].map((x) => h("th", {}, x)))),
      h("tbody", {}, running.map((inv) => h("tr", { "data-id": inv.id },
        h("td", { class: "mono" }, h("a", { href: "#/inv/" + encodeURIComponent(inv.id) }, inv.id)),
        h("td", {}, inv.queue), h("td", { class: "mono" }, inv.worker || "—"),
        h("td", {}, h("div", { class: "bar", title: inv.progress_message || "" },
          h("div", { style: `width:${Math.round(100 * (inv.progress || 0))}%` })),
          h("span", { class: "muted" }, inv.progress === null ? "" :
            `${Math.round(100 * inv.progress)}% ${inv.progress_message || ""}`)),
        h("td", {}, ago(inv.started_at)), h("td", { class: "num" }, `${inv.attempt}/${inv.max_attempts}`),
        h("td", {}, h("button", { class: "danger", onclick: () =>
          act("Cancelled " + inv.id, () => api("POST", `/v1/invocations/${encodeURIComponent(inv.id)}/cancel`)) }, "Cancel"))))))
      : h("p", { class: "muted" }, "Nothing is running."));
}

async function daemonsView() {
  const { daemons } = await api("GET", "/v1/daemons");
  const health = (d) => {
    if (d.stopped_at != null) return "stopped";  // (exited of its own accord)
    const a = now() - d.last_heartbeat;
    return a < 60 ? "ok" : a < 300 ? "late" : "gone";
  };
  return h("div", { class: "card" }, h("h1", {}, "Daemons"),
    daemons.length ? h("table", { id: "daemons" },
      h("thead", {}, h("tr", {}, ["name", "health", "queues", "concurrency", "busy", "last heartbeat", "host", ""].map((x) => h("th", {}, x)))),
      h("tbody", {}, daemons.map((d) => h("tr", { "data-id": d.id },
        h("td", {}, d.name, h("div", { class: "muted mono" }, d.id)),
        h("td", {}, h("span", { class: "health " + health(d) }), health(d),
          d.stopped_at != null ? (d.draining ? " · drained" : "") : d.draining ? " · draining" : ""),
        h("td", {}, d.queues.join(", ")), h("td", { class: "num" }, d.concurrency),
        h("td", { class: "num" }, d.running), h("td", {}, ago(d.last_heartbeat) + " ago"),
        h("td", { class: "mono" }, d.host || "—"),
        h("td", {}, me.role === "admin" && !d.draining && d.stopped_at == null ? h("button", { onclick: () =>
          act("Draining " + d.name, () => api("POST", `/v1/daemons/${encodeURIComponent(d.id)}/drain`)) }, "Drain") : null)))))
      : h("p", { class: "muted" }, "No daemon has registered."));
}

async function invocationView(id) {
  const { invocation: inv } = await api("GET", "/v1/invocations/" + encodeURIComponent(id));
  if (logFor !== id) { logFor = id; logCursor = 0; logText = ""; }
  const logs = await api("GET", `/v1/invocations/${encodeURIComponent(id)}/logs?after=${logCursor}`);
  for (const e of logs.entries) logText += e.text;
  logCursor = logs.next;
  const call = inv.call;
  const history = [["submitted", inv.created_at]];
  if (inv.available_at > inv.created_at + 0.001) history.push([inv.attempt ? "due again" : "due", inv.available_at]);
  if (inv.started_at) history.push([`running (attempt ${inv.attempt})`, inv.started_at]);
  if (inv.finished_at) history.push([inv.state, inv.finished_at]);
  const actions = [];
  if (["pending", "scheduled", "running"].includes(inv.state))
    actions.push(h("button", { class: "danger", id: "cancel", onclick: () =>
      act("Cancelled", () => api("POST", `/v1/invocations/${encodeURIComponent(inv.id)}/cancel`)) }, "Cancel"));
  if (["failed", "dead"].includes(inv.state))
    actions.push(h("button", { class: "primary", id: "retry", onclick: () =>
      act("Retrying", () => api("POST", `/v1/invocations/${encodeURIComponent(inv.id)}/retry`)) }, "Retry"));
  if (inv.state === "pending") {
    const input = h("input", { type: "number", value: inv.priority, id: "priority" });
    actions.push(input, h("button", { onclick: () => act("Priority changed", () =>
      api("PATCH", `/v1/invocations/${encodeURIComponent(inv.id)}`, { priority: Number(input.value) })) }, "Set priority"));
  }
  const err = inv.error;
  return [
    h("div", { class: "card" },
      h("h1", {}, "Invocation ", h("span", { class: "mono" }, inv.id), " ", stateTag(inv.state)),
      h("dl", { id: "summary" },
        h("dt", {}, "queue"), h("dd", {}, h("a", { href: "#/queue/" + encodeURIComponent(inv.queue) }, inv.queue)),
        h("dt", {}, "calls"), h("dd", { class: "mono" }, call ? `${call.name}` + (call.kind === "ref" ? `(${call.args})` : "") : "—"),
        call && call.kind === "pickle" ? [h("dt", {}, "arguments"), h("dd", {}, call.args_bytes === null ? "in a blob" : `${call.args_bytes} bytes pickled`)] : null,
        call && call.kind === "exec" && call.env.length ? [h("dt", {}, "environment"), h("dd", { class: "mono" }, call.env.join(" "))] : null,
        h("dt", {}, "attempts"), h("dd", {}, `${inv.attempt} of ${inv.max_attempts}`),
        h("dt", {}, "priority"), h("dd", {}, inv.priority),
        h("dt", {}, "worker"), h("dd", { class: "mono" }, inv.worker || "—"),
        h("dt", {}, "progress"), h("dd", {}, inv.progress === null ? "—" : `${Math.round(inv.progress * 100)}% ${inv.progress_message || ""}`),
        h("dt", {}, "timeout"), h("dd", {}, inv.timeout ? inv.timeout + " s" : "none")),
      h("p", { class: "actions" }, actions)),
    h("div", { class: "card" }, h("h2", {}, "State history"),
      h("table", { id: "history" }, h("tbody", {}, history.map(([what, t]) =>
        h("tr", {}, h("td", {}, what), h("td", {}, when(t)), h("td", { class: "muted" }, ago(t) + " ago")))))),
    err ? h("div", { class: "card", id: "error" }, h("h2", {}, "Error"),
      h("p", { class: "error mono" }, `${err.type}: ${err.message}`),
      err.traceback ? h("pre", { id: "traceback" }, err.traceback) : null) : null,
    h("div", { class: "card" }, h("h2", {}, "Logs"), h("pre", { id: "logs" }, logText || "(no output yet)")),
  ];
}

// --- boot ----------------------------------------------------------------------------------------------
document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  start();
});
document.getElementById("logout").addEventListener("click", () => logout());
if (sessionStorage.getItem(TOKEN_KEY)) start(); else logout();
