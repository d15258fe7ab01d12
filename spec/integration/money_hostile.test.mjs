// Hostile money (issue #14): inputs built to break the arithmetic of billing, against the
// real binary, Postgres, Redis and the mock upstream.
//
//   - a reservation bound that cannot be priced (max_tokens 10^18, 2^62, 2^63-1) is
//     refused with a 400 before anything is held or sent; it was served for a tenant
//     whose balance is 0, and its negative reservation row then failed every settlement
//     batch of its worker;
//   - a poisoned element in the spool (such a row) is quarantined, counted, and the
//     settlements behind it land;
//   - the bound reserved is the bound the upstream receives, whatever the field's
//     spelling (max_completion_tokens: 1 beside max_tokens: 10^8 reserved for 1 token);
//   - money inputs past what tollgate can hold (top-up, budgets, prices, apply) are
//     refused with a 400 naming the field and the largest amount;
//   - absurd upstream usage (2^63-1 tokens) is billed at the reserved bound, flagged;
//     a 200 whose usage cannot be read is estimated, never free.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient, applyState, chat, metrics, redisCli, request } from './lib/db.mjs';
import {
  MODEL,
  billedSetup,
  chatBody,
  count,
  reservationFor,
  reservedBound,
  startBilledGateway,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

let mock;
let bill; // balance 10 USD: 1 USD / 2 USD per million input / output tokens
let broke; // balance 0
let gw;
let gwBroke;
let spoolDir;

const MOST_USD = '9007199.254740992'; // TG_MONEY_REQUEST_MAX

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '10' });
  broke = await billedSetup({ mock, balance: '0' });
  spoolDir = tempDir('spool');
  gw = await startBilledGateway(bill, { workers: 1 }, { mock, spoolDir });
  gwBroke = await startBilledGateway(broke, { workers: 1 }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
  await broke?.db.drop();
});

/** POST `p` on gateway g with a raw JSON text body (exact big integers). */
function post(g, key, p, text, headers = {}) {
  return request(`${g.url}${p}`, { method: 'POST', headers: { authorization: `Bearer ${key}`, ...headers }, body: text });
}

const show = (o) => JSON.stringify(o, (k, v) => (typeof v === 'bigint' ? String(v) : v));
const msgs = '"messages":[{"role":"user","content":"hi [mock chunks=2]"}]';

test('a bound that cannot be priced is refused (400, nothing held or sent), even for a tenant with nothing', async () => {
  const before = (await mock.stats()).total;
  for (const [g, b] of [[gwBroke, broke], [gw, bill]]) {
    for (const n of ['1000000000000000000', '4611686018427387904', '9223372036854775807']) {
      for (const field of ['max_tokens', 'max_completion_tokens']) {
        const r = await post(g, b.key, '/v1/chat/completions', `{"model":"${MODEL}",${msgs},"${field}":${n}}`);
        assert.equal(r.status, 400, `${field} ${n}: ${r.text}`);
        assert.equal(r.json?.error?.code, 'max_tokens_too_large', r.text);
        assert.equal(r.json.error.type, 'invalid_request_error');
        assert.ok(r.json.error.message.includes(field) && r.json.error.message.includes(MOST_USD), r.text);
      }
      // The Anthropic protocol answers in its own shape.
      const m = await post(g, b.key, '/v1/messages', `{"model":"${MODEL}","max_tokens":${n},${msgs}}`,
        { 'anthropic-version': '2023-06-01' });
      assert.equal(m.status, 400, m.text);
      assert.equal(m.json?.type, 'error', m.text);
      assert.equal(m.json.error.type, 'invalid_request_error', m.text);
      assert.match(m.json.error.message, /max_tokens/);
      // Responses: max_output_tokens.
      const rs = await post(g, b.key, '/v1/responses', `{"model":"${MODEL}","input":"hi","max_output_tokens":${n}}`);
      assert.equal(rs.status, 400, rs.text);
      assert.match(rs.json.error.message, /max_output_tokens/);
    }
  }
  assert.equal((await mock.stats()).total, before, 'nothing reached the upstream');
  assert.equal(await count(broke, 'reservations'), 0, 'nothing reserved for the broke tenant');
  assert.equal(await count(bill, 'reservations'), 0, 'nothing reserved');
  // A limit that is not a positive integer is refused too: a translation would not read
  // it (a fraction, a string) or the provider would not take it (zero, negative); it
  // was read as "no limit" and the default reserved while the other spelling went on.
  for (const v of ['1e20', '1.5', '"100"', '0', '-1', '-0']) {
    const f = await post(gw, bill.key, '/v1/chat/completions', `{"model":"${MODEL}",${msgs},"max_completion_tokens":${v},"max_tokens":5}`);
    assert.equal(f.status, 400, `${v}: ${f.text}`);
    assert.equal(f.json.error.code, 'invalid_max_tokens');
    assert.match(f.json.error.message, /max_completion_tokens must be a positive integer/);
  }
  // The broke tenant's ordinary request: 402, not served.
  const ok = await post(gwBroke, broke.key, '/v1/chat/completions', JSON.stringify(chatBody('small [mock chunks=2]', { maxTokens: 10 })));
  assert.equal(ok.status, 402, ok.text);
  // And the worker still settles: a normal request of the funded tenant lands.
  const r = await chat(gw, bill.key, chatBody('after the hostile ones [mock chunks=2]', { maxTokens: 10 }));
  assert.equal(r.status, 200, r.text);
  await waitUsageRow(bill, r.headers['x-request-id']);
});

