// Routing by what the providers say about each account's quota (#20). Three accounts
// on the mock, whose per-credential quota (POST /_mock/quota) sends each provider's
// headers with the real countdown and answers 429 once a window is spent. A load that
// exhausts an account: the gateway reads "nothing left" from that account's own
// headers and sends it nothing more until the reset, so the mock answers zero 429s
// (counted at the mock: its per-credential `rejected`), and the client sees only 200s;
// at the reset the account gets traffic again. Then each style in turn (Codex
// x-codex-primary-*, Anthropic anthropic-ratelimit-requests-*, unified windows, OpenAI
// x-ratelimit-*), and unreadable headers that change nothing but a counter.
//
// One worker: the account health each request sees is one state machine, and the
// requests go one at a time, so "after its headers said it was empty" is exact.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { adminClient } from './lib/db.mjs';
import { credOf, diff, sendMany, sleep, startRouting, statuses } from './lib/routing.mjs';

const WINDOW_MS = 10000; // long enough for a loaded CI box to exhaust, check and start an instance within one
let rt;

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }],
    gateway: { workers: 1 },
  });
});

after(() => rt?.stop());

async function quota(name, rule) {
  const r = await fetch(`${rt.mock.url}/_mock/quota`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ credential: credOf(name), window_ms: WINDOW_MS, ...rule }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
}

const q = async (name) => (await rt.stats(name)).quota;

