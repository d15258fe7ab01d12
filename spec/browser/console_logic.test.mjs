// The console's arithmetic, without a browser: what the dashboard derives from GET
// /metrics (rates, error shares, histogram quantiles, restarts) and the ranges and
// queries of the usage reports (computed by the server). These modules are the ones the console bundles
// (admin-ui/src/*.js), imported as they are.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { histogramQuantile, parsePrometheus, ratePoint, refusalRows, summarize } from '../../admin-ui/src/metrics.js';
import { money } from '../../admin-ui/src/format.js';
import { dayBound, nextDay, presetRange, reportQuery, seriesOf } from '../../admin-ui/src/usage.js';

const close = (a, b, eps = 1e-9, what = '') => assert.ok(Math.abs(a - b) <= eps, `${what}: ${a} != ${b}`);

/** Prometheus text like the gateway's (core/src/base/tg_metrics.c). */
function metricsText({ ok = 0, e401 = 0, e502 = 0, aborted = 0, admin = 0, ttft = [] } = {}) {
  const les = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
  const lines = ['# HELP tollgate_requests_total Requests answered, by route and status.', '# TYPE tollgate_requests_total counter'];
  if (ok) lines.push(`tollgate_requests_total{route="chat_completions",status="200"} ${ok}`);
  if (e401) lines.push(`tollgate_requests_total{route="chat_completions",status="401"} ${e401}`);
  if (e502) lines.push(`tollgate_requests_total{route="chat_completions",status="502"} ${e502}`);
  if (aborted) lines.push(`tollgate_requests_total{route="chat_completions",status="499"} ${aborted}`);
  if (admin) lines.push(`tollgate_requests_total{route="admin",status="200"} ${admin}`);
  lines.push('# TYPE tollgate_ttft_seconds histogram');
  for (const le of les) lines.push(`tollgate_ttft_seconds_bucket{le="${le}"} ${ttft.filter((v) => v <= le).length}`);
  lines.push(`tollgate_ttft_seconds_bucket{le="+Inf"} ${ttft.length}`);
  lines.push(`tollgate_ttft_seconds_sum ${ttft.reduce((a, b) => a + b, 0)}`, `tollgate_ttft_seconds_count ${ttft.length}`);
  lines.push('tollgate_inflight_requests 3', 'tollgate_connections 7', 'tollgate_tokens_total{kind="input"} 11', 'tollgate_tokens_total{kind="output"} 22');
  return `${lines.join('\n')}\n`;
}

test('parsePrometheus reads names, labels, values and +Inf', () => {
  const m = parsePrometheus('# HELP x\na 1\nb{x="1",y="a\\"b"} 2.5\nc_bucket{le="+Inf"} +Inf\n');
  assert.deepEqual(m[0], { name: 'a', labels: {}, value: 1 });
  assert.deepEqual(m[1].labels, { x: '1', y: 'a\\"b' });
  assert.equal(m[1].value, 2.5);
  assert.equal(m[2].value, Infinity);
});

test('summarize counts client traffic only, errors without client aborts', () => {
  const s = summarize(parsePrometheus(metricsText({ ok: 10, e401: 2, e502: 1, aborted: 4, admin: 50 })), 1000);
  assert.equal(s.requests, 17, 'admin polling is not client traffic');
  assert.equal(s.errors, 3, '401 and 502 are errors; 499 (client went away) is not');
  assert.equal(s.serverErrors, 1);
  assert.equal(s.byStatus['chat_completions 200'], 10);
  assert.equal(s.inflight, 3);
  assert.equal(s.connections, 7);
  assert.equal(s.tokensIn, 11);
  assert.equal(s.tokensOut, 22);
});

