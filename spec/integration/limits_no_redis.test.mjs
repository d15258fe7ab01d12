// Limits on keys with Postgres but no usable Redis: no `redis` at all, or a URL the
// client refuses (bad scheme). Every admission is then decided without Redis, and that
// decision must reach the request on a later loop turn, never from inside the call that
// asked (tg_limits.h): a refusal delivered synchronously once recycled the request and
// then wrote the admission handle into it (a use-after-free, caught by the ASan run of
// this file), and an admission delivered synchronously to a request that then failed at
// once was never released, so the instance's local concurrency count leaked for good.
//
//   no Redis, default policies (local): the instance's bucket of the key's own limit
//     admits exactly the burst, then 429; a TPM-only key is held to its TPM; a
//     concurrency-1 key refuses a second request while one runs, and after requests that
//     fail right after admission (no account serves the model) it still admits — its
//     count went back to 0;
//   bad Redis URL, closed: every request gets 503 limiter_unavailable + Retry-After;
//
// and afterwards every worker still answers, /metrics counts each decision by policy.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keepAliveAgent, metrics, plainKey, request, startStateGateway, tally } from './lib/db.mjs';

const CRED = 'sk-limits-no-redis';
const K = { rate: plainKey('rate'), tpm: plainKey('tpm'), conc: plainKey('conc'), closed: plainKey('closed'),
  holder: plainKey('holder'), both: plainKey('both') };
const BURST = 3;
let db;
let mock;
let none; // no Redis, default policies
let bad;  // a Redis URL the client refuses, policies closed

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    // tiny: one request at a time for the whole tenant.
    tenants: [{ name: 'acme' }, { name: 'tiny', concurrency: 1 }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000,
      groups: ['main'], models: [MODEL] }],
    keys: [
      { name: 'rate', tenant: 'acme', group: 'main', key: K.rate, rpm: 6 },
      // 2,000 tokens a minute; each request below is estimated at ~1,500 (max_tokens).
      { name: 'tpm', tenant: 'acme', group: 'main', key: K.tpm, tpm: 2000 },
      { name: 'conc', tenant: 'acme', group: 'main', key: K.conc, concurrency: 1 },
      { name: 'closed', tenant: 'acme', group: 'main', key: K.closed, rpm: 1000 },
      { name: 'holder', tenant: 'tiny', group: 'main', key: K.holder },
      { name: 'both', tenant: 'tiny', group: 'main', key: K.both, rpm: 6 },
    ],
  });
  await db.exec(`UPDATE api_keys SET rpm_burst = ${BURST} WHERE rpm = 6`);
  none = await startStateGateway(db, { workers: 2 }, { mock, redis: null });
  bad = await startStateGateway(db, {
    workers: 1,
    limiter: { on_redis_down_rate: 'closed', on_redis_down_concurrency: 'closed' },
  }, { mock, redis: 'bogus://nowhere' });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const req = (text, extra) => chatReq(MODEL, `${text} [mock chunks=1]`, extra);

