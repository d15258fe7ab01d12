// An account's concurrency is a slot lease in Redis, held across the gateway's workers
// and instances: the upstream never sees more concurrent requests on the account than
// its `concurrency`. Account a has concurrency 2.
//
//   group `solo`: only a. Six concurrent slow streams: a never has more than 2 in
//                 flight; the others wait for a slot (at most limiter.queue_timeout_ms)
//                 and are served as slots free up, or get 429 accounts_busy when the
//                 wait is over first.
//   group `pool`: a and b (concurrency 16). Six concurrent slow streams all succeed at
//                 once: a full account yields to the next candidate.
// Every stream is its own connection, so they spread over the gateway's two workers.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { mockText, sseContent } from './lib/harness.mjs';
import { redisCli, SUITE_REDIS } from './lib/db.mjs';
import { sleep, startRouting, statuses, waitFor } from './lib/routing.mjs';

const LIMIT = 2;
const STREAMS = 6;
const SLOW = '[mock chunks=10 interval_ms=100]'; // ~1 s per stream
let rt;
let slotKey;

before(async () => {
  rt = await startRouting({
    groups: ['solo', 'pool'],
    accounts: [
      { name: 'a', concurrency: LIMIT, groups: ['solo', 'pool'] },
      { name: 'b', concurrency: 16, groups: ['pool'] },
    ],
  });
  slotKey = `{a:${(await rt.account('a')).id}}:conc`;
});

after(() => rt?.stop());

const streams = (key, n = STREAMS, via = rt.gw) =>
  Promise.all(Array.from({ length: n }, (_, i) => rt.stream(`slow ${i} ${SLOW}`, {}, { key, gw: via })));

test(`one account with concurrency ${LIMIT}: ${STREAMS} concurrent streams, never more than ${LIMIT} in flight upstream`, async () => {
  await rt.mock.reset();
  const rs = await streams(rt.keys.solo);
  const a = await rt.stats('a');
  assert.ok(a.max_inflight <= LIMIT, `the mock saw ${a.max_inflight} concurrent requests on a (limit ${LIMIT})`);
  // The default wait for a slot (8 s) outlasts three waves of ~1 s streams: all served.
  assert.deepEqual(statuses(rs), { 200: STREAMS });
  for (const r of rs) {
    assert.equal(r.complete, true);
    assert.equal(sseContent(r.text), mockText(10));
  }
  assert.equal(a.requests, STREAMS);
  assert.equal(a.max_inflight, LIMIT, 'the slots were used');
});

test('when no slot frees up within limiter.queue_timeout_ms the client gets 429 accounts_busy, and the upstream nothing', async () => {
  const gw2 = await rt.another({ limiter: { queue_timeout_ms: 300 } }, { wait: ['solo'] });
  await rt.mock.reset();
  const rs = await streams(rt.keys.solo, STREAMS, gw2);
  const a = await rt.stats('a');
  assert.ok(a.max_inflight <= LIMIT, `the mock saw ${a.max_inflight} concurrent requests on a (limit ${LIMIT})`);
  const ok = rs.filter((r) => r.status === 200);
  const busy = rs.filter((r) => r.status === 429);
  assert.equal(ok.length, LIMIT, `served: ${JSON.stringify(statuses(rs))}`);
  assert.equal(busy.length, STREAMS - LIMIT, JSON.stringify(statuses(rs)));
  for (const r of busy) {
    assert.equal(JSON.parse(r.text).error.code, 'accounts_busy', r.text);
    assert.ok(Number(r.headers['retry-after']) >= 1, 'a 429 carries Retry-After');
  }
  assert.equal(a.requests, LIMIT, 'the refused streams never reached the upstream');
  await gw2.stop();
});

test('the slots are released: nothing is left in the lease set and the account serves again', async () => {
  await waitFor(async () => (await redisCli(SUITE_REDIS, 'ZCARD', slotKey)) === '0', { timeout: 3000, what: `${slotKey} to be empty` });
  await rt.mock.reset();
  const rs = await streams(rt.keys.solo, LIMIT);
  assert.deepEqual(statuses(rs), { 200: LIMIT });
  assert.equal((await rt.stats('a')).max_inflight, LIMIT);
});

test(`a full account yields to the next candidate: ${STREAMS} streams in a pool of a and b all succeed`, async () => {
  await rt.mock.reset();
  const rs = await streams(rt.keys.pool);
  assert.deepEqual(statuses(rs), { 200: STREAMS });
  const [a, b] = [await rt.stats('a'), await rt.stats('b')];
  assert.ok(a.max_inflight <= LIMIT, `the mock saw ${a.max_inflight} concurrent requests on a (limit ${LIMIT})`);
  assert.equal(a.requests + b.requests, STREAMS);
  assert.ok(b.requests >= STREAMS - LIMIT, `b took the overflow: a ${a.requests}, b ${b.requests}`);
});

test('two instances share the limit', async () => {
  const gw2 = await rt.another();
  await rt.mock.reset();
  const rs = (await Promise.all([streams(rt.keys.solo, 3), streams(rt.keys.solo, 3, gw2)])).flat();
  const a = await rt.stats('a');
  assert.ok(a.max_inflight <= LIMIT, `the mock saw ${a.max_inflight} concurrent requests on a across two instances (limit ${LIMIT})`);
  assert.deepEqual(statuses(rs), { 200: 6 });
  await gw2.stop();
});

test('a stream that outlives the lease TTL keeps its slot', async () => {
  // Two instances with lease_ttl_ms = 1000 (the minimum) and one worker each: the two
  // long streams (~3 s) run through the first, later streams go through the second,
  // which knows about the first's streams only through the leases in Redis. A slot
  // that is not renewed while its stream runs expires after 1 s and lets a third
  // stream onto the account.
  const short = { limiter: { lease_ttl_ms: 1000, queue_timeout_ms: 300 }, workers: 1 };
  const gw2 = await rt.another(short, { wait: ['solo'] });
  const gw3 = await rt.another(short, { wait: ['solo'] });
  await rt.mock.reset();
  const long = Array.from({ length: LIMIT }, (_, i) =>
    rt.stream(`long ${i} [mock chunks=30 interval_ms=100]`, {}, { key: rt.keys.solo, gw: gw2 }));
  await waitFor(async () => (await rt.stats('a')).inflight === LIMIT, { timeout: 3000, what: 'the long streams to start' });
  await sleep(1500); // past the lease TTL, while both long streams still run
  // Late streams through the other instance; each waits for a slot at most 300 ms.
  const late = [];
  for (let i = 0; i < 4; i++) late.push(await rt.stream(`late ${i} [mock chunks=2]`, {}, { key: rt.keys.solo, gw: gw3 }));
  const rs = await Promise.all(long);
  assert.deepEqual(statuses(rs), { 200: LIMIT });
  const a = await rt.stats('a');
  assert.ok(a.max_inflight <= LIMIT,
    `the mock saw ${a.max_inflight} concurrent requests on a (limit ${LIMIT}); the streams started 1.5 s into ` +
    `the long ones got ${JSON.stringify(statuses(late))}`);
  await Promise.all([gw2.stop(), gw3.stop()]);
});