test('the bound reserved is the bound the upstream receives, whatever the spelling', async () => {
  // /v1/messages on an OpenAI account: translated; max_tokens 10^8 ($200 at 2 USD per
  // million) beside max_completion_tokens 1. Was served, reserved for 1 token.
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const anthropic = new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
  await assert.rejects(
    anthropic.messages.create({ model: MODEL, max_tokens: 100000000, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }], max_completion_tokens: 1 }),
    (e) => e.status === 402 && /balance/.test(e.message),
  );
  const { default: OpenAI } = await import('openai');
  const openai = new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
  await assert.rejects(
    openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 100000000, max_completion_tokens: 1 }),
    (e) => e.status === 402,
  );
  await assert.rejects(
    openai.responses.create({ model: MODEL, input: 'hi', max_output_tokens: 1, max_tokens: 100000000 }),
    (e) => e.status === 402,
  );
  // Within the balance: the reservation row holds the larger bound, and it is the one
  // the upstream was sent.
  const text = `{"model":"${MODEL}","max_tokens":3000,"max_completion_tokens":1,${msgs}}`;
  const r = await post(gw, bill.key, '/v1/messages', text, { 'anthropic-version': '2023-06-01' });
  assert.equal(r.status, 200, r.text);
  const id = r.headers['x-request-id'];
  await waitUsageRow(bill, id);
  const sent = JSON.parse((await mock.last()).body);
  const upstreamBound = Math.max(...['max_tokens', 'max_completion_tokens', 'max_output_tokens'].map((k) => sent[k] ?? 0));
  assert.equal(await reservedBound(bill, id), reservationFor(Buffer.byteLength(text), upstreamBound), `upstream got ${JSON.stringify(sent)}`);
  assert.equal(upstreamBound, 3000);
});

test('money inputs past what tollgate holds are refused, naming the field and the largest amount', async () => {
  // On the broke deployment (its tenant has nothing): a top-up of 9.3 billion was
  // accepted, then every request of the tenant got 503 billing_unavailable (its balance
  // in nano-USD does not fit the live balance's int64).
  const admin = adminClient(gwBroke);
  for (const amount of ['9300000000', '1000000000.000000001', '99999999999999999999', 1e12]) {
    const r = await admin.post(`/tenants/${broke.tenantId}/topup`, { amount });
    assert.equal(r.status, 400, `top-up ${amount}: ${r.text}`);
    assert.match(r.json.error.message, /amount.*1000000000/);
  }
  // Up to the limit is fine; past it in sum, refused.
  let r = await admin.post(`/tenants/${broke.tenantId}/topup`, { amount: '999999990' });
  assert.equal(r.status, 200, r.text);
  r = await admin.post(`/tenants/${broke.tenantId}/topup`, { amount: '1000' });
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /amount.*balance would exceed 1000000000/);
  // Requests of the tenant are served and billed.
  const ok = await chat(gwBroke, broke.key, chatBody('rich now [mock chunks=2]', { maxTokens: 10 }));
  assert.equal(ok.status, 200, ok.text);
  await waitUsageRow(broke, ok.headers['x-request-id']);
  for (const [p, body, field] of [
    [`/keys/${broke.keyId}`, { budget: '922337204000' }, 'budget'],
    [`/keys/${broke.keyId}`, { budget: 1e10 }, 'budget'],
    [`/tenants/${broke.tenantId}`, { budget: '1000000001' }, 'budget'],
    [`/prices/${MODEL}`, { output: '9223372037' }, 'output'],
    [`/prices/${MODEL}`, { reasoning: '1000000000.5' }, 'reasoning'],
  ]) {
    const x = await admin.patch(p, body);
    assert.equal(x.status, 400, `${p} ${JSON.stringify(body)}: ${x.text}`);
    assert.ok(x.json.error.message.includes(`"${field}"`), x.text);
    assert.match(x.json.error.message, /1000000000/);
  }
  const created = await admin.post('/tenants', { name: 'too-rich', balance: '1000000000.5' });
  assert.equal(created.status, 400, created.text);
  assert.match(created.json.error.message, /"balance".*1000000000/);
  // tollgate apply, the same rule.
  await assert.rejects(applyState(broke.db, { tenants: [{ name: 'acme2', balance: '5000000000' }] }, { redis: broke.redis }),
    /apply: tenants\[1\]: field "balance" must be a decimal amount from 0 to 1000000000/);
  await assert.rejects(applyState(broke.db, { prices: [{ model: 'x', input: 1e15, output: '1' }] }, { redis: broke.redis }),
    /apply: prices\[1\]: field "input" must be a decimal amount from 0 to 1000000000/);
  assert.match(await verifyLedger(broke), /all invariants hold/);
});

