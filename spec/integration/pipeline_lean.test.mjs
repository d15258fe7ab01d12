// A leaner settlement batch (issue #17 "pipeline", goal 3; sql/0023_settle_lean.sql):
//
//   * a request whose reservation and settlement go to Postgres in the same batch is one
//     element — the settlement carrying its reservation's bound and instance — and what
//     the books hold is what they held with two: its usage row with the bound, no
//     reservation row; written as its `reserve` element would have been when the
//     settlement does not bill (a replay's duplicate); a row written meanwhile by someone
//     else reconciled;
//   * usage's foreign keys are checked once per batch (the batch's tenants and keys
//     locked, all there) and on delete (a trigger): a settlement naming a key that is
//     gone is refused with foreign_key_violation, a key with usage cannot be deleted,
//     and a delete racing a batch loses on either side, never leaving a usage row of a
//     deleted key;
//   * the gateway sends such pairs as one element under load (counted in /metrics).
// Against a real Postgres (the suite's) and a real gateway; the books checked with
// `tollgate ledger verify` after each.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import fs from 'node:fs';
import path from 'node:path';

import { startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, lit, metrics, psql } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  fmtNano,
  pool,
  reservationRows,
  reservedBound,
  settleBatch,
  settleJson,
  settlement,
  startBilledGateway,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

let bill;
let mock;
let seq = 0;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

const BOUND = 50_000_000n; // 0.05 USD reserved
const newId = (what) => `lean-${what}-${process.pid}-${seq++}`;

/** A settlement with its reservation inside, as the gateway writes a pair (tg_billing_settle.c). */
function merged(id, { input = 100, output = 50, keyId, tenantId } = {}) {
  return {
    ...settlement(bill, { requestId: id, input, output }),
    ...(keyId ? { api_key_id: keyId } : {}),
    ...(tenantId ? { tenant_id: tenantId } : {}),
    amount: fmtNano(BOUND),
    instance: 'lean-test',
  };
}

const settle = (batch) => settleJson(bill.conninfo, batch);

/** A second key of the tenant, without usage. */
async function freshKey(tag) {
  return psql(bill.conninfo, `INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
    VALUES (${bill.tenantId}, ${lit(`lean-${tag}-${seq++}`)}, sha256(convert_to(${lit(`lean-${tag}-${seq}-${process.pid}`)}, 'UTF8')),
            'tg-lean') RETURNING id`).then((s) => s.trim());
}

// On a database of its own: the SQL tests below write settlements Redis never saw (its
// live balance would differ from Postgres') and leave an unknown outcome pending (which
// this gateway's reconciler would settle meanwhile).
test('the gateway sends a reservation inside its settlement when both wait for the same batch', async () => {
  const bill = await billedSetup({ mock, balance: '100' });
  const gw = await startBilledGateway(bill, {}, { mock });
  const merged0 = (await metrics(gw))['tollgate_billing_total{event="reservation_merged"}'] ?? 0;
  // Postgres held up (the tenant's row locked until every request was answered, however
  // slow the box): the batches in flight wait, and every request made meanwhile has its
  // reservation and its settlement in the queue.
  const app = `tg-lean-locker-${process.pid}`;
  const locked = psql(bill.conninfo, `SET application_name = '${app}'; BEGIN;
    SELECT 1 FROM tenants WHERE id = ${bill.tenantId} FOR UPDATE; SELECT pg_sleep(60); COMMIT;`).catch(() => {});
  await waitFor(async () => Number(await bill.db.scalar(
    `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}' AND query LIKE '%pg_sleep%'`)) === 1,
  { timeout: 10000, what: 'the row lock taken' });
  const before = await accountsMoney(bill);
  const res = await pool(Array.from({ length: 40 }, (_, i) => i), 8,
    () => chat(gw, bill.key, chatBody('hello [mock chunks=2]', { maxTokens: 50, stream: false })));
  assert.ok(res.every((r) => r.status === 200), `all answered: ${res.map((r) => r.status)}`);
  await bill.db.scalar(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '${app}'`);
  await locked;
  const ids = res.map((r) => r.headers['x-request-id']);
  for (const id of ids) await waitUsageRow(bill, id, 20000);
  const m = await metrics(gw);
  const n = (m['tollgate_billing_total{event="reservation_merged"}'] ?? 0) - merged0;
  assert.ok(n >= 30, `reservations sent inside their settlements: ${n} of 40`);
  let billed = 0n;
  for (const id of ids) {
    const [u] = await usageRows(bill, id);
    billed += u.cost;
    assert.equal(await reservedBound(bill, id) > 0n, true, `${id}: its bound kept`);
    assert.ok((await reservationRows(bill, id)).every((r) => r.state === 'reconciled'), `${id}: nothing left open`);
  }
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM reservations WHERE request_id IN (${ids.map(lit).join(',')})`),
    String(40 - n), 'a reservation row only for the requests whose reservation went alone');
  const after = await accountsMoney(bill);
  assert.equal(before.balance - after.balance, billed, 'the balance moved by what the usage rows bill');
  await gw.stop();
  await verifyLedger(bill);
  await bill.db.drop();
});

