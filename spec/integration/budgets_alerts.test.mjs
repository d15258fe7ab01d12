// Budget alerts (#24, item 4): thresholds fire once per period each, as a signed webhook
// (HMAC-SHA256 over "<timestamp>.<body>"), delivered by the reconciler off the event loop,
// every attempt logged; a receiver that is down is retried with backoff and the alert is
// finally logged failed; /metrics counts them.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { freePort, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { adminClient, chat, metrics } from './lib/db.mjs';
import {
  billedSetup,
  chatBody,
  costOf,
  count,
  fmtNano,
  mockInputTokens,
  reservationFor,
  startBilledGateway,
  verifyLedger,
} from './lib/billing.mjs';

const TEXT = 'alerts [mock chunks=4]';
const BODY = chatBody(TEXT, { maxTokens: 5 });
const R = reservationFor(Buffer.byteLength(JSON.stringify(BODY)), 5);
const A = costOf(mockInputTokens(TEXT), 4);
const AMOUNT = 4n * R;
// Threshold k is reached by the k-th request's settled cost, not before.
const THRESHOLDS = [1n, 2n, 3n].map((k) => Number((100n * k * A) / AMOUNT));
const SECRET = 'whsec-test-0123456789';

let mock;
let bill;
let gw;
let receiver;
const received = [];

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  const port = await freePort();
  receiver = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), at: Date.now() });
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => receiver.listen(port, '127.0.0.1', r));
  receiver.url = `http://127.0.0.1:${port}/hook`;
  gw = await startBilledGateway(bill, { workers: 1 }, { mock });
});

after(async () => {
  receiver?.close();
  await stopAll();
  await bill?.db.drop();
});

async function waitUsage(n) {
  for (let i = 0; i < 200 && (await count(bill, 'usage')) < n; i++) await sleep(50);
  assert.equal(await count(bill, 'usage'), n);
}

test('each threshold reaches the webhook once per period, signed; the console\'s API lists the alerts', async () => {
  assert.deepEqual(new Set(THRESHOLDS).size, 3, `distinct thresholds ${THRESHOLDS}`);
  const admin = adminClient(gw);
  const budget = await admin.create('/budgets', {
    name: 'k-alerts', api_key_id: Number(bill.keyId), amount: fmtNano(AMOUNT), period: 'day',
    thresholds: THRESHOLDS, webhook_url: receiver.url, webhook_secret: SECRET,
  });
  assert.equal(budget.webhook_secret, undefined, 'the secret is never shown');
  for (let k = 1; k <= 5; k++) {
    const r = await chat(gw, bill.key, BODY);
    assert.equal(r.status, 200, r.text);
    await waitUsage(k);
    if (k <= 3) {
      await waitFor(() => received.length >= k, { timeout: 10000, what: `alert ${k}` });
    }
  }
  await sleep(1500); // passes enough for any duplicate to arrive
  assert.equal(received.length, 3, `one post per threshold: ${received.map((x) => x.body).join('\n')}`);
  const seen = [];
  for (const m of received) {
    const ts = m.headers['x-tollgate-timestamp'];
    assert.match(ts, /^[0-9]+$/);
    assert.ok(Math.abs(Number(ts) - Date.now() / 1000) < 60, 'a fresh timestamp');
    const want = crypto.createHmac('sha256', SECRET).update(`${ts}.${m.body}`).digest('hex');
    assert.equal(m.headers['x-tollgate-signature'], `sha256=${want}`, 'a valid signature');
    const wrong = crypto.createHmac('sha256', 'other').update(`${ts}.${m.body}`).digest('hex');
    assert.notEqual(m.headers['x-tollgate-signature'], `sha256=${wrong}`);
    const j = JSON.parse(m.body);
    assert.equal(j.type, 'budget.threshold');
    assert.equal(j.budget.id, Number(budget.id));
    assert.equal(j.budget.name, 'k-alerts');
    seen.push(j.threshold);
    assert.ok(j.period_start && j.period_end, m.body);
  }
  assert.deepEqual(seen.sort((a, b) => a - b), THRESHOLDS, 'each threshold once, in any order');
  const b = await admin.read(`/budgets/${budget.id}`);
  assert.deepEqual(b.alerts.map((a) => [a.threshold, a.state, a.attempts]).sort((x, y) => x[0] - y[0]),
    THRESHOLDS.map((t) => [t, 'delivered', 1]));
  assert.equal(b.has_webhook_secret, true);
  const key = await admin.read(`/keys/${bill.keyId}`);
  assert.ok(key.budgets.some((x) => x.id === Number(budget.id) && x.scope === 'key'), 'the key lists its budget');
  const m = await metrics(gw);
  assert.equal(m['tollgate_budget_alerts_total{event="delivered"}'], 3);
  assert.equal(m['tollgate_budget_alerts_total{event="failed"}'], 0);
  await verifyLedger(bill);
});

test('a receiver that is down is retried with backoff and the alert is finally logged failed', async () => {
  const admin = adminClient(gw);
  const dead = await freePort(); // nothing listens there
  const budget = await admin.create('/budgets', {
    name: 't-alerts-down', tenant_id: Number(bill.tenantId), amount: fmtNano(4n * R), period: 'week',
    timezone: 'America/New_York', thresholds: [1], webhook_url: `http://127.0.0.1:${dead}/hook`,
  });
  const n = await count(bill, 'usage');
  const r = await chat(gw, bill.key, BODY);
  assert.equal(r.status, 200, r.text);
  await waitUsage(n + 1);
  await waitFor(async () => (await admin.read(`/budgets/${budget.id}`)).alerts[0]?.state === 'failed',
    { timeout: 30000, interval: 250, what: 'the alert to be given up' });
  const rows = await bill.db.query(`SELECT attempt, status, error, at FROM budget_alert_deliveries
    WHERE budget_id = ${budget.id} ORDER BY attempt`);
  assert.deepEqual(rows.map((x) => x.attempt), [1, 2, 3, 4, 5], 'five attempts, each logged');
  for (const x of rows) {
    assert.equal(x.status, null);
    assert.match(x.error, /connect/);
  }
  const gaps = rows.slice(1).map((x, i) => Date.parse(x.at) - Date.parse(rows[i].at));
  for (let i = 0; i < gaps.length; i++) {
    assert.ok(gaps[i] >= 500 * 2 ** i - 100, `backoff before attempt ${i + 2}: ${gaps[i]} ms`);
  }
  const m = await metrics(gw);
  assert.equal(m['tollgate_budget_alerts_total{event="failed"}'], 1);
  assert.equal(m['tollgate_budget_alerts_total{event="retried"}'], 4);
  // Nothing was lost: the request was billed as usual.
  await verifyLedger(bill);
});
