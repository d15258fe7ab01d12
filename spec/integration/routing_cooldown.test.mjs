// A 429 with Retry-After cools the account for exactly that long, on every instance.
// Three equal accounts; the mock answers a's next request with 429 and Retry-After: 2
// (routing.cooldown_429_ms is 30 s, so a cooldown of ~2 s can only come from the
// header). The client gets 200s throughout (the 429 is retried on another account);
// accounts.cooldown_until of a is ~2 s ahead; for those 2 s a receives nothing, neither
// through the gateway that saw the 429 nor through a second instance on the same
// database and Redis; after them a gets a trial request and then its share again.
//
// Each gateway runs one worker, so each instance's account health is one state
// machine (see routing_recovery.test.mjs).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { diff, sleep, startRouting, statuses } from './lib/routing.mjs';

const RETRY_AFTER_S = 2;
let rt;
let gw2;
let t429; // when the client's request that a answered with 429 completed
let row429; // a's accounts row read right after it

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }],
    routing: { cooldown_429_ms: 30000 },
    gateway: { workers: 1 },
  });
  gw2 = await rt.another();
  await rt.mock.reset();
});

after(() => rt?.stop());

test('the 429 is retried on another account and accounts.cooldown_until is Retry-After ahead', async () => {
  await rt.fault('a', { status: 429, retry_after: RETRY_AFTER_S, count: 1 });
  const rs = [];
  // Requests until one is routed to a (selection among equals is random).
  for (let i = 0; i < 60 && (await rt.counts()).a === 0; i++) rs.push(await rt.chat(`until a ${i} [mock chunks=2]`));
  t429 = Date.now();
  row429 = await rt.account('a');
  assert.equal((await rt.counts()).a, 1, 'a was picked within 60 requests');
  assert.deepEqual(statuses(rs), { 200: rs.length }, rs.map((r) => r.text).join('\n'));
  assert.ok(row429.cooldown_until_ms, 'accounts.cooldown_until of a is set');
  const ahead = row429.cooldown_until_ms - row429.now_ms;
  assert.ok(ahead > RETRY_AFTER_S * 1000 - 700 && ahead <= RETRY_AFTER_S * 1000,
    `accounts.cooldown_until is ${ahead} ms ahead (want ~${RETRY_AFTER_S * 1000}, from Retry-After, not cooldown_429_ms)`);
});

test('during Retry-After the account gets nothing, through either instance', async () => {
  assert.ok(t429, 'the previous test cooled a');
  const before = await rt.counts();
  const rs = [];
  let k = 0;
  while (Date.now() < t429 + RETRY_AFTER_S * 1000 - 300) {
    rs.push(await rt.chat(`cooling ${k} [mock chunks=2]`, {}, { gw: k++ % 2 ? gw2 : rt.gw }));
    await sleep(20);
  }
  assert.ok(rs.length >= 10, `${rs.length} requests during the cooldown`);
  assert.deepEqual(statuses(rs), { 200: rs.length });
  const n = diff(await rt.counts(), before);
  assert.equal(n.a, 0, `a received ${n.a} requests while cooling: ${JSON.stringify(n)}`);
  assert.equal(n.b + n.c, rs.length);
});

test('after Retry-After the account gets a trial, then its share of the load', async () => {
  assert.ok(t429, 'the previous test cooled a');
  await sleep(Math.max(0, t429 + RETRY_AFTER_S * 1000 + 300 - Date.now()));
  const before = await rt.counts();
  // The trial: within a few requests once the cooldown is over.
  const trial = [];
  for (let i = 0; i < 15 && (await rt.counts()).a === before.a; i++) trial.push(await rt.chat(`trial ${i} [mock chunks=2]`));
  assert.deepEqual(statuses(trial), { 200: trial.length });
  const afterTrial = await rt.counts();
  const row = await rt.account('a');
  assert.equal(afterTrial.a - before.a, 1,
    `a got its trial within ${trial.length} requests after the cooldown ended ` +
    `(counts since: ${JSON.stringify(diff(afterTrial, before))}; accounts.cooldown_until ${row.cooldown_until_ms - row.now_ms} ms ahead)`);
  // Then its share: an equal share of 60 is 20.
  const rs = [];
  for (let i = 0; i < 60; i++) rs.push(await rt.chat(`share ${i} [mock chunks=2]`));
  assert.deepEqual(statuses(rs), { 200: 60 });
  const n = diff(await rt.counts(), afterTrial);
  assert.ok(n.a >= 10, `a received ${n.a} of 60 requests after a successful trial (want >= 10): ${JSON.stringify(n)}`);
});
