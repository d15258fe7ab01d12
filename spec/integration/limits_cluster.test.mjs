// Issue 6, item 3: every script's keys share one hash tag, so the scripts run unchanged
// on Redis Cluster. The gateway runs here against a real redis-server in cluster mode (a
// one-node cluster that owns all 16,384 slots, on 127.0.0.1). Redis Cluster refuses a
// script whose declared keys hash to different slots (CROSSSLOT), and Redis 7 also fails
// a redis.call on a key outside the slot of the script's declared keys, so a key built
// without the tenant's tag — in admission, release, renewal, the account slot, the
// budget reservation or settlement — turns into an error reply here, which the test
// reads from the server's own error counters.
//
// With billing on and every limit set on the key and on its tenant (rpm, tpm,
// concurrency), streaming and non-streaming requests are admitted, refused by the rate
// limit, answered, released and settled; the ledger balances; no lease is left.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freePort, HOST, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, chatReq, plainKey, redisCli, tally } from './lib/db.mjs';
import { billedSetup, MODEL, startBilledGateway, verifyLedger } from './lib/billing.mjs';

let mock;
let cluster;
let bill;
let gw;
const TIGHT = plainKey('tight');

/** A one-node Redis Cluster on 127.0.0.1 (its bus port is port + 10000). */
async function startCluster() {
  let port;
  for (;;) {
    port = await freePort();
    if (port + 10000 <= 65535) break;
  }
  const dir = tempDir('cluster');
  const child = spawn('redis-server', ['--port', String(port), '--bind', HOST, '--cluster-enabled', 'yes',
    '--cluster-config-file', path.join(dir, 'nodes.conf'), '--dir', dir, '--save', '', '--appendonly', 'no',
    '--daemonize', 'no', '--logfile', ''], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d) => { out = (out + d).slice(-20000); });
  child.stderr.on('data', (d) => { out = (out + d).slice(-20000); });
  const exited = new Promise((resolve) => child.on('exit', resolve));
  const url = `redis://${HOST}:${port}`;
  const c = {
    url,
    pid: child.pid,
    output: () => out,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      process.kill(child.pid, 'SIGKILL');
      await exited;
    },
  };
  try {
    await waitFor(async () => (await redisCli(url, 'PING')) === 'PONG', { timeout: 10000, what: 'cluster node PING' });
    assert.equal(await redisCli(url, 'CLUSTER', 'ADDSLOTSRANGE', '0', '16383'), 'OK');
    await waitFor(async () => /cluster_state:ok/.test(await redisCli(url, 'CLUSTER', 'INFO')), { timeout: 10000, what: 'cluster_state:ok' });
  } catch (e) {
    await c.stop();
    throw new Error(`${e.message}\n${out}`);
  }
  return c;
}

/** The server's error replies by kind, from INFO errorstats: {NOSCRIPT: 1, ...}. */
async function errorStats() {
  const out = await redisCli(cluster.url, 'INFO', 'errorstats');
  const errs = {};
  for (const m of out.matchAll(/^errorstat_([^:]+):count=(\d+)/gm)) errs[m[1]] = Number(m[2]);
  return errs;
}

before(async () => {
  mock = await startMock();
  cluster = await startCluster();
  bill = await billedSetup({ mock, redis: cluster.url, balance: '100' });
  // Every limit, on the key and on its tenant: each part of the admission script runs.
  await bill.db.exec(`UPDATE api_keys SET rpm = 6000, rpm_burst = 100, tpm = 10000000, concurrency = 50 WHERE id = ${bill.keyId}`);
  await bill.db.exec(`UPDATE tenants SET rpm = 6000, rpm_burst = 100, tpm = 10000000, concurrency = 50 WHERE id = ${bill.tenantId}`);
  // A second key of the same tenant whose bucket holds two requests: the refusal path.
  await bill.db.exec(`INSERT INTO api_keys (tenant_id, group_id, name, key_hash, prefix, rpm, rpm_burst)
    SELECT tenant_id, group_id, 'tight', sha256(convert_to('${TIGHT}', 'UTF8')), 'tgk-tigh', 60, 2
    FROM api_keys WHERE id = ${bill.keyId}`);
  gw = await startBilledGateway(bill, { workers: 2 }, { mock });
});

after(async () => {
  await stopAll();
  await cluster?.stop();
  await bill?.db.drop();
});

test('the gateway is served by a Redis Cluster node: admission, release, billing, nothing cross-slot', async () => {
  const before = await errorStats();
  const rs = await Promise.all(Array.from({ length: 24 }, (_, i) => chat(gw, bill.key,
    chatReq(MODEL, `cluster ${i} [mock chunks=3 interval_ms=20]`, { stream: i % 2 === 0 }), { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 24 }, rs.find((r) => r.status !== 200)?.text);

  // The bucket of two: exactly two admitted, the rest refused by the rate limit.
  const tight = [];
  for (let i = 0; i < 4; i++) tight.push(await chat(gw, TIGHT, chatReq(MODEL, `tight ${i}`), { timeout: 10000 }));
  assert.deepEqual(tally(tight.map((r) => r.status)), { 200: 2, 429: 2 });
  for (const r of tight.filter((x) => x.status === 429)) {
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
    assert.ok(Number(r.headers['retry-after']) >= 1, 'Retry-After');
  }

  // Every script the requests ran succeeded: the only error reply a cluster node may
  // have sent is NOSCRIPT (the first EVALSHA of each script on a fresh server).
  const after = await errorStats();
  const grew = Object.fromEntries(Object.entries(after).filter(([k, v]) => v !== (before[k] || 0) && k !== 'NOSCRIPT'));
  assert.deepEqual(grew, {}, `error replies from the cluster node: ${JSON.stringify(after)}`);
  const evals = await redisCli(cluster.url, 'INFO', 'commandstats');
  assert.match(evals, /cmdstat_evalsha:calls=\d+/, 'the scripts ran as EVALSHA');

  // Leases are given back, and every key the scripts left carries a hash tag.
  const tenantTag = `{t:${bill.tenantId}}`;
  await waitFor(async () => (await redisCli(cluster.url, 'ZCARD', `${tenantTag}:conc:k:${bill.keyId}`)) === '0',
    { timeout: 5000, what: 'the key\'s leases back to 0' });
  await waitFor(async () => (await redisCli(cluster.url, 'ZCARD', `${tenantTag}:conc:t`)) === '0',
    { timeout: 5000, what: 'the tenant\'s leases back to 0' });
  const keys = (await redisCli(cluster.url, 'KEYS', '*')).split('\n').filter(Boolean);
  const untagged = keys.filter((k) => !/^\{[at]:\d+\}:/.test(k) && !k.startsWith('tollgate:'));
  assert.deepEqual(untagged, [], 'every data key has a {t:<tenant>} or {a:<account>} tag');
  assert.ok(keys.some((k) => k.startsWith(`${tenantTag}:b:k:`)), `the key's buckets are on the node: ${keys.join(' ')}`);
  assert.ok(keys.some((k) => k === `${tenantTag}:money`), 'the live balance is on the node');

  // Settled exactly: the ledger balances, and no reservation is left once settled.
  await waitFor(async () => Number(await bill.db.scalar(`SELECT count(*) FROM usage WHERE tenant_id = ${bill.tenantId}`)) === 26,
    { timeout: 15000, what: '26 usage rows' });
  await waitFor(async () => Number(await bill.db.scalar(
    `SELECT count(*) FROM reservations WHERE tenant_id = ${bill.tenantId} AND state = 'reserved'`)) === 0,
  { timeout: 15000, what: 'every reservation settled' });
  await verifyLedger(bill);
});