test('histogramQuantile interpolates inside the bucket like Prometheus', () => {
  // 100 observations evenly in (0.1, 0.25]: p50 is half way through that bucket.
  const h = [[0.1, 0], [0.25, 100], [Infinity, 100]];
  close(histogramQuantile(0.5, h), 0.175, 1e-12, 'p50');
  close(histogramQuantile(0.95, h), 0.1 + 0.15 * 0.95, 1e-12, 'p95');
  assert.equal(histogramQuantile(0.5, [[0.1, 0], [Infinity, 0]]), null, 'empty');
  // Everything beyond the last finite bucket: the quantile is that bucket's bound.
  assert.equal(histogramQuantile(0.99, [[60, 0], [Infinity, 5]]), 60);
});

test('ratePoint: requests/s, error shares and TTFT quantiles between two samples', () => {
  const a = summarize(parsePrometheus(metricsText({ ok: 10, ttft: Array(10).fill(0.04) })), 10_000);
  const fast = Array(10).fill(0.04);
  const slow = [...Array(18).fill(0.2), 0.7, 0.7];
  const b = summarize(parsePrometheus(metricsText({ ok: 30, e401: 4, e502: 1, ttft: [...fast, ...slow] })), 12_000);
  const p = ratePoint(a, b);
  close(p.rps, 25 / 2, 1e-9, 'rps');
  close(p.errorPct, (100 * 5) / 25, 1e-9, 'error %');
  close(p.serverErrorPct, 100 / 25, 1e-9, '5xx %');
  // Only the 20 new observations count: 18 in (0.1, 0.25], 2 in (0.5, 1].
  assert.ok(p.p50ms > 100 && p.p50ms <= 250, `p50 ${p.p50ms}`);
  assert.ok(p.p95ms > 500 && p.p95ms <= 1000, `p95 ${p.p95ms}`);
});

test('ratePoint skips an interval in which the gateway restarted', () => {
  const a = summarize(parsePrometheus(metricsText({ ok: 100 })), 0);
  const b = summarize(parsePrometheus(metricsText({ ok: 3 })), 2000);
  assert.equal(ratePoint(a, b), null);
  assert.equal(ratePoint(a, a), null, 'no time passed');
});

test('usage reports: presets end at the next whole UTC hour, custom days are [from, to + 1 day), queries keep group_by', () => {
  const now = Date.parse('2026-11-20T12:34:56.789Z');
  assert.deepEqual(presetRange(24, now), { from: '2026-11-19T13:00:00Z', to: '2026-11-20T13:00:00Z' });
  assert.deepEqual(presetRange(14 * 24, now), { from: '2026-11-06T13:00:00Z', to: '2026-11-20T13:00:00Z' });
  assert.equal(dayBound('2026-11-30'), '2026-11-30T00:00:00Z');
  assert.equal(dayBound('30.11.2026'), '');
  assert.equal(nextDay('2026-11-30'), '2026-12-01');
  assert.equal(reportQuery({ from: 'a', to: 'b', groupBy: '', filters: { tenant_id: '', model: ' m ' }, limit: 100 }), 'from=a&to=b&group_by=&model=m&limit=100');
  const s = seriesOf([{ hour: '2026-11-20T10:00:00Z', requests: 3, successes: 2, cost: '0.5' }, { day: '2026-11-21', requests: 1, successes: 1, cost: 0 }]);
  assert.deepEqual(s, { xs: [Date.parse('2026-11-20T10:00:00Z') / 1000, Date.parse('2026-11-21T00:00:00Z') / 1000], ok: [2, 1], bad: [1, 0], cost: [0.5, 0] });
});

test('money shows what is stored: at least 2 decimals, every further non-zero digit, no float rounding', () => {
  assert.equal(money('0.000117'), '$0.000117');
  assert.equal(money('15.5000000000'), '$15.50');
  assert.equal(money(15.5), '$15.50');
  assert.equal(money('1234567.1234567891'), '$1,234,567.1234567891');
  assert.equal(money('0'), '$0.00');
  assert.equal(money(0.1 + 0.2), '$0.30');
  assert.equal(money(null), '—');
});

