"use strict";
const $ = (sel) => document.querySelector(sel);
let selected = null, cursor = null, last = {};

function say(text, error) {
  const s = $("#status");
  s.textContent = text;
  s.className = error ? "error" : "";
}

async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + (sessionStorage.getItem("token") || "") };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch("/api/v1" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

function cell(row, text, cls, field) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  if (field) td.dataset.field = field;
  return td;
}

function button(parent, label, action, data, handler, danger) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  Object.assign(b.dataset, data);
  if (danger) b.className = "danger";
  b.addEventListener("click", handler);
  parent.appendChild(b);
  parent.appendChild(document.createTextNode(" "));
}

// Scores of -inf ("now") and +inf ("park") arrive saturated, far outside what a Date holds.
const when = (ms) => {
  if (typeof ms !== "number" || Number.isNaN(ms)) return "-";
  if (ms <= -8.64e15) return "now (-inf)";
  if (ms >= 8.64e15) return "parked (+inf)";
  return new Date(ms).toISOString().replace("T", " ").replace(".000Z", "Z");
};
const age = (s) => s < 1 ? "-" : s < 120 ? s.toFixed(0) + " s" : (s / 60).toFixed(1) + " min";

async function act(what, trigger, path, body, question) {
  if (question && !confirm(question)) return;
  try {
    const r = await api("POST", "/triggers/" + encodeURIComponent(trigger) + path, body);
    say(what + ": " + JSON.stringify(r));
    await refresh();
  } catch (e) { say(what + " failed: " + e.message, true); }
}

async function refresh() {
  let data;
  try { data = await api("GET", "/triggers"); }
  catch (e) { say(e.message, true); return; }
  const now = Date.now();
  const body = $("#triggers tbody");
  body.replaceChildren();
  for (const t of data.triggers) {
    const s = t.stats, row = body.insertRow();
    row.dataset.trigger = t.name;
    if (t.name === selected) row.className = "selected";
    const name = cell(row, "");
    const link = document.createElement("button");
    link.type = "button"; link.textContent = t.name; link.dataset.action = "select";
    link.addEventListener("click", () => select(t.name));
    name.appendChild(link);
    cell(row, s.scheduled, "num", "scheduled");
    cell(row, s.due, "num", "due");
    cell(row, s.inflight, "num", "inflight");
    cell(row, s.dead, "num", "dead");
    cell(row, age(s.oldest_due_age_seconds), "num", "oldest");
    cell(row, t.lateness_p99_seconds == null ? "-" : (t.lateness_p99_seconds * 1000).toFixed(0) + " ms", "num", "lateness");
    const prev = last[t.name];
    const rate = prev ? (t.forwarded_total - prev.total) * 1000 / Math.max(1, now - prev.at) : 0;
    last[t.name] = { total: t.forwarded_total, at: now };
    cell(row, rate.toFixed(1), "num", "rate");
    const state = s.paused ? "paused" : "active";
    const limit = t.rate_limit ? " · limit " + t.rate_limit.per_second + "/s, burst " + t.rate_limit.burst : "";
    cell(row, state + limit, s.paused ? "paused" : "", "state");
    const actions = row.insertCell();
    if (s.paused) button(actions, "Resume", "resume", { trigger: t.name }, () => act("Resumed", t.name, "/resume"));
    else button(actions, "Pause", "pause", { trigger: t.name }, () => act("Paused", t.name, "/pause", undefined,
      "Pause " + t.name + "? Every bridge stops claiming its messages until it is resumed."));
  }
  if (selected) await detail();
}

async function select(name) {
  selected = name;
  cursor = null;
  $("#detail").hidden = false;
  $("#detail-name").textContent = name;
  await refresh();
}

async function detail() {
  const t = encodeURIComponent(selected);
  try {
    const [f, page, dead] = await Promise.all([
      api("GET", "/triggers/" + t + "/forecast?bucket_ms=60000&buckets=60"),
      api("GET", "/triggers/" + t + "/scheduled?limit=25" + (cursor ? "&after=" + encodeURIComponent(cursor) : "")),
      api("GET", "/triggers/" + t + "/dead?limit=50"),
    ]);
    chart(f);
    const sb = $("#scheduled tbody");
    sb.replaceChildren();
    for (const e of page.items) {
      const row = sb.insertRow();
      row.dataset.member = e.member;
      cell(row, when(e.due_ms));
      cell(row, e.member);
      cell(row, e.attempts, "num");
      cell(row, e.body_size == null ? "" : e.body_preview + (e.body_size > e.body_preview.length ? " ..." : ""));
      const a = row.insertCell();
      button(a, "Promote", "promote", { member: e.member }, () => act("Promoted", selected, "/promote", { members: [e.member] }));
      button(a, "Cancel", "cancel", { member: e.member }, () => act("Cancelled", selected, "/cancel", { members: [e.member] },
        "Cancel " + e.member + "? It will not be sent."), true);
    }
    $("#next-page").disabled = !page.next;
    $("#next-page").dataset.next = page.next || "";
    const db = $("#dead tbody");
    db.replaceChildren();
    for (const d of dead.items) {
      const row = db.insertRow();
      row.dataset.member = d.member;
      cell(row, when(d.at_ms));
      cell(row, d.member);
      cell(row, d.reason ? d.reason.reason + (d.reason.detail ? ": " + d.reason.detail : "") : "-");
      const a = row.insertCell();
      button(a, "Requeue", "requeue", { member: d.member }, () => act("Requeued", selected, "/dead/requeue", { members: [d.member] },
        "Requeue " + d.member + "? It will be sent now."));
    }
  } catch (e) { say(e.message, true); }
}

function chart(f) {
  const svg = $("#forecast"), w = svg.clientWidth || 900, h = 120, n = f.buckets.length;
  const max = Math.max(1, ...f.buckets), bw = (w - 40) / n;
  let out = "";
  f.buckets.forEach((v, i) => {
    const bh = Math.round((h - 20) * v / max);
    out += `<rect x="${40 + i * bw}" y="${h - 14 - bh}" width="${Math.max(1, bw - 1)}" height="${bh}" fill="#4b86b4"><title>${v} due in minute ${i + 1}</title></rect>`;
  });
  out += `<text x="0" y="10">${max}</text><text x="0" y="${h - 2}">now</text><text x="${w - 40}" y="${h - 2}">+1 h</text>`;
  out += `<text x="40" y="10">overdue ${f.overdue}, later ${f.later}</text>`;
  svg.innerHTML = out;
}

$("#login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("token", $("#token").value);
  say("Connected");
  refresh();
});
$("#first-page").addEventListener("click", () => { cursor = null; detail(); });
$("#next-page").addEventListener("click", () => { cursor = $("#next-page").dataset.next || null; detail(); });
$("#find").addEventListener("click", async () => {
  try {
    const m = await api("GET", "/triggers/" + encodeURIComponent(selected) + "/messages/" + encodeURIComponent($("#search").value));
    $("#found").textContent = JSON.stringify(m, null, 2);
  } catch (e) { $("#found").textContent = e.message; }
});
$("#purge-dead").addEventListener("click", () => act("Purged", selected, "/purge", { what: "dead", confirm: true },
  "Delete every dead letter of " + selected + " for good?"));
if (sessionStorage.getItem("token")) refresh();
setInterval(() => { if (sessionStorage.getItem("token")) refresh(); }, 2000);
