"use strict";
const $ = (sel) => document.querySelector(sel);
let selected = null, cursor = null, deadCursor = null, last = {}, triggers = {};
let windowName = "15m", staleSince = null, drawerFrom = null;
/// The trigger the status line is about: it is cleared when another one is chosen.
let statusAbout = null;

function say(text, error, about) {
  const s = $("#status");
  s.textContent = text;
  s.className = error ? "error" : "";
  statusAbout = about || null;
}

/// What the console says when the API refuses the token.
const UNAUTHORIZED = "unauthorized: the admin token was refused (type the right one and Connect)";

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

// Scores of -inf and +inf arrive as words ("now", "parked") beside a null time.
const when = (ms, word) => {
  if (word === "now") return "now (-inf)";
  if (word === "parked") return "parked (+inf)";
  if (typeof ms !== "number" || Number.isNaN(ms)) return "-";
  return local(new Date(ms)) + " (" + relative(ms) + ")";
};
const age = (s) => s < 1 ? "-" : s < 120 ? s.toFixed(0) + " s" : (s / 60).toFixed(1) + " min";
const seconds = (s) => s == null ? "-" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(s < 10 ? 2 : 0) + " s";

// A member for a table cell or a question: long ones (inline, the member is the message)
// show their start and their length, so a large message cannot push the actions away.
const short = (text, most = 120) =>
  text.length <= most ? text : text.slice(0, most) + "\u2026 (" + text.length.toLocaleString() + " characters)";

/// A member as shown: cut as `short` does, and marked when it is not UTF-8 (the API sends it
/// in base64 beside its text, and the console names it by that base64).
const shownMember = (item, most) => short(item.member, most) + (item.member_b64 ? " [not UTF-8]" : "");

/// The body of an action on one message: the member as text, or in base64 when it is not UTF-8.
const naming = (item) => item.member_b64 ? { members_b64: [item.member_b64] } : { members: [item.member] };

// What an action's answer means, in words, naming the trigger; an action on named messages
// that changed none says so.
function outcome(what, trigger, r, named) {
  const n = (count, one, many) => count + " " + (count === 1 ? one : many);
  const on = what + " on " + trigger + ": ";
  const count = r.cancelled ?? r.requeued ?? r.changed;
  const none = named && count === 0 ? " (none was there to act on any more: sent, cancelled or moved meanwhile)" : "";
  if ("paused" in r) return trigger + (r.changed ? (r.paused ? " paused" : " resumed") : (r.paused ? " was already paused" : " was not paused"));
  if ("cancelled" in r) return on + n(r.cancelled, "message", "messages") + none;
  if ("deleted" in r) return on + n(r.deleted, "message", "messages") + " deleted";
  if ("requeued" in r) return on + n(r.requeued, "dead letter", "dead letters") + " scheduled again" + none;
  if ("changed" in r) return on + n(r.changed, "message", "messages") + none;
  return what;
}

async function act(what, trigger, path, body, question) {
  if (question && !confirm(question)) return false;
  const named = body && (body.members || body.members_b64) ? true : false;
  try {
    const r = await api("POST", "/triggers/" + encodeURIComponent(trigger) + path, body);
    say(outcome(what, trigger, r, named), false, trigger);
    await refresh();
    return true;
  } catch (e) {
    say(what + " on " + trigger + " failed: " + (e.status === 401 ? UNAUTHORIZED : e.message), true, trigger);
    return false;
  }
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
  if (e.status === 401) say(UNAUTHORIZED, true);
}

function fresh() {
  staleSince = null;
  $("#stale").hidden = true;
  for (const el of [$("#triggers"), $("#detail")]) el.classList.remove("stale");
}

