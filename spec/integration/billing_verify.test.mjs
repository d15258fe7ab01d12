// `tollgate ledger verify` exits 0 on a consistent ledger and 1 naming each broken
// invariant: a balance that does not follow from the ledger, usage debits that differ
// from usage costs, a batch's ledger entry that differs from its usage rows, a request
// billed twice, a usage row without its fingerprint or ledger entry, a key's
// spend that differs from its usage, a reservation left `reserved` for over a minute,
// a settled request whose reservation is still open, and Redis totals that differ from
// Postgres. Each is broken on purpose (in Postgres or Redis) and repaired again.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import { chat, redisCli } from './lib/db.mjs';
import { billedSetup, chatBody, ledger, liveMoney, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

let bill;
let ids = [];

before(async () => {
  const mock = await startMock();
  bill = await billedSetup({ mock, balance: '10' });
  const gw = await startBilledGateway(bill, { workers: 1 }, { mock });
  for (const n of [3, 5]) {
    const r = await chat(gw, bill.key, chatBody(`verify me [mock chunks=${n}]`));
    assert.equal(r.status, 200, r.text);
    ids.push(r.headers['x-request-id']);
    await waitUsageRow(bill, ids.at(-1));
  }
  await gw.stop();
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

/** Runs verify; returns {code, problems: the PROBLEM lines}. */
async function verify() {
  const r = await ledger(bill, 'verify');
  return { code: r.code, problems: r.stdout.split('\n').filter((l) => l.startsWith('PROBLEM')), out: r.stdout + r.stderr };
}

/** Breaks something with `breakSql`, expects verify to name it, repairs with `fixSql`. */
async function expectProblem(breakSql, fixSql, want) {
  await bill.db.exec(breakSql);
  let r;
  try {
    r = await verify();
  } finally {
    await bill.db.exec(fixSql);
  }
  assert.equal(r.code, 1, `verify must fail:\n${r.out}`);
  for (const re of want) assert.ok(r.problems.some((l) => re.test(l)), `a problem matching ${re}:\n${r.out}`);
  assert.equal((await verify()).code, 0, 'consistent again after the repair');
}

test('a consistent ledger verifies (exit 0, every invariant named ok)', async () => {
  const r = await ledger(bill, 'verify');
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.equal(r.stdout.split('\n').filter((l) => l.startsWith('ok ')).length, 11, r.stdout);
  assert.match(r.stdout, /all invariants hold/);
});

test('a budget period whose recorded spend is not the sum of its usage (budgets)', async () => {
  await expectProblem(
    `INSERT INTO budget_periods (budget_id, period_start, spend) VALUES (424242, '2026-01-01T00:00:00Z', 0.5);
     INSERT INTO budget_usage (request_id, budget_id, period_start, cost) VALUES ('${ids[0]}', 424242, '2026-01-01T00:00:00Z', 0.25)`,
    `DELETE FROM budget_periods WHERE budget_id = 424242; DELETE FROM budget_usage WHERE budget_id = 424242`,
    [/PROBLEM each budget period's spend = the sum of its usage.*budget_id=424242/,
      new RegExp(`PROBLEM each budget usage row = its request's usage cost.*request_id=${ids[0]}`)]);
});

test('a balance that does not follow from the ledger', async () => {
  await expectProblem(`UPDATE tenants SET balance = balance - 0.000001 WHERE id = ${bill.tenantId}`,
    `UPDATE tenants SET balance = balance + 0.000001 WHERE id = ${bill.tenantId}`,
    [new RegExp(`PROBLEM each balance = opening.*tenant_id=${bill.tenantId}`)]);
});

// A settlement batch's ledger entry (one per tenant, sql/0006) written twice: the copy
// debits what no usage row costs.
test("a batch's ledger entry written twice", async () => {
  const entry = `(SELECT ledger_id FROM usage WHERE request_id = '${ids[0]}')`;
  await expectProblem(
    `INSERT INTO ledger (tenant_id, kind, amount, note) SELECT tenant_id, kind, amount, note FROM ledger WHERE id = ${entry};
     UPDATE tenants SET balance = balance + (SELECT amount FROM ledger WHERE id = ${entry}) WHERE id = ${bill.tenantId}`,
    `UPDATE tenants SET balance = balance - (SELECT amount FROM ledger WHERE id = ${entry}) WHERE id = ${bill.tenantId};
     DELETE FROM ledger WHERE id = (SELECT max(id) FROM ledger WHERE kind = 'usage' AND request_id IS NULL)`,
    [/PROBLEM each batch's ledger entry = minus the costs of its usage rows/, /PROBLEM usage debits in the ledger = usage costs/]);
});

// Ledger rows of a request of its own (before sql/0006) twice.
test('a request billed twice in the ledger', async () => {
  await expectProblem(
    `INSERT INTO ledger (tenant_id, kind, amount, request_id) VALUES (${bill.tenantId}, 'usage', 0, '${ids[0]}'), (${bill.tenantId}, 'usage', 0, '${ids[0]}')`,
    `DELETE FROM ledger WHERE request_id = '${ids[0]}'`,
    [new RegExp(`PROBLEM no request id billed twice.*request_id=${ids[0]}`)]);
});

test("a key's spend that differs from its usage", async () => {
  await expectProblem(`UPDATE api_keys SET spend = spend + 1 WHERE id = ${bill.keyId}`,
    `UPDATE api_keys SET spend = spend - 1 WHERE id = ${bill.keyId}`,
    [new RegExp(`PROBLEM each key's spend = its usage.*key_id=${bill.keyId}`)]);
});

// The usage row is its request's dedup (sql/0006): its fingerprint, and its ledger entry.
test('a usage row without its fingerprint, or without its ledger entry', async () => {
  const edit = (set) => `ALTER TABLE usage DISABLE TRIGGER usage_immutable; UPDATE usage SET ${set} WHERE request_id = '${ids[1]}';
    ALTER TABLE usage ENABLE TRIGGER usage_immutable`;
  await expectProblem(`CREATE TABLE saved AS SELECT fingerprint, ledger_id FROM usage WHERE request_id = '${ids[1]}'; ${edit('fingerprint = NULL')}`,
    `${edit('fingerprint = (SELECT fingerprint FROM saved)')}; DROP TABLE saved`,
    [new RegExp(`PROBLEM every usage row has its fingerprint and its ledger entry.*${ids[1]}`)]);
  await expectProblem(`CREATE TABLE saved AS SELECT fingerprint, ledger_id FROM usage WHERE request_id = '${ids[1]}'; ${edit('ledger_id = -1')}`,
    `${edit('ledger_id = (SELECT ledger_id FROM saved)')}; DROP TABLE saved`,
    [new RegExp(`PROBLEM every usage row has its fingerprint and its ledger entry.*${ids[1]}`)]);
});

test('a reservation left reserved for over a minute, and a settled request whose reservation is open', async () => {
  // (a request settled in the batch of its reservation has no row, sql/0017: one is
  // written open for it here, and left reconciled)
  await expectProblem(
    `INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model, created_at)
       VALUES ('lost-1', 1, ${bill.tenantId}, ${bill.keyId}, 0, 'mock-gpt', now() - interval '2 minutes');
     INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model, state)
       VALUES ('${ids[0]}', 1, ${bill.tenantId}, ${bill.keyId}, 0, 'mock-gpt', 'reserved')
       ON CONFLICT (request_id, attempt) DO UPDATE SET state = 'reserved'`,
    `DELETE FROM reservations WHERE request_id = 'lost-1';
     UPDATE reservations SET state = 'reconciled' WHERE request_id = '${ids[0]}'`,
    [/PROBLEM every reservation is reconciled or pending.*request_id=lost-1/,
      new RegExp(`PROBLEM every settled request's reservations are reconciled.*request_id=${ids[0]}`)]);
});

test('Redis totals that differ from Postgres', async () => {
  const live = await liveMoney(bill);
  assert.notEqual(live.avail, null, 'the live balance is in Redis');
  const key = `{t:${bill.tenantId}}:money`;
  await redisCli(bill.redis, 'HINCRBY', key, 'avail', '-1000');
  let r;
  try {
    r = await verify();
  } finally {
    await redisCli(bill.redis, 'HINCRBY', key, 'avail', '1000');
  }
  assert.equal(r.code, 1, r.out);
  assert.ok(r.problems.some((l) => new RegExp(`PROBLEM Redis reserved totals match Postgres: tenant_id=${bill.tenantId}`).test(l)), r.out);
  assert.equal((await verify()).code, 0);
});
