// Budgets through the admin API and `tollgate apply` (#24, items 5 and 6): hostile values
// (negative, huge, unknown periods, time zones that do not exist, a key of another tenant)
// are refused with 400 naming the field and nothing is written; apply refuses the same
// values and creates budgets by name; a user's budget applies to every key of that user,
// and a key's page lists every budget that applies to it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import { adminClient, applyState, chat } from './lib/db.mjs';
import { billedSetup, chatBody, count, fmtNano, reservationFor, startBilledGateway } from './lib/billing.mjs';

let mock;
let bill;
let gw;
let admin;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  gw = await startBilledGateway(bill, { workers: 1 }, { mock });
  admin = adminClient(gw);
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test('hostile budget values are refused with 400 naming the field; nothing is written', async () => {
  const other = await admin.create('/tenants', { name: 'other', balance: '1' });
  const base = { name: 'b', tenant_id: Number(bill.tenantId), amount: '10', period: 'day' };
  const cases = [
    [{ amount: '-1' }, 'amount'],
    [{ amount: -5 }, 'amount'],
    [{ amount: '1000000000.000000001' }, 'amount'],
    [{ amount: '99999999999999999999' }, 'amount'],
    [{ amount: 1e300 }, 'amount'],
    [{ amount: 'ten' }, 'amount'],
    [{ period: 'year' }, 'period'],
    [{ period: 'DAY' }, 'period'],
    [{ period: '' }, 'period'],
    [{ period: 'hours' }, 'period_hours'],
    [{ period: 'hours', period_hours: 0 }, 'period_hours'],
    [{ period: 'hours', period_hours: 100000 }, 'period_hours'],
    [{ period: 'hours', period_hours: -3 }, 'period_hours'],
    [{ period: 'day', period_hours: 5 }, 'period_hours'],
    [{ timezone: 'Mars/Olympus_Mons' }, 'timezone'],
    [{ timezone: '../../../etc/passwd' }, 'timezone'],
    [{ timezone: '/etc/localtime' }, 'timezone'],
    [{ timezone: 'Europe/Berlin\n' }, 'timezone'],
    [{ timezone: '' }, 'timezone'],
    [{ timezone: 'x'.repeat(300) }, 'timezone'],
    [{ thresholds: [0] }, 'thresholds'],
    [{ thresholds: [101] }, 'thresholds'],
    [{ thresholds: [] }, 'thresholds'],
    [{ thresholds: ['50'] }, 'thresholds'],
    [{ thresholds: [50.5] }, 'thresholds'],
    [{ webhook_url: 'ftp://x/y' }, 'webhook_url'],
    [{ webhook_url: 'http://ok/\r\nX: y' }, 'webhook_url'],
    [{ tenant_id: undefined }, 'tenant_id'],
    [{ tenant_id: Number(other.id), api_key_id: Number(bill.keyId) }, 'tenant_id'],
    [{ api_key_id: 999999999 }, 'api_key_id'],
    [{ name: '' }, 'name'],
  ];
  for (const [over, field] of cases) {
    const body = { ...base, ...over };
    for (const k of Object.keys(body)) if (body[k] === undefined) delete body[k];
    const r = await admin.post('/budgets', body);
    assert.equal(r.status, 400, `${JSON.stringify(over)}: ${r.status} ${r.text}`);
    assert.equal(r.json?.error?.param, field, `${JSON.stringify(over)}: ${r.text}`);
    assert.equal(typeof r.json.error.message, 'string');
  }
  assert.equal(await count(bill, 'budgets'), 0, 'nothing was written');
  // A change to a hostile value is refused the same way.
  const ok = await admin.create('/budgets', base);
  for (const [over, field] of [[{ timezone: 'Nowhere/Atlantis' }, 'timezone'], [{ amount: '-0.5' }, 'amount'],
    [{ period: 'fortnight' }, 'period']]) {
    const r = await admin.patch(`/budgets/${ok.id}`, over);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json?.error?.param, field, r.text);
  }
  const again = await admin.read(`/budgets/${ok.id}`);
  assert.equal(again.timezone, 'UTC');
  assert.equal(again.period, 'day');
  await admin.del(`/budgets/${ok.id}`);
  // The gateway still serves.
  const r = await chat(gw, bill.key, chatBody('still here [mock chunks=1]'));
  assert.equal(r.status, 200, r.text);
});