/// Reads the triggers and the selected one's detail; false when the API did not answer.
async function refresh() {
  let data;
  try { data = await api("GET", "/triggers"); }
  catch (e) { stale(e); return false; }
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
    for (const count of ["scheduled", "due", "inflight", "dead"]) cell(row, s[count], "num", count);
    cell(row, age(s.oldest_due_age_seconds), "num", "oldest");
    cell(row, seconds(t.lateness_p99_1m_seconds), "num", "lateness");
    const prev = last[t.name];
    const rate = prev ? (t.forwarded_total - prev.total) * 1000 / Math.max(1, now - prev.at) : null;
    last[t.name] = { total: t.forwarded_total, at: now };
    cell(row, rate == null ? "-" : rate.toFixed(1), "num", "rate");
    // A held trigger (its destination fails: `state: "held"`, `held.reason` what the broker
    // or endpoint said) shows "held" and why; a pause by an operator comes first.
    const held = !s.paused && t.state === "held";
    const why = (t.held && t.held.reason) || "";
    const state = s.paused ? "paused" : held ? "held" + (why ? ": " + why : "") : "active";
    const limit = t.rate_limit ? " · limit " + t.rate_limit.per_second + "/s, burst " + t.rate_limit.burst : "";
    cell(row, state + limit, held ? "held" : s.paused ? "paused" : "", "state");
    const actions = row.insertCell();
    if (s.paused) button(actions, "Resume", "resume", { trigger: t.name }, () => act("Resumed", t.name, "/resume"));
    else button(actions, "Pause", "pause", { trigger: t.name }, () => act("Paused", t.name, "/pause", undefined,
      "Pause " + t.name + "? Every bridge stops claiming its messages until it is resumed."));
  }
  if (selected) await detail();
  return true;
}

/// Shows trigger `name`'s detail; `keep` keeps the pages and search the URL named.
async function select(name, keep) {
  if (statusAbout && statusAbout !== name) say("");
  if (selected !== name) closeDrawer();
  selected = name;
  if (!keep) {
    cursor = null;
    deadCursor = null;
    searching = false;
    searched = "";
    $("#search").value = "";
    $("#found").textContent = "";
  }
  $("#detail").hidden = false;
  $("#detail-name").textContent = name;
  route();
  if ((await refresh()) && !triggers[name]) say("no trigger named " + name + " on this bridge", true, name);
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
    if (m.member_b64) row.dataset.memberB64 = m.member_b64;
    const item = { kind, ...m };
    fill(row, item);
    openable(row, item);
  }
}

/// The actions on one message (`item.kind` says where it is), in its row or the drawer: Show
/// (rows only), Promote and Cancel when scheduled, Requeue when dead. An action in the drawer
/// closes it once done.
function messageActions(parent, item, row, inDrawer) {
  const data = { member: item.member.length <= 256 ? item.member : "" };
  const done = (ok) => { if (ok && inDrawer) closeDrawer(); };
  if (!inDrawer) button(parent, "Show", "show", data, () => drawer(item, row));
  if (item.kind === "scheduled") {
    button(parent, "Promote", "promote", data, async () => done(await act("Promoted", selected, "/promote", naming(item))));
    button(parent, "Cancel", "cancel", data, async () => done(await act("Cancelled", selected, "/cancel", naming(item),
      "Cancel " + shownMember(item, 60) + "? It will not be sent.")), true);
  }
  if (item.kind === "dead") {
    button(parent, "Requeue", "requeue", data, async () => done(await act("Requeued", selected, "/dead/requeue", naming(item),
      "Requeue " + shownMember(item, 60) + "? It will be sent now.")));
  }
}

function scheduledRows(items) {
  memberRows("#scheduled tbody", "scheduled", items, (row, e) => {
    cell(row, when(e.due_ms, e.due));
    cell(row, shownMember(e), "member");
    cell(row, e.attempts, "num");
    cell(row, e.body_size == null ? "" : short(e.body_preview, 160) + (e.body_size > e.body_preview.length ? " ..." : ""), "member");
    messageActions(row.insertCell(), e, row);
  });
}

/// The trigger's schedules, the config's and those added at run time, with their last and
/// next fire.
function scheduleRows(items) {
  const body = $("#schedules tbody");
  body.replaceChildren();
  for (const s of items) {
    const row = body.insertRow();
    row.dataset.schedule = s.name;
    cell(row, s.name, "", "name");
    cell(row, s.source, "", "source");
    cell(row, s.cron, "member", "cron");
    cell(row, s.timezone, "", "timezone");
    cell(row, s.misfire, "", "misfire");
    cell(row, when(s.last_fire_ms), "", "last");
    cell(row, when(s.next_fire_ms), "", "next");
  }
  $("#schedules-note").textContent = items.length ? "" : "No schedules: add one in the config or with `delay-bridge schedule add`.";
}

