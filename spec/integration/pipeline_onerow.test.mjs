// One Postgres row per billed request on the normal path (issue #17 "pipeline", goal 3;
// sql/0017_settle_one_row.sql): tg_settle_batch writes no reservation row for a request
// reserved the normal way, with one attempt, whose settlement is in the same batch — its
// usage row is its record. Every other shape keeps its rows as before: a reservation
// whose row was already written (a batch whose answer was lost, replayed with the
// settlement), a retried request (a row per attempt, with its bound), an `unheld`
// attempt, a reservation alone (in flight). Called the way the gateway, its spool and
// the reconciler call it: one tg_settle_batch per batch, against a real Postgres; after
// each, the books agree (`tollgate ledger verify`).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import { lit } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  costOf,
  fmtNano,
  reservationRows,
  reservedBound,
  settleBatch,
  settlement,
  usageRows,
  verifyLedger,
} from './lib/billing.mjs';

let bill;
let seq = 0;

before(async () => {
  const mock = await startMock(); // only named by the account; never called here
  bill = await billedSetup({ mock, balance: '10' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

const BOUND = 50_000_000n; // 0.05 USD reserved

/** A `reserve` element as the gateway's batcher writes it (tg_billing_holds.c). */
function reserveOp(id, { attempt = 1, note } = {}) {
  return {
    op: 'reserve', request_id: id, attempt, tenant_id: bill.tenantId, api_key_id: bill.keyId,
    amount: fmtNano(BOUND), model: 'mock-gpt', instance: 'onerow-test', ...(note ? { note } : {}),
  };
}

const newId = (what) => `onerow-${what}-${process.pid}-${seq++}`;

test('reserved and settled in one batch: the usage row only, no reservation row; billed once', async () => {
  const before = await accountsMoney(bill);
  const ids = [newId('a'), newId('b'), newId('c')];
  const batch = ids.flatMap((id) => [reserveOp(id), settlement(bill, { requestId: id, input: 100, output: 50 })]);
  const out = await settleBatch(bill.conninfo, batch);
  assert.deepEqual(out.map((o) => o.outcome), ['reserved', 'settled', 'reserved', 'settled', 'reserved', 'settled']);
  for (const id of ids) {
    assert.deepEqual(await reservationRows(bill, id), [], `${id}: no reservation row`);
    assert.equal((await usageRows(bill, id)).length, 1, `${id}: its usage row`);
    assert.equal(await reservedBound(bill, id), BOUND, `${id}: what it reserved, kept in its usage row`);
  }
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - 3n * costOf(100, 50), 'debited once each');
  // The same batch again (a spool replay): duplicates, and still no reservation row
  // left open (a late reserve of a settled request is written reconciled, as before).
  const again = await settleBatch(bill.conninfo, batch);
  assert.deepEqual(again.map((o) => o.outcome), ['reserved', 'duplicate', 'reserved', 'duplicate', 'reserved', 'duplicate']);
  for (const id of ids) {
    assert.ok((await reservationRows(bill, id)).every((r) => r.state === 'reconciled'), `${id}: nothing open`);
  }
  assert.equal((await accountsMoney(bill)).balance, m.balance, 'not billed again');
  await verifyLedger(bill);
});

test('its row already written (an earlier batch whose answer was lost): reconciled at the cost, as before', async () => {
  const id = newId('lost');
  await settleBatch(bill.conninfo, [reserveOp(id)]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.state, r.amount]), [['reserved', BOUND]]);
  const out = await settleBatch(bill.conninfo, [reserveOp(id), settlement(bill, { requestId: id, input: 10, output: 5 })]);
  assert.deepEqual(out.map((o) => o.outcome), ['reserved', 'settled']);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.state, r.amount, r.settled_cost]),
    [['reconciled', BOUND, costOf(10, 5)]], 'the row there is reconciled, not left reserved');
  await verifyLedger(bill);
});

test('in flight at its batch, settled in a later one: its row, reserved then reconciled', async () => {
  const id = newId('flight');
  await settleBatch(bill.conninfo, [reserveOp(id)]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => r.state), ['reserved'], 'the money in flight is in Postgres');
  await settleBatch(bill.conninfo, [settlement(bill, { requestId: id })]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => r.state), ['reconciled']);
  await verifyLedger(bill);
});

test('a retried request keeps a row per attempt with its bound, even settled in the batch of its reservations', async () => {
  const id = newId('retry');
  const s = { ...settlement(bill, { requestId: id, input: 10, output: 5 }), attempts: 2 };
  await settleBatch(bill.conninfo, [reserveOp(id, { attempt: 1 }), reserveOp(id, { attempt: 2 }), s]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.attempt, r.state, r.amount]),
    [[1, 'reconciled', BOUND], [2, 'reconciled', BOUND]]);
  await verifyLedger(bill);
});

test('an unheld attempt (money open while Redis was away) keeps its row', async () => {
  const id = newId('unheld');
  await settleBatch(bill.conninfo, [reserveOp(id, { note: 'unheld' }), settlement(bill, { requestId: id })]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.state, r.note]), [['reconciled', 'unheld']]);
  await verifyLedger(bill);
});

test('odd batches: empty, a negative attempt count, reservations without their settlement — inert, or in flight, never a row lost or left open', async () => {
  assert.deepEqual(await settleBatch(bill.conninfo, []), []);
  const id = newId('neg');
  // attempts 0 or negative count as one (greatest(coalesce(attempts, 1), 1)): the
  // one-attempt rule applies, and the request is billed once.
  const out = await settleBatch(bill.conninfo, [reserveOp(id), { ...settlement(bill, { requestId: id }), attempts: -3 }]);
  assert.deepEqual(out.map((o) => o.outcome), ['reserved', 'settled']);
  assert.equal((await usageRows(bill, id)).length, 1);
  assert.ok((await reservationRows(bill, id)).every((r) => r.state === 'reconciled'));
  // A reserve without a settlement and one for an id already settled elsewhere: the
  // first stays reserved (in flight), the second is written reconciled.
  const open = newId('open');
  await settleBatch(bill.conninfo, [reserveOp(open), reserveOp(id)]);
  assert.deepEqual((await reservationRows(bill, open)).map((r) => r.state), ['reserved']);
  assert.ok((await reservationRows(bill, id)).every((r) => r.state === 'reconciled'));
  await settleBatch(bill.conninfo, [settlement(bill, { requestId: open })]);
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM reservations WHERE request_id LIKE ${lit(`onerow-%-${process.pid}-%`)} AND state <> 'reconciled'`), '0');
  await verifyLedger(bill);
});
