// Issue 21, item 1's last part: TLS to Redis (rediss://, the config's redis_tls table).
// A throwaway CA signs a server certificate (127.0.0.1 and localhost) and a client one;
// a private redis-server serves TLS only on 127.0.0.1 (its unix socket, plaintext, is
// the test's own window on it). What a user would notice, checked here:
// - a gateway with limits and billing on a rediss:// URL works, its key's concurrency
//   limit holds (the mock upstream never sees more than C at once), and its scripts and
//   money live in that Redis, reached on the TLS port; `tollgate ledger verify` (the
//   blocking client) goes through TLS too;
// - a Redis whose certificate the configured CA did not sign is refused with a clear log
//   line, and the gateway fails as core/README.md's "When Redis is down" says for
//   limits `closed` (503, no crash, /healthz still answers);
// - mutual TLS: with tls-auth-clients yes, the configured client certificate is accepted
//   (a gateway's workers and `tollgate ledger`) and its absence is refused and logged; a
//   server name that the certificate does not carry is refused;
// - rediss-cluster://: a one-node TLS-only cluster (tls-cluster yes, no plaintext port,
//   so CLUSTER SHARDS names its tls-port alone and no host): the map is read over TLS
//   and the limit holds. (The 3 + 3 cluster of scale.cluster_up stays plaintext; this
//   node costs about a second.)

import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freePort, HOST, startGateway, startMock, stopAll, tempDir, TG_BIN, toLua, waitFor } from './lib/harness.mjs';
import { chat, chatReq, metrics, redisCli, SECRET_KEY, startRedis, tally } from './lib/db.mjs';
import { billedEnv, billedSetup, liveMoney, MODEL, startBilledGateway } from './lib/billing.mjs';

const C = 2; // the key's concurrency limit
const closed = { on_redis_down_rate: 'closed', on_redis_down_tokens: 'closed', on_redis_down_concurrency: 'closed' };
let dir;
let pki;
let redis;
let tlsPort;
let tlsUrl;
let mock;
let bill;

/** A CA, a server certificate for 127.0.0.1 / localhost signed by it, a client one, and a
 *  second CA that signed nothing of these (EC keys: quick). */
function makePki(d) {
  const f = (n) => path.join(d, n);
  const run = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  const key = (n) => run('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', f(n));
  for (const ca of ['ca', 'other-ca']) {
    key(`${ca}.key`);
    run('req', '-x509', '-new', '-key', f(`${ca}.key`), '-subj', `/CN=tollgate test ${ca}`, '-days', '1', '-out', f(`${ca}.pem`));
  }
  for (const [n, ext] of [['server', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'],
    ['client', 'extendedKeyUsage=clientAuth\n']]) {
    key(`${n}.key`);
    run('req', '-new', '-key', f(`${n}.key`), '-subj', `/CN=${n}`, '-out', f(`${n}.csr`));
    fs.writeFileSync(f(`${n}.ext`), ext);
    run('x509', '-req', '-in', f(`${n}.csr`), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial', '-days', '1',
      '-extfile', f(`${n}.ext`), '-out', f(`${n}.pem`));
  }
  return { ca: f('ca.pem'), otherCa: f('other-ca.pem'), cert: f('server.pem'), key: f('server.key'),
    clientCert: f('client.pem'), clientKey: f('client.key') };
}

/** `tollgate ledger verify` on bill's database and the TLS Redis with `redisTls`. */
function ledgerVerify(redisTls) {
  const cfg = path.join(tempDir('cfg'), 'tollgate.lua');
  fs.writeFileSync(cfg, `return ${toLua({ upstream: { url: `http://${HOST}:9/v1` }, billing: { unknown_usage: 'charge' }, redis_tls: redisTls })}\n`);
  const env = { ...process.env, ...billedEnv(bill), TOLLGATE_REDIS: tlsUrl, TOLLGATE_SECRET_KEY: SECRET_KEY };
  return new Promise((resolve) => {
    execFile(TG_BIN, ['ledger', 'verify', '-c', cfg], { env, timeout: 30000 }, (err, stdout, stderr) =>
      resolve({ code: err ? err.code : 0, out: `${stdout}${stderr}` }));
  });
}

before(async () => {
  if (!process.env.TOLLGATE_PG || !process.env.TOLLGATE_REDIS) {
    console.log('skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run with spec/run.sh)');
    process.exit(77);
  }
  dir = tempDir('pki');
  pki = makePki(dir);
  tlsPort = await freePort();
  redis = await startRedis({ args: ['--bind', '127.0.0.1', '--tls-port', String(tlsPort), '--tls-cert-file', pki.cert,
    '--tls-key-file', pki.key, '--tls-ca-cert-file', pki.ca, '--tls-auth-clients', 'optional'] });
  tlsUrl = `rediss://127.0.0.1:${tlsPort}`;
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '1000' }); // set up on the suite's Redis ...
  await bill.db.exec(`UPDATE api_keys SET concurrency = ${C}, rpm = 100000, rpm_burst = 100000, tpm = 100000000 WHERE id = ${bill.keyId}`);
  await bill.db.exec(`UPDATE tenants SET concurrency = 100, rpm = 100000, rpm_burst = 100000, tpm = 100000000 WHERE id = ${bill.tenantId}`);
  bill.redis = tlsUrl; // ... the gateways use the TLS one
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await bill?.db.drop();
});

