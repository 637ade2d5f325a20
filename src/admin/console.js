"use strict";
const $ = (sel) => document.querySelector(sel);
let selected = null, cursor = null, deadCursor = null, last = {}, triggers = {};
let windowName = "15m", staleSince = null, drawerFrom = null;

function say(text, error) {
  const s = $("#status");
  s.textContent = text;
  s.className = error ? "error" : "";
}

/// An API call; a failure says what failed: the HTTP status and the API's error, or that the
/// bridge did not answer at all.
async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + (sessionStorage.getItem("token") || "") };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch("/api/v1" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    const err = new Error("bridge unreachable");
    err.status = 0;
    throw err;
  }
  const data = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) {
    const err = new Error(data.error || r.statusText);
    err.status = r.status;
    throw err;
  }
  return data;
}

function cell(row, text, cls, field) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  if (field) td.dataset.field = field;
  return td;
}

// Actions that change a queue: hidden when the API is read-only.
const CHANGES = new Set(["pause", "resume", "promote", "cancel", "requeue"]);

function button(parent, label, action, data, handler, danger) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  if (CHANGES.has(action)) b.classList.add("changes");
  Object.assign(b.dataset, data);
  if (danger) b.classList.add("danger");
  b.addEventListener("click", handler);
  parent.appendChild(b);
  parent.appendChild(document.createTextNode(" "));
  return b;
}

const pad = (n) => String(n).padStart(2, "0");
/// A time of day in the browser's zone.
const clock = (d) => pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
const local = (d) => d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(d);

/// How far `ms` is from now, in words: "in 5 min", "3 min ago".
function relative(ms, now = Date.now()) {
  const d = ms - now, a = Math.abs(d) / 1000;
  let text;
  if (a < 1) return "now";
  if (a < 90) text = Math.round(a) + " s";
  else if (a < 90 * 60) text = Math.round(a / 60) + " min";
  else if (a < 48 * 3600) text = Math.round(a / 3600) + " h";
  else text = Math.round(a / 86400) + " days";
  return d > 0 ? "in " + text : text + " ago";
}

// Scores of -inf ("now") and +inf ("park") arrive saturated, far outside what a Date holds.
const when = (ms) => {
  if (typeof ms !== "number" || Number.isNaN(ms)) return "-";
  if (ms <= -8.64e15) return "now (-inf)";
  if (ms >= 8.64e15) return "parked (+inf)";
  return local(new Date(ms)) + " (" + relative(ms) + ")";
};
const age = (s) => s < 1 ? "-" : s < 120 ? s.toFixed(0) + " s" : (s / 60).toFixed(1) + " min";
const seconds = (s) => s == null ? "-" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(s < 10 ? 2 : 0) + " s";

// A member for a table cell or a question: long ones (inline, the member is the message)
// show their start and their length, so a large message cannot push the actions away.
const short = (text, most = 120) =>
  text.length <= most ? text : text.slice(0, most) + "\u2026 (" + text.length.toLocaleString() + " characters)";

// What an action's answer means, in words.
function outcome(what, trigger, r) {
  const n = (count, one, many) => count + " " + (count === 1 ? one : many);
  if ("paused" in r) return trigger + (r.changed ? (r.paused ? " paused" : " resumed") : (r.paused ? " was already paused" : " was not paused"));
  if ("cancelled" in r) return what + ": " + n(r.cancelled, "message", "messages");
  if ("deleted" in r) return what + ": " + n(r.deleted, "message", "messages") + " deleted";
  if ("requeued" in r) return what + ": " + n(r.requeued, "dead letter", "dead letters") + " scheduled again";
  if ("changed" in r) return what + ": " + n(r.changed, "message", "messages");
  return what;
}

async function act(what, trigger, path, body, question) {
  if (question && !confirm(question)) return;
  try {
    const r = await api("POST", "/triggers/" + encodeURIComponent(trigger) + path, body);
    say(outcome(what, trigger, r));
    await refresh();
  } catch (e) { say(what + " failed: " + e.message, true); }
}