test('absurd usage is billed at the reserved bound, flagged; unreadable usage is estimated, never free', async () => {
  const m0 = await metrics(gw);
  const cases = [
    ['usage=2', false, 'clamped'],
    ['usage=2', true, 'clamped'],
    ['usage=3', false, 'estimated'],
    ['usage=0', false, 'estimated'],
    ['usage=0', true, 'estimated'],
  ];
  for (const [knob, stream, kind] of cases) {
    const body = chatBody(`odd usage [mock chunks=3 ${knob}]`, { maxTokens: 50, stream });
    const text = JSON.stringify(body);
    const r = await chat(gw, bill.key, text);
    assert.equal(r.status, 200, `${knob} stream=${stream}: ${r.text}`);
    const row = await waitUsageRow(bill, r.headers['x-request-id']);
    assert.equal(row.estimated, true, `${knob} stream=${stream}: ${show(row)}`);
    assert.ok(row.cost > 0n, `${knob} stream=${stream} billed ${row.cost}`);
    const bound = reservationFor(Buffer.byteLength(text), 50);
    if (kind === 'clamped') {
      assert.equal(row.cost, bound, `${knob}: the reserved bound`);
    } else {
      assert.ok(row.cost <= bound, `${knob}: at most the bound`);
      // Streams count the content events (3); a whole answer, the output limit it was sent.
      assert.equal(Number(row.output_tokens), stream ? 3 : 50, show(row));
    }
  }
  const m1 = await metrics(gw);
  assert.equal(m1['tollgate_billing_total{event="usage_clamped"}'] - m0['tollgate_billing_total{event="usage_clamped"}'], 2);
  assert.equal(m1['tollgate_billing_total{event="usage_estimated"}'] - m0['tollgate_billing_total{event="usage_estimated"}'], 3);
  const out = await verifyLedger(bill);
  assert.match(out, /all invariants hold/);
});

test('a poisoned element in the spool is quarantined, counted, and the settlements behind it land', async () => {
  // The spool of a worker as the overflow left it: a reservation row with a negative
  // amount first, then a real request's reservation and settlement.
  const g2dir = tempDir('spool');
  const rid = `poison-behind-${Date.now()}`;
  const good = [
    { op: 'reserve', request_id: rid, attempt: 1, tenant_id: bill.tenantId, api_key_id: bill.keyId, amount: '0.000100000', model: MODEL, instance: 'gone' },
    { request_id: rid, fingerprint: 'f'.repeat(64), tenant_id: bill.tenantId, api_key_id: bill.keyId, group_id: bill.groupId,
      account_id: null, model: MODEL, attempts: 1, input: 10, output: 20, cache_read: null, cache_write: null,
      reasoning: null, cost: '0.000050000', estimated: false, status: 200, ttft_ms: null, total_ms: 1.5 },
  ];
  const poison = { op: 'reserve', request_id: 'poisoned', attempt: 1, tenant_id: bill.tenantId, api_key_id: bill.keyId,
    amount: '-9223372036.854775808', model: MODEL, instance: 'gone' };
  fs.writeFileSync(path.join(g2dir, 'settlements-w0.jsonl'), `${JSON.stringify([poison, ...good])}\n${JSON.stringify(good)}\n`);
  // And in the shared Redis, a dead gateway's hold of a key this Postgres does not know
  // (another deployment): not recorded (its row would be refused at every pass).
  const foreign = '{t:987654321}:holds';
  await redisCli(bill.redis, 'HSET', foreign, 'foreign-req:1', `987654321|dead-instance|${Date.now() - 60000}|1000|${MODEL}`);
  const g2 = await startBilledGateway(bill, { workers: 1 }, { mock, spoolDir: g2dir });
  await waitUsageRow(bill, rid, 15000);
  await waitFor(async () => (await metrics(g2))['tollgate_billing_total{event="quarantined"}'] === 1,
    { timeout: 10000, what: 'the quarantine counter' });
  const q = fs.readFileSync(path.join(g2dir, 'quarantine-w0.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(q.length, 1);
  assert.equal(q[0].element.request_id, 'poisoned');
  assert.match(q[0].error, /amount|check/);
  await waitFor(() => !fs.existsSync(path.join(g2dir, 'settlements-w0.jsonl.replay')), { timeout: 10000, what: 'the replay file done' });
  assert.equal((await usageRows(bill, rid)).length, 1, 'billed once');
  // A few reconciler passes (every 500 ms; whichever gateway holds the lock scans).
  await sleep(3000);
  let q2 = 0;
  for (const g of [gw, gwBroke, g2]) q2 += (await metrics(g))['tollgate_billing_total{event="quarantined"}'];
  assert.equal(q2, 1, 'the foreign hold is left alone');
  await redisCli(bill.redis, 'DEL', foreign);
  // Its live requests settle as usual.
  const r = await chat(g2, bill.key, chatBody('after the poison [mock chunks=2]', { maxTokens: 10 }));
  assert.equal(r.status, 200);
  await waitUsageRow(bill, r.headers['x-request-id']);
  await g2.stop();
  await sleep(10);
});