async function metric(name, gw = rt.gw) {
  const text = await (await fetch(`${gw.url}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

// Exhausts `spent` (limit 4 each) with 30 one-at-a-time requests while `roomy` has
// plenty; the spent accounts get exactly their 4 and the mock rejects none of theirs.
async function exhaust(spent, roomy, what) {
  const before = await rt.counts();
  const rs = await sendMany(rt, 30, (i) => [`${what} ${i} [mock chunks=1]`]);
  assert.deepEqual(statuses(rs), { 200: 30 }, rs.filter((r) => r.status !== 200).map((r) => r.text).join('\n'));
  const n = diff(await rt.counts(), before);
  for (const s of spent) {
    const st = await q(s);
    assert.equal(st.rejected, 0, `${what}: ${s}'s window was spent and still got requests: ${JSON.stringify(st)}; sent ${JSON.stringify(n)}`);
    assert.equal(n[s], 4, `${what}: ${s} served its 4 requests and then none: ${JSON.stringify(n)}`);
  }
  assert.equal(n[roomy], 30 - 4 * spent.length, `${what}: the rest went to ${roomy}: ${JSON.stringify(n)}`);
}

test('accounts whose headers say they are spent get nothing until the reset (Codex, Anthropic)', async () => {
  await quota('a', { style: 'codex', limit: 4 });
  await quota('b', { style: 'anthropic', limit: 4 });
  await quota('c', { style: 'openai', limit: 1000 });
  const skips = await metric('tollgate_quota_skips_total');
  await exhaust(['a', 'b'], 'c', 'codex+anthropic');
  assert.ok((await metric('tollgate_quota_skips_total')) > skips, 'skips counted in /metrics');
  // What the console shows: the fleet's copy, through the admin API.
  const admin = adminClient(rt.gw);
  const qa = (await admin.get(`/accounts/${(await rt.account('a')).id}/quota`)).json;
  assert.equal(qa.known, true, JSON.stringify(qa));
  assert.equal(qa.windows[0].name, 'short');
  assert.equal(qa.windows[0].used, 1);
  assert.ok(qa.blocked_until_ms > qa.now_ms && qa.blocked_until_ms <= qa.now_ms + WINDOW_MS, JSON.stringify(qa));
  const qb = (await admin.get(`/accounts/${(await rt.account('b')).id}/quota`)).json;
  assert.deepEqual(qb.limits.map((l) => [l.name, l.limit, l.remaining]), [['requests', 4, 0]], JSON.stringify(qb));
  const qc = (await admin.get(`/accounts/${(await rt.account('c')).id}/quota`)).json;
  assert.equal(qc.blocked_until_ms, 0, JSON.stringify(qc));
  assert.ok((await metric('tollgate_quota_values_total')) > 0, 'values counted in /metrics');
  // Per account on /metrics, as the (one) worker learned it: b's requests gone, a's
  // short window used up, c's requests left, each with its reset still ahead.
  const text = await (await fetch(`${rt.gw.url}/metrics`)).text();
  const gauge = (name, labels) => {
    const m = text.match(new RegExp(`^${name}\\{${labels}\\} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  const [ia, ib, ic] = [(await rt.account('a')).id, (await rt.account('b')).id, (await rt.account('c')).id];
  assert.equal(gauge('tollgate_account_quota_remaining', `account="${ib}",kind="requests"`), 0, text);
  assert.equal(gauge('tollgate_account_quota_limit', `account="${ib}",kind="requests"`), 4, text);
  assert.equal(gauge('tollgate_account_quota_window_utilization', `account="${ia}",window="short"`), 1, text);
  assert.ok(gauge('tollgate_account_quota_window_reset_seconds', `account="${ia}",window="short"`) > 0, text);
  assert.ok(gauge('tollgate_account_quota_remaining', `account="${ic}",kind="requests"`) > 900, text);
  assert.ok(gauge('tollgate_account_quota_age_seconds', `account="${ic}"`) < 60, text);
});

test('at the reset the spent accounts get traffic again', async () => {
  const resetIn = Math.max((await q('a')).reset_in_ms, (await q('b')).reset_in_ms);
  await sleep(resetIn + 150);
  const before = await rt.counts();
  const rs = await sendMany(rt, 15, (i) => [`after the reset ${i} [mock chunks=1]`]);
  assert.deepEqual(statuses(rs), { 200: 15 });
  const n = diff(await rt.counts(), before);
  assert.ok(n.a >= 2 && n.b >= 2, `traffic moved back to a and b at the reset: ${JSON.stringify(n)}`);
  assert.equal((await q('a')).rejected + (await q('b')).rejected, 0);
});

test('unified windows and OpenAI x-ratelimit headers are read the same way', async () => {
  // The windows the previous test used end first (the gateway knows when: it waits).
  await sleep(Math.max((await q('a')).reset_in_ms, (await q('b')).reset_in_ms, 0) + 150);
  await quota('a', { style: 'unified', limit: 4 });
  await quota('b', { style: 'openai', limit: 4 });
  await quota('c', { style: 'anthropic', limit: 1000 });
  await exhaust(['a', 'b'], 'c', 'unified+openai');
});

test('another instance reads the spent windows from the fleet\'s copy in Redis', async () => {
  // A fresh instance has seen none of a's and b's headers; it reads their learned quota
  // ({a:<id>}:quota, in the pipeline of the account's slot) before using them.
  const gw2 = await rt.another();
  const before = await rt.counts();
  const rs = await sendMany(rt, 12, (i) => [`fleet ${i} [mock chunks=1]`, {}, { gw: gw2 }]);
  assert.deepEqual(statuses(rs), { 200: 12 });
  const n = diff(await rt.counts(), before);
  assert.equal((await q('a')).rejected + (await q('b')).rejected, 0, `the mock rejected none: ${JSON.stringify(n)}`);
  assert.equal(n.c, 12, `all to c: ${JSON.stringify(n)}`);
  assert.ok((await metric('tollgate_quota_shared_total')) > 0, 'the first instance wrote the fleet\'s copy');
});

test('unreadable quota headers change nothing but a counter', async () => {
  // A fresh instance (its own account health: the fair share of the first one leans on
  // the accounts that were spent above), every account sending unreadable values.
  await sleep(Math.max((await q('a')).reset_in_ms, (await q('b')).reset_in_ms, 0) + 150);
  const gw2 = await rt.another();
  await rt.mock.reset();
  for (const n of ['a', 'b', 'c']) await quota(n, { style: 'openai', limit: 0, malformed: true });
  const bad = await metric('tollgate_quota_malformed_total', gw2);
  const values = await metric('tollgate_quota_values_total', gw2); // its warm-up read real ones
  const rs = await sendMany(rt, 30, (i) => [`malformed ${i} [mock chunks=1]`, {}, { gw: gw2 }]);
  assert.deepEqual(statuses(rs), { 200: 30 });
  const n = await rt.counts();
  for (const k of ['a', 'b', 'c']) assert.ok(n[k] >= 7, `spread as without headers: ${JSON.stringify(n)}`);
  assert.equal(await metric('tollgate_quota_skips_total', gw2), 0, 'no account passed over');
  assert.equal(await metric('tollgate_quota_values_total', gw2), values, 'nothing learned');
  assert.ok((await metric('tollgate_quota_malformed_total', gw2)) >= bad + 30 * 7, 'each unreadable value counted');
});
