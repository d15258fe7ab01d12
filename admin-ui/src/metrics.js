// The dashboard's arithmetic on GET /metrics (Prometheus text), kept free of the DOM so
// node:test can check it (spec/browser/console_logic.test.mjs).
//
// The gateway's counters only grow (they restart from zero when the process does), so
// every rate is the difference of two samples divided by the time between them; a
// counter that went down means a restart and that interval is skipped.

/** Routes whose requests are client traffic (not the console's own polling). */
export const TRAFFIC_ROUTES = new Set(['chat_completions', 'messages', 'responses', 'embeddings', 'models']);

/** Parses Prometheus text into [{name, labels, value}]. */
export function parsePrometheus(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const lm of (m[2] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2];
    const v = m[3] === '+Inf' ? Infinity : Number(m[3]);
    out.push({ name: m[1], labels, value: v });
  }
  return out;
}

/**
 * One sample of what the dashboard needs, from parsed metrics: totals of client traffic
 * by status class, the TTFT histogram's cumulative buckets, and the gauges.
 */
export function summarize(series, t = Date.now()) {
  const s = {
    t,
    requests: 0,
    errors: 0,        // 4xx and 5xx of client traffic
    serverErrors: 0,  // 5xx (and 499 client aborts are not counted as errors)
    byRoute: {},
    byStatus: {},     // "route status" -> count, client traffic only
    ttft: [],         // [[le, cumulative count]] sorted by le
    ttftCount: 0,
    ttftSum: 0,
    inflight: 0,
    connections: 0,
    tokensIn: 0,
    tokensOut: 0,
    upstreamErrors: 0,
    clientAborts: 0,
    refusals: {},     // the gateway's own error answers by code (tollgate_refusals_total)
    stickyBound: 0,   // requests of a bound conversation (tollgate_sticky_bound_total)
    stickyHits: 0,    // of those, sent to the bound account
    quotaSkips: 0,    // accounts passed over because their provider said they were spent
  };
  const buckets = new Map();
  for (const m of series) {
    switch (m.name) {
      case 'tollgate_requests_total': {
        const route = m.labels.route;
        if (!TRAFFIC_ROUTES.has(route)) break;
        s.requests += m.value;
        s.byRoute[route] = (s.byRoute[route] || 0) + m.value;
        const k = `${route} ${m.labels.status}`;
        s.byStatus[k] = (s.byStatus[k] || 0) + m.value;
        const st = m.labels.status === 'other' ? 0 : Number(m.labels.status);
        if (st >= 400 && st !== 499) s.errors += m.value;
        if (st >= 500) s.serverErrors += m.value;
        break;
      }
      case 'tollgate_ttft_seconds_bucket':
        buckets.set(m.labels.le === '+Inf' ? Infinity : Number(m.labels.le), m.value);
        break;
      case 'tollgate_ttft_seconds_count':
        s.ttftCount = m.value;
        break;
      case 'tollgate_ttft_seconds_sum':
        s.ttftSum = m.value;
        break;
      case 'tollgate_inflight_requests':
        s.inflight = m.value;
        break;
      case 'tollgate_connections':
        s.connections = m.value;
        break;
      case 'tollgate_tokens_total':
        if (m.labels.kind === 'input') s.tokensIn = m.value;
        if (m.labels.kind === 'output') s.tokensOut = m.value;
        break;
      case 'tollgate_upstream_errors_total':
        s.upstreamErrors = m.value;
        break;
      case 'tollgate_client_aborts_total':
        s.clientAborts = m.value;
        break;
      case 'tollgate_refusals_total':
        s.refusals[m.labels.code] = m.value;
        break;
      case 'tollgate_sticky_bound_total':
        s.stickyBound = m.value;
        break;
      case 'tollgate_sticky_hits_total':
        s.stickyHits = m.value;
        break;
      case 'tollgate_quota_skips_total':
        s.quotaSkips = m.value;
        break;
      default:
        break;
    }
  }
  s.ttft = [...buckets.entries()].sort((a, b) => a[0] - b[0]);
  return s;
}

/**
 * The q-quantile (0..1) of a histogram given as cumulative [[le, count]], interpolating
 * linearly inside the bucket as Prometheus's histogram_quantile does. null when empty.
 */
export function histogramQuantile(q, cumulative) {
  if (!cumulative.length) return null;
  const total = cumulative[cumulative.length - 1][1];
  if (!(total > 0)) return null;
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, count] of cumulative) {
    if (count >= rank) {
      if (le === Infinity) return prevLe; // beyond the last finite bucket: its bound
      const inBucket = count - prevCount;
      if (inBucket <= 0) return le;
      return prevLe + (le - prevLe) * ((rank - prevCount) / inBucket);
    }
    prevLe = le === Infinity ? prevLe : le;
    prevCount = count;
  }
  return prevLe;
}

/** The histogram of what happened between two samples (b later than a). */
export function histogramDelta(a, b) {
  const before = new Map(a.ttft);
  return b.ttft.map(([le, c]) => [le, Math.max(0, c - (before.get(le) ?? 0))]);
}

/**
 * One point of the live charts from two samples: requests/s, error share (%), 5xx
 * share (%), p50 and p95 TTFT (ms) of the requests in between. null when the gateway
 * restarted in between (a counter went down) or no time passed.
 */
export function ratePoint(a, b) {
  const dt = (b.t - a.t) / 1000;
  if (!(dt > 0) || b.requests < a.requests || b.ttftCount < a.ttftCount) return null;
  const dReq = b.requests - a.requests;
  const dErr = b.errors - a.errors;
  const d5xx = b.serverErrors - a.serverErrors;
  const h = histogramDelta(a, b);
  const p50 = histogramQuantile(0.5, h);
  const p95 = histogramQuantile(0.95, h);
  return {
    t: b.t,
    rps: dReq / dt,
    errorPct: dReq > 0 ? (100 * dErr) / dReq : null,
    serverErrorPct: dReq > 0 ? (100 * d5xx) / dReq : null,
    p50ms: p50 === null ? null : p50 * 1000,
    p95ms: p95 === null ? null : p95 * 1000,
  };
}

/** Refusals by code between two samples (a, b): [{code, total, recent}] sorted by recent
 *  then total, largest first; `recent` is b - a (0 without a), `total` since start. */
export function refusalRows(a, b) {
  if (!b) return [];
  return Object.entries(b.refusals || {})
    .map(([code, total]) => ({ code, total, recent: a ? Math.max(0, total - (a.refusals?.[code] || 0)) : 0 }))
    .sort((x, y) => y.recent - x.recent || y.total - x.total || x.code.localeCompare(y.code));
}