test('a settlement with its reservation inside: the usage row with the bound, no reservation row, billed once', async () => {
  const before = await accountsMoney(bill);
  const ids = [newId('a'), newId('b'), newId('c')];
  assert.deepEqual(await settle(ids.map((id) => merged(id))), ['settled', 'settled', 'settled']);
  for (const id of ids) {
    assert.deepEqual(await reservationRows(bill, id), [], `${id}: no reservation row`);
    assert.equal((await usageRows(bill, id)).length, 1, `${id}: its usage row`);
    assert.equal(await reservedBound(bill, id), BOUND, `${id}: its bound in its usage row`);
  }
  assert.equal((await accountsMoney(bill)).balance, before.balance - 3n * costOf(100, 50), 'debited once each');
  await verifyLedger(bill);
});

test('the same batch again (a replay): duplicates, each reservation written reconciled as its reserve element would be', async () => {
  const ids = [newId('dup'), newId('dup')];
  const batch = ids.map((id) => merged(id, { input: 7, output: 3 }));
  assert.deepEqual(await settle(batch), ['settled', 'settled']);
  const m = await accountsMoney(bill);
  // once through the jsonb form (the reconciler's, the tests'), once through json
  assert.deepEqual((await settleBatch(bill.conninfo, batch)).map((o) => o.outcome), ['duplicate', 'duplicate']);
  assert.deepEqual(await settle(batch), ['duplicate', 'duplicate']);
  for (const id of ids) {
    assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.attempt, r.state, r.amount, r.note]),
      [[1, 'reconciled', BOUND, null]], `${id}: one row, reconciled, with its bound`);
  }
  assert.equal((await accountsMoney(bill)).balance, m.balance, 'not billed again');
  await verifyLedger(bill);
});

test('a row written meanwhile by someone else (the reconciler, for a gateway it took for dead) is reconciled', async () => {
  const id = newId('orphan');
  await settleBatch(bill.conninfo, [{
    op: 'reserve', request_id: id, attempt: 1, tenant_id: bill.tenantId, api_key_id: bill.keyId, amount: fmtNano(BOUND),
    model: 'mock-gpt', instance: 'gone', state: 'pending_reconciliation', note: 'orphaned hold',
  }]);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => r.state), ['pending_reconciliation']);
  assert.deepEqual(await settle([merged(id, { input: 10, output: 5 })]), ['settled']);
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.state, r.settled_cost]),
    [['reconciled', costOf(10, 5)]], 'reconciled at the cost, not left open');
  await verifyLedger(bill);
});

test('both forms in one batch, with a retry, an unknown outcome and a request id twice: outcomes in order, books agree', async () => {
  const [a, b, r, u, twice] = ['mix-a', 'mix-b', 'mix-r', 'mix-u', 'mix-2'].map(newId);
  const reserve = (id, attempt = 1) => ({
    op: 'reserve', request_id: id, attempt, tenant_id: bill.tenantId, api_key_id: bill.keyId, amount: fmtNano(BOUND),
    model: 'mock-gpt', instance: 'lean-test',
  });
  const out = await settle([
    merged(a), reserve(b), settlement(bill, { requestId: b }), reserve(r, 1), reserve(r, 2),
    { ...settlement(bill, { requestId: r }), attempts: 2 },
    { op: 'unknown', request_id: u, tenant_id: bill.tenantId, api_key_id: bill.keyId, attempts: 1, amount: fmtNano(BOUND), model: 'mock-gpt', instance: 'lean-test' },
    merged(twice), merged(twice),
  ]);
  assert.deepEqual(out, ['settled', 'reserved', 'settled', 'reserved', 'reserved', 'settled', 'unknown', 'settled', 'duplicate']);
  assert.deepEqual(await reservationRows(bill, a), []);
  assert.deepEqual(await reservationRows(bill, b), [], 'a pair of two elements: no row either (0017)');
  assert.deepEqual((await reservationRows(bill, r)).map((x) => [x.attempt, x.state]), [[1, 'reconciled'], [2, 'reconciled']]);
  assert.deepEqual((await reservationRows(bill, u)).map((x) => x.state), ['pending_reconciliation']);
  assert.equal((await usageRows(bill, twice)).length, 1, 'a request id twice in a batch bills once');
  await verifyLedger(bill);
});

