// Concurrent requests never overspend a balance: 50 requests at once, spread over two
// gateway instances (two workers each) that share Postgres and Redis, against a balance
// that covers exactly 10 reservations. Exactly 10 reach the upstream and succeed; 40
// get the OpenAI-shaped 402 insufficient_balance without reaching it; neither the live
// balance nor the Postgres balance ever goes below zero; `ledger verify` passes.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll } from './lib/harness.mjs';
import { chat, tally } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  fmtNano,
  liveMoney,
  mockInputTokens,
  reservationFor,
  startBilledGateway,
  usageRows,
  verifyLedger,
} from './lib/billing.mjs';

const TEXT = 'fifty at once [mock delay_ms=1000 chunks=4]';
const BODY = chatBody(TEXT, { maxTokens: 1000 });
const R = reservationFor(Buffer.byteLength(JSON.stringify(BODY)), 1000);
const A = costOf(mockInputTokens(TEXT), 4);
let mock;
let bill;
let gws;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: fmtNano(10n * R) });
  gws = await Promise.all([startBilledGateway(bill, {}, { mock }), startBilledGateway(bill, {}, { mock })]);
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test('50 concurrent requests against a balance that covers exactly 10 reservations: 10 succeed, 40 get 402', async () => {
  assert.equal((await accountsMoney(bill)).balance, 10n * R);
  await mock.reset();

  // Watch both balances while the requests run.
  let watching = true;
  const seen = { minAvail: null, minBalance: null, maxReserved: 0n };
  const watcher = (async () => {
    while (watching) {
      const live = await liveMoney(bill);
      const { balance } = await accountsMoney(bill);
      if (live.avail !== null && (seen.minAvail === null || live.avail < seen.minAvail)) seen.minAvail = live.avail;
      if (live.reserved !== null && live.reserved > seen.maxReserved) seen.maxReserved = live.reserved;
      if (seen.minBalance === null || balance < seen.minBalance) seen.minBalance = balance;
      await sleep(20);
    }
  })();

  const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => chat(gws[i % 2], bill.key, BODY, { timeout: 30000 })));
  const statuses = tally(rs.map((r) => r.status));
  assert.deepEqual(statuses, { 200: 10, 402: 40 }, `statuses ${JSON.stringify(statuses)}`);
  for (const r of rs.filter((x) => x.status === 402)) {
    assert.equal(r.json?.error?.code, 'insufficient_balance', r.text);
    assert.equal(r.json.error.type, 'insufficient_quota', r.text);
    assert.equal(typeof r.json.error.message, 'string');
    assert.ok(r.headers['x-request-id'], 'a refused request still has its id');
  }
  assert.equal((await mock.stats()).total, 10, 'the upstream saw exactly the 10 that were reserved');

  // Settlement is asynchronous: wait for the 10 usage rows.
  const ok = rs.filter((r) => r.status === 200).map((r) => r.headers['x-request-id']);
  for (let i = 0; i < 100 && (await count(bill, 'usage')) < 10; i++) await sleep(50);
  watching = false;
  await watcher;

  for (const id of ok) {
    const rows = await usageRows(bill, id);
    assert.equal(rows.length, 1, `request ${id}: one usage row`);
    assert.equal(rows[0].cost, A);
  }
  assert.equal(await count(bill, 'usage'), 10, 'no usage row for a refused request');
  assert.equal(await count(bill, 'reservations'), 10, 'no reservation row for a refused request');
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0);

  assert.ok(seen.minAvail !== null && seen.minAvail >= 0n, `the live balance never went negative (min ${seen.minAvail})`);
  assert.ok(seen.minBalance >= 0n, `the Postgres balance never went negative (min ${seen.minBalance})`);
  assert.ok(seen.maxReserved <= 10n * R, `never more than the balance held (max ${seen.maxReserved})`);
  const m = await accountsMoney(bill);
  assert.equal(m.balance, 10n * R - 10n * A, 'billed the 10 actual costs');
  const live = await liveMoney(bill);
  assert.equal(live.avail, m.balance);
  assert.equal(live.reserved, 0n);
  await verifyLedger(bill);
});

test('the freed money is usable again, and a bound above the balance is refused even if the actual cost would fit', async () => {
  const { balance } = await accountsMoney(bill); // 10R - 10A: covers 9 bounds, not 10
  const fits = Number(balance / R);
  assert.equal(fits, 9);
  const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(gws[i % 2], bill.key, BODY, { timeout: 30000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: fits, 402: 12 - fits });
  await sleep(300);
  for (let i = 0; i < 100 && (await count(bill, 'usage')) < 10 + fits; i++) await sleep(50);
  assert.equal(await count(bill, 'usage'), 10 + fits);
  const m = await accountsMoney(bill);
  assert.ok(m.balance >= 0n);
  assert.equal(m.balance, 10n * R - BigInt(10 + fits) * A);
  await verifyLedger(bill);
});
