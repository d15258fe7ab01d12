// Redis answers late. A reservation's script may run in Redis after the gateway
// stopped waiting for it (redis_timeout_ms): the request is refused (503, money fails
// closed), but the hold the script took must not stay in the live balance for ever —
// otherwise the tenant's available money shrinks by the bound with every such timeout
// and `ledger verify` reports Redis and Postgres apart. And a client that leaves while
// its reservation is still in flight was never served: it must not be charged. A
// private Redis, made to stall for 1.5 s by a long-running script; the account has no
// concurrency limit, so the reservation is the request's first Redis call.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll } from './lib/harness.mjs';
import { chat, redisCli, startRedis } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  count,
  ledger,
  liveMoney,
  startBilledGateway,
  streamChat,
  usageRows,
  waitUsageRow,
} from './lib/billing.mjs';

/** Keeps Redis busy for `ms` milliseconds (every other client waits meanwhile). */
const STALL = "local s = redis.call('TIME') local t0 = s[1] * 1000000 + s[2] " +
  "while true do local n = redis.call('TIME') if n[1] * 1000000 + n[2] - t0 > tonumber(ARGV[1]) * 1000 then break end end return 1";

let mock;
let redis;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  bill = await billedSetup({ mock, balance: '10', redis: redis.url, concurrency: 0 });
  // (Each test compares the money before and after itself, so that one test's leak
  // does not fail the next.)
  gw = await startBilledGateway(bill, { workers: 1, redis_timeout_ms: 250 }, { mock });
  const r = await chat(gw, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(r.status, 200, r.text);
  await waitUsageRow(bill, r.headers['x-request-id']);
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await bill?.db.drop();
});

test('a reservation whose Redis reply times out: refused or served, but its hold never leaks', async () => {
  const before = await accountsMoney(bill);
  const liveBefore = await liveMoney(bill);
  assert.equal(liveBefore.avail, before.balance);
  assert.equal(liveBefore.reserved, 0n);

  const stall = redisCli(redis.url, 'EVAL', STALL, '0', '1500');
  await sleep(50);
  const r = await chat(gw, bill.key, chatBody('while Redis stalls [mock chunks=3]', { maxTokens: 500 }), { timeout: 15000 });
  await stall;
  const id = r.headers['x-request-id'];
  assert.ok(r.status === 200 || (r.status === 503 && r.json?.error?.code === 'billing_unavailable'),
    `served, or refused with 503 billing_unavailable: ${r.status} ${r.text}`);
  await sleep(1500);

  const rows = await usageRows(bill, id);
  const cost = rows.length ? rows[0].cost : 0n;
  if (r.status === 503) assert.equal(rows.length, 0, 'a refused request is not billed');
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - cost);
  const live = await liveMoney(bill);
  const res = await bill.db.query(`SELECT state FROM reservations WHERE request_id = '${id}'`);
  const detail = `status ${r.status}, reservation rows ${JSON.stringify(res)}, Redis ${JSON.stringify({ avail: String(live.avail), reserved: String(live.reserved) })}`;
  assert.equal(live.reserved, 0n, `nothing is held any more (${detail})`);
  assert.equal(live.avail, m.balance, `the live balance equals the Postgres balance (${detail})`);
  assert.equal(await count(bill, 'reservations', "state = 'reserved'"), 0);
  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, `ledger verify:\n${v.stdout}${v.stderr}`);
});

test('client gone while its reservation is in flight: the upstream is never called, nothing is charged, the hold returns', async () => {
  // This gateway waits up to 5 s for Redis, so the reservation completes after the
  // client left (the request is detached from it).
  const g = await startBilledGateway(bill, { workers: 1, redis_timeout_ms: 5000 }, { mock });
  const warm = await chat(g, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(warm.status, 200, warm.text);
  await waitUsageRow(bill, warm.headers['x-request-id']);
  await mock.reset();
  const before = await accountsMoney(bill);
  const liveBefore = await liveMoney(bill);
  const reservationsBefore = await count(bill, 'reservations');

  const stall = redisCli(redis.url, 'EVAL', STALL, '0', '1500');
  await sleep(50);
  const r = await streamChat(g, bill.key, { ...chatBody('leave during the reservation [mock chunks=5]', { maxTokens: 500 }), stream: false },
    { abortAfterMs: 400 });
  assert.equal(r.aborted, true);
  assert.equal(r.status, 0, 'the client left before any answer');
  await stall;

  // Longer than reconcile_after_ms (2 s) plus a reconciler pass.
  await sleep(5000);
  assert.equal((await mock.stats()).total, 0, 'the upstream was never called');
  const res = await bill.db.query(`SELECT request_id, state, (amount * 1000000000)::bigint::text AS amount,
    (settled_cost * 1000000000)::bigint::text AS settled_cost FROM reservations ORDER BY created_at DESC LIMIT 1`);
  const detail = JSON.stringify({ reservation: (await count(bill, 'reservations')) > reservationsBefore ? res[0] : null });
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance, `nothing charged for a request that never ran: ${detail}`);
  const live = await liveMoney(bill);
  assert.equal(live.reserved - liveBefore.reserved, 0n, `the hold was returned: ${detail}`);
  assert.equal(live.avail, liveBefore.avail, 'the live balance is what it was');
  assert.equal(await count(bill, 'reservations', "state = 'reserved'"), 0, `no reservation left reserved: ${detail}`);
  await g.stop();
});