test('no Redis, local: the instance keeps a bucket of the key\'s own limit (burst, then 429)', async () => {
  // Fresh connections land on either worker: the bucket is the instance's, not a worker's.
  const rs = [];
  for (let i = 0; i < BURST + 3; i++) rs.push(await chat(none, K.rate, req(`rate ${i}`)));
  assert.deepEqual(rs.map((r) => r.status), [...Array(BURST).fill(200), 429, 429, 429], rs.map((r) => r.text).join('\n'));
  for (const r of rs.slice(BURST)) {
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
    assert.match(r.json?.error?.message, /key rpm \(local/);
    assert.ok(Number(r.headers['retry-after']) >= 1);
  }
});

test('no Redis, local: a TPM-only key is held to its tokens per minute, corrected by the usage', async () => {
  // The first request is charged its estimate (~1,500 of 2,000) while it streams: a
  // second one does not fit. Once it ends, the charge is corrected to its real usage
  // (a few tokens), and a third fits again.
  const first = chat(none, K.tpm, chatReq(MODEL, 'tpm 1 [mock chunks=10 interval_ms=100]', { max_tokens: 1500, stream: true }), { timeout: 10000 });
  await new Promise((r) => setTimeout(r, 300));
  const second = await chat(none, K.tpm, req('tpm 2', { max_tokens: 1500 }));
  assert.equal(second.status, 429, second.text);
  assert.equal(second.json?.error?.code, 'tokens_limit_exceeded');
  assert.match(second.json?.error?.message, /key tpm \(local/);
  assert.equal((await first).status, 200);
  const third = await chat(none, K.tpm, req('tpm 3', { max_tokens: 1500 }));
  assert.equal(third.status, 200, third.text);
});

test('no Redis, local: a concurrency count that requests failing right after admission give back', async () => {
  // Admitted, then refused at once by account selection (no account serves this model):
  // each must give its slot back, or the key (concurrency 1) stays full forever.
  for (let i = 0; i < 6; i++) {
    const r = await chat(none, K.conc, chatReq('no-such-model', 'x'));
    assert.equal(r.status, 503, r.text);
    assert.equal(r.json?.error?.code, 'no_account_available');
  }
  // One slow stream holds the slot: a second request is refused while it runs.
  const slow = chat(none, K.conc, chatReq(MODEL, 'hold [mock chunks=10 interval_ms=100]', { stream: true }), { timeout: 10000 });
  let refused;
  for (let i = 0; i < 20 && !refused; i++) {
    await new Promise((r) => setTimeout(r, 50));
    const r = await chat(none, K.conc, req('second'));
    if (r.status === 429) refused = r;
  }
  assert.ok(refused, 'a second request is refused while the first holds the only slot');
  assert.equal(refused.json?.error?.code, 'concurrency_limit_exceeded');
  assert.equal((await slow).status, 200);
  // The slot is back: one at a time, requests pass again, on both workers.
  const agent = keepAliveAgent(1);
  for (let i = 0; i < 4; i++) {
    const r = await chat(none, K.conc, req(`after ${i}`), i % 2 ? {} : { agent });
    assert.equal(r.status, 200, r.text);
  }
  agent.destroy();
});

test('no Redis, local: a request the tenant refuses takes nothing from its key (both or neither)', async () => {
  // The holder key takes the tenant's only slot with a slow stream; meanwhile the
  // "both" key (rpm 6, burst 3) is refused by the tenant 5 times. Its own bucket must
  // still be full afterwards: exactly the burst passes, one at a time.
  const hold = chat(none, K.holder, chatReq(MODEL, 'hold [mock chunks=10 interval_ms=100]', { stream: true }), { timeout: 10000 });
  await new Promise((r) => setTimeout(r, 300));
  for (let i = 0; i < 5; i++) {
    const r = await chat(none, K.both, req(`refused ${i}`));
    assert.equal(r.status, 429, r.text);
    assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded');
    assert.match(r.json?.error?.message, /tenant concurrency/);
  }
  assert.equal((await hold).status, 200);
  const rs = [];
  for (let i = 0; i < BURST + 1; i++) rs.push(await chat(none, K.both, req(`both ${i}`)));
  assert.deepEqual(rs.map((r) => r.status), [...Array(BURST).fill(200), 429], rs.map((r) => r.text).join('\n'));
  assert.match(rs[BURST].json?.error?.message, /key rpm/);
});

test('bad Redis URL, closed: every request is refused with 503 limiter_unavailable, and the worker lives on', async () => {
  const before = (await mock.stats()).total;
  const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(bad, K.closed, req(`closed ${i}`))));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 503: 20 });
  for (const r of rs) {
    assert.equal(r.json?.error?.code, 'limiter_unavailable');
    assert.ok(Number(r.headers['retry-after']) >= 1);
  }
  assert.equal((await mock.stats()).total, before, 'nothing reached the upstream');
  const agent = keepAliveAgent(1);
  for (let i = 0; i < 3; i++) assert.equal((await request(`${bad.url}/healthz`, { agent })).status, 200);
  agent.destroy();
  const m = await metrics(bad);
  assert.equal(m['tollgate_limiter_down_total{policy="closed"}'], 20);
  assert.equal(m['tollgate_limiter_down_limits_total{limit="rate",policy="closed"}'], 20);
  assert.equal(m['tollgate_limiter_down_total{policy="open"}'], 0);
});

test('every decision without Redis is counted, and both gateways are still up', async () => {
  const m = await metrics(none);
  // rate: 6 requests + the "both" key's 5 + 4; tpm: 3; conc: 6 failing + the stream + its
  // refused probes + 4, and the tenant's.
  assert.equal(m['tollgate_limiter_down_limits_total{limit="rate",policy="local"}'], BURST + 3 + 5 + BURST + 1);
  assert.equal(m['tollgate_limiter_down_limits_total{limit="tokens",policy="local"}'], 3);
  assert.ok(m['tollgate_limiter_down_limits_total{limit="concurrency",policy="local"}'] >= 6 + 1 + 1 + 4);
  assert.equal(m['tollgate_limiter_down_total{policy="closed"}'], 0);
  // One limit kind per request, except the "both" key's 9 (rate and tenant concurrency).
  assert.equal(m['tollgate_limiter_down_total{policy="local"}'] + 5 + BURST + 1,
    m['tollgate_limiter_down_limits_total{limit="rate",policy="local"}'] +
    m['tollgate_limiter_down_limits_total{limit="tokens",policy="local"}'] +
    m['tollgate_limiter_down_limits_total{limit="concurrency",policy="local"}']);
  for (const gw of [none, bad]) {
    assert.ok(gw.proc.running);
    assert.equal((await request(`${gw.url}/healthz`)).status, 200);
  }
});
