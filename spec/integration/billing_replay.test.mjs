// Settlement idempotency in Postgres itself: tg_settle_batch (sql/0003_billing.sql) is
// what the gateway, its spool replay and the reconciler all call, so the same
// settlement may arrive many times at once. Here it arrives 100 times concurrently,
// from 100 connections released at the same instant, and bills once: one usage row,
// one ledger row, the balance and the key's spend debited once, the reservation
// reconciled. The same request id with other numbers is a conflict, never a second
// charge, and whole batches replayed concurrently settle each request once.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import { applyState, lit, plainKey, tally } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  count,
  fmtNano,
  ledgerRows,
  psqlConcurrent,
  reservationRows,
  settleBatch,
  settleSql,
  settlement,
  usageRows,
  verifyLedger,
} from './lib/billing.mjs';

const OPENING = 10_000_000_000n; // 10 USD
let bill;

before(async () => {
  const mock = await startMock(); // only named by the account; never called here
  bill = await billedSetup({ mock, balance: '10' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

/** A `reserved` reservation row for request id, as phase_reserve writes it. */
async function reserve(id, amount) {
  await bill.db.exec(`INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model)
    VALUES (${lit(id)}, 1, ${bill.tenantId}, ${bill.keyId}, ${fmtNano(amount)}, 'mock-gpt')`);
}

/** Outcome counts over the output lines ("<id> <outcome>") of many psql processes. */
const outcomes = (outs) => tally(outs.flat().map((l) => l.split(' ')[1]));

test('the same settlement replayed 100 times concurrently bills once', async () => {
  const id = 'replay-once-1';
  await reserve(id, 3_000_000n);
  const s = settlement(bill, { requestId: id, input: 400, output: 1000 }); // 0.0024 USD
  const cost = 2_400_000n;
  const before = await accountsMoney(bill);

  const outs = await psqlConcurrent(bill.conninfo, Array(100).fill(settleSql([s])));
  assert.deepEqual(outcomes(outs), { settled: 1, duplicate: 99 }, 'exactly one of the 100 settled');

  const rows = await usageRows(bill, id);
  assert.equal(rows.length, 1, 'one usage row');
  assert.equal(rows[0].cost, cost);
  assert.equal(rows[0].input_tokens, 400);
  assert.equal(rows[0].output_tokens, 1000);
  assert.deepEqual(await ledgerRows(bill, id), [{ kind: 'usage', amount: -cost }], 'debited once in the ledger');
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - cost, 'balance debited once');
  assert.equal(m.spend, before.spend + cost, 'tenant spend added once');
  assert.equal(m.keySpend, before.keySpend + cost, 'key spend added once');
  assert.deepEqual((await reservationRows(bill, id)).map((r) => [r.state, r.settled_cost]), [['reconciled', cost]]);
  assert.equal(await count(bill, 'billing_dedup', `request_id = ${lit(id)}`), 1);

  // The same request id with different numbers: a conflict, still billed once.
  const other = settlement(bill, { requestId: id, input: 400, output: 3000 });
  assert.notEqual(other.fingerprint, s.fingerprint);
  assert.deepEqual(await settleBatch(bill.conninfo, [other]), [{ request_id: id, outcome: 'conflict' }]);
  const conflicts = await psqlConcurrent(bill.conninfo, Array(20).fill(settleSql([other])));
  assert.deepEqual(outcomes(conflicts), { conflict: 20 });
  assert.deepEqual(await accountsMoney(bill), m, 'a conflict changes no money');
  assert.equal((await usageRows(bill, id)).length, 1);
  assert.equal((await usageRows(bill, id))[0].cost, cost, 'the first settlement stands');
  assert.equal((await ledgerRows(bill, id)).length, 1);
  await verifyLedger(bill);
});

test('100 concurrent settlements of one request with two different fingerprints: one wins, billed once', async () => {
  const id = 'replay-race-2';
  await reserve(id, 5_000_000n);
  const a = settlement(bill, { requestId: id, input: 100, output: 100 }); // 0.0003
  const b = settlement(bill, { requestId: id, input: 100, output: 900 }); // 0.0019
  const before = await accountsMoney(bill);
  const sqls = Array.from({ length: 100 }, (_, i) => settleSql([i % 2 ? a : b]));
  const outs = await psqlConcurrent(bill.conninfo, sqls);
  const t = outcomes(outs);
  assert.equal(t.settled, 1, `exactly one settled: ${JSON.stringify(t)}`);
  assert.equal((t.duplicate ?? 0) + (t.conflict ?? 0), 99);
  assert.equal(t.duplicate, 49, 'the 49 others with the winner\'s fingerprint are duplicates');
  assert.equal(t.conflict, 50, 'the 50 with the loser\'s fingerprint are conflicts');

  const [row] = await usageRows(bill, id);
  assert.equal((await usageRows(bill, id)).length, 1);
  assert.ok(row.cost === 300_000n || row.cost === 1_900_000n, `cost ${row.cost}`);
  const fp = await bill.db.scalar(`SELECT fingerprint FROM billing_dedup WHERE request_id = ${lit(id)}`);
  assert.equal(fp, row.cost === 300_000n ? a.fingerprint : b.fingerprint, 'the dedup row names the winner');
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - row.cost, 'debited once, by the winner');
  assert.equal(m.keySpend, before.keySpend + row.cost);
  await verifyLedger(bill);
});

test('a batch of 200 replayed from 10 connections at once (and repeated inside a batch) settles each request once', async () => {
  const ids = Array.from({ length: 200 }, (_, i) => `replay-batch-${i}`);
  for (let i = 0; i < ids.length; i += 50) {
    await bill.db.exec(`INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model)
      SELECT 'replay-batch-' || g, 1, ${bill.tenantId}, ${bill.keyId}, 0.001, 'mock-gpt' FROM generate_series(${i}, ${i + 49}) g`);
  }
  const batch = ids.map((id, i) => settlement(bill, { requestId: id, input: 10 + (i % 7), output: 20 + (i % 11) }));
  const total = batch.reduce((sum, s) => sum + BigInt(s.input) * 1000n + BigInt(s.output) * 2000n, 0n);
  const before = await accountsMoney(bill);
  const usageBefore = await count(bill, 'usage');

  // Every connection sends the batch with its first 20 elements repeated at the end.
  const withRepeats = [...batch, ...batch.slice(0, 20)];
  const outs = await psqlConcurrent(bill.conninfo, Array(10).fill(settleSql(withRepeats)));
  assert.deepEqual(outcomes(outs), { settled: 200, duplicate: 10 * 220 - 200 });
  const settledIds = outs.flat().filter((l) => l.endsWith(' settled')).map((l) => l.split(' ')[0]);
  assert.equal(new Set(settledIds).size, 200, 'each request id settled by exactly one connection');

  assert.equal(await count(bill, 'usage') - usageBefore, 200, '200 new usage rows');
  assert.equal(await count(bill, 'usage', "request_id LIKE 'replay-batch-%' AND ledger_id IN (SELECT id FROM ledger WHERE kind = 'usage')"),
    200, 'each in a ledger entry');
  assert.equal(await count(bill, 'reservations', "request_id LIKE 'replay-batch-%' AND state = 'reconciled'"), 200);
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - total, 'the batch debited its total once');
  assert.equal(m.balance, OPENING - (m.spend), 'balance = opening - spend');
  await verifyLedger(bill);
});

test('batches of different requests from two tenants, in opposite orders, settle concurrently without a deadlock', async () => {
  // Two workers (or gateways) each batch the settlements they have: nothing orders them
  // by tenant, so one batch may hold tenant A's row and want B's while another holds B's
  // and wants A's. Postgres then aborts one batch ("deadlock detected"): every
  // settlement in it is delayed to the spool, or lost if that was the spool's replay.
  await applyState(bill.db, {
    tenants: [{ name: 'other', balance: '10' }],
    keys: [{ name: 'k2', tenant: 'other', group: 'g', key: plainKey('other') }],
  }, { redis: bill.redis });
  const [o] = await bill.db.query("SELECT t.id AS t, k.id AS k FROM tenants t JOIN api_keys k ON k.tenant_id = t.id WHERE t.name = 'other'");
  const other = { ...bill, tenantId: o.t, keyId: o.k };
  const mk = (b, prefix) => Array.from({ length: 100 }, (_, i) => settlement(b, { requestId: `${prefix}-${i}`, input: 5, output: 5 }));
  const runs = [];
  for (let round = 0; round < 3; round++) {
    const p = `order-${round}`;
    const first = [...mk(bill, `${p}-a1`), ...mk(other, `${p}-a2`)];
    const second = [...mk(other, `${p}-b2`), ...mk(bill, `${p}-b1`)];
    runs.push(await psqlConcurrent(bill.conninfo, [settleSql(first), settleSql(second)], { startInMs: 1500 })
      .then((outs) => outcomes(outs), (e) => e.message.split('\n').slice(0, 3).join(' | ')));
  }
  assert.deepEqual(runs, Array(3).fill({ settled: 400 }), 'every concurrent batch committed');
  await verifyLedger(bill);
});