test('refusals by reason: counts since start and between two samples, largest recent first', () => {
  const a = summarize(parsePrometheus('tollgate_refusals_total{code="invalid_api_key"} 5\n'));
  const b = summarize(parsePrometheus('tollgate_refusals_total{code="invalid_api_key"} 6\ntollgate_refusals_total{code="no_account_available"} 4\n'));
  assert.deepEqual(refusalRows(a, b), [
    { code: 'no_account_available', total: 4, recent: 4 },
    { code: 'invalid_api_key', total: 6, recent: 1 },
  ]);
  assert.deepEqual(refusalRows(null, a), [{ code: 'invalid_api_key', total: 5, recent: 0 }]);
});

test('quotaLines: windows and limits with the share used and the countdown to the reset (quota #20)', async () => {
  const { countdown, quotaLines } = await import('../../admin-ui/src/quota.js');
  assert.equal(countdown(12_000), '12 s');
  assert.equal(countdown(7 * 60_000), '7 min');
  assert.equal(countdown(3 * 3_600_000), '3 h');
  assert.equal(countdown(-5), '0 s');
  const now = 1_000_000;
  const q = {
    known: true,
    now_ms: now + 500, // the gateway's clock runs 500 ms ahead of the browser's
    blocked_until_ms: now + 60_500,
    windows: [{ name: 'short', used: 1, reset_at_ms: now + 60_500, window_ms: 18e6, status: 'rejected' },
      { name: 'long', used: 0.25, reset_at_ms: now + 500 + 2 * 86_400_000, window_ms: 6048e5, status: 'allowed' }],
    limits: [{ name: 'input_tokens', limit: 40000, remaining: 30000, reset_at_ms: now + 500 + 30_000 }],
  };
  const lines = quotaLines(q, now);
  assert.deepEqual(lines.map((l) => [l.label, l.text, l.reset, l.spent]), [
    ['5 h', '100%', '60 s', true],
    ['7 d', '25%', '2 d', false],
    ['input tokens', '30,000 / 40,000 left', '30 s', false],
  ]);
  assert.equal(lines[2].used, 0.25);
  assert.deepEqual(quotaLines({ known: false }, now), []);
  assert.deepEqual(quotaLines(null, now), []);
});

test('bedrockFields: the accounts form\'s AWS fields become settings and a write-only credential (providers #19)', async () => {
  const { bedrockFields } = await import('../../admin-ui/src/bedrock.js');
  const v = { aws_region: ' us-east-1 ', aws_access_key_id: 'AKIDEXAMPLE', aws_secret: 'wJalr/K7+KEY', aws_session_token: '' };
  assert.deepEqual(bedrockFields(v, null), { settings: { region: 'us-east-1', access_key_id: 'AKIDEXAMPLE' }, credential: 'wJalr/K7+KEY' });
  assert.deepEqual(bedrockFields({ ...v, aws_session_token: 'TOK/1=' }, null).credential, 'wJalr/K7+KEY:TOK/1=');
  // Editing: a blank secret keeps the stored one; other settings are kept.
  const acc = { has_credential: true, settings: { region: 'eu-west-1', access_key_id: 'OLD', other: 'x' } };
  assert.deepEqual(bedrockFields({ ...v, aws_secret: '' }, acc), { settings: { region: 'us-east-1', access_key_id: 'AKIDEXAMPLE', other: 'x' } });
  const field = (f) => (e) => e.field === f;
  assert.throws(() => bedrockFields({ ...v, aws_region: 'US East' }, null), field('aws_region'));
  assert.throws(() => bedrockFields({ ...v, aws_access_key_id: 'akid' }, null), field('aws_access_key_id'));
  assert.throws(() => bedrockFields({ ...v, aws_secret: '' }, null), field('aws_secret'));
  assert.throws(() => bedrockFields({ ...v, aws_secret: '', aws_session_token: 'T' }, acc), field('aws_secret'));
});