test(`over TLS: a key's concurrency limit of ${C} holds, and the limits and money live in the TLS Redis`, async () => {
  const gw = await startBilledGateway(bill, { workers: 1, limiter: closed, redis_tls: { ca_file: pki.ca } }, { mock });
  const slow = (i) => chatReq(MODEL, `tls ${i} [mock chunks=4 interval_ms=80]`, { stream: true });
  const rs = await Promise.all(Array.from({ length: 8 }, (_, i) => chat(gw, bill.key, slow(i), { timeout: 20000 })));
  const t = tally(rs.map((r) => r.status));
  assert.equal((t[200] || 0) + (t[429] || 0), 8, `${JSON.stringify(t)} ${rs.find((r) => r.status !== 200 && r.status !== 429)?.text}`);
  assert.ok(t[200] >= C, JSON.stringify(t));
  const s = (await mock.stats()).credentials[bill.cred];
  assert.equal(s.max_inflight, C, `upstream saw ${s.max_inflight} at once, limit ${C}: ${JSON.stringify(t)} ${rs.map((r) => r.text).join(' | ').slice(0, 1500)}`);
  // The gateway's connections are on the TLS port, and its scripts ran there.
  const clients = (await redisCli(redis.url, 'CLIENT', 'LIST')).split('\n').filter((l) => /name=tollgate:/.test(l));
  assert.ok(clients.length >= 2, `tollgate's connections: ${clients.join('\n')}`);
  for (const l of clients) assert.match(l, new RegExp(`laddr=127\\.0\\.0\\.1:${tlsPort} `), l);
  assert.match(await redisCli(redis.url, 'INFO', 'commandstats'), /cmdstat_evalsha:calls=[1-9]/);
  const money = await liveMoney(bill, redis.url);
  assert.ok(money.avail !== null, 'the tenant\'s money is loaded in the TLS Redis');
  await waitFor(async () => (await liveMoney(bill, redis.url)).reserved === 0n, { timeout: 10000, what: 'reservations settled' });
  // The blocking client (`tollgate ledger`) goes through TLS too.
  const v = await ledgerVerify({ ca_file: pki.ca });
  assert.equal(v.code, 0, v.out);
  await gw.stop();
});

test('a Redis certificate the CA did not sign: refused, logged clearly, limits closed (503), no crash', async () => {
  const gw = await startGateway({ workers: 1, access_log: false, limiter: closed, redis_tls: { ca_file: pki.otherCa },
    billing: { spool_dir: tempDir('spool'), reconcile_after_ms: 2000, unknown_usage: 'charge' } },
  { mock, env: billedEnv(bill) });
  const line = await gw.proc.waitForLine('stderr', /redis: .*TLS to 127\.0\.0\.1:\d+: handshake failed/, 10000);
  assert.match(line, /certificate verify failed/, line);
  assert.ok(!/tgk-|sk-/.test(gw.proc.lines.stderr.join('\n')), 'no secret in the log');
  let r;
  await waitFor(async () => {
    r = await chat(gw, bill.key, chatReq(MODEL, 'refused'), { timeout: 10000 });
    return r.status !== 503 || !/accounts_unavailable/.test(r.text);
  }, { timeout: 10000, what: 'the account pool loaded' });
  assert.equal(r.status, 503, r.text);
  assert.match(r.json?.error?.code ?? '', /^(limiter|billing)_unavailable$/, r.text);
  assert.equal((await fetch(`${gw.url}/healthz`)).status, 200);
  assert.ok(gw.proc.running, 'the gateway is still up');
  const v = await ledgerVerify({ ca_file: pki.otherCa });
  assert.notEqual(v.code, 0);
  assert.match(v.out, /certificate verify failed/, v.out);
  await gw.stop();
});

