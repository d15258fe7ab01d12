// The data plane does not touch Postgres on the hot path, and survives Postgres
// trouble: while the key table is locked (a database that does not answer), cached
// keys keep working at full speed, an uncached key gets 503 auth_unavailable after the
// query timeout instead of hanging, and that failure is not cached. When the
// gateway's database connections are killed, its pool reconnects by itself.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, metrics, plainKey, startStateGateway } from './lib/db.mjs';

const WARM = plainKey('warm');
const COLD = plainKey('cold');
const LATER = plainKey('later');
const PG_TIMEOUT = 1000;
let db;
let mock;
let gw;
const lockers = [];

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-pg-outage', groups: ['main'] }],
    keys: [
      { name: 'warm', tenant: 'acme', group: 'main', key: WARM },
      { name: 'cold', tenant: 'acme', group: 'main', key: COLD },
      { name: 'later', tenant: 'acme', group: 'main', key: LATER },
    ],
  });
  // One worker, so "cached" means cached in the worker that answers.
  gw = await startStateGateway(db, { workers: 1, postgres_timeout_ms: PG_TIMEOUT }, { mock });
});

after(async () => {
  for (const l of lockers) if (l.exitCode === null) l.kill('SIGKILL');
  await stopAll();
  await db?.drop();
});

/** Holds an exclusive lock on api_keys for `ms` in another session; resolves once held. */
async function lockKeys(ms) {
  const l = spawn('psql', ['-X', '-q', '-d', db.conninfo, '-c',
    `BEGIN; LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(${ms / 1000}); COMMIT;`], { stdio: 'ignore' });
  lockers.push(l);
  l.done = new Promise((resolve) => l.on('exit', resolve));
  await waitFor(async () => (await db.scalar(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'api_keys' AND l.mode = 'AccessExclusiveLock' AND l.granted")) === '1',
  { timeout: 5000, interval: 20, what: 'the table lock' });
  return l;
}

test('while the key table does not answer, cached keys work and an uncached one fails fast with 503', async () => {
  for (let i = 0; i < 3; i++) assert.equal((await chat(gw, WARM, chatReq(MODEL))).status, 200);
  const lookups = (await metrics(gw)).tollgate_auth_db_lookups_total;
  const l = await lockKeys(3500);

  const t0 = Date.now();
  for (let i = 0; i < 20; i++) {
    const r = await chat(gw, WARM, chatReq(MODEL, 'warm [mock chunks=1]'));
    assert.equal(r.status, 200, r.text);
  }
  const warmMs = Date.now() - t0;
  assert.ok(warmMs < 1000, `20 requests with a cached key took ${warmMs} ms while Postgres was stuck`);

  const t1 = Date.now();
  const cold = await chat(gw, COLD, chatReq(MODEL), { timeout: 10000 });
  const coldMs = Date.now() - t1;
  assert.equal(cold.status, 503, cold.text);
  assert.equal(cold.json?.error?.code, 'auth_unavailable');
  assert.ok(coldMs >= PG_TIMEOUT * 0.8 && coldMs < PG_TIMEOUT + 1500, `refused after ${coldMs} ms (postgres_timeout_ms ${PG_TIMEOUT})`);

  // The admin API reports the stuck database instead of hanging.
  const a = await adminClient(gw).get('/keys', { timeout: 10000 });
  assert.ok(a.status === 503 || a.status === 504, `admin during the outage: ${a.status} ${a.text}`);

  await l.done;
  // The failure was not cached: the same key works as soon as the database answers.
  const again = await chat(gw, COLD, chatReq(MODEL));
  assert.equal(again.status, 200, again.text);
  const m = await metrics(gw);
  assert.ok(m.tollgate_auth_db_lookups_total >= lookups + 2, 'the cold key was looked up again after the failure');
});

test("the gateway's database connections are killed: the pool reconnects by itself", async () => {
  const killed = await db.scalar(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()");
  assert.ok(Number(killed) >= 1, `killed ${killed} connections of the gateway`);
  // A cached key does not notice.
  assert.equal((await chat(gw, WARM, chatReq(MODEL))).status, 200);
  // A lookup and an admin call work again within a few seconds (at most one 503 each while reconnecting).
  const t0 = Date.now();
  await waitFor(async () => (await chat(gw, LATER, chatReq(MODEL))).status === 200, { timeout: 5000, interval: 100, what: 'a key lookup after the reconnect' });
  await waitFor(async () => (await adminClient(gw).get('/keys')).status === 200, { timeout: 5000, interval: 100, what: 'the admin API after the reconnect' });
  assert.ok(Date.now() - t0 < 5000);
  assert.ok(gw.proc.running);
});