test('apply: a budgets section by name, refused whole on a bad zone, unchanged the second time', async () => {
  const state = {
    tenants: [{ name: 'acme', balance: '100' }],
    budgets: [
      { name: 'acme-monthly', tenant: 'acme', amount: '500', period: 'month', timezone: 'America/Los_Angeles' },
      { name: 'k-6h', tenant: 'acme', key: 'k', amount: '20', period: 'hours', period_hours: 6, thresholds: [50, 90] },
    ],
  };
  const bad = structuredClone(state);
  bad.budgets[0].timezone = 'America/Atlantis';
  await assert.rejects(applyState(bill.db, bad), /budgets\[1\].*timezone/s);
  assert.equal(await count(bill, 'budgets'), 0);
  const out = (await applyState(bill.db, state)).stdout;
  assert.match(out, /\+ budgets acme-monthly/);
  assert.match(out, /\+ budgets k-6h/);
  const again = (await applyState(bill.db, state)).stdout;
  assert.match(again, /0 created, 0 updated/);
  const rows = await bill.db.query(`SELECT name, api_key_id IS NOT NULL AS keyed, period, period_hours, timezone,
    thresholds FROM budgets ORDER BY name`);
  assert.deepEqual(rows, [
    { name: 'acme-monthly', keyed: false, period: 'month', period_hours: null, timezone: 'America/Los_Angeles', thresholds: [50, 80, 100] },
    { name: 'k-6h', keyed: true, period: 'hours', period_hours: 6, timezone: 'UTC', thresholds: [50, 90] },
  ]);
  await bill.db.exec('DELETE FROM budgets');
});

test('a user\'s budget applies to each of the user\'s keys, and the key lists every budget that applies', async () => {
  const user = await admin.create('/users', { tenant_id: Number(bill.tenantId), email: 'ann@example.com' });
  const k2 = await admin.create('/keys', { tenant_id: Number(bill.tenantId), name: 'ann-2', user_id: Number(user.id),
    group_id: Number(bill.groupId) });
  await admin.update(`/keys/${bill.keyId}`, { user_id: Number(user.id) });
  const body = chatBody('user budget [mock delay_ms=800 chunks=2]', { maxTokens: 100 });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 100);
  const ub = await admin.create('/budgets', { name: 'ann-daily', user_id: Number(user.id), amount: fmtNano(R + R / 2n),
    period: 'day', timezone: 'Asia/Tokyo' });
  const tb = await admin.create('/budgets', { name: 'acme-weekly', tenant_id: Number(bill.tenantId), amount: '50',
    period: 'week' });
  assert.equal(ub.tenant_id, Number(bill.tenantId));
  const key = await admin.read(`/keys/${k2.id}`);
  assert.deepEqual(key.budgets.map((b) => [b.name, b.scope]).sort(), [['acme-weekly', 'tenant'], ['ann-daily', 'user']]);
  for (const b of key.budgets) {
    assert.ok(Date.parse(b.current.resets_at) > Date.now(), 'it resets in the future');
    assert.ok(b.current.remaining !== undefined);
  }
  // One bound fits the user's day, not two: of two requests at once on two keys of the
  // user, one goes and the other is refused.
  const [a, c] = await Promise.all([chat(gw, bill.key, body), chat(gw, k2.key, body)]);
  const b = a.status === 402 ? a : c;
  assert.deepEqual([a.status, c.status].sort(), [200, 402], `${a.text}\n${c.text}`);
  assert.equal(b.json.error.code, 'budget_exceeded');
  assert.match(b.json.error.message, /daily budget "ann-daily" of this key's user/);
});
