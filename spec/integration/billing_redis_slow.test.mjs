// Redis answers late. A reservation's script may run in Redis after the gateway
// stopped waiting for it (redis_timeout_ms): the request is refused (503, money fails
// closed), but the hold the script took must not stay in the live balance for ever —
// otherwise the tenant's available money shrinks by the bound with every such timeout
// and `ledger verify` reports Redis and Postgres apart. A private Redis, made to stall
// for 1.5 s by a long-running script.

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
  bill = await billedSetup({ mock, balance: '10', redis: redis.url });
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