/// Which call of `detail` is the latest: an earlier one answered later (the 2 s refresh beside
/// a click) paints nothing over it.
let detailCalls = 0;

async function detail() {
  const t = encodeURIComponent(selected), call = ++detailCalls;
  try {
    const [f, page, dead, inflight, history, schedules] = await Promise.all([
      api("GET", "/triggers/" + t + "/forecast?bucket_ms=60000&buckets=60"),
      searching ? null : api("GET", "/triggers/" + t + "/scheduled?limit=25" + (cursor ? "&after=" + encodeURIComponent(cursor) : "")),
      api("GET", "/triggers/" + t + "/dead?limit=25" + (deadCursor ? "&after=" + encodeURIComponent(deadCursor) : "")),
      api("GET", "/triggers/" + t + "/inflight?limit=25"),
      api("GET", "/triggers/" + t + "/history?window=" + windowName),
      api("GET", "/triggers/" + t + "/schedules"),
    ]);
    if (call !== detailCalls) return;
    chart(f);
    charts(history);
    scheduleRows(schedules.schedules);
    if (page && !searching) {
      scheduledRows(page.items);
      $("#next-page").disabled = !page.next;
      $("#next-page").dataset.next = page.next || "";
    }
    memberRows("#inflight tbody", "inflight", inflight.items, (row, m) => {
      cell(row, when(m.lease_deadline_ms, m.lease_deadline));
      cell(row, shownMember(m), "member");
      messageActions(row.insertCell(), m, row);
    });
    memberRows("#dead tbody", "dead", dead.items, (row, d) => {
      cell(row, when(d.at_ms, d.at));
      cell(row, shownMember(d), "member");
      cell(row, d.reason ? d.reason.reason : "-", "", "reason");
      cell(row, d.attempts == null ? "-" : d.attempts, "num", "attempts");
      cell(row, d.detail ? short(String(d.detail), 160) : "", "member", "detail");
      messageActions(row.insertCell(), d, row);
    });
    reasons(dead.items);
    $("#dead-next").disabled = !dead.next;
    $("#dead-next").dataset.next = dead.next || "";
    const n = triggers[selected] ? triggers[selected].stats.dead : 0;
    $("#requeue-all").textContent = "Requeue all (" + n + ")";
    $("#purge-dead").textContent = "Purge all dead letters (" + n + ")";
  } catch (e) { stale(e); }
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
    say("Requeued all on " + selected + ": " + total + " dead letters scheduled again", false, selected);
  } catch (e) { say("Requeue all on " + selected + " failed after " + total + ": " + e.message, true, selected); }
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
    say("Purged " + reason + " on " + t + ": " + r.deleted + " dead letters deleted", false, t);
  } catch (e) { say("Purge by reason on " + t + " failed: " + e.message, true, t); }
  await refresh();
}

function purgeDead() {
  const n = triggers[selected] ? triggers[selected].stats.dead : 0;
  act("Purged", selected, "/purge", { what: "dead", confirm: true },
    "Delete all " + n + " dead letters of " + selected + " for good?");
}

$("#first-page").addEventListener("click", () => { searching = false; searched = ""; cursor = null; $("#found").textContent = ""; route(); detail(); });
$("#next-page").addEventListener("click", () => { cursor = $("#next-page").dataset.next || null; route(); detail(); });
$("#dead-first").addEventListener("click", () => { deadCursor = null; route(); detail(); });
$("#dead-next").addEventListener("click", () => { deadCursor = $("#dead-next").dataset.next || null; route(); detail(); });
$("#requeue-all").addEventListener("click", requeueAll);
$("#requeue-oldest").addEventListener("click", requeueOldest);
$("#purge-dead").addEventListener("click", purgeDead);
$("#purge-by-reason").addEventListener("click", purgeReason);
function pressWindow(name) {
  windowName = name;
  $("#window-15m").setAttribute("aria-pressed", String(name === "15m"));
  $("#window-1h").setAttribute("aria-pressed", String(name === "1h"));
}
for (const [id, name] of [["#window-15m", "15m"], ["#window-1h", "1h"]]) {
  $(id).addEventListener("click", () => {
    pressWindow(name);
    route();
    if (selected) detail();
  });
}