test('a settlement naming a key or a tenant that is not there: the batch is refused with foreign_key_violation, nothing written', async () => {
  const id = newId('nokey');
  for (const over of [{ keyId: 987654321 }, { tenantId: 987654321 }]) {
    await assert.rejects(settle([merged(newId('ok')), merged(id, over)]), /23503|foreign key|does not exist/);
  }
  assert.deepEqual(await usageRows(bill, id), []);
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM usage WHERE api_key_id = 987654321 OR tenant_id = 987654321`), '0');
  // Text that is not a batch: a clear error, as the gateway would split and quarantine.
  const call = (text) => psql(bill.conninfo, `SELECT count(*) FROM tg_settle_batch(${lit(text)}::json)`);
  await assert.rejects(call('[{"request_id": "x",'), /invalid input syntax for type json/);
  await assert.rejects(call('{"request_id": "x"}'), /cannot call json_to_recordset on an object/);
  const rid = newId('badnum');
  await assert.rejects(call(JSON.stringify([{ ...merged(rid), amount: 'lots' }])), /invalid input syntax for type numeric/);
  assert.deepEqual(await usageRows(bill, rid), [], 'nothing written');
});

test('a key with usage cannot be deleted; one without can', async () => {
  const used = await freshKey('used');
  const id = newId('used');
  assert.deepEqual(await settle([merged(id, { keyId: Number(used) })]), ['settled']);
  await assert.rejects(psql(bill.conninfo, `DELETE FROM api_keys WHERE id = ${used}`), /still referenced from table "usage"/);
  const unused = await freshKey('unused');
  await psql(bill.conninfo, `DELETE FROM api_keys WHERE id = ${unused}`);
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM api_keys WHERE id = ${unused}`), '0');
  await verifyLedger(bill);
});

test('a delete racing a batch: whichever holds the key first, no usage row of a deleted key', async () => {
  // The batch first (its transaction open 1.5 s): the delete waits, then sees the usage.
  const k1 = await freshKey('race1');
  const id1 = newId('race1');
  const batch = JSON.stringify([merged(id1, { keyId: Number(k1) })]);
  const settling = psql(bill.conninfo, `BEGIN; SELECT count(*) FROM tg_settle_batch(${lit(batch)}::json);
    SELECT pg_sleep(1.5); COMMIT;`);
  await new Promise((r) => setTimeout(r, 500));
  const t0 = Date.now();
  await assert.rejects(psql(bill.conninfo, `DELETE FROM api_keys WHERE id = ${k1}`), /still referenced from table "usage"/);
  assert.ok(Date.now() - t0 > 400, 'the delete waited for the batch');
  await settling;
  assert.equal((await usageRows(bill, id1)).length, 1);

  // The delete first (its transaction open 1.5 s): the batch waits, finds the key gone, is refused.
  const k2 = await freshKey('race2');
  const id2 = newId('race2');
  const deleting = psql(bill.conninfo, `BEGIN; DELETE FROM api_keys WHERE id = ${k2}; SELECT pg_sleep(1.5); COMMIT;`);
  await new Promise((r) => setTimeout(r, 500));
  await assert.rejects(settle([merged(id2, { keyId: Number(k2) })]), /API key that does not exist/);
  await deleting;
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM api_keys WHERE id = ${k2}`), '0');
  assert.deepEqual(await usageRows(bill, id2), [], 'no usage row of a deleted key');
  await verifyLedger(bill);
});

test('a spooled settlement carrying its reservation that Postgres refuses: quarantined, its reservation kept and settled by the rule', async () => {
  // The spool of a gateway as it writes a pair (one element), whose cost Postgres cannot
  // hold (numeric overflow): refused on its own, quarantined; its usage is unknown, and
  // the unknown element carries the reservation, so the bound is still held in Postgres
  // (pending_reconciliation) and the reconciler settles it at the bound, once.
  const g = await billedSetup({ mock, balance: '100' });
  const dir = tempDir('spool');
  const rid = `lean-poison-${process.pid}-${seq++}`;
  const bad = { ...settlement(g, { requestId: rid }), cost: '99999999999999999999', amount: fmtNano(BOUND), instance: 'gone' };
  fs.writeFileSync(path.join(dir, 'settlements-w0.jsonl'), `${JSON.stringify([bad])}\n`);
  const gw = await startBilledGateway(g, { workers: 1 }, { mock, spoolDir: dir });
  await waitFor(async () => (await metrics(gw))['tollgate_billing_total{event="quarantined"}'] === 1,
    { timeout: 15000, what: 'the quarantine' });
  const q = fs.readFileSync(path.join(dir, 'quarantine-w0.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(q[0].element.request_id, rid);
  assert.equal(q[0].element.amount, fmtNano(BOUND));
  await waitUsageRow(g, rid, 45000); // the reconciler's passes: slow on a loaded box
  const [u] = await usageRows(g, rid);
  assert.equal(u.estimated, true, 'settled by the reconciliation rule');
  assert.equal(u.cost, BOUND, 'at the bound it reserved');
  assert.deepEqual((await reservationRows(g, rid)).map((r) => [r.state, r.amount]), [['reconciled', BOUND]]);
  await gw.stop();
  await verifyLedger(g);
  await g.db.drop();
});
