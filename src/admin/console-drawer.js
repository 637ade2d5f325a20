"use strict";
// The console's message drawer, its search, and the URL that names what is shown; loaded
// last, it connects.

/// Text shown in the drawer: at most this many characters of a body.
const SHOWN = 65536;
/// Longest member (or base64 of one) asked for by its name in a URL; a longer one is asked
/// for, and linked, by the id its consumers see.
const NAMED = 2048;

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

/// The API path of one message of the selected trigger, by member (base64 when it is not
/// UTF-8); `null` for a member too long for a URL: inline, the row has all of it, and asking
/// by its id would read the whole queue.
function messagePath(item) {
  const base = "/triggers/" + encodeURIComponent(selected) + "/messages/";
  if (item.member_b64 && item.member_b64.length <= NAMED) return base + encodeURIComponent(item.member_b64) + "?encoding=base64";
  if (!item.member_b64 && item.member.length <= NAMED) return base + encodeURIComponent(item.member);
  return null;
}

/// A message as `GET .../messages/M` answers it, as a row's item: its first place.
function fromMessage(m) {
  const place = m.places[0] || {};
  let reason = null;
  try { reason = place.reason ? JSON.parse(place.reason) : null; } catch (e) { /* as it is */ }
  return {
    kind: { scheduled: "scheduled", in_flight: "inflight", dead: "dead" }[place.state],
    member: m.member, member_b64: m.member_b64, id: m.id, member_size: m.member_size,
    due_ms: place.due_ms, due: place.due, attempts: place.attempts ?? (reason && reason.attempts),
    lease_deadline_ms: place.lease_deadline_ms, lease_deadline: place.lease_deadline,
    at_ms: place.at_ms, at: place.at, reason, detail: place.detail, message: m,
  };
}

