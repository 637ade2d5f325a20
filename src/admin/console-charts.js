"use strict";
// The console's charts: the forecast's bars and the history's lines, drawn as SVG.

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
