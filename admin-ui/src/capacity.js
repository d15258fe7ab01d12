// The capacity report, computed in the browser from usage rows (GET /admin/api/v1/usage)
// and the price list, because the admin API has no per-account summary. Free of the DOM
// so node:test checks it (spec/browser/console_logic.test.mjs).
//
// What is approximate, and shown as such on the page:
//  - A usage row is one billed request, attributed to the account that answered last;
//    attempts that failed on another account before a retry are not in the rows, so a
//    429 an account gave before the request moved elsewhere is not counted against it.
//  - Equivalent value uses today's list prices, not the prices on the day of the request.
//  - Token counts the upstream did not report (null) count as zero.
//  - Utilisation is the sum of request durations divided by (window × the account's
//    concurrency limit): the average share of its slots in use, not a peak.

/** Cost in USD of one row's tokens at list price p (per million tokens), like the
 *  gateway's billing: reasoning tokens are part of output and priced apart when the
 *  price list has a reasoning price. */
export function listValue(row, p) {
  if (!p) return 0;
  const n = (v) => (v == null ? 0 : Number(v));
  const out = n(row.output_tokens);
  const reasoning = Math.min(n(row.reasoning_tokens), out);
  const reasoningPrice = p.reasoning == null ? Number(p.output) : Number(p.reasoning);
  return (
    (n(row.input_tokens) * Number(p.input) +
      (out - reasoning) * Number(p.output) +
      reasoning * reasoningPrice +
      n(row.cache_read_tokens) * Number(p.cache_read) +
      n(row.cache_write_tokens) * Number(p.cache_write)) /
    1e6
  );
}

/** The q-quantile (0..1) of numbers by the nearest-rank method; null when empty. */
export function quantile(values, q) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1));
  return s[i];
}

const ok = (st) => st != null && st >= 200 && st < 300;

/**
 * One line per account for the rows created within `days` days before `now` (ms):
 * {accountId, name, requests, successes, successRate, share429, p95TtftMs, tokens,
 *  value, utilisation, unpricedModels}. Accounts without rows are listed with zeros so
 * idle capacity shows. Rows without an account (static upstream) are grouped under id
 * null.
 */
export function capacityReport(rows, { accounts = [], prices = [], days, now = Date.now() }) {
  const from = now - days * 86400e3;
  const priceOf = new Map(prices.map((p) => [p.model, p]));
  const acc = new Map();
  const line = (id) => {
    if (!acc.has(id)) {
      const a = accounts.find((x) => x.id === id);
      acc.set(id, {
        accountId: id,
        name: a ? a.name : id == null ? '(static upstream)' : `account ${id}`,
        concurrency: a ? Number(a.concurrency) : null,
        status: a ? a.status : null,
        requests: 0,
        successes: 0,
        with429: 0,
        withStatus: 0,
        ttfts: [],
        tokens: 0,
        value: 0,
        busyMs: 0,
        unpriced: new Set(),
      });
    }
    return acc.get(id);
  };
  for (const a of accounts) line(a.id);
  for (const r of rows) {
    const t = Date.parse(r.created_at);
    if (!(t >= from && t <= now)) continue;
    const l = line(r.account_id ?? null);
    l.requests++;
    if (r.status != null) l.withStatus++;
    if (r.status === 429) l.with429++;
    if (r.total_ms != null) l.busyMs += Number(r.total_ms);
    if (!ok(r.status)) continue;
    l.successes++;
    if (r.ttft_ms != null && r.ttft_ms >= 0) l.ttfts.push(Number(r.ttft_ms));
    const tok = ['input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens'].reduce(
      (s, k) => s + (r[k] == null ? 0 : Number(r[k])),
      0,
    );
    l.tokens += tok;
    const p = priceOf.get(r.model);
    if (!p) l.unpriced.add(r.model);
    l.value += listValue(r, p);
  }
  const windowMs = days * 86400e3;
  return [...acc.values()]
    .map((l) => ({
      accountId: l.accountId,
      name: l.name,
      status: l.status,
      concurrency: l.concurrency,
      requests: l.requests,
      successes: l.successes,
      successRate: l.withStatus ? l.successes / l.withStatus : null,
      share429: l.withStatus ? l.with429 / l.withStatus : null,
      p95TtftMs: quantile(l.ttfts, 0.95),
      tokens: l.tokens,
      value: l.value,
      utilisation: l.concurrency ? l.busyMs / (windowMs * l.concurrency) : null,
      unpricedModels: [...l.unpriced].sort(),
    }))
    .sort((a, b) => b.value - a.value || b.requests - a.requests || String(a.name).localeCompare(String(b.name)));
}
