// Retries and failover on the bill: every attempt reserves its own bound (one
// `reservations` row per attempt, the same request id), the client's request is billed
// once with the number of attempts it took, and every attempt's Redis hold is returned.
// An attempt that failed with an upstream error status costs nothing.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll, fetchT } from './lib/harness.mjs';
import { chat } from './lib/db.mjs';
import {
  CRED,
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  fmtNano,
  ledgerRows,
  liveMoney,
  liveReservation,
  mockInputTokens,
  reservationFor,
  reservationRows,
  startBilledGateway,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

const CRED2 = 'sk-billing-account-2';
let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({
    mock,
    balance: '10',
    accounts: [{ name: 'up', credential: CRED, priority: 10 }, { name: 'up2', credential: CRED2, priority: 10 }],
  });
  gw = await startBilledGateway(bill, { routing: { max_attempts: 3 } }, { mock });
  const r = await chat(gw, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(r.status, 200, r.text);
  await waitUsageRow(bill, r.headers['x-request-id']);
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

/** Installs a mock fault rule for every credential: the next `count` calls get `status`. */
async function fault(rule) {
  const r = await fetchT(`${mock.url}/_mock/faults`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ credential: '*', ...rule }),
  });
  await r.arrayBuffer();
  assert.ok(r.ok, `mock faults: HTTP ${r.status}`);
}

test('a 500 then a success: two reservations of one request id, billed once with attempts = 2', async () => {
  await mock.reset();
  await fault({ status: 500, count: 1 });
  const text = 'fail over [mock chunks=6]';
  const body = chatBody(text, { maxTokens: 300 });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 300);
  const A = costOf(mockInputTokens(text), 6);
  const before = await accountsMoney(bill);

  const r = await chat(gw, bill.key, body);
  assert.equal(r.status, 200, r.text);
  assert.equal((await mock.stats()).total, 2, 'the upstream saw two attempts');
  const id = r.headers['x-request-id'];
  const row = await waitUsageRow(bill, id);
  assert.equal(row.attempts, 2, 'the bill shows the attempts of the one logical request');
  assert.equal(row.cost, A, 'billed once, for the attempt that answered');
  assert.equal(row.estimated, false);
  assert.deepEqual((await reservationRows(bill, id)).map((x) => [x.attempt, x.state, x.amount]),
    [[1, 'reconciled', R], [2, 'reconciled', R]], 'each attempt reserved its own bound');
  assert.deepEqual(await ledgerRows(bill, id), [{ kind: 'usage', amount: -A }]);

  assert.equal(await liveReservation(bill, id, 1), null);
  assert.equal(await liveReservation(bill, id, 2), null);
  const live = await liveMoney(bill);
  assert.equal(live.reserved, 0n, 'both holds were returned');
  assert.equal(live.avail, before.balance - A);
  assert.equal((await accountsMoney(bill)).balance, before.balance - A);
  await verifyLedger(bill);
});

test('every attempt fails: the error reaches the client, nothing is billed, every hold is returned', async () => {
  await mock.reset();
  await fault({ status: 500, count: 3 });
  const body = chatBody('all fail [mock chunks=6]', { maxTokens: 300 });
  const before = await accountsMoney(bill);
  const r = await chat(gw, bill.key, body);
  assert.equal(r.status, 500, r.text);
  assert.equal((await mock.stats()).total, 3, 'three attempts');
  const id = r.headers['x-request-id'];
  await waitUsageRow(bill, id).catch(() => {});
  assert.deepEqual((await reservationRows(bill, id)).map((x) => [x.attempt, x.state]),
    [[1, 'reconciled'], [2, 'reconciled'], [3, 'reconciled']]);
  for (const u of await usageRows(bill, id)) assert.equal(u.cost, 0n, 'a failed request costs nothing');
  assert.ok((await count(bill, 'usage', `request_id = '${id}'`)) <= 1);
  const live = await liveMoney(bill);
  assert.equal(live.reserved, 0n);
  assert.equal(live.avail, before.balance);
  assert.deepEqual(await accountsMoney(bill), before, 'no money moved');
  await verifyLedger(bill);
});

test("a failed attempt's hold does not block the retry: a balance of 1.5 bounds still fails over", async () => {
  // The first attempt ended with an upstream 500: its outcome is known and costs 0, so
  // holding its bound while the second attempt reserves only turns a failover the
  // balance can pay for into a 402 that names the wrong cause.
  const text = 'fail over on a small balance [mock chunks=6]';
  const body = chatBody(text, { maxTokens: 300 });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 300);
  const small = await billedSetup({
    mock,
    balance: fmtNano(R + R / 2n),
    accounts: [{ name: 'up', credential: CRED, priority: 10 }, { name: 'up2', credential: CRED2, priority: 10 }],
  });
  try {
    const g = await startBilledGateway(small, { workers: 1, routing: { max_attempts: 3 } }, { mock });
    await mock.reset();
    await fault({ status: 500, count: 1 });
    const r = await chat(g, small.key, body);
    assert.equal(r.status, 200, `expected the retry to succeed, got ${r.status} ${r.text}`);
    const row = await waitUsageRow(small, r.headers['x-request-id']);
    assert.equal(row.attempts, 2);
    assert.equal(row.cost, costOf(mockInputTokens(text), 6));
    await verifyLedger(small);
    await g.stop();
  } finally {
    await small.db.drop();
  }
});
