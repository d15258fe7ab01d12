// The books balance under load: 2,000 quick requests from 32 keep-alive clients over a
// gateway with two workers (so reservation rows and settlements are batched while
// others are in flight). Afterwards every 200 has exactly one usage row at its exact
// cost, every reservation row is reconciled, the live balance in Redis equals the
// Postgres balance with nothing held, and `ledger verify` passes. The reconciler is
// kept out of it (reconcile_after_ms 10 min): nothing here is lost or unknown.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { chat, keepAliveAgent, tally } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  ledger,
  liveMoney,
  mockInputTokens,
  pool,
  startBilledGateway,
} from './lib/billing.mjs';

const N = 2000;
const TEXT = 'quick [mock chunks=2]';
const A = costOf(mockInputTokens(TEXT), 2);
let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  gw = await startBilledGateway(bill, { billing: { reconcile_after_ms: 600000 } }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test(`${N} requests from 32 clients: every 200 billed once at its cost, every reservation reconciled, ledger verify passes`, async () => {
  const agent = keepAliveAgent(32);
  const rs = await pool(Array.from({ length: N }, (_, i) => i), 32,
    () => chat(gw, bill.key, chatBody(TEXT, { maxTokens: 20 }), { agent, timeout: 30000 }));
  agent.destroy();
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: N });

  await waitFor(async () => (await count(bill, 'usage')) >= N, { timeout: 20000, what: `${N} usage rows` }).catch(async (e) => {
    throw new Error(`${e.message}: ${await count(bill, 'usage')}`);
  });
  await sleep(500);
  const ids = rs.map((r) => `'${r.headers['x-request-id']}'`).join(',');
  const [u] = await bill.db.query(`SELECT count(*) AS n, count(DISTINCT request_id) AS ids,
    count(*) FILTER (WHERE cost <> ${Number(A) / 1e9}) AS wrong_cost, count(*) FILTER (WHERE estimated) AS estimated
    FROM usage WHERE request_id IN (${ids})`);
  assert.deepEqual(u, { n: N, ids: N, wrong_cost: 0, estimated: 0 }, 'one exact usage row per answered request');
  assert.equal(await count(bill, 'usage'), N);

  // A request settled in the batch of its reservation has no reservation row (sql/0017);
  // those written earlier are all reconciled: nothing is left open.
  const open = await bill.db.query(`SELECT state, count(*) AS n FROM reservations GROUP BY state ORDER BY state`);
  assert.ok(open.every((x) => x.state === 'reconciled' && Number(x.n) <= N), `every reservation row reconciled: ${JSON.stringify(open)}`);

  const m = await accountsMoney(bill);
  assert.equal(m.balance, 100_000_000_000n - BigInt(N) * A);
  const live = await liveMoney(bill);
  assert.deepEqual({ avail: live.avail, reserved: live.reserved }, { avail: m.balance, reserved: 0n }, 'Redis = Postgres, nothing held');
  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, `ledger verify:\n${v.stdout}${v.stderr}`);
});
