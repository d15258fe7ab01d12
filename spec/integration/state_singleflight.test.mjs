// 1,000 concurrent requests with a cold cache for one key cause exactly one database
// lookup: the key cache is single-flight (everyone who misses while the lookup runs
// waits for that one query), and afterwards the key is served from memory.
//
// The cache is per worker, so the gateway runs with `workers = 1` here: with N workers
// the right answer would be "at most N lookups". To make sure the misses really are
// concurrent (and not just one fast lookup followed by 999 hits), the api_keys table
// is locked in a second session while the first 100 requests arrive: the one lookup
// cannot finish until every one of them is waiting for it.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keepAliveAgent, metrics, plainKey, startStateGateway } from './lib/db.mjs';

const KEY = plainKey('cold');
const CRED = 'sk-singleflight';
const N = 1000;
const SOCKETS = 100;
let db;
let mock;
let gw;
let locker;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'main', key: KEY }],
  });
  gw = await startStateGateway(db, { workers: 1 }, { mock });
  // The account snapshot is loaded before the burst (it is not what this test counts).
  await waitFor(async () => (await chat(gw, 'tg-test-key', chatReq(MODEL))).status === 200, { timeout: 5000, what: 'gateway ready' });
});

after(async () => {
  if (locker && locker.exitCode === null) locker.kill('SIGKILL');
  await stopAll();
  await db?.drop();
});

test(`${N} concurrent requests with a cold cache cause exactly one database lookup`, async () => {
  const m0 = await metrics(gw);
  assert.equal(m0.tollgate_auth_db_lookups_total, 0, 'the key was never looked up before');

  // Hold the table for 1.5 s in another session.
  locker = spawn('psql', ['-X', '-q', '-d', db.conninfo, '-c',
    'BEGIN; LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(1.5); COMMIT;'], { stdio: 'ignore' });
  const lockerDone = new Promise((resolve) => locker.on('exit', resolve));
  await waitFor(async () => (await db.scalar(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'api_keys' AND l.mode = 'AccessExclusiveLock' AND l.granted")) === '1',
  { timeout: 5000, interval: 20, what: 'the table lock' });

  const agent = keepAliveAgent(SOCKETS);
  const t0 = Date.now();
  const results = await Promise.allSettled(Array.from({ length: N }, (_, i) =>
    chat(gw, KEY, chatReq(MODEL, `request ${i} [mock chunks=1]`), { agent, timeout: 30000 })));
  const elapsed = Date.now() - t0;
  agent.destroy();
  await lockerDone;

  const errors = results.filter((r) => r.status === 'rejected').map((r) => r.reason.message);
  assert.deepEqual(errors.slice(0, 5), [], `${errors.length} requests failed`);
  const statuses = {};
  for (const r of results) statuses[r.value.status] = (statuses[r.value.status] || 0) + 1;
  assert.deepEqual(statuses, { 200: N }, `every request succeeded: ${JSON.stringify(statuses)}`);
  assert.ok(elapsed >= 1000, `the burst waited for the locked lookup (${elapsed} ms)`);

  const m = await metrics(gw);
  const hits = m['tollgate_auth_cache_total{result="hit"}'] - m0['tollgate_auth_cache_total{result="hit"}'];
  const misses = m['tollgate_auth_cache_total{result="miss"}'] - m0['tollgate_auth_cache_total{result="miss"}'];
  assert.equal(m.tollgate_auth_db_lookups_total, 1, `database lookups (misses ${misses}, hits ${hits})`);
  assert.equal(hits + misses, N, 'every request consulted the cache once');
  assert.ok(misses >= SOCKETS / 2, `the misses were concurrent: ${misses} requests waited for the one lookup`);
  const up = (await mock.stats()).credentials[CRED];
  assert.equal(up?.requests, N, 'every request reached the upstream with the account credential');
});

test('afterwards the key is served from the cache without touching the database', async () => {
  const m0 = await metrics(gw);
  for (let i = 0; i < 20; i++) assert.equal((await chat(gw, KEY, chatReq(MODEL))).status, 200);
  const m = await metrics(gw);
  assert.equal(m.tollgate_auth_db_lookups_total, m0.tollgate_auth_db_lookups_total);
  assert.equal(m['tollgate_auth_cache_total{result="hit"}'] - m0['tollgate_auth_cache_total{result="hit"}'], 20);
});

test('an unknown key is looked up once, then answered from a negative entry', async () => {
  const m0 = await metrics(gw);
  const bad = plainKey('unknown');
  const agent = keepAliveAgent(50);
  const rs = await Promise.all(Array.from({ length: 200 }, () => chat(gw, bad, chatReq(MODEL), { agent })));
  agent.destroy();
  assert.ok(rs.every((r) => r.status === 401));
  const m = await metrics(gw);
  assert.equal(m.tollgate_auth_db_lookups_total - m0.tollgate_auth_db_lookups_total, 1, 'one lookup for 200 requests');
  assert.ok(m['tollgate_auth_cache_total{result="negative_hit"}'] - m0['tollgate_auth_cache_total{result="negative_hit"}'] > 0);
});
