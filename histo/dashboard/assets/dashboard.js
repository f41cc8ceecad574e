// anvilproxy dashboard. It polls three endpoints of the listener that
// served it, by relative URL: requests (the recent per-request timings;
// every 1.5 s), snapshot (the current window as an anvil-serving.benchmark/v1
// document, or the last complete one while the current has no request yet;
// every 4 s) and status (the counts since start; every 4 s), and draws
// everything as inline SVG. Percentiles are nearest rank, as in the v1
// schema. No content is ever shown: the endpoints carry none. Run without a
// document (node), it only exports its pure helpers, for the tests.
"use strict";
(() => {
  const REQUESTS_EVERY = 1500;
  const SNAPSHOT_EVERY = 4000;
  const HISTORY_MS = 5 * 60e3;
  const BUCKET_MS = 5e3;
  const MIN_SPAN_MS = 60e3;
  const WATERFALL_ROWS = 26;
  const MAX_KEPT = 20000;

  const seen = new Map(); // request id → record, oldest first
  let snap = null;
  let snapIsLast = false; // snap is the last complete window: the current one has no request yet
  let status = null;
  let baseline = null; // /diff: the window in progress against --baseline; null without one
  let skew = 0; // server clock − browser clock, ms
  let lastOK = 0;
  let lastError = "";
  // needToken is set when an endpoint answered 401: the proxy has an
  // --admin-token and the page was opened without #token= (or a wrong
  // one). Every panel then says so instead of "no requests yet".
  let needToken = false;

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const known = (v) => typeof v === "number" && isFinite(v);
  const now = () => Date.now() + skew;

  // With --admin-token, open the dashboard as /#token=THE-TOKEN: the
  // fragment never leaves the browser, and the token is sent as a bearer
  // credential to the endpoints that need it.
  const token = typeof location === "undefined" ? null : new URLSearchParams(location.hash.slice(1)).get("token");
  const auth = token ? { Authorization: "Bearer " + token } : {};

  async function getJSON(path) {
    const r = await fetch(path, { cache: "no-store", headers: auth });
    if (r.status === 401) {
      needToken = true;
      throw new Error(TOKEN_MESSAGE);
    }
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    needToken = false;
    // The server's clock places requests in time; the Date header has one
    // second resolution, so only a larger difference is taken as skew.
    const d = Date.parse(r.headers.get("Date") || "");
    if (isFinite(d)) {
      const s = d - Date.now();
      skew = Math.abs(s) > 2000 ? s : 0;
    }
    return r.json();
  }

  // ---- formatting ----

  function fmtMs(ms) {
    if (!known(ms)) return "–";
    const a = Math.abs(ms);
    if (a === 0) return "0";
    if (a < 1) return ms.toFixed(2) + "ms";
    if (a < 10) return ms.toFixed(1) + "ms";
    if (a < 1000) return Math.round(ms) + "ms";
    if (a < 10e3) return (ms / 1e3).toFixed(2) + "s";
    if (a < 120e3) return (ms / 1e3).toFixed(1) + "s";
    return (ms / 60e3).toFixed(1) + "m";
  }
  // axisFormat returns a formatter for the ticks of an axis up to maxMs:
  // one unit for the whole axis (ms, s or min, from its largest tick) and
  // the fewest decimals that tell its ticks apart, so that an axis never
  // reads "50.0s, 100.0s, 2.5m".
  function axisFormat(maxMs, stepMs) {
    const [div, unit] = maxMs >= 600e3 ? [60e3, "m"] : maxMs >= 1e3 ? [1e3, "s"] : [1, "ms"];
    const step = (stepMs || maxMs) / div;
    let dec = 0;
    while (dec < 3 && Math.abs(step * 10 ** dec - Math.round(step * 10 ** dec)) > 1e-6) dec++;
    return (ms) => (ms === 0 ? "0" : (ms / div).toFixed(dec) + unit);
  }

  // failureClass is histo.FailureClass (histo/failures.go): how a failed
  // request failed, in the words of the live table and the report.
  function failureClass(r) {
    if (r.error_kind === "client_gone") return "abandoned";
    if (r.status === 429 || r.status === 503) return "refused";
    return "errors";
  }
  // The routes that generate: proxy.Route.Generates (routes_test.go holds them equal).
  const INFERENCE = new Set(["chat", "completions", "responses", "messages", "llama_completion", "ollama_generate", "ollama_chat"]);
  const isInference = (r) => INFERENCE.has(r.route);

  // countsText is "168 requests, 16 failed (11 abandoned, 5 refused)" over
  // the inference records given.
  function countsText(recs) {
    const n = { abandoned: 0, refused: 0, errors: 0 };
    let failed = 0;
    for (const r of recs) if (r.failed) { failed++; n[failureClass(r)]++; }
    const parts = Object.entries(n).filter(([, v]) => v > 0).map(([k, v]) => `${v} ${k === "errors" && v === 1 ? "error" : k}`);
    return `${recs.length} request${recs.length === 1 ? "" : "s"}, ${failed} failed` + (parts.length ? ` (${parts.join(", ")})` : "");
  }

  // driftRows is the drift events in time order, the newest `max`.
  function driftRows(events, max) {
    return events.slice().sort((a, b) => Date.parse(a.at) - Date.parse(b.at)).slice(-max);
  }

  // engineView reads the snapshot's engine section (docs/engines.md): the
  // engine's own running and waiting counts, its token and prefill totals
  // against the proxy's, engine ÷ proxy (1.00× when the proxy sees all of
  // the engine's traffic), and whether the split reads that others share
  // the engine (shared). It returns {empty} or {big, pairs}.
  function engineView(e) {
    if (!e) return { empty: "not scraped: --engine-metrics is off" };
    if (e.state === "absent") return { empty: "the engine exports no /metrics (ollama; llama-server without --metrics)" };
    if (e.state !== "ok") return { empty: "engine /metrics: " + e.state };
    const ratio = (v) => (known(v) ? v.toFixed(2) + "×" : "–");
    const num = (v, d) => (known(v) ? (d === undefined ? String(v) : v.toFixed(d)) : "–");
    const pair = (a, b, r, d) => `${num(a, d)} / ${num(b, d)} (${ratio(r)})`;
    return {
      big: ratio(e.prompt_tokens_ratio),
      pairs: [["engine", e.kind], ["running", num(e.running)], ["waiting", num(e.waiting)],
        ["KV cache", known(e.kv_cache_usage) ? (100 * e.kv_cache_usage).toFixed(0) + "%" : "–"],
        ["prompt tok engine / proxy", pair(e.engine_prompt_tokens, e.proxy_prompt_tokens, e.prompt_tokens_ratio)],
        ["output tok engine / proxy", pair(e.engine_output_tokens, e.proxy_output_tokens, e.output_tokens_ratio)],
        ["prefill s engine / proxy", pair(e.engine_prefill_seconds, e.proxy_prefill_seconds, e.prefill_seconds_ratio, 2)],
        ["others share it", e.shared === "unknown" ? `unknown (${(100 * e.unaccounted_share).toFixed(0)}% of requests without usage)` : (e.shared || "–")]],
    };
  }

  if (typeof document === "undefined") {
    globalThis.anvilDashboard = { axisFormat, failureClass, countsText, driftRows, fmtMs, engineView };
    return;
  }

  const pct = (f) => (known(f) ? (100 * f).toFixed(f >= 0.995 || f < 0.1 ? 1 : 0) + "%" : "–");
  function fmtTok(n) {
    if (!known(n)) return "–";
    return n >= 10e3 ? (n / 1e3).toFixed(0) + "k" : n >= 1e3 ? (n / 1e3).toFixed(1) + "k" : String(n);
  }
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  function quantile(sorted, q) {
    if (sorted.length === 0) return NaN;
    return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)];
  }
  const width = (el, fallback) => Math.max(120, el.clientWidth || fallback);

  // ---- data ----

  function ingest(list) {
    for (let i = list.length - 1; i >= 0; i--) {
      const r = list[i];
      if (seen.has(r.id)) continue;
      const s = r.stamps_ms || {};
      r._t0 = Date.parse(r.start);
      const end = [s.client_done, s.end, r.e2e_ms].find(known);
      r._fin = r._t0 + (known(end) ? end : 0);
      seen.set(r.id, r);
    }
    const cutoff = now() - HISTORY_MS - BUCKET_MS;
    for (const [id, r] of seen) {
      if (seen.size > MAX_KEPT || r._fin < cutoff) seen.delete(id);
      else break;
    }
  }

  // timeRange is the x range of the charts over time: the last five
  // minutes, or less while there is less history, but at least one.
  function timeRange() {
    const end = now();
    let first = end;
    for (const r of seen.values()) first = Math.min(first, r._fin);
    const start = Math.max(end - HISTORY_MS, Math.min(end - MIN_SPAN_MS, Math.floor(first / BUCKET_MS) * BUCKET_MS));
    return [start, end];
  }
  const spanText = (ms) => (ms >= 90e3 ? "−" + Math.round(ms / 60e3) + "m" : "−" + Math.round(ms / 1e3) + "s");

  function records(since) {
    const out = [];
    for (const r of seen.values()) if (r._fin >= since) out.push(r);
    return out;
  }

  // ---- SVG helpers ----

  function svg(w, h, body, label) {
    return `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(label)}">${body}</svg>`;
  }
  const TOKEN_MESSAGE = token
    ? "the admin token in this page's address (#token=…) is not the proxy's --admin-token"
    : "this proxy has an --admin-token: open the dashboard as /#token=YOUR-TOKEN (the token stays in the browser)";
  const empty = (msg) => `<div class="empty">${esc(needToken ? "no data: " + TOKEN_MESSAGE : msg)}</div>`;

  // lineChart draws series of [x, y] points (y null breaks the line) over
  // the time range [x0, x1], y from 0.
  function lineChart(el, series, x0, x1, label) {
    const W = width(el, 250), H = 118, L = 40, R = 6, T = 6, B = 16;
    let max = 0;
    for (const s of series) for (const p of s.pts) if (p && known(p[1])) max = Math.max(max, p[1]);
    if (max === 0 && !series.some((s) => s.pts.some((p) => p && known(p[1])))) {
      el.innerHTML = empty("no requests yet");
      return;
    }
    const top = niceCeil(max * 1.05);
    const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const Y = (y) => T + (1 - y / top) * (H - T - B);
    const tick = axisFormat(top, top / 2);
    let b = "";
    for (const f of [0, 0.5, 1]) {
      b += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(f * top)}" y2="${Y(f * top)}"/>`;
      b += `<text x="${L - 4}" y="${Y(f * top) + 3}" text-anchor="end">${tick(f * top)}</text>`;
    }
    b += `<text x="${L}" y="${H - 3}">${spanText(x1 - x0)}</text><text x="${W - R}" y="${H - 3}" text-anchor="end">now</text>`;
    for (const s of series) {
      let d = "", pen = "M";
      for (const p of s.pts) {
        if (!p || !known(p[1])) { pen = "M"; continue; }
        d += `${pen}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
        pen = "L";
      }
      if (d) b += `<path class="${s.cls}" d="${d}"/>`;
      // A lone point draws no line: mark every point.
      for (const p of s.pts) if (p && known(p[1]) && s.dots) b += `<circle class="${s.cls}" cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="1.6"/>`;
    }
    el.innerHTML = svg(W, H, b, label);
  }

  // ---- panels ----

  const PHASES = [
    ["queue", "queue_ms"],
    ["prefill", "prefill_ms"],
    ["ttfo", "time_to_first_output_ms"],
    ["ttft", "ttft_ms"],
    ["tpot", "tpot_ms"],
  ];

  function renderPhases() {
    const [x0, t] = timeRange();
    const start = Math.floor(x0 / BUCKET_MS) * BUCKET_MS;
    const n = Math.ceil((t - start) / BUCKET_MS);
    const buckets = PHASES.map(() => Array.from({ length: n }, () => []));
    for (const r of records(start)) {
      if (r.failed || !isInference(r)) continue;
      const k = Math.floor((r._fin - start) / BUCKET_MS);
      if (k < 0 || k >= n) continue;
      PHASES.forEach(([, key], i) => { if (known(r[key])) buckets[i][k].push(r[key]); });
    }
    PHASES.forEach(([name], i) => {
      const p50 = [], p99 = [];
      buckets[i].forEach((vals, k) => {
        const x = Math.max(x0, Math.min(start + (k + 0.5) * BUCKET_MS, t));
        if (vals.length === 0) { p50.push(null); p99.push(null); return; }
        vals.sort((a, b) => a - b);
        p50.push([x, quantile(vals, 0.5)]);
        p99.push([x, quantile(vals, 0.99)]);
      });
      lineChart($("chart-" + name), [
        { cls: "p50 s-" + name, pts: p50, dots: true },
        { cls: "p99 s-" + name, pts: p99 },
      ], x0, t, name + " p50 and p99 over time");
    });
  }

  const SEGMENTS = [
    ["pqueue", "proxy queue"],
    ["connect", "connect"],
    ["queue", "engine queue"],
    ["unknown", "queue + prefill (split unknown)"],
    ["prefill", "prefill"],
    ["reasoning", "reasoning"],
    ["decode", "decode"],
  ];

  // segments lays a request's phases out from t_recv, in ms: proxy queue,
  // connect, engine queue, prefill up to the first output, reasoning up to
  // the first content, decode to the end of the upstream stream.
  function segments(r) {
    const s = r.stamps_ms || {};
    const out = [];
    const push = (a, b, cls) => { if (known(a) && known(b) && b > a) out.push([a, b, cls]); };
    const fo = s.first_output, fc = s.first_content;
    const end = [s.end, r.e2e_ms, s.client_done].find(known);
    const pq = known(r.proxy_queue_ms) ? r.proxy_queue_ms : 0;
    const conn = known(r.connect_ms) ? r.connect_ms : 0;
    if (!known(fo)) {
      push(0, end, "unknown");
      return out;
    }
    push(0, pq, "pqueue");
    if (known(r.queue_ms) && known(r.prefill_ms)) {
      const eq = Math.max(0, r.queue_ms - pq);
      push(pq, pq + conn, "connect");
      push(pq + conn, Math.min(fo, pq + conn + eq), "queue");
      push(Math.min(fo, pq + conn + eq), fo, "prefill");
    } else {
      push(pq, fo, "unknown");
    }
    const dec = known(fc) && fc > fo ? fc : fo;
    push(fo, dec, "reasoning");
    push(dec, end, "decode");
    return out;
  }

  const ROUTES = { chat: "chat", completions: "compl", responses: "resp", messages: "msgs" };

  function renderLegend() {
    const sw = (cls) => `<svg width="10" height="10" aria-hidden="true"><rect class="f-${cls}" width="10" height="10" rx="2"/></svg>`;
    $("legend").innerHTML = `<span>rows: route, prompt→output tokens, cached share</span>` + SEGMENTS.map(([cls, name]) => `<span>${sw(cls)}${esc(name)}</span>`).join("") +
      `<span><svg width="10" height="10" aria-hidden="true"><line class="fail" x1="1" y1="1" x2="9" y2="9"/><line class="fail" x1="9" y1="1" x2="1" y2="9"/></svg>failed</span>`;
  }

  function renderWaterfall() {
    const el = $("waterfall");
    renderOthers();
    const recs = [...seen.values()].filter(isInference).sort((a, b) => a._t0 - b._t0).slice(-WATERFALL_ROWS);
    if (recs.length === 0) {
      el.innerHTML = empty("no requests yet");
      $("where").innerHTML = "";
      return;
    }
    const W = width(el, 860), LBL = 160, R = 8, ROW = 12, GAP = 3, T = 2, B = 16;
    const t0 = Math.min(...recs.map((r) => r._t0));
    const t1 = Math.max(...recs.map((r) => r._fin), t0 + 1);
    const span = t1 - t0;
    const X = (ms) => LBL + (ms / span) * (W - LBL - R);
    const H = T + recs.length * (ROW + GAP) + B;
    let b = "";
    const step = niceCeil(span / 8);
    const tick = axisFormat(Math.floor(span / step) * step, step);
    for (let v = 0; v <= span; v += step) {
      b += `<line class="grid" x1="${X(v)}" x2="${X(v)}" y1="${T}" y2="${H - B}"/>`;
      b += `<text x="${X(v)}" y="${H - 4}" text-anchor="middle">${tick(v)}</text>`;
    }
    const totals = {};
    recs.forEach((r, i) => {
      const y = T + i * (ROW + GAP);
      const off = r._t0 - t0;
      const hit = known(r.cached_tokens) && r.prompt_tokens > 0 ? " " + pct(r.cached_tokens / r.prompt_tokens) : "";
      b += `<text class="label" x="0" y="${y + ROW - 2}">${esc(ROUTES[r.route] || r.route)} ${fmtTok(r.prompt_tokens)}→${fmtTok(r.output_tokens)}${esc(hit)}</text>`;
      const segs = segments(r);
      for (const [a, c, cls] of segs) {
        totals[cls] = (totals[cls] || 0) + (c - a);
        const x = X(off + a), w = Math.max(0.8, X(off + c) - X(off + a));
        b += `<rect class="f-${cls}" x="${x.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${ROW}"><title>${esc(SEGMENTS.find((s) => s[0] === cls)[1])}: ${fmtMs(c - a)}</title></rect>`;
      }
      if (r.failed) {
        const x = X(r._fin - t0);
        b += `<line class="fail" x1="${x - 4}" y1="${y + 1}" x2="${x + 4}" y2="${y + ROW - 1}"/><line class="fail" x1="${x + 4}" y1="${y + 1}" x2="${x - 4}" y2="${y + ROW - 1}"/>`;
      }
      b += `<rect x="${LBL}" y="${y}" width="${W - LBL - R}" height="${ROW}" fill="transparent"><title>${esc(tooltip(r))}</title></rect>`;
    });
    el.innerHTML = svg(W, H, b, "waterfall of the most recent requests");
    renderWhere(totals);
  }

  function tooltip(r) {
    const parts = [`${r.route} ${r.model || ""} status ${r.status}${r.failed ? " FAILED " + (r.error_kind || "") : ""}`,
      `queue ${fmtMs(r.queue_ms)} (${r.queue_source}) · prefill ${fmtMs(r.prefill_ms)} · ttfo ${fmtMs(r.time_to_first_output_ms)} · ttft ${fmtMs(r.ttft_ms)}`,
      `reasoning ${fmtMs(r.reasoning_ms)} · generation ${fmtMs(r.generation_ms)} · tpot ${fmtMs(r.tpot_ms)} · e2e ${fmtMs(r.e2e_ms)}`,
      `prompt ${r.prompt_tokens} (cached: engine ${r.cached_tokens}, inferred ${r.cache_inferred_tokens}) · output ${r.output_tokens} (reasoning ${r.reasoning_tokens})`];
    if (known(r.retry_attempt) && r.retry_attempt > 0) parts.push(`retry attempt ${r.retry_attempt}`);
    return parts.join("\n");
  }

  // renderWhere is one bar: the waterfall's time by phase, waiting (the
  // rail) against the engine working (the cook).
  function renderWhere(totals) {
    const el = $("where");
    const sum = Object.values(totals).reduce((a, b) => a + b, 0);
    if (!(sum > 0)) { el.innerHTML = ""; return; }
    const W = width(el, 860), H = 32, L = 160;
    let x = L, b = `<text class="label" x="0" y="13">where the time went</text>`;
    const wait = (totals.pqueue || 0) + (totals.queue || 0);
    const work = (totals.prefill || 0) + (totals.reasoning || 0) + (totals.decode || 0);
    b += `<text x="0" y="27">waiting ${pct(wait / sum)} · engine ${pct(work / sum)}</text>`;
    for (const [cls, name] of SEGMENTS) {
      const v = totals[cls] || 0;
      if (v <= 0) continue;
      const w = (v / sum) * (W - L - 8);
      b += `<rect class="f-${cls}" x="${x.toFixed(1)}" y="2" width="${w.toFixed(1)}" height="14"><title>${esc(name)}: ${pct(v / sum)}</title></rect>`;
      const label = (cls === "unknown" ? "unsplit" : name) + " " + pct(v / sum);
      if (w > label.length * 5.6 + 4) b += `<text x="${(x + 2).toFixed(1)}" y="28">${esc(label)}</text>`;
      x += w;
    }
    el.innerHTML = svg(W, H, b, "share of time by phase");
  }

  function renderGoodput() {
    const el = $("goodput"), note = $("goodput-note");
    const g = snap && snap.anvilproxy && snap.anvilproxy.goodput;
    if (!g) { el.innerHTML = empty("waiting for the first snapshot"); note.textContent = ""; return; }
    const curves = g.slos || [];
    const total = `${pct(g.ratio)} good: ${g.good} of ${g.requests} requests in ${windowName()}`;
    if (curves.length === 0) {
      el.innerHTML = `<div class="big">${pct(g.ratio)}</div>`;
      note.textContent = "no --slo configured: goodput is the share of requests that did not fail. " + total;
      return;
    }
    const W = width(el, 400), H = 150, L = 34, R = 8, T = 8, B = 30;
    const lo = Math.log2(0.25), hi = Math.log2(4);
    const X = (m) => L + ((Math.log2(m) - lo) / (hi - lo)) * (W - L - R);
    const Y = (f) => T + (1 - f) * (H - T - B);
    let b = "";
    for (const f of [0, 0.5, 1]) b += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(f)}" y2="${Y(f)}"/><text x="${L - 4}" y="${Y(f) + 3}" text-anchor="end">${f * 100}%</text>`;
    for (const m of [0.25, 0.5, 1, 2, 4]) b += `<text x="${X(m)}" y="${H - B + 12}" text-anchor="middle">${m}×</text>`;
    b += `<line class="budget" x1="${X(1)}" x2="${X(1)}" y1="${T}" y2="${H - B}"/>`;
    const legend = [];
    curves.forEach((c, i) => {
      const k = (i % 5) + 1;
      const pts = (c.curve || []).filter((p) => known(p.share));
      if (pts.length) {
        b += `<path class="p50 s-${k}" d="${pts.map((p, j) => (j ? "L" : "M") + X(p.multiple).toFixed(1) + "," + Y(p.share).toFixed(1)).join("")}"/>`;
        for (const p of pts) b += `<circle class="d-${k}" cx="${X(p.multiple).toFixed(1)}" cy="${Y(p.share).toFixed(1)}" r="2.5"><title>${esc(c.metric)} ≤ ${fmtMs(p.budget_ms)}: ${pct(p.share)}</title></circle>`;
      }
      legend.push(`<tspan class="d-${k}">■</tspan> ${esc(c.metric)} ≤ ${fmtMs(c.threshold_ms)}: ${pct(c.ratio)}`);
    });
    b += `<text class="label" x="${L}" y="${H - 4}">${legend.join("   ")}</text>`;
    el.innerHTML = svg(W, H, b, "goodput against budget multiples of each SLO");
    note.textContent = "goodput (every SLO, 1×): " + total;
  }

  function renderCache() {
    const el = $("cache"), note = $("cache-note");
    const [x0, t] = timeRange();
    const recs = records(x0).filter((r) => isInference(r) && !r.failed && r.prompt_tokens > 0);
    if (recs.length === 0) { el.innerHTML = empty("no requests yet"); note.textContent = ""; return; }
    const W = width(el, 400), H = 130, L = 34, R = 8, T = 6, B = 16;
    const X = (x) => L + ((x - x0) / (t - x0)) * (W - L - R);
    const Y = (f) => T + (1 - f) * (H - T - B);
    let b = "";
    for (const f of [0, 0.5, 1]) b += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(f)}" y2="${Y(f)}"/><text x="${L - 4}" y="${Y(f) + 3}" text-anchor="end">${f * 100}%</text>`;
    b += `<text x="${L}" y="${H - 3}">${spanText(t - x0)}</text><text x="${W - R}" y="${H - 3}" text-anchor="end">now</text>`;
    // The engine's word (dots) and the proxy's inference from prefill time
    // (crosses) are kept apart, never summed: an engine that reports
    // nothing has no engine figure, not 0%. The proxy's squares go first,
    // the engine's dots over them: where both agree (the usual case) the
    // dot stays visible inside its square.
    let cached = 0, prompt = 0, reuseN = 0, reuseSum = 0, inferred = 0, inferable = 0, dots = "";
    for (const r of recs) {
      if (known(r.cached_tokens)) {
        cached += r.cached_tokens;
        prompt += r.prompt_tokens;
        dots += `<circle class="dot-cache" cx="${X(r._fin).toFixed(1)}" cy="${Y(r.cached_tokens / r.prompt_tokens).toFixed(1)}" r="2.4"/>`;
      }
      if (known(r.cache_inferred_tokens)) {
        inferred += r.cache_inferred_tokens;
        inferable += r.prompt_tokens;
        const x = X(r._fin), y = Y(r.cache_inferred_tokens / r.prompt_tokens);
        b += `<path class="dot-inferred" d="M${(x - 2.5).toFixed(1)} ${(y - 2.5).toFixed(1)}l5 5m0 -5l-5 5"/>`;
      }
      if (known(r.prefix_reuse)) {
        reuseN++;
        reuseSum += r.prefix_reuse;
        b += `<rect class="dot-reuse" x="${(X(r._fin) - 3.5).toFixed(1)}" y="${(Y(r.prefix_reuse) - 3.5).toFixed(1)}" width="7" height="7"/>`;
      }
    }
    b += dots;
    el.innerHTML = svg(W, H, b, "prefix cache hit per request over time");
    const reuse = reuseN ? `proxy-side prefix reuse ${pct(reuseSum / reuseN)} mean over ${reuseN} (squares)` : "prefix reuse n/a (the proxy reports none)";
    const engine = prompt ? `engine-reported cache hit ${pct(cached / prompt)} of ${fmtTok(prompt)} prompt tokens (token-weighted; dots)` : "engine-reported cache hit: not reported";
    const guess = inferable ? `inferred from prefill time ${pct(inferred / inferable)} of ${fmtTok(inferable)} (crosses)` : "inferred: – (no cold prefill rate yet)";
    note.textContent = `${engine} · ${guess}, ${spanText(t - x0).slice(1)} · ${reuse}`;
  }

  // windowName names the window the snapshot panels show, with its
  // length: the snapshot window in progress (how far in, of
  // --snapshot-interval), or the last complete one.
  function windowName() {
    const a = snap && snap.anvilproxy;
    const len = status && status.snapshot_window && status.snapshot_window.seconds > 0 ? status.snapshot_window.seconds * 1e3 : NaN;
    if (snapIsLast) return "the last complete window" + (known(len) ? " (" + spanText(len).slice(1) + ")" : "") + "; this one has no request yet";
    if (!a || !a.window_start) return "this window";
    const so = Date.parse(a.window_end) - Date.parse(a.window_start);
    return "this window (" + spanText(so).slice(1) + " so far" + (known(len) ? " of " + spanText(len).slice(1) : "") + ")";
  }

  function kv(pairs) {
    return `<div class="kv">${pairs.map(([k, v]) => `<span>${esc(k)} <b>${esc(v)}</b></span>`).join("")}</div>`;
  }

  function table(cols, rows) {
    const head = cols.map((c) => `<th class="${c.num ? "num" : ""}">${esc(c.name)}</th>`).join("");
    const body = rows.map((r) => "<tr>" + cols.map((c) => `<td class="${c.num ? "num" : ""}">${esc(c.get(r))}</td>`).join("") + "</tr>").join("");
    return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
  }

  function hbars(items, W, label) {
    if (items.length === 0) return "";
    const max = Math.max(...items.map((i) => i[1]));
    const L = 190, ROW = 14, H = items.length * (ROW + 3);
    let b = "";
    items.forEach(([name, n], i) => {
      const y = i * (ROW + 3);
      const w = Math.max(1, (n / max) * (W - L - 40));
      b += `<text class="label" x="0" y="${y + 11}">${esc(name)}</text><rect class="f-queue" x="${L}" y="${y}" width="${w.toFixed(1)}" height="${ROW}"/><text x="${(L + w + 4).toFixed(1)}" y="${y + 11}">${n}</text>`;
    });
    return svg(W, H, b, label);
  }

  function renderRetry() {
    const el = $("retry");
    if (!snap) { el.innerHTML = empty("waiting for the first snapshot"); return; }
    const rs = snap.anvilproxy && snap.anvilproxy.retry;
    if (!rs) { el.innerHTML = empty("no retry data in " + windowName()); return; }
    const gap = rs.backoff_gap_ms || {};
    let h = `<div class="big">${known(rs.amplification) ? rs.amplification.toFixed(2) + "×" : "–"}</div><p class="note window">${esc(windowName())}</p>`;
    h += kv([["attempts", rs.attempts], ["logical", rs.logical_requests], ["retries", rs.retries],
      ["by SDK header", rs.retries_by_header], ["wasted prompt tok", fmtTok(rs.wasted_prompt_tokens)],
      ["wasted output tok", fmtTok(rs.wasted_completion_tokens)],
      ["backoff p50/p90", `${fmtMs(gap.p50)} / ${fmtMs(gap.p90)}`]]);
    const by = Object.entries(rs.retries_by_previous_outcome || {}).sort((a, b) => b[1] - a[1]);
    h += by.length ? hbars(by, width(el, 420), "retries by what ended the previous attempt") : `<div class="empty">no retries</div>`;
    const top = (rs.top_clients || []).filter((c) => c.retries > 0).slice(0, 5);
    if (top.length) {
      h += table([
        { name: "client", get: (c) => c.client },
        { name: "attempts", num: true, get: (c) => c.attempts },
        { name: "logical", num: true, get: (c) => c.logical_requests },
        { name: "retries", num: true, get: (c) => c.retries },
        { name: "ampl.", num: true, get: (c) => (known(c.amplification) ? c.amplification.toFixed(2) + "×" : "–") },
      ], top);
    }
    el.innerHTML = h;
  }

  // renderEngine shows the snapshot's engine section (engineView).
  function renderEngine() {
    const el = $("engine");
    if (!snap) { el.innerHTML = empty("waiting for the first snapshot"); return; }
    const v = engineView(snap.anvilproxy && snap.anvilproxy.engine);
    el.innerHTML = v.empty ? empty(v.empty) : `<div class="big">${esc(v.big)}</div>` + kv(v.pairs);
  }

  // renderDrift shows the snapshot's prefix section (docs/design.md "Prefix drift"): the
  // counts, drifts by segment and class, and the latest drift events. Keys
  // it does not know are shown as they come, so that a newer proxy's
  // additions are not hidden.
  function renderDrift() {
    const el = $("drift");
    if (!snap) { el.innerHTML = empty("waiting for the first snapshot"); return; }
    const p = snap.anvilproxy && snap.anvilproxy.prefix;
    if (p === null || p === undefined) { el.innerHTML = empty("not tracked: this proxy reports no prefix section"); return; }
    if (typeof p !== "object" || Array.isArray(p)) { el.innerHTML = generic(p, 0); return; }
    const rest = Object.assign({}, p);
    const take = (k) => { const v = rest[k]; delete rest[k]; return v; };
    const reuse = take("reuse") || {};
    const pairs = [["tracked", take("tracked")], ["drifts", take("drifts")], ["masked", take("masked_drifts")],
      ["prefix reuse mean", pct(reuse.mean)], ["p50", pct(reuse.p50)],
      ["cache checked", take("cache_checked")], ["miss despite reuse", take("cache_miss_despite_reuse")],
      ["expected cached tok", fmtTok(take("expected_cached_tokens"))], ["engine cached tok", fmtTok(take("engine_cached_tokens"))]]
      .filter(([, v]) => v !== undefined);
    let h = `<p class="note window">${esc(windowName())}</p>` + kv(pairs.map(([k, v]) => [k, scalar(v)]));
    const untracked = Object.entries(take("untracked") || {}).filter(([, n]) => n > 0);
    if (untracked.length) h += kv(untracked.map(([k, n]) => ["untracked " + k.replace(/_/g, " "), n]));
    const by = Object.entries(take("drifts_by_segment_class") || {}).sort((a, b) => b[1] - a[1]);
    if (by.length) h += hbars(by, Math.min(width(el, 600), 520), "drifts by segment/class");
    const events = take("recent_drifts");
    if (Array.isArray(events) && events.length) {
      h += table([
        { name: "at", get: (e) => (e.at ? new Date(e.at).toLocaleTimeString() : "–") },
        { name: "conversation", get: (e) => e.conversation },
        { name: "turn", num: true, get: (e) => e.turn },
        { name: "segment", get: (e) => e.segment + (e.segment === "message" || e.segment === "tools" ? " " + e.message_index : "") },
        { name: "role", get: (e) => e.role },
        { name: "offset", num: true, get: (e) => (known(e.offset) ? e.offset + (e.offset_exact === false ? "~" : "") : "–") },
        { name: "class", get: (e) => e.class },
        { name: "lost bytes", num: true, get: (e) => fmtTok(e.lost_bytes) },
      ], driftRows(events, 8));
    } else if (Array.isArray(events)) {
      h += `<div class="empty">no drift in ${windowName()}</div>`;
    }
    if (Object.keys(rest).length) h += generic(rest, 1);
    el.innerHTML = h;
  }

  function scalar(v) {
    if (v === null) return "–";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
    return String(v);
  }

  function generic(v, depth) {
    if (typeof v !== "object" || v === null) return kv([["value", scalar(v)]]);
    if (Array.isArray(v)) {
      if (v.length === 0) return `<div class="empty">none</div>`;
      if (typeof v[0] !== "object" || v[0] === null) return kv([["values", v.map(scalar).join(", ")]]);
      const keys = [];
      for (const row of v.slice(0, 50)) for (const k of Object.keys(row)) if (!keys.includes(k) && keys.length < 9) keys.push(k);
      return table(keys.map((k) => ({ name: k, num: typeof v[0][k] === "number", get: (r) => (typeof r[k] === "object" && r[k] !== null ? JSON.stringify(r[k]) : scalar(r[k])) })), v.slice(-12).reverse());
    }
    const pairs = [], nested = [];
    for (const [k, x] of Object.entries(v)) {
      if (typeof x === "object" && x !== null) nested.push([k, x]);
      else pairs.push([k.replace(/_/g, " "), scalar(x)]);
    }
    let h = pairs.length ? kv(pairs) : "";
    for (const [k, x] of nested) {
      if (depth >= 2) { h += kv([[k, JSON.stringify(x)]]); continue; }
      h += `<h2><small>${esc(k.replace(/_/g, " "))}</small></h2>` + generic(x, depth + 1);
    }
    return h || `<div class="empty">empty</div>`;
  }

  function renderHeader() {
    const st = $("status");
    const fresh = Date.now() - lastOK < 3 * REQUESTS_EVERY + 1000;
    st.className = "status " + (lastError ? "error" : fresh ? "live" : "stale");
    st.textContent = lastError ? "error" : fresh ? "live" : "stale";
    st.title = lastError || "updated " + new Date(lastOK).toLocaleTimeString();
    if (needToken) {
      st.textContent = "needs token";
      $("summary").textContent = TOKEN_MESSAGE;
      $("summary").className = "summary alert";
      return;
    }
    $("summary").className = "summary";
    // The last minutes of traffic, from the records: right after a window
    // ends, the window itself says "0 requests".
    // The counts since start and the records come from one poll, so they
    // agree; the records' span is given only when it is shorter than the
    // uptime (else it is the same requests, counted twice).
    const [x0, t] = timeRange();
    const recent = records(x0).filter(isInference);
    let text = `last ${spanText(t - x0).slice(1)}: ${countsText(recent)}`;
    if (status) {
      const since = `since start (${spanText(status.uptime_s * 1e3).slice(1)}): ${status.requests} request${status.requests === 1 ? "" : "s"}, ${status.failed} failed, ${status.retries} retr${status.retries === 1 ? "y" : "ies"}`;
      text = (status.uptime_s * 1e3 > t - x0 ? text + " · " : "") + since + ` · ${status.inflight} in flight`;
      if (status.upstream && !status.upstream.ready) text += ` · UPSTREAM NOT READY: ${status.upstream.reason}`;
    }
    const model = snap && snap.model;
    $("summary").textContent = (model ? model + " · " : "") + text;
  }

  // renderOthers lists the newest requests that are not inference (an
  // agent's probe of /v1/models, a path the engine answered 404): method,
  // path and status, as /requests has them.
  function renderOthers() {
    const el = $("others");
    const recs = [...seen.values()].filter((r) => !isInference(r)).sort((a, b) => a._t0 - b._t0).slice(-5);
    if (recs.length === 0) { el.innerHTML = ""; return; }
    el.innerHTML = `<h2><small>other requests (not inference), newest last</small></h2>` + table([
      { name: "at", get: (r) => new Date(r._t0).toLocaleTimeString() },
      { name: "method", get: (r) => r.method },
      { name: "path", get: (r) => r.path || "–" },
      { name: "route", get: (r) => r.route },
      { name: "status", num: true, get: (r) => r.status },
    ], recs);
  }

  // renderBaseline shows /diff as anvilproxy diff prints it: the verdict,
  // then each row's change at p50, p90 and p99, marked where it is inside
  // the noise or rests on too few samples. Without --baseline the panel
  // stays hidden.
  function renderBaseline() {
    const panel = $("baseline-panel");
    panel.hidden = !baseline;
    if (!baseline) return;
    const cell = (r, stat) => {
      const p = (r.points || []).find((x) => x.stat === stat);
      if (!p) return "";
      const rel = known(p.relative) ? (p.relative >= 0 ? "+" : "") + (100 * p.relative).toFixed(Math.abs(p.relative) >= 0.1 ? 0 : 1) + "%" : "–";
      const notes = [p.few_samples ? "n<" + p.samples_needed : "", p.inside_noise && known(p.change) ? "noise" : ""].filter(Boolean);
      return rel + (notes.length ? " (" + notes.join(", ") + ")" : "");
    };
    const rows = baseline.rows || [];
    $("baseline").innerHTML = `<p class="verdict">verdict: ${esc(baseline.verdict || "")}</p>` + table([
      { name: "metric", get: (r) => r.name },
      { name: "n base/now", num: true, get: (r) => (r.points[0] ? r.points[0].baseline_samples + "/" + r.points[0].current_samples : "") },
      { name: "p50", num: true, get: (r) => cell(r, "p50") || cell(r, "value") },
      { name: "p90", num: true, get: (r) => cell(r, "p90") },
      { name: "p99", num: true, get: (r) => cell(r, "p99") },
    ], rows) + `<p class="note">baseline ${esc(baseline.baseline.requests)} requests, ${esc(baseline.baseline.started_at)} to ${esc(baseline.baseline.finished_at)}; now ${esc(windowName())}</p>`;
  }

  function render() {
    renderHeader();
    renderBaseline();
    renderPhases();
    renderWaterfall();
    renderGoodput();
    renderCache();
    renderRetry();
    renderEngine();
    renderDrift();
    const ready = seen.size > 0 && snap !== null;
    document.body.dataset.ready = String(ready);
    document.body.dataset.requests = String(seen.size);
    document.body.dataset.svgs = String(document.querySelectorAll("main svg").length);
  }

  async function poll(fn, every) {
    for (;;) {
      if (!document.hidden) {
        try {
          await fn();
          lastOK = Date.now();
          lastError = "";
        } catch (e) {
          lastError = String(e && e.message ? e.message : e);
        }
        render();
      }
      await new Promise((res) => setTimeout(res, every));
    }
  }

  renderLegend();
  window.addEventListener("resize", render);
  poll(async () => {
    const [reqs, st] = await Promise.all([getJSON("requests?limit=512"), getJSON("status")]);
    ingest(reqs.requests || []);
    status = st;
  }, REQUESTS_EVERY);
  poll(async () => {
    const cur = await getJSON("snapshot");
    snap = cur;
    snapIsLast = false;
    if (cur.requests === 0) {
      try {
        const last = await getJSON("snapshot?window=last");
        if (last.requests > 0) { snap = last; snapIsLast = true; }
      } catch (e) { /* no window has ended yet */ }
    }
    try { baseline = await getJSON("diff"); } catch (e) { baseline = null; }
  }, SNAPSHOT_EVERY);
})();
