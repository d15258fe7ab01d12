// No request reaches the upstream more often than the attempt limit, and nothing is
// retried once a byte has reached the client.
//
//   group `pool`: four equal accounts, routing.max_attempts = 3
//   group `two`:  four more accounts, used through a second instance with max_attempts 2
//   group `st`:   three healthy accounts for the streaming tests
//   group `rl`:   two accounts that both answer 429
// plus the config file's static key, which uses the static upstream (no retries).
// The mock counts requests per credential, so every upstream call is visible.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { CLIENT_KEY, UPSTREAM_KEY, mockText, sseContent } from './lib/harness.mjs';
import { credOf, startRouting } from './lib/routing.mjs';

const MAX_ATTEMPTS = 3;
let rt;

before(async () => {
  rt = await startRouting({
    groups: ['pool', 'two', 'st', 'rl'],
    accounts: [
      ...['a', 'b', 'c', 'd'].map((name) => ({ name, groups: ['pool'] })),
      ...['e', 'f', 'g', 'h'].map((name) => ({ name, groups: ['two'] })),
      ...['s1', 's2', 's3'].map((name) => ({ name, groups: ['st'] })),
      ...['x', 'y'].map((name) => ({ name, groups: ['rl'] })),
    ],
    routing: { max_attempts: MAX_ATTEMPTS, cooldown_5xx_ms: 60000, cooldown_429_ms: 60000 },
  });
});

after(() => rt?.stop());

/** Upstream requests per credential, and in total, since `before` (a stats object). */
async function callsSince(before) {
  const now = (await rt.mock.stats()).credentials || {};
  const out = { total: 0 };
  for (const [cred, s] of Object.entries(now)) {
    const d = s.requests - (before[cred]?.requests ?? 0);
    if (d) {
      out[cred] = d;
      out.total += d;
    }
  }
  return out;
}
const snapshot = async () => (await rt.mock.stats()).credentials || {};

test(`every account returns 500: the client gets the 500 after exactly ${MAX_ATTEMPTS} upstream calls`, async () => {
  for (const n of ['a', 'b', 'c', 'd']) await rt.fault(n, { status: 500 });
  const before = await snapshot();
  const r = await rt.chat('all failing [mock chunks=2]');
  const calls = await callsSince(before);
  assert.equal(r.status, 500, r.text);
  assert.equal(r.json?.error?.type !== undefined, true, `the upstream's error body is passed through: ${r.text}`);
  assert.equal(calls.total, MAX_ATTEMPTS, `upstream calls: ${JSON.stringify(calls)}`);
  assert.equal(Object.keys(calls).length - 1, MAX_ATTEMPTS, `each attempt on another account: ${JSON.stringify(calls)}`);
});

test(`while they keep failing, no request makes more than ${MAX_ATTEMPTS} upstream calls`, async () => {
  for (let i = 0; i < 10; i++) {
    const before = await snapshot();
    const r = await rt.chat(`still failing ${i} [mock chunks=2]`);
    const calls = await callsSince(before);
    assert.ok(calls.total <= MAX_ATTEMPTS, `request ${i}: ${calls.total} upstream calls (${JSON.stringify(calls)}), status ${r.status}`);
    assert.ok(r.status === 500 || r.status === 503, `request ${i}: status ${r.status}: ${r.text}`);
  }
  await rt.clearFaults();
});

test('the limit is the configured one: max_attempts = 2 makes exactly 2 upstream calls', async () => {
  const gw2 = await rt.another({ routing: { ...rt.gw.config.routing, max_attempts: 2 } }, { wait: ['two'] });
  for (const n of ['e', 'f', 'g', 'h']) await rt.fault(n, { status: 502 });
  const before = await snapshot();
  const r = await rt.chat('two attempts [mock chunks=2]', {}, { key: rt.keys.two, gw: gw2 });
  const calls = await callsSince(before);
  assert.equal(r.status, 502, r.text);
  assert.equal(calls.total, 2, `upstream calls: ${JSON.stringify(calls)}`);
  await rt.clearFaults();
  await gw2.stop();
});

test('a key without a group uses the static upstream: one call, no retry', async () => {
  await rt.faultCredential(UPSTREAM_KEY, { status: 500 });
  const before = await snapshot();
  const r = await rt.chat('static [mock chunks=2]', {}, { key: CLIENT_KEY });
  const calls = await callsSince(before);
  assert.equal(r.status, 500, r.text);
  assert.deepEqual(calls, { total: 1, [UPSTREAM_KEY]: 1 });
  await rt.clearFaults();
});

test('nothing is retried once a byte reached the client: a stream cut after 3 chunks', async () => {
  const before = await snapshot();
  const r = await rt.stream('cut [mock chunks=10 interval_ms=20 close_after=3]', {}, { key: rt.keys.st });
  const calls = await callsSince(before);
  assert.equal(r.status, 200);
  assert.equal(r.complete, false, `the client sees a truncated stream (no final chunk): ${r.error}`);
  assert.ok(!r.text.includes('[DONE]'), r.text);
  assert.equal(sseContent(r.text.slice(0, r.text.lastIndexOf('\n\n') + 2)), mockText(3), `the 3 chunks sent before the cut:\n${r.text}`);
  assert.equal(calls.total, 1, `the upstream saw exactly one request: ${JSON.stringify(calls)}`);
});

test('a stream that fails before its first byte is retried (the contrast to the cut stream)', async () => {
  // Two of the three accounts answer 503; streams until one was first sent to one of
  // them (selection among equals is random).
  for (const n of ['s1', 's2']) await rt.fault(n, { status: 503 });
  let calls = { total: 0 };
  for (let i = 0; i < 20 && calls.total < 2; i++) {
    const before = await snapshot();
    const r = await rt.stream(`retried ${i} [mock chunks=4]`, {}, { key: rt.keys.st });
    calls = await callsSince(before);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.complete, true);
    assert.equal(sseContent(r.text), mockText(4));
    assert.ok(calls.total <= MAX_ATTEMPTS, `upstream calls: ${JSON.stringify(calls)}`);
    assert.equal(calls[credOf('s3')], 1, `answered by the healthy account: ${JSON.stringify(calls)}`);
  }
  assert.ok(calls.total >= 2, 'one of the streams was first sent to a failing account and retried');
  await rt.clearFaults();
});

test('every account rate limited: the client gets the provider 429 with its Retry-After', async () => {
  await rt.fault('x', { status: 429, retry_after: 7 });
  await rt.fault('y', { status: 429, retry_after: 7 });
  const before = await snapshot();
  const r = await rt.chat('rate limited everywhere [mock chunks=2]', {}, { key: rt.keys.rl });
  const calls = await callsSince(before);
  assert.ok(calls.total <= MAX_ATTEMPTS, `upstream calls: ${JSON.stringify(calls)}`);
  assert.deepEqual([calls[credOf('x')], calls[credOf('y')]], [1, 1], `each rate-limited account tried once: ${JSON.stringify(calls)}`);
  assert.equal(r.status, 429, `status ${r.status}: ${r.text}`);
  assert.equal(r.headers['retry-after'], '7', `Retry-After passed to the client: ${JSON.stringify(r.headers)}`);
  await rt.clearFaults();
});
