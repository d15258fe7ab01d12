// Issue 21, items 1 and 3: a fleet of three gateways on a real Redis Cluster of 3
// primaries + 3 replicas (spec/scale/cluster.sh, started once for the `scale` label by
// the ctest fixture scale.cluster_up; its seeds in $TG_SCALE_CLUSTER_DIR/env), with every
// limit and billing on. The gateways' Redis client reads the slot map, sends each script
// to the primary of its tenant's tag, follows MOVED / ASK and rides through failovers.
//
// What a user would notice, checked here: a key's concurrency limit C holds across the
// three instances (the mock upstream never sees more than C at once), the README's token
// bucket example (60/min, burst 20) admits 20 and then refuses, and under a bounded load
// a manual CLUSTER FAILOVER and a kill -9 of the primary that holds the tenant's keys
// over-admit no more than the README states (limits `closed` while Redis is unreachable:
// C for a manual failover, 2·C after a kill -9), in-flight leases go back to zero,
// `tollgate ledger verify` is clean and every request has its usage row.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { adminClient, chat, chatReq, metrics, plainKey, tally } from './lib/db.mjs';
import { billedSetup, MODEL, startBilledGateway, verifyLedger } from './lib/billing.mjs';

const DIR = process.env.TG_SCALE_CLUSTER_DIR;
const C = 4; // the key's concurrency limit
let mock;
let bill;
let gws = [];
let ports = [];
let seeds;
const BUCKET = plainKey('bucket');

function cli(port, ...args) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['-p', String(port), ...args], { timeout: 10000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`redis-cli -p ${port} ${args.join(' ')}: ${stderr || err.message}`));
      else resolve(stdout.trim());
    });
  });
}

/** The cluster as CLUSTER NODES tells it: [{id, port, role, master, failed}]. */
async function nodes() {
  for (const p of ports) {
    try {
      const out = await cli(p, 'CLUSTER', 'NODES');
      return out.split('\n').filter(Boolean).map((l) => {
        const f = l.split(' ');
        return { id: f[0], port: Number(f[1].split(':')[1].split('@')[0]), role: f[2].includes('master') ? 'master' : 'replica',
          master: f[3], failed: /fail/.test(f[2]) };
      });
    } catch { /* that node is down: the next */ }
  }
  throw new Error('no cluster node answers');
}

/** The port of the primary serving `key`'s slot, and of its replica. */
async function ownerOf(key) {
  const slot = Number(await cli(ports.find(Boolean), 'CLUSTER', 'KEYSLOT', key));
  for (const p of ports) {
    try {
      const shards = await cli(p, 'CLUSTER', 'SLOTS');
      const lines = shards.split('\n');
      // redis-cli prints each range flat: start, end, ip, port, id, [ip, port, id]...
      for (let i = 0; i + 4 < lines.length; i++) {
        const from = Number(lines[i]), to = Number(lines[i + 1]);
        if (/^\d+$/.test(lines[i]) && /^\d+$/.test(lines[i + 1]) && lines[i + 2] === '127.0.0.1' && from <= slot && slot <= to) {
          const primary = Number(lines[i + 3]);
          const ns = await nodes();
          const pid = ns.find((n) => n.port === primary)?.id;
          const replica = ns.find((n) => n.master === pid && !n.failed)?.port;
          return { slot, primary, replica };
        }
      }
    } catch { /* next node */ }
  }
  throw new Error(`no owner for ${key}`);
}

async function clusterOk() {
  for (const p of ports) {
    const st = await cli(p, 'CLUSTER', 'INFO').catch(() => '');
    if (st && !/cluster_state:ok/.test(st)) return false;
  }
  return true;
}

const slow = (i) => chatReq(MODEL, `scale ${i} [mock chunks=4 interval_ms=60]`, { stream: i % 2 === 0 });

/** `loops` clients, each sending requests one after another to gateway i % 3 until
 *  `until()` is true: the statuses. Bounded by count and time. */