/// The last reading failed: the numbers on screen are greyed out and a banner says since
/// when and why; the next good reading clears both.
function stale(e) {
  if (!staleSince) staleSince = new Date();
  const why = e.status ? "HTTP " + e.status + ": " + e.message : e.message;
  const b = $("#stale");
  b.textContent = "stale since " + clock(staleSince) + " (" + why + "): the numbers below are the last ones read, not live";
  b.hidden = false;
  for (const el of [$("#triggers"), $("#detail")]) el.classList.add("stale");
  for (const td of document.querySelectorAll('#triggers td[data-field="rate"]')) td.textContent = "-";
  last = {};
}

function fresh() {
  staleSince = null;
  $("#stale").hidden = true;
  for (const el of [$("#triggers"), $("#detail")]) el.classList.remove("stale");
}

async function refresh() {
  let data;
  try { data = await api("GET", "/triggers"); }
  catch (e) { stale(e); return; }
  fresh();
  // A read-only API refuses every change: its actions are not offered.
  document.body.classList.toggle("read-only", data.read_only === true);
  const now = Date.now();
  const body = $("#triggers tbody");
  body.replaceChildren();
  triggers = {};
  for (const t of data.triggers) {
    triggers[t.name] = t;
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
    cell(row, seconds(t.lateness_p99_1m_seconds), "num", "lateness");
    const prev = last[t.name];
    const rate = prev ? (t.forwarded_total - prev.total) * 1000 / Math.max(1, now - prev.at) : null;
    last[t.name] = { total: t.forwarded_total, at: now };
    cell(row, rate == null ? "-" : rate.toFixed(1), "num", "rate");
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
  deadCursor = null;
  searching = false;
  $("#found").textContent = "";
  $("#detail").hidden = false;
  $("#detail-name").textContent = name;
  await refresh();
}

/// A row that opens the message drawer when clicked, or with Enter once focused.
function openable(row, item) {
  row.tabIndex = 0;
  row.addEventListener("click", (e) => { if (!e.target.closest("button")) drawer(item, row); });
  row.addEventListener("keydown", (e) => { if (e.key === "Enter" && e.target === row) drawer(item, row); });
}

// Fills the table body `selector` with a row per member of `items`: `fill` writes a row's
// cells (given the item with its `kind`), and the row opens the member's drawer.
function memberRows(selector, kind, items, fill) {
  const body = $(selector);
  body.replaceChildren();
  for (const m of items) {
    const row = body.insertRow();
    row.dataset.member = m.member;
    const item = { kind, ...m };
    fill(row, item);
    openable(row, item);
  }
}

function scheduledRows(items) {
  memberRows("#scheduled tbody", "scheduled", items, (row, e) => {
    cell(row, when(e.due_ms));
    cell(row, short(e.member));
    cell(row, e.attempts, "num");
    cell(row, e.body_size == null ? "" : e.body_preview + (e.body_size > e.body_preview.length ? " ..." : ""));
    const a = row.insertCell();
    button(a, "Show", "show", { member: e.member }, () => drawer(e, row));
    button(a, "Promote", "promote", { member: e.member }, () => act("Promoted", selected, "/promote", { members: [e.member] }));
    button(a, "Cancel", "cancel", { member: e.member }, () => act("Cancelled", selected, "/cancel", { members: [e.member] },
      "Cancel " + short(e.member, 60) + "? It will not be sent."), true);
  });
}

async function detail() {
  const t = encodeURIComponent(selected);
  try {
    const [f, page, dead, inflight, history] = await Promise.all([
      api("GET", "/triggers/" + t + "/forecast?bucket_ms=60000&buckets=60"),
      searching ? null : api("GET", "/triggers/" + t + "/scheduled?limit=25" + (cursor ? "&after=" + encodeURIComponent(cursor) : "")),
      api("GET", "/triggers/" + t + "/dead?limit=25" + (deadCursor ? "&after=" + encodeURIComponent(deadCursor) : "")),
      api("GET", "/triggers/" + t + "/inflight?limit=25"),
      api("GET", "/triggers/" + t + "/history?window=" + windowName),
    ]);
    chart(f);
    charts(history);
    if (page) {
      scheduledRows(page.items);
      $("#next-page").disabled = !page.next;
      $("#next-page").dataset.next = page.next || "";
    }
    memberRows("#inflight tbody", "inflight", inflight.items, (row, m) => {
      cell(row, when(m.lease_deadline_ms));
      cell(row, short(m.member));
      button(row.insertCell(), "Show", "show", { member: m.member }, () => drawer(m, row));
    });
    memberRows("#dead tbody", "dead", dead.items, (row, d) => {
      cell(row, when(d.at_ms));
      cell(row, short(d.member));
      cell(row, d.reason ? d.reason.reason : "-", "", "reason");
      cell(row, d.attempts == null ? "-" : d.attempts, "num", "attempts");
      cell(row, d.reason && d.reason.detail ? short(String(d.reason.detail), 160) : "", "", "detail");
      const a = row.insertCell();
      button(a, "Show", "show", { member: d.member }, () => drawer(d, row));
      button(a, "Requeue", "requeue", { member: d.member }, () => act("Requeued", selected, "/dead/requeue", { members: [d.member] },
        "Requeue " + short(d.member, 60) + "? It will be sent now."));
    });
    reasons(dead.items);
    $("#dead-next").disabled = !dead.next;
    $("#dead-next").dataset.next = dead.next || "";
    const n = triggers[selected] ? triggers[selected].stats.dead : 0;
    $("#requeue-all").textContent = "Requeue all (" + n + ")";
    $("#purge-dead").textContent = "Purge all dead letters (" + n + ")";
  } catch (e) { stale(e); }
}

/// The forecast: a bar per minute of the next hour. The scale's labels sit left of the bars
/// and the time labels under them, so no label covers a bar or the axis.
function chart(f) {
  const svg = $("#forecast"), w = svg.clientWidth || 900, h = 130, n = f.buckets.length;
  const left = 44, top = 6, bottom = 18, ph = h - top - bottom;
  const max = Math.max(1, ...f.buckets), bw = (w - left - 4) / n;
  let out = `<line class="axis" x1="${left - 2}" y1="${top}" x2="${left - 2}" y2="${h - bottom}"/>`;
  out += `<line class="axis" x1="${left - 2}" y1="${h - bottom}" x2="${w}" y2="${h - bottom}"/>`;
  f.buckets.forEach((v, i) => {
    const bh = Math.round(ph * v / max);
    out += `<rect class="bar" x="${left + i * bw}" y="${h - bottom - bh}" width="${Math.max(1, bw - 1)}" height="${bh}"><title>${v} due in minute ${i + 1}</title></rect>`;
  });
  out += `<text x="${left - 6}" y="${top + 8}" text-anchor="end">${max}</text>`;
  out += `<text x="${left - 6}" y="${h - bottom}" text-anchor="end">0</text>`;
  out += `<text x="${left}" y="${h - 4}">now</text><text x="${w - 2}" y="${h - 4}" text-anchor="end">+1 h</text>`;
  svg.innerHTML = out;
  $("#forecast-note").textContent = "Overdue " + f.overdue + ", later than an hour " + f.later + ".";
}

/// A line chart of `lines` ({values, cls}) over the points' times; the scale at the left, the
/// window's start and end under it.
function lines(svg, points, series, format, span, win) {
  const w = svg.clientWidth || 300, h = 130, left = 46, top = 6, bottom = 18, ph = h - top - bottom;
  // A bridge younger than the window: the chart spans what it has.
  const end = Date.now(), first = points.length ? points[0].at_ms - 10000 : end - span;
  span = Math.max(60000, Math.min(span, end - first));
  const start = end - span;
  const all = series.flatMap((s) => points.map(s.value)).filter((v) => v != null);
  const max = Math.max(...all, 0) || 1;
  const x = (at) => left + (w - left - 4) * Math.max(0, at - start) / span;
  const y = (v) => top + ph - ph * v / max;
  let out = `<line class="axis" x1="${left - 2}" y1="${top}" x2="${left - 2}" y2="${h - bottom}"/>`;
  out += `<line class="axis" x1="${left - 2}" y1="${h - bottom}" x2="${w}" y2="${h - bottom}"/>`;
  for (const s of series) {
    // A window without a value (no message forwarded) breaks the line.
    let d = "", pen = "M";
    for (const p of points) {
      const v = s.value(p);
      if (v == null) { pen = "M"; continue; }
      d += `${pen}${x(p.at_ms).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
    }
    if (d) out += `<path class="line ${s.cls || ""}" d="${d.trim()}"><title>${s.name}</title></path>`;
    // The latest value as a dot, with its value and time on hover.
    const lastPoint = [...points].reverse().find((p) => s.value(p) != null);
    if (lastPoint) {
      const v = s.value(lastPoint);
      out += `<circle class="dot ${s.cls || ""}" r="2.5" cx="${x(lastPoint.at_ms).toFixed(1)}" cy="${y(v).toFixed(1)}"><title>${s.name} ${format(v)} at ${clock(new Date(lastPoint.at_ms))}</title></circle>`;
    }
  }
  svg.dataset.points = points.length;
  svg.dataset.window = win;
  out += `<text x="${left - 6}" y="${top + 8}" text-anchor="end">${format(max)}</text>`;
  out += `<text x="${left - 6}" y="${h - bottom}" text-anchor="end">0</text>`;
  const back = span / 1000, ago = back >= 3600 ? "1 h" : back >= 90 ? Math.round(back / 60) + " min" : Math.round(back) + " s";
  out += `<text x="${left}" y="${h - 4}">-${ago}</text><text x="${w - 2}" y="${h - 4}" text-anchor="end">now</text>`;
  if (points.length < 2) out += `<text x="${left + 8}" y="${top + ph / 2}">collecting: a point every 10 s</text>`;
  svg.innerHTML = out;
}

function charts(history) {
  const p = history.points, span = (history.window === "1h" ? 3600 : 900) * 1000, win = history.window;
  const rate = (v) => v >= 10 ? v.toFixed(0) : v.toFixed(1);
  lines($("#chart-forwarded"), p, [{ name: "forwarded/s", value: (q) => q.forwarded_per_second }], rate, span, win);
  lines($("#chart-dead"), p, [{ name: "dead-lettered/s", value: (q) => q.dead_lettered_per_second }], rate, span, win);
  lines($("#chart-due"), p, [{ name: "due", value: (q) => q.due }], (v) => v.toFixed(0), span, win);
  lines($("#chart-lateness"), p, [
    { name: "p50", value: (q) => q.lateness_p50_seconds },
    { name: "p99", value: (q) => q.lateness_p99_seconds, cls: "p99" },
  ], seconds, span, win);
}

// The message drawer.

/// Text shown in the drawer: at most this many characters of a body.
const SHOWN = 65536;

function field(list, name, value) {
  const dt = document.createElement("dt"), dd = document.createElement("dd");
  dt.textContent = name;
  dd.textContent = value;
  list.append(dt, dd);
}

/// `text` pretty-printed when it is JSON, bounded to [`SHOWN`] characters.
function pretty(text) {
  let out = text;
  try { out = JSON.stringify(JSON.parse(text), null, 2); } catch (e) { /* not JSON: as it is */ }
  return out.length <= SHOWN ? out : out.slice(0, SHOWN) + "\n\u2026 (first " + SHOWN.toLocaleString() + " of " + out.length.toLocaleString() + " characters)";
}

/// An envelope (a JSON object with `body` or `body_b64`): its fields, headers and body apart.
function envelope(text) {
  if (text.length > 4 * SHOWN || text[0] !== "{") return null;
  let v;
  try { v = JSON.parse(text); } catch (e) { return null; }
  if (!v || typeof v !== "object" || Array.isArray(v) || !("body" in v || "body_b64" in v)) return null;
  let body = v.body;
  if (body === undefined) {
    try { body = atob(v.body_b64); } catch (e) { body = v.body_b64; }
  }
  const fields = Object.entries(v).filter(([k]) => !["body", "body_b64", "headers"].includes(k));
  return { fields, headers: v.headers && typeof v.headers === "object" ? Object.entries(v.headers) : [], body: typeof body === "string" ? body : JSON.stringify(body) };
}

async function drawer(item, row) {
  drawerFrom = row ? row.querySelector("button") || row : document.activeElement;
  const d = $("#drawer"), fields = $("#drawer-fields"), headers = $("#drawer-headers");
  fields.replaceChildren();
  headers.replaceChildren();
  $("#drawer-title").textContent = short(item.member, 80);
  field(fields, "Member", short(item.member, 400));
  field(fields, "State", { scheduled: "scheduled", inflight: "in flight", dead: "dead letter" }[item.kind]);
  if (item.kind === "scheduled") {
    field(fields, "Due", when(item.due_ms));
    field(fields, "Attempts", item.attempts);
  }
  if (item.kind === "inflight") field(fields, "Lease ends", when(item.lease_deadline_ms));
  if (item.kind === "dead") {
    field(fields, "Dead since", when(item.at_ms));
    field(fields, "Attempts", item.attempts == null ? "-" : item.attempts);
    field(fields, "Reason", item.reason ? item.reason.reason : "-");
    if (item.reason && item.reason.detail) field(fields, "Detail", item.reason.detail);
  }
  // Inline, the member is the message; in hash mode the body is read by id (bounded by the
  // API to 1 MiB, and here to what is shown).
  let text = item.member;
  const t = triggers[selected];
  if (t && t.payload === "hash") {
    text = item.body_preview || "";
    if (item.member.length <= 2048) {
      try {
        const m = await api("GET", "/triggers/" + encodeURIComponent(selected) + "/messages/" + encodeURIComponent(item.member));
        for (const p of m.places) if (p.state !== item.kind.replace("inflight", "in_flight")) field(fields, "Also", p.state);
        text = m.body == null ? "(" + (m.body_size == null ? "no body" : m.body_size.toLocaleString() + " bytes: too large to show") + ")" : m.body;
      } catch (e) { text = "(" + e.message + ")"; }
    }
  }
  const env = envelope(text);
  if (env) {
    for (const [k, v] of env.fields) field(fields, k, typeof v === "string" ? v : JSON.stringify(v));
    for (const [k, v] of env.headers) field(headers, k, typeof v === "string" ? v : JSON.stringify(v));
    text = env.body;
  }
  if (!headers.children.length) field(headers, "-", "no envelope headers");
  $("#drawer-body").textContent = pretty(text);
  d.hidden = false;
  $("#drawer-close").focus();
}

function closeDrawer() {
  if ($("#drawer").hidden) return;
  $("#drawer").hidden = true;
  if (drawerFrom && document.contains(drawerFrom)) drawerFrom.focus();
}

// Search: an exact member or id first; else its prefix among the first scheduled pages.

/// Scheduled members a prefix search reads at most (4 pages of 250).
const PREFIX_SCAN = 1000;
let searching = false;

async function find() {
  const q = $("#search").value;
  if (!q || !selected) return;
  const t = encodeURIComponent(selected), found = $("#found");
  try {
    const m = await api("GET", "/triggers/" + t + "/messages/" + encodeURIComponent(q));
    const place = m.places[0] || {};
    found.textContent = q + ": " + m.places.map((p) => p.state).join(", ");
    const kind = { scheduled: "scheduled", in_flight: "inflight", dead: "dead" }[place.state];
    let reason = null;
    try { reason = place.reason ? JSON.parse(place.reason) : null; } catch (e) { /* as it is */ }
    drawer({ kind, member: q, due_ms: place.due_ms, attempts: place.attempts ?? (reason && reason.attempts),
      lease_deadline_ms: place.lease_deadline_ms, at_ms: place.at_ms, reason }, null);
    return;
  } catch (e) {
    if (e.status !== 404) { found.textContent = e.message; return; }
  }
  let after = null, read = 0;
  const hits = [];
  while (read < PREFIX_SCAN) {
    const page = await api("GET", "/triggers/" + t + "/scheduled?limit=250" + (after ? "&after=" + encodeURIComponent(after) : ""));
    read += page.items.length;
    hits.push(...page.items.filter((e) => e.member.startsWith(q)));
    after = page.next;
    if (!after) break;
  }
  searching = true;
  scheduledRows(hits.slice(0, 100));
  $("#next-page").disabled = true;
  found.textContent = hits.length + " scheduled " + (hits.length === 1 ? "message starts" : "messages start") + " with \u201c" + short(q, 60) +
    "\u201d among the first " + read.toLocaleString() + (after ? " (the search reads no further: First page ends it)" : "");
}

// Bulk actions on dead letters: each asks first, naming how many.

async function requeueAll() {
  const n = triggers[selected] ? triggers[selected].stats.dead : 0;
  if (!confirm("Requeue all " + n + " dead letters of " + selected + "? They will be sent now.")) return;
  let total = 0;
  try {
    for (let i = 0; i < 1000 && total < n; i++) {
      const r = await api("POST", "/triggers/" + encodeURIComponent(selected) + "/dead/requeue", { limit: Math.min(1000, n - total) });
      total += r.requeued;
      if (r.requeued === 0) break;
    }
    say("Requeued all: " + total + " dead letters scheduled again");
  } catch (e) { say("Requeue all failed after " + total + ": " + e.message, true); }
  await refresh();
}

function requeueOldest() {
  const n = Math.max(1, Math.min(1000, parseInt($("#requeue-count").value, 10) || 1));
  act("Requeued the oldest", selected, "/dead/requeue", { limit: n },
    "Requeue the " + n + " oldest dead letters of " + selected + "? They will be sent now.");
}

/// The reasons of the dead letters seen on this trigger's pages, for a purge by reason.
let seenReasons = { trigger: null, all: new Set() };
function reasons(items) {
  if (seenReasons.trigger !== selected) seenReasons = { trigger: selected, all: new Set() };
  for (const d of items) if (d.reason && d.reason.reason) seenReasons.all.add(d.reason.reason);
  const select = $("#purge-reason"), chosen = select.value;
  const wanted = [...seenReasons.all].sort();
  if ([...select.options].map((o) => o.value).join() === wanted.join()) return;
  select.replaceChildren(...wanted.map((r) => new Option(r, r, false, r === chosen)));
}

/// Counts the dead letters with the chosen reason (a dry run), asks with that count, purges.
async function purgeReason() {
  const reason = $("#purge-reason").value, t = selected;
  if (!reason) return;
  const path = "/triggers/" + encodeURIComponent(t) + "/purge";
  try {
    const n = (await api("POST", path, { what: "dead", reason, dry_run: true })).matching;
    if (!confirm("Delete the " + n + " dead letters of " + t + " whose reason is " + reason + ", for good?")) return;
    const r = await api("POST", path, { what: "dead", reason, confirm: true });
    say("Purged " + reason + ": " + r.deleted + " dead letters deleted");
  } catch (e) { say("Purge by reason failed: " + e.message, true); }
  await refresh();
}

function purgeDead() {
  const n = triggers[selected] ? triggers[selected].stats.dead : 0;
  act("Purged", selected, "/purge", { what: "dead", confirm: true },
    "Delete all " + n + " dead letters of " + selected + " for good?");
}

$("#login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("token", $("#token").value);
  say("Connected");
  refresh();
});
$("#first-page").addEventListener("click", () => { searching = false; cursor = null; $("#found").textContent = ""; detail(); });
$("#next-page").addEventListener("click", () => { cursor = $("#next-page").dataset.next || null; detail(); });
$("#dead-first").addEventListener("click", () => { deadCursor = null; detail(); });
$("#dead-next").addEventListener("click", () => { deadCursor = $("#dead-next").dataset.next || null; detail(); });
$("#find-form").addEventListener("submit", (e) => { e.preventDefault(); find(); });
$("#requeue-all").addEventListener("click", requeueAll);
$("#requeue-oldest").addEventListener("click", requeueOldest);
$("#purge-dead").addEventListener("click", purgeDead);
$("#purge-by-reason").addEventListener("click", purgeReason);
$("#drawer-close").addEventListener("click", closeDrawer);
document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDrawer(); });
for (const [id, name] of [["#window-15m", "15m"], ["#window-1h", "1h"]]) {
  $(id).addEventListener("click", () => {
    windowName = name;
    $("#window-15m").setAttribute("aria-pressed", String(name === "15m"));
    $("#window-1h").setAttribute("aria-pressed", String(name === "1h"));
    if (selected) detail();
  });
}
// A read-only API needs no token: the first reading tells, and then the console polls as if
// one were given.
let open = false;
api("GET", "/triggers").then(() => { open = true; refresh(); }, () => {
  if (sessionStorage.getItem("token")) refresh();
});
setInterval(() => { if (open || sessionStorage.getItem("token")) refresh(); }, 2000);
