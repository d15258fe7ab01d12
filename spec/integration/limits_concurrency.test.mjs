// A concurrency limit of 8 holds across three gateway instances: 40 slow streams for
// one key, spread over the three, and the upstream never sees more than 8 of them at
// once. The others wait in the gateways' queues (queue_max 64, queue_timeout_ms 20000)
// and are admitted as slots free up, so all 40 complete; afterwards nothing is in
// flight, neither at the upstream nor in the leases in Redis. A full queue refuses at
// once; a tenant's concurrency holds across its keys; an account's concurrency caps
// what that account is sent (issue 6: limits at tenant, key and account level).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, mockText, sleep, sseContent, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keyId, plainKey, redisCli, SUITE_REDIS, startStateGateway, tally } from './lib/db.mjs';

const KEY = plainKey('conc');
const CRED = 'sk-limits-concurrency';
const LIMIT = 8;
const STREAMS = 40;
const CHUNKS = 20;
const INTERVAL = 100;
const CAPPED_1 = plainKey('capped-1');
const CAPPED_2 = plainKey('capped-2');
const TENANT_LIMIT = 3;
const SMALL_KEY = plainKey('small-account');
const SMALL_CRED = 'sk-limits-small-account';
const ACCOUNT_LIMIT = 2;
let db;
let mock;
let gws;
let leaseKey;

before(async () => {
  mock = await startMock();
  db = await createDb();
  // A tenant whose concurrency is capped, with two unlimited keys; and an account with
  // a concurrency of its own, in a group of its own.
  await applyState(db, {
    tenants: [{ name: 'acme' }, { name: 'capped' }],
    groups: [{ name: 'main' }, { name: 'small-account' }],
    accounts: [
      { name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] },
      { name: 'small', provider: 'openai', base_url: `${mock.url}/v1`, credential: SMALL_CRED, concurrency: ACCOUNT_LIMIT, groups: ['small-account'] },
    ],
    keys: [
      { name: 'k', tenant: 'acme', group: 'main', key: KEY, concurrency: LIMIT },
      { name: 'c1', tenant: 'capped', group: 'main', key: CAPPED_1 },
      { name: 'c2', tenant: 'capped', group: 'main', key: CAPPED_2 },
      { name: 'small', tenant: 'acme', group: 'small-account', key: SMALL_KEY },
    ],
  });
  await db.exec(`UPDATE tenants SET concurrency = ${TENANT_LIMIT} WHERE name = 'capped'`);
  const tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  leaseKey = `{t:${tenant}}:conc:k:${await keyId(db, 'k')}`;
  const cfg = { workers: 2, limiter: { queue_max: 64, queue_timeout_ms: 20000 } };
  gws = await Promise.all([0, 1, 2].map(() => startStateGateway(db, cfg, { mock })));
});

after(async () => {
  await stopAll();
  await db?.drop();
});

test(`concurrency ${LIMIT} across three instances: ${STREAMS} slow streams, never more than ${LIMIT} upstream`, async () => {
  await mock.reset();
  // Watch the upstream while the streams run (the mock also keeps its own maximum).
  let watching = true;
  let seenMax = 0;
  let samples = 0;
  const watcher = (async () => {
    while (watching && samples < 2000) {
      const c = (await mock.stats()).credentials[CRED];
      seenMax = Math.max(seenMax, c?.inflight ?? 0);
      samples++;
      await sleep(25);
    }
  })();

  const t0 = Date.now();
  const results = await Promise.allSettled(Array.from({ length: STREAMS }, (_, i) =>
    chat(gws[i % 3], KEY, chatReq(MODEL, `stream ${i} [mock chunks=${CHUNKS} interval_ms=${INTERVAL}]`, { stream: true }), { timeout: 45000 })));
  const elapsed = Date.now() - t0;
  watching = false;
  await watcher;

  const failed = results.filter((r) => r.status === 'rejected').map((r) => r.reason.message);
  assert.deepEqual(failed.slice(0, 3), [], `${failed.length} streams failed on the wire`);
  const rs = results.map((r) => r.value);
  const statuses = tally(rs.map((r) => r.status));
  assert.equal((statuses[200] || 0) + (statuses[429] || 0), STREAMS, `only 200 or 429: ${JSON.stringify(statuses)}`);
  for (const r of rs.filter((x) => x.status === 429)) assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded');
  for (const r of rs.filter((x) => x.status === 200)) {
    assert.equal(sseContent(r.text), mockText(CHUNKS), 'an admitted stream is complete');
    assert.match(r.text, /data: \[DONE\]/);
  }
  // With a 20 s queue and ~10 s of work, every stream should get its turn.
  assert.equal(statuses[200], STREAMS, `all ${STREAMS} completed: ${JSON.stringify(statuses)}`);

  const s = (await mock.stats()).credentials[CRED];
  assert.ok(s.max_inflight <= LIMIT, `the upstream saw ${s.max_inflight} streams of the key at once (limit ${LIMIT})`);
  assert.ok(seenMax <= LIMIT, `sampled ${seenMax} in flight`);
  assert.ok(s.max_inflight >= LIMIT - 1, `the slots were used (max in flight ${s.max_inflight})`);
  assert.equal(s.requests, statuses[200], 'one upstream request per admitted stream');
  // 40 streams of ~2 s, 8 at a time, cannot finish in less than 5 rounds.
  assert.ok(elapsed >= (STREAMS / LIMIT) * CHUNKS * INTERVAL * 0.9, `took ${elapsed} ms`);

  await waitFor(async () => ((await mock.stats()).credentials[CRED]?.inflight ?? 0) === 0, { timeout: 3000, what: 'upstream in flight back to 0' });
  await waitFor(async () => (await redisCli(SUITE_REDIS, 'ZCARD', leaseKey)) === '0', { timeout: 3000, what: `no lease left in ${leaseKey}` });
});

