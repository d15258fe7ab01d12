// usage (#18, items 3 and 5): the admin API's reports from the rollups — GET usage/report
// (any range and grouping, paged with opaque page tokens), usage/capacity (per account
// and group, with the rule of its recommendation) and usage/export (CSV, streamed) —
// agree with the usage rows, and bad ranges, groupings and page tokens are clear 400s in
// the admin API's error shape ({"error": {"message", "type", "code", "param"}}).

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import { billedSetup, chatBody, settleBatch, settlement, startBilledGateway, toNano, waitUsageRow } from './lib/billing.mjs';
import { adminClient, chat } from './lib/db.mjs';

let mock;
let bill;
let gw;
let admin;
const HOUR = 3600000;
const hourIso = (ms) => new Date(Math.floor(ms / HOUR) * HOUR).toISOString().replace('.000Z', 'Z');
const idAt = (ms) => `${ms.toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '20' });
  // Two earlier hours of traffic (settled as a spool replay would), then live requests.
  const t0 = Date.now() - 3 * HOUR;
  const els = [];
  for (let i = 0; i < 6; i++) els.push(settlement(bill, { requestId: idAt(t0 + (i % 2) * HOUR + i), input: 5 + i, output: 7 }));
  els.push(settlement(bill, { requestId: idAt(t0 + 5), input: 0, output: 0, cost: '0', status: 429 }));
  await settleBatch(bill.conninfo, els);
  gw = await startBilledGateway(bill, {}, { mock });
  admin = adminClient(gw);
  for (let i = 0; i < 3; i++) {
    const r = await chat(gw, bill.key, chatBody(`live ${i} [mock chunks=4 ttft_ms=${40 * (i + 1)}]`, { stream: true }));
    assert.equal(r.status, 200, r.text);
    await waitUsageRow(bill, r.headers['x-request-id']);
  }
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

function assert400(r, code, param) {
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.type, 'invalid_request_error', r.text);
  assert.equal(r.json.error.code, code, r.text);
  assert.equal(r.json.error.param, param, r.text);
  assert.ok(r.json.error.message.length > 10, r.text);
}

test('report: totals and groupings equal the usage rows; pages by token add up to the whole', async () => {
  const from = hourIso(Date.now() - 5 * HOUR);
  const to = hourIso(Date.now() + HOUR);
  const rows = await bill.db.query(`SELECT request_id, cost::text AS cost, status, input_tokens FROM usage`);
  const total = (await admin.get(`/usage/report?from=${from}&to=${to}&group_by=`)).json;
  assert.equal(total.data.length, 1);
  assert.equal(total.data[0].requests, rows.length);
  assert.equal(total.data[0].errors['429'], 1);
  assert.equal(toNano(String(total.data[0].cost)), rows.reduce((s, r) => s + toNano(r.cost), 0n));
  assert.equal(total.data[0].tokens.input, rows.reduce((s, r) => s + (r.input_tokens ?? 0), 0));
  assert.ok(total.data[0].ttft.p95_ms > 0);

  const byHour = (await admin.get(`/usage/report?from=${from}&to=${to}&group_by=hour,model`)).json;
  assert.ok(byHour.data.length >= 3, JSON.stringify(byHour));
  assert.equal(byHour.data.reduce((s, r) => s + r.requests, 0), rows.length);
  assert.equal(byHour.next_page_token, null);

  // One group per page, by token, to the end: the same groups in the same order.
  const seen = [];
  let token = '';
  for (let i = 0; i < 20; i++) {
    const r = await admin.get(`/usage/report?from=${from}&to=${to}&group_by=hour,model&limit=1${token ? `&page_token=${token}` : ''}`);
    assert.equal(r.status, 200, r.text);
    seen.push(...r.json.data);
    if (!r.json.next_page_token) break;
    assert.doesNotMatch(r.json.next_page_token, /v1|:/, 'opaque');
    token = r.json.next_page_token;
  }
  assert.deepEqual(seen, byHour.data);

  // A token of another query is refused, and so is one that is not ours.
  const p1 = (await admin.get(`/usage/report?from=${from}&to=${to}&group_by=hour,model&limit=1`)).json;
  assert400(await admin.get(`/usage/report?from=${from}&to=${to}&group_by=model&limit=1&page_token=${p1.next_page_token}`),
    'invalid_page_token', 'page_token');
  assert400(await admin.get(`/usage/report?page_token=zz`), 'invalid_page_token', 'page_token');
  assert400(await admin.get(`/usage/report?page_token=${Buffer.from('v1:-5:abc').toString('hex')}`), 'invalid_page_token', 'page_token');
});

test('capacity: per account and per group, with the rule; export streams the same numbers as CSV', async () => {
  const cap = await admin.get('/usage/capacity?by=account');
  assert.equal(cap.status, 200, cap.text);
  assert.match(cap.json.rule, /recommended_concurrency = max\(1, ceil\(1\.25 x in_flight\.p95\)\)/);
  const acct = cap.json.data.find((d) => d.account_id === bill.accountId);
  assert.ok(acct, cap.text);
  assert.ok(acct.requests >= 3 && acct.recommended_concurrency >= 1 && acct.utilisation >= 0, cap.text);
  const grp = await admin.get('/usage/capacity?by=group');
  assert.equal(grp.status, 200, grp.text);
  assert.match(grp.json.rule, /recommended_oversubscription/);
  assert.ok(grp.json.data.some((d) => d.group_id === bill.groupId));

  const ex = await admin.get('/usage/export?group_by=hour,account');
  assert.equal(ex.status, 200);
  assert.match(ex.headers['content-type'], /^text\/csv/);
  assert.equal(ex.headers['transfer-encoding'], 'chunked');
  const lines = ex.text.trim().split('\n');
  assert.match(lines[0], /^hour,account_id,requests,successes,err_429,/);
  const n = lines.slice(1).reduce((s, l) => s + Number(l.split(',')[2]), 0);
  assert.equal(n, Number(await bill.db.scalar('SELECT count(*) FROM usage')));
});

test('bad ranges, groupings, filters and tokens: 400 naming the parameter', async () => {
  assert400(await admin.get('/usage/report?from=yesterday'), 'invalid_range', 'from');
  assert400(await admin.get('/usage/report?to=2026-13-01'), 'invalid_range', 'to');
  assert400(await admin.get('/usage/report?from=2026-12-01T10:30:00Z'), 'invalid_range', 'from');
  assert400(await admin.get('/usage/report?from=2026-12-02&to=2026-12-01'), 'invalid_range', 'from');
  assert400(await admin.get('/usage/report?from=2024-01-01&to=2026-01-01'), 'invalid_range', 'to');
  assert400(await admin.get('/usage/report?group_by=week'), 'invalid_grouping', 'group_by');
  assert400(await admin.get('/usage/report?group_by=hour,day'), 'invalid_grouping', 'group_by');
  assert400(await admin.get('/usage/report?group_by=model,model'), 'invalid_grouping', 'group_by');
  assert400(await admin.get('/usage/report?tenant_id=abc'), 'invalid_request', 'tenant_id');
  assert400(await admin.get('/usage/report?limit=0'), 'invalid_request', 'limit');
  assert400(await admin.get('/usage/capacity?by=key'), 'invalid_grouping', 'by');
  assert400(await admin.get('/usage/capacity?window_hours=0'), 'invalid_request', 'window_hours');
  assert400(await admin.get('/usage/export?from=2026-12-01T00:00:01Z'), 'invalid_range', 'from');
  // the worker is still up
  assert.equal((await admin.get('/usage/report')).status, 200);
});
