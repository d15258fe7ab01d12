// The console's arithmetic, without a browser: what the dashboard derives from GET
// /metrics (rates, error shares, histogram quantiles, restarts), the capacity report
// from usage rows, and the CSV export. These modules are the ones the console bundles
// (admin-ui/src/*.js), imported as they are.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { capacityReport, listValue, quantile } from '../../admin-ui/src/capacity.js';
import { csvCell, toCsv, USAGE_COLUMNS } from '../../admin-ui/src/csv.js';
import { histogramQuantile, parsePrometheus, ratePoint, refusalRows, summarize } from '../../admin-ui/src/metrics.js';
import { money } from '../../admin-ui/src/format.js';

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

test('listValue prices like billing: reasoning is part of output, priced apart when set', () => {
  const row = { input_tokens: 1_000_000, output_tokens: 500_000, reasoning_tokens: 100_000, cache_read_tokens: 200_000, cache_write_tokens: null };
  const p = { input: 0.15, output: 0.6, cache_read: 0.075, cache_write: 0.3, reasoning: null };
  close(listValue(row, p), 0.15 + 0.5 * 0.6 + 0.2 * 0.075, 1e-12, 'reasoning as output');
  close(listValue(row, { ...p, reasoning: 2 }), 0.15 + 0.4 * 0.6 + 0.1 * 2 + 0.2 * 0.075, 1e-12, 'reasoning priced');
  assert.equal(listValue(row, undefined), 0, 'no price');
});

test('quantile uses the nearest rank', () => {
  const v = Array.from({ length: 100 }, (_, i) => i + 1);
  assert.equal(quantile(v, 0.95), 95);
  assert.equal(quantile([5], 0.95), 5);
  assert.equal(quantile([], 0.95), null);
});

test('capacityReport: value, success rate, 429 share, P95 TTFT, utilisation per account, window', () => {
  const now = Date.parse('2026-11-20T12:00:00Z');
  const at = (daysAgo) => new Date(now - daysAgo * 86400e3).toISOString();
  const accounts = [
    { id: 1, name: 'a', concurrency: 2, status: 'active' },
    { id: 2, name: 'b', concurrency: 1, status: 'active' },
    { id: 3, name: 'idle', concurrency: 4, status: 'disabled' },
  ];
  const prices = [{ model: 'm', input: 1, output: 2, cache_read: 0, cache_write: 0, reasoning: null }];
  const rows = [];
  for (let i = 0; i < 18; i++) rows.push({ account_id: 1, model: 'm', status: 200, input_tokens: 1e6, output_tokens: 0, ttft_ms: 100 + i, total_ms: 3600e3, created_at: at(1) });
  rows.push({ account_id: 1, model: 'm', status: 429, input_tokens: null, output_tokens: null, ttft_ms: null, total_ms: 10, created_at: at(2) });
  rows.push({ account_id: 1, model: 'm', status: 502, input_tokens: 5e6, output_tokens: 0, ttft_ms: 9999, total_ms: 10, created_at: at(2) });
  rows.push({ account_id: 2, model: 'x', status: 200, input_tokens: 10, output_tokens: 10, ttft_ms: 50, total_ms: 10, created_at: at(3) });
  rows.push({ account_id: 2, model: 'm', status: 200, input_tokens: 1e6, output_tokens: 1e6, ttft_ms: 50, total_ms: 10, created_at: at(10) });

  const r7 = capacityReport(rows, { accounts, prices, days: 7, now });
  assert.deepEqual(r7.map((r) => r.name), ['a', 'b', 'idle'], 'by value, idle accounts listed');
  const a = r7[0];
  assert.equal(a.requests, 20);
  assert.equal(a.successes, 18);
  close(a.successRate, 18 / 20, 1e-12, 'success rate');
  close(a.share429, 1 / 20, 1e-12, '429 share');
  close(a.value, 18 * 1, 1e-9, 'only successful tokens are valued');
  assert.equal(a.p95TtftMs, 117, 'P95 of successful requests only');
  close(a.utilisation, (18 * 3600e3 + 20) / (7 * 86400e3 * 2), 1e-12, 'utilisation');
  const b = r7[1];
  assert.equal(b.requests, 1, 'the 10-day-old row is outside 7 days');
  assert.deepEqual(b.unpricedModels, ['x']);
  assert.equal(b.value, 0);
  assert.equal(r7[2].requests, 0);
  assert.equal(r7[2].successRate, null);

  const r14 = capacityReport(rows, { accounts, prices, days: 14, now });
  const b14 = r14.find((r) => r.name === 'b');
  assert.equal(b14.requests, 2);
  close(b14.value, 1 + 2, 1e-9, 'value in 14 days');
});

test('toCsv quotes what needs quoting and defuses spreadsheet formulas', () => {
  assert.equal(csvCell(null), '');
  assert.equal(csvCell('a,b'), '"a,b"');
  assert.equal(csvCell('say "hi"'), '"say ""hi"""');
  assert.equal(csvCell('=HYPERLINK("x")'), `"'=HYPERLINK(""x"")"`);
  assert.equal(csvCell(-5), '-5', 'numbers are not formulas');
  const csv = toCsv([{ id: 1, model: 'gpt-4o-mini', cost: 0.0001, request_id: 'r\n1' }]);
  const [head, row] = csv.split('\r\n');
  assert.equal(head, USAGE_COLUMNS.join(','));
  assert.ok(row.startsWith('1,'));
  assert.ok(csv.includes('"r\n1"'));
  assert.ok(csv.endsWith('\r\n'));
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