test('mutual TLS and the server name: a client certificate when Redis asks for one, the name checked', async () => {
  await redisCli(redis.url, 'CONFIG', 'SET', 'tls-auth-clients', 'yes');
  try {
    const withCert = await ledgerVerify({ ca_file: pki.ca, cert: pki.clientCert, key: pki.clientKey });
    assert.equal(withCert.code, 0, withCert.out);
    const without = await ledgerVerify({ ca_file: pki.ca });
    assert.notEqual(without.code, 0, without.out);
    assert.match(without.out, /TLS to 127\.0\.0\.1:\d+/, without.out);
    // The workers' client: with the certificate a limited request is served ...
    const gw = await startBilledGateway(bill, { workers: 1, limiter: closed,
      redis_tls: { ca_file: pki.ca, cert: pki.clientCert, key: pki.clientKey } }, { mock });
    const r = await chat(gw, bill.key, chatReq(MODEL, 'mutual'), { timeout: 10000 });
    assert.equal(r.status, 200, r.text);
    await gw.stop();
    // ... and without it the connection is refused, and the log says so.
    const gw2 = await startBilledGateway(bill, { workers: 1, limiter: closed, redis_tls: { ca_file: pki.ca } }, { mock });
    const line = await gw2.proc.waitForLine('stderr', /redis: .*connect failed: TLS to 127\.0\.0\.1:\d+/, 10000);
    assert.match(line, /certificate required|client certificate/, line);
    assert.equal((await chat(gw2, bill.key, chatReq(MODEL, 'no cert'), { timeout: 10000 })).status, 503);
    await gw2.stop();
  } finally {
    await redisCli(redis.url, 'CONFIG', 'SET', 'tls-auth-clients', 'optional');
  }
  const named = await ledgerVerify({ ca_file: pki.ca, server_name: 'localhost' });
  assert.equal(named.code, 0, named.out);
  const wrong = await ledgerVerify({ ca_file: pki.ca, server_name: 'redis.example.com' });
  assert.notEqual(wrong.code, 0, wrong.out);
  assert.match(wrong.out, /certificate verify failed|hostname mismatch/, wrong.out);
  const bad = await ledgerVerify({ ca_file: pki.ca, cert: pki.clientCert });
  assert.equal(bad.code, 2, bad.out);
  assert.match(bad.out, /redis_tls\.key/, bad.out);
});

test('rediss-cluster://: a TLS-only cluster node, its map read over TLS, the limit holds', async () => {
  const port = await freePort();
  const bus = await freePort();
  const node = await startRedis({ args: ['--bind', '127.0.0.1', '--tls-port', String(port), '--cluster-port', String(bus),
    '--tls-cert-file', pki.cert, '--tls-key-file', pki.key, '--tls-ca-cert-file', pki.ca, '--tls-auth-clients', 'optional',
    '--tls-cluster', 'yes', '--tls-replication', 'yes', '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf'] });
  try {
    assert.equal(await redisCli(node.url, 'CLUSTER', 'ADDSLOTSRANGE', '0', '16383'), 'OK');
    await waitFor(async () => /cluster_state:ok/.test(await redisCli(node.url, 'CLUSTER', 'INFO')), { timeout: 10000, what: 'cluster_state:ok' });
    const shards = await redisCli(node.url, 'CLUSTER', 'SHARDS');
    assert.match(shards, /^tls-port$/m);
    assert.doesNotMatch(shards, /^port$/m); // a TLS-only node: the client must take tls-port
    await mock.reset();
    const gw = await startBilledGateway({ ...bill, redis: `rediss-cluster://127.0.0.1:${port}` },
      { workers: 1, limiter: closed, redis_tls: { ca_file: pki.ca } }, { mock });
    const slow = (i) => chatReq(MODEL, `cluster ${i} [mock chunks=4 interval_ms=80]`, { stream: true });
    const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => chat(gw, bill.key, slow(i), { timeout: 20000 })));
    const t = tally(rs.map((r) => r.status));
    assert.equal((t[200] || 0) + (t[429] || 0), 6, JSON.stringify(t));
    const s = (await mock.stats()).credentials[bill.cred];
    assert.equal(s.max_inflight, C, `upstream saw ${s.max_inflight} at once, limit ${C}: ${JSON.stringify(t)}`);
    const m = await metrics(gw);
    assert.ok((m['tollgate_redis_total{event="map_read"}'] ?? 0) >= 1, 'the slot map was read');
    const clients = (await redisCli(node.url, 'CLIENT', 'LIST')).split('\n').filter((l) => /name=tollgate:/.test(l));
    assert.ok(clients.length >= 2, clients.join('\n'));
    for (const l of clients) assert.match(l, new RegExp(`laddr=127\\.0\\.0\\.1:${port} `), l);
    await gw.stop();
  } finally {
    await node.stop();
  }
});