test('with the queue drained, the key admits a full set of streams again at once', async () => {
  await mock.reset();
  const t0 = Date.now();
  const rs = await Promise.all(Array.from({ length: LIMIT }, (_, i) =>
    chat(gws[i % 3], KEY, chatReq(MODEL, `again ${i} [mock chunks=5 interval_ms=100]`, { stream: true }), { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: LIMIT });
  assert.ok(Date.now() - t0 < 1500, `no waiting: ${Date.now() - t0} ms`);
  assert.equal((await mock.stats()).credentials[CRED].max_inflight, LIMIT, 'all at once');
});

test('a full queue refuses at once with 429 concurrency_limit_exceeded and Retry-After', async () => {
  // A fourth instance with a queue of 1 and a short wait: 8 streams hold the slots, one
  // request waits, the rest are refused at once.
  const small = await startStateGateway(db, { workers: 1, limiter: { queue_max: 1, queue_timeout_ms: 1500 } }, { mock });
  await mock.reset();
  const holders = Array.from({ length: LIMIT }, (_, i) =>
    chat(gws[i % 3], KEY, chatReq(MODEL, `hold ${i} [mock chunks=30 interval_ms=100]`, { stream: true }), { timeout: 20000 }));
  await waitFor(async () => (await mock.stats()).credentials[CRED]?.inflight === LIMIT, { timeout: 5000, what: 'slots taken' });
  const t0 = Date.now();
  const settled = await Promise.allSettled(Array.from({ length: 4 }, () => chat(small, KEY, chatReq(MODEL, 'extra'))));
  const elapsed = Date.now() - t0;
  assert.deepEqual(settled.filter((r) => r.status === 'rejected').map((r) => r.reason.message), [], 'every extra request got an answer');
  const rs = settled.map((r) => r.value);
  assert.deepEqual(tally(rs.map((r) => r.status)), { 429: 4 });
  for (const r of rs) {
    assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded');
    assert.ok(Number(r.headers['retry-after']) >= 1, 'Retry-After');
  }
  // Three were refused at once (queue full); one waited its 1.5 s first.
  assert.ok(elapsed >= 1400 && elapsed < 5000, `the waiting one gave up after the queue timeout (${elapsed} ms)`);
  const held = await Promise.allSettled(holders);
  assert.deepEqual(held.filter((r) => r.status === 'rejected').map((r) => r.reason.message), [], 'the holders were not disturbed');
  assert.deepEqual(tally(held.map((r) => r.value.status)), { 200: LIMIT });
  assert.ok((await mock.stats()).credentials[CRED].max_inflight <= LIMIT);
  await waitFor(async () => (await redisCli(SUITE_REDIS, 'ZCARD', leaseKey)) === '0', { timeout: 3000, what: 'leases released' });
});

/** Runs n slow streams, alternating over keys and gateways; resolves with {statuses, max} for cred. */
async function slowStreams(n, keys, cred) {
  await mock.reset();
  const rs = await Promise.all(Array.from({ length: n }, (_, i) =>
    chat(gws[i % 3], keys[i % keys.length], chatReq(MODEL, `slow ${i} [mock chunks=10 interval_ms=100]`, { stream: true }), { timeout: 30000 })));
  await waitFor(async () => ((await mock.stats()).credentials[cred]?.inflight ?? 0) === 0, { timeout: 3000, what: 'in flight back to 0' });
  return { statuses: tally(rs.map((r) => r.status)), max: (await mock.stats()).credentials[cred]?.max_inflight ?? 0 };
}

test(`a tenant's concurrency of ${TENANT_LIMIT} holds across its keys and instances`, async () => {
  const { statuses, max } = await slowStreams(9, [CAPPED_1, CAPPED_2], CRED);
  assert.deepEqual(statuses, { 200: 9 }, 'all wait their turn');
  assert.ok(max <= TENANT_LIMIT, `the upstream saw ${max} of the tenant's streams at once (limit ${TENANT_LIMIT})`);
  assert.ok(max >= TENANT_LIMIT - 1, `the slots were used (${max})`);
});

test(`an account's concurrency of ${ACCOUNT_LIMIT} caps what the account is sent`, async () => {
  const { statuses, max } = await slowStreams(6, [SMALL_KEY], SMALL_CRED);
  assert.equal((statuses[200] || 0) + (statuses[429] || 0) + (statuses[503] || 0), 6, JSON.stringify(statuses));
  assert.ok(max <= ACCOUNT_LIMIT, `the account (concurrency ${ACCOUNT_LIMIT}) was sent ${max} streams at once: ${JSON.stringify(statuses)}`);
});
