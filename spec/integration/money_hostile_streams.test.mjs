// Hostile money (issue #14): many concurrent streams that the upstream resets mid-way.
// Their usage is unknown, so each reservation must become `pending_reconciliation` (the
// reconciler settles it by the README's rule) — never stay `reserved`, which
// `tollgate ledger verify` reports and only a manual reconcile cleared. The cause: the
// "usage unknown" update and the reservation row travel in different settlement batches
// (two in flight per worker, or one spooled and one live), and an update that committed
// first found no row to change.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll, waitFor } from './lib/harness.mjs';
import { billedSetup, ledger, startBilledGateway } from './lib/billing.mjs';

let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  // Long reconcile delay: nothing is settled by the reconciler during the test.
  gw = await startBilledGateway(bill, { workers: 2, billing: { reconcile_after_ms: 600000 } }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function oneStream(openai, i) {
  try {
    const stream = await openai.chat.completions.create({
      model: 'mock-gpt',
      stream: true,
      max_tokens: 64,
      messages: [{ role: 'user', content: `reset me ${i} [mock chunks=8 close_after=3 interval_ms=2]` }],
    });
    // eslint-disable-next-line no-unused-vars
    for await (const _ of stream);
    return 'ended';
  } catch {
    return 'reset';
  }
}

test('streams reset mid-way leave every reservation pending_reconciliation; ledger verify is clean at once', async () => {
  const { default: OpenAI } = await import('openai');
  const openai = new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
  const rounds = 4;
  const per = 60;
  let resets = 0;
  for (let r = 0; r < rounds; r++) {
    const out = await Promise.all(Array.from({ length: per }, (_, i) => oneStream(openai, r * per + i)));
    resets += out.filter((o) => o === 'reset').length;
  }
  assert.equal(resets, rounds * per, 'every stream was reset by the upstream');
  const total = rounds * per;
  // Every request's reservation row is written (settlement is asynchronous) ...
  await waitFor(async () => Number(await bill.db.scalar('SELECT count(*) FROM reservations')) === total,
    { timeout: 15000, what: `${total} reservation rows` });
  // ... and none is left `reserved` once the queues are empty.
  await waitFor(async () => Number(await bill.db.scalar(`SELECT count(*) FROM reservations WHERE state = 'pending_reconciliation'`)) === total,
    { timeout: 10000, what: 'every reservation pending_reconciliation' }).catch(() => {});
  const states = await bill.db.query('SELECT state, count(*)::int AS n FROM reservations GROUP BY state ORDER BY state');
  assert.deepEqual(states, [{ state: 'pending_reconciliation', n: total }], JSON.stringify(states));
  // Right away, no manual reconcile: the ledger verifies, even with a zero age limit
  // on `reserved` rows.
  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, v.stdout + v.stderr);
  // Nothing was billed: the usage is unknown until the reconciler's rule applies.
  assert.equal(Number(await bill.db.scalar('SELECT count(*) FROM usage')), 0);
  // Once the gateway is gone the rule settles them all (each at its reserved bound),
  // and their holds leave the suite's Redis.
  await gw.stop();
  const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
  assert.equal(rec.code, 0, rec.stdout + rec.stderr);
  await waitFor(async () => Number(await bill.db.scalar('SELECT count(*) FROM usage WHERE estimated')) === total,
    { timeout: 15000, what: 'every request settled by the reconciliation rule' });
  const v2 = await ledger(bill, 'verify');
  assert.equal(v2.code, 0, v2.stdout + v2.stderr);
});