async function load(loops, until, { max = 400, key = bill.key } = {}) {
  const statuses = [];
  let n = 0;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: loops }, async (_, l) => {
    while (!until() && n < max && Date.now() - t0 < 30000) {
      const i = n++;
      const r = await chat(gws[(l + i) % gws.length], key, slow(i), { timeout: 20000 }).catch((e) => ({ status: `error ${e.message}` }));
      statuses.push(r.status);
      if (r.status !== 200) await sleep(30);
    }
  }));
  return statuses;
}

async function leasesZero() {
  const tag = `{t:${bill.tenantId}}`;
  const owner = await ownerOf(`${tag}:conc:k:${bill.keyId}`);
  await waitFor(async () => (await cli(owner.primary, 'ZCARD', `${tag}:conc:k:${bill.keyId}`)) === '0',
    { timeout: 20000, what: "the key's leases back to 0" });
}

before(async () => {
  if (!DIR || !fs.existsSync(path.join(DIR, 'env'))) {
    console.log('skipped: no Redis Cluster (TG_SCALE_CLUSTER_DIR; run with ctest -L scale)');
    process.exit(77);
  }
  seeds = fs.readFileSync(path.join(DIR, 'env'), 'utf8').match(/TOLLGATE_REDIS_CLUSTER=(\S+)/)[1];
  ports = fs.readFileSync(path.join(DIR, 'ports'), 'utf8').trim().split(/\s+/).map(Number);
  await waitFor(clusterOk, { timeout: 20000, what: 'cluster_state:ok' });
  mock = await startMock();
  bill = await billedSetup({ mock, redis: seeds, balance: '1000' });
  await bill.db.exec(`UPDATE api_keys SET concurrency = ${C}, rpm = 100000, rpm_burst = 100000, tpm = 100000000 WHERE id = ${bill.keyId}`);
  await bill.db.exec(`UPDATE tenants SET concurrency = 100, rpm = 100000, rpm_burst = 100000, tpm = 100000000 WHERE id = ${bill.tenantId}`);
  // The README's example key: 60 requests a minute, in bursts of at most 20.
  await bill.db.exec(`INSERT INTO api_keys (tenant_id, group_id, name, key_hash, prefix, rpm, rpm_burst)
    SELECT tenant_id, group_id, 'bucket', sha256(convert_to('${BUCKET}', 'UTF8')), 'tgk-buck', 60, 20
    FROM api_keys WHERE id = ${bill.keyId}`);
  const limiter = { on_redis_down_rate: 'closed', on_redis_down_tokens: 'closed', on_redis_down_concurrency: 'closed' };
  gws = await Promise.all([0, 1, 2].map(() => startBilledGateway(bill, { workers: 1, limiter }, { mock })));
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test('the keys are spread over the primaries, and each gateway reads the map', async () => {
  const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => chat(gws[i % 3], bill.key, slow(i), { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 6 }, rs.find((r) => r.status !== 200)?.text);
  const ns = await nodes();
  const holders = [];
  for (const n of ns.filter((x) => x.role === 'master')) {
    const calls = [...(await cli(n.port, 'INFO', 'commandstats')).matchAll(/^cmdstat_(evalsha|eval|zadd|zrem|get|set):calls=(\d+)/gm)];
    if (calls.some((m) => Number(m[2]) > 0)) holders.push(n.port);
  }
  assert.ok(holders.length >= 2, `tollgate's commands went to ${holders.length} primary(ies) only`);
  for (const gw of gws) {
    const m = await metrics(gw);
    assert.ok((m['tollgate_redis_total{event="map_read"}'] ?? 0) >= 1, `the slot map was read: ${Object.keys(m).filter((k) => k.includes("redis")).map((k) => `${k}=${m[k]}`).join(" ")}`);
  }
});

test(`a key's concurrency limit of ${C} holds across three instances`, async () => {
  await mock.reset();
  const rs = await Promise.all(Array.from({ length: 18 }, (_, i) => chat(gws[i % 3], bill.key, slow(i), { timeout: 20000 })));
  const t = tally(rs.map((r) => r.status));
  assert.equal((t[200] || 0) + (t[429] || 0), 18, JSON.stringify(t));
  assert.ok(t[200] >= C, JSON.stringify(t));
  const s = (await mock.stats()).credentials[bill.cred];
  assert.ok(s.max_inflight <= C, `upstream saw ${s.max_inflight} at once, limit ${C}`);
  assert.equal(s.max_inflight, C, 'the limit was reached');
  await leasesZero();
});

test('the token bucket example: 60/min in bursts of 20, across three instances', async () => {
  const t0 = Date.now();
  const rs = [];
  for (let i = 0; i < 30; i++) rs.push(await chat(gws[i % 3], BUCKET, chatReq(MODEL, `bucket ${i}`), { timeout: 10000 }));
  const secs = (Date.now() - t0) / 1000;
  const ok = rs.filter((r) => r.status === 200).length;
  assert.ok(ok >= 20 && ok <= 20 + Math.ceil(secs) + 1, `${ok} admitted in ${secs} s (burst 20, 1 per second)`);
  assert.deepEqual(rs.slice(0, 20).map((r) => r.status), Array(20).fill(200));
  for (const r of rs.filter((x) => x.status !== 200)) {
    assert.equal(r.status, 429);
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
  }
});

async function failoverUnderLoad(what, act, bound) {
  await mock.reset();
  let done = false;
  const running = load(2 * C, () => done);
  await sleep(1500);
  const detail = await act();
  await waitFor(clusterOk, { timeout: 20000, what: `cluster_state:ok after ${what}` });
  await sleep(1500); // load on the new primary
  done = true;
  const statuses = await running;
  const t = tally(statuses);
  const s = (await mock.stats()).credentials[bill.cred];
  console.log(`${what}: ${JSON.stringify(t)}, upstream max in flight ${s.max_inflight} (C = ${C}), ${detail}`);
  assert.ok(s.max_inflight <= bound, `${what}: upstream saw ${s.max_inflight} at once, bound ${bound}`);
  const bad = Object.keys(t).filter((k) => !['200', '429', '503'].includes(k));
  assert.deepEqual(bad, [], `${what}: only 200, 429 or 503: ${JSON.stringify(t)}`);
  assert.ok(t[200] > 0, 'requests were served');
  await waitFor(async () => ((await mock.stats()).credentials[bill.cred]?.inflight ?? 0) === 0, { timeout: 10000, what: 'upstream idle' });
  await leasesZero();
  return t;
}

test('an admin change on one instance reaches the others through the cluster (classic Pub/Sub)', async () => {
  // Each instance has the bucket key cached (30 s): a revoke seen within 2 s came by Pub/Sub.
  for (const gw of gws) assert.notEqual((await chat(gw, BUCKET, chatReq(MODEL, 'cached'), { timeout: 10000 })).status, 401);
  const id = await bill.db.scalar("SELECT id FROM api_keys WHERE name = 'bucket'");
  const t0 = Date.now();
  await adminClient(gws[0]).update(`/keys/${id}`, { status: 'revoked' });
  for (const gw of gws.slice(1)) {
    await waitFor(async () => (await chat(gw, BUCKET, chatReq(MODEL, 'revoked?'), { timeout: 10000 })).status === 401,
      { timeout: 2000, interval: 50, what: 'the revoke seen by another instance' });
  }
  console.log(`revoke seen by every instance within ${Date.now() - t0} ms`);
});

test("the tenant's slot migrated to another primary under load: ASK, TRYAGAIN and MOVED followed", async () => {
  const owner = await ownerOf(`{t:${bill.tenantId}}:money`);
  const ns = await nodes();
  const from = ns.find((n) => n.port === owner.primary);
  const to = ns.find((n) => n.role === 'master' && !n.failed && n.port !== owner.primary);
  const before = await Promise.all(gws.map((gw) => metrics(gw)));
  await failoverUnderLoad('slot migration', async () => {
    const slot = String(owner.slot);
    await cli(to.port, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id);
    await cli(from.port, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', to.id);
    let moved = 0;
    for (let round = 0; round < 3; round++) { // the load keeps making keys: move what is there, thrice
      await sleep(300);
      const keys = (await cli(from.port, 'CLUSTER', 'GETKEYSINSLOT', slot, '1000')).split('\n').filter(Boolean);
      if (keys.length) await cli(from.port, 'MIGRATE', '127.0.0.1', String(to.port), '', '0', '5000', 'KEYS', ...keys);
      moved += keys.length;
    }
    for (const n of (await nodes()).filter((x) => x.role === 'master' && !x.failed)) {
      await cli(n.port, 'CLUSTER', 'SETSLOT', slot, 'NODE', to.id);
    }
    assert.equal(await cli(from.port, 'CLUSTER', 'COUNTKEYSINSLOT', slot), '0');
    return `slot ${slot} (${moved} keys) moved from ${from.port} to ${to.port}`;
  }, C);
  const after = await Promise.all(gws.map((gw) => metrics(gw)));
  const grew = (k) => after.reduce((a, m, i) => a + (m[k] ?? 0) - (before[i][k] ?? 0), 0);
  console.log(`redirects followed ${grew('tollgate_redis_total{event="redirect"}')}, retries ${grew('tollgate_redis_total{event="cluster_retry"}')}`);
  assert.ok(grew('tollgate_redis_total{event="redirect"}') > 0, 'ASK / MOVED followed');
  assert.equal((await ownerOf(`{t:${bill.tenantId}}:money`)).primary, to.port, 'the new owner serves the tenant');
  await verifyLedger(bill);
});

test('a manual CLUSTER FAILOVER under load: at most C at once, leases return, the ledger verifies', async () => {
  const owner = await ownerOf(`{t:${bill.tenantId}}:money`);
  await failoverUnderLoad('manual failover', async () => {
    assert.equal(await cli(owner.replica, 'CLUSTER', 'FAILOVER'), 'OK');
    await waitFor(async () => (await nodes()).find((n) => n.port === owner.replica)?.role === 'master',
      { timeout: 10000, what: 'the replica promoted' });
    return `replica ${owner.replica} took over from ${owner.primary}`;
  }, C);
  const m = await Promise.all(gws.map((gw) => metrics(gw)));
  const redirects = m.reduce((a, x) => a + (x['tollgate_redis_total{event="redirect"}'] ?? 0), 0);
  const reads = m.reduce((a, x) => a + (x['tollgate_redis_total{event="map_read"}'] ?? 0), 0);
  console.log(`redirects followed ${redirects}, map reads ${reads}`);
  await verifyLedger(bill);
});

test('kill -9 of the primary that holds the tenant: over-admission within 2·C, leases return, the ledger verifies', async () => {
  const owner = await ownerOf(`{t:${bill.tenantId}}:money`);
  const pid = Number(fs.readFileSync(path.join(DIR, `redis-${owner.primary}.pid`), 'utf8'));
  await failoverUnderLoad('kill -9', async () => {
    process.kill(pid, 'SIGKILL');
    await waitFor(async () => (await nodes()).find((n) => n.port === owner.replica)?.role === 'master',
      { timeout: 15000, what: 'the replica promoted' });
    return `primary ${owner.primary} killed, replica ${owner.replica} promoted`;
  }, 2 * C);
  // The killed node comes back as a replica (the fixture's cleanup stops it by its PID).
  await new Promise((resolve, reject) => execFile(process.env.TG_SCALE_CLUSTER_SH, ['node', DIR, String(owner.primary)],
    { timeout: 15000 }, (e, out, err) => (e ? reject(new Error(`${e.message} ${err}`)) : resolve())));
  // Every request has its usage row, and Redis agrees with Postgres: a release the
  // killed primary acknowledged and its replica never had leaves its hold in the new
  // primary, given back by the reconciler (2 s reconcile delay) once Postgres shows the
  // request settled.
  await waitFor(async () => Number(await bill.db.scalar(
    `SELECT count(*) FROM reservations WHERE tenant_id = ${bill.tenantId} AND state = 'reserved'`)) === 0,
  { timeout: 20000, what: 'every reservation settled' });
  const holds = `{t:${bill.tenantId}}:holds`;
  await waitFor(async () => (await cli((await ownerOf(holds)).primary, 'HLEN', holds)) === '0',
    { timeout: 20000, interval: 250, what: 'no hold left in Redis' });
  await verifyLedger(bill);
});