/// The message drawer: the message's member, the id consumers see, where it is, its
/// actions, headers and body. The message is read from the API for its id, its other
/// places and, in hash mode, its body.
async function drawer(item, row) {
  drawerFrom = row ? row.querySelector("button") || row : document.activeElement;
  const d = $("#drawer"), fields = $("#drawer-fields"), headers = $("#drawer-headers");
  opened = item;
  route();
  const t = triggers[selected], hash = t && t.payload === "hash";
  let m = item.message || null, failed = null;
  const path = m ? null : messagePath(item);
  if (path) {
    try { m = await api("GET", path); } catch (e) { failed = e.message; }
  }
  fields.replaceChildren();
  headers.replaceChildren();
  $("#drawer-title").textContent = shownMember(item, 80);
  field(fields, "Member", shownMember(item, 400));
  if (item.member_b64) field(fields, "Member (base64)", short(item.member_b64, 400));
  field(fields, "Id", (m && m.id) || item.id || "-");
  field(fields, "State", { scheduled: "scheduled", inflight: "in flight", dead: "dead letter" }[item.kind]);
  if (item.kind === "scheduled") {
    field(fields, "Due", when(item.due_ms, item.due));
    field(fields, "Attempts", item.attempts);
  }
  if (item.kind === "inflight") field(fields, "Lease ends", when(item.lease_deadline_ms, item.lease_deadline));
  if (item.kind === "dead") {
    field(fields, "Dead since", when(item.at_ms, item.at));
    field(fields, "Attempts", item.attempts == null ? "-" : item.attempts);
    field(fields, "Reason", item.reason ? item.reason.reason : "-");
    const detail = item.detail || (item.reason && item.reason.detail);
    if (detail) field(fields, "Detail", detail);
  }
  if (m) for (const p of m.places) if (p.state !== item.kind.replace("inflight", "in_flight")) field(fields, "Also", p.state);
  const actions = $("#drawer-actions");
  actions.replaceChildren();
  messageActions(actions, item, null, true);
  // Inline, the member is the message; in hash mode the body is read by id (bounded by the
  // API to 1 MiB, and here to what is shown).
  let text = item.member;
  if (hash) {
    text = item.body_preview || "";
    if (m) text = m.body == null ? "(" + (m.body_size == null ? "no body" : m.body_size.toLocaleString() + " bytes: too large to show") + ")" : m.body;
    else if (failed) text = "(" + failed + ")";
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
  opened = null;
  route();
  if (drawerFrom && document.contains(drawerFrom)) drawerFrom.focus();
}

// Search: the API finds a member, an id in hash mode or the id consumers see, over the whole
// queue; else the text's prefix among the first scheduled pages.

/// Scheduled members a prefix search reads at most (4 pages of 250).
const PREFIX_SCAN = 1000;
let searching = false, searched = "";

async function find() {
  const q = $("#search").value;
  if (!q || !selected) return;
  searched = q;
  route();
  const t = encodeURIComponent(selected), found = $("#found");
  try {
    const m = await api("GET", "/triggers/" + t + "/messages/" + encodeURIComponent(q));
    const by = { member: "", consumer_id: " (the id its consumers see)", envelope_id: " (its envelope's id, which its consumers see)" }[m.found_by] || "";
    found.textContent = short(q, 60) + by + ": " + m.places.map((p) => p.state.replace("_", " ")).join(", ");
    await drawer(fromMessage(m), null);
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
  // A refresh under way read the first page: it shows nothing over the matches.
  detailCalls++;
  scheduledRows(hits.slice(0, 100));
  $("#next-page").disabled = true;
  found.textContent = hits.length + " scheduled " + (hits.length === 1 ? "message starts" : "messages start") + " with \u201c" + short(q, 60) +
    "\u201d among the first " + read.toLocaleString() + (after ? " (the search reads no further: First page ends it)" : "") +
    "; no message has it as its member or id";
}

// The URL names what is shown, as `#t=TRIGGER&w=1h&s=PAGE&d=PAGE&q=SEARCH&m=MEMBER`
// (`mb=` a member in base64, `id=` a message by the id its consumers see): a pasted link
// opens the same view, and a reload keeps it.

/// The message in the drawer (its item), or `null`.
let opened = null;

/// The URL's hash for what is shown now.
function routeHash() {
  const p = new URLSearchParams();
  if (selected) p.set("t", selected);
  if (windowName !== "15m") p.set("w", windowName);
  if (cursor) p.set("s", cursor);
  if (deadCursor) p.set("d", deadCursor);
  if (searched) p.set("q", searched);
  if (opened) {
    if (opened.member_b64 && opened.member_b64.length <= NAMED) p.set("mb", opened.member_b64);
    else if (!opened.member_b64 && opened.member.length <= NAMED) p.set("m", opened.member);
    else if (opened.id) p.set("id", opened.id);
  }
  return p.toString();
}

/// Writes the view into the URL (replacing the history entry: a reload or a link opens it).
function route() {
  const h = routeHash();
  if (location.hash.slice(1) !== h) history.replaceState(null, "", h ? "#" + h : location.pathname + location.search);
}

/// Opens the view the URL names: the trigger, its pages and history window, a search, and a
/// message in the drawer.
async function applyRoute() {
  const p = new URLSearchParams(location.hash.slice(1));
  pressWindow(p.get("w") === "1h" ? "1h" : "15m");
  const t = p.get("t");
  if (!t) return;
  cursor = p.get("s");
  deadCursor = p.get("d");
  searching = false;
  searched = p.get("q") || "";
  $("#search").value = searched;
  $("#found").textContent = "";
  await select(t, true);
  if (searched && !p.has("m") && !p.has("mb") && !p.has("id")) await find();
  const base = "/triggers/" + encodeURIComponent(t) + "/messages/";
  const path = p.has("mb") ? base + encodeURIComponent(p.get("mb")) + "?encoding=base64"
    : p.has("m") ? base + encodeURIComponent(p.get("m"))
    : p.has("id") ? base + encodeURIComponent(p.get("id")) : null;
  if (!path) return;
  try { await drawer(fromMessage(await api("GET", path)), null); }
  catch (e) { say("The linked message: " + e.message, true, t); }
}

/// Connected (or reloaded): the triggers, then the view the URL names.
async function start() {
  if (await refresh()) await applyRoute();
}

$("#login").addEventListener("submit", async (e) => {
  e.preventDefault();
  sessionStorage.setItem("token", $("#token").value);
  try {
    await api("GET", "/triggers");
    say("Connected");
  } catch (err) {
    say(err.status === 401 ? UNAUTHORIZED : "Not connected: " + err.message, true);
    if (err.status === 401) return;
  }
  await start();
});
$("#find-form").addEventListener("submit", (e) => { e.preventDefault(); find(); });
$("#drawer-close").addEventListener("click", closeDrawer);
document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDrawer(); });
// A link pasted into this tab's address bar.
window.addEventListener("hashchange", () => { if (location.hash.slice(1) !== routeHash()) applyRoute(); });
// A read-only API needs no token: the first reading tells, and then the console polls as if
// one were given.
let open = false;
api("GET", "/triggers").then(() => { open = true; start(); }, (e) => {
  if (sessionStorage.getItem("token")) start();
  else if (e.status === 401) say("Type the admin token to connect");
});
setInterval(() => { if (open || sessionStorage.getItem("token")) refresh(); }, 2000);
