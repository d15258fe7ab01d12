// Driver of cluster_bench.sh (see there): one Redis target ($TOLLGATE_REDIS: a single
// node or a redis-cluster:// seed list), one Markdown row. Uses the integration tests'
// helpers (real binary, real Postgres and Redis, the mock upstream); the gateway runs
// under callgrind through the wrapper $TG_BIN (TG_CG_OUT names its output).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { startMock, stopAll } from '../integration/lib/harness.mjs';
import { chat, chatReq, keepAliveAgent } from '../integration/lib/db.mjs';
import { billedSetup, MODEL, startBilledGateway } from '../integration/lib/billing.mjs';

const N = Number(process.env.TG_BENCH_N || 300);
const label = process.argv[2];
const url = process.env.TOLLGATE_REDIS;
const cluster = url.startsWith('redis-cluster://');
const nodes = cluster ? process.env.TG_BENCH_PORTS.trim().split(/\s+/) : [/:(\d+)$/.exec(url)[1]];
const cli = (port, ...args) => execFileSync('redis-cli', ['-p', port, ...args]).toString();

function primaries() {
  return nodes.filter((p) => {
    try {
      return /^role:master/m.test(cli(p, 'INFO', 'replication'));
    } catch {
      return false;
    }
  });
}

function commandstats() {
  const all = {};
  for (const p of primaries()) {
    for (const m of cli(p, 'INFO', 'commandstats').matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) all[m[1]] = (all[m[1]] || 0) + Number(m[2]);
  }
  return all;
}

const mock = await startMock();
const bill = await billedSetup({ mock, redis: url, balance: '100000' });
await bill.db.exec(`UPDATE api_keys SET rpm = 1000000, rpm_burst = 100000, tpm = 1000000000, concurrency = 100 WHERE id = ${bill.keyId}`);
await bill.db.exec(`UPDATE tenants SET rpm = 1000000, rpm_burst = 100000, tpm = 1000000000, concurrency = 100 WHERE id = ${bill.tenantId}`);
const cgOut = path.join(process.env.TG_CG_DIR, `cg-${label}.out`);
const gw = await startBilledGateway(bill, { workers: 1, redis_timeout_ms: 2000 }, { mock, env: { TG_CG_OUT: cgOut } });
const agent = keepAliveAgent(1);
const body = chatReq(MODEL, 'bench [mock chunks=2]');
for (let i = 0; i < 50; i++) await chat(gw, bill.key, body, { agent, timeout: 20000 });
await new Promise((r) => setTimeout(r, 500));
for (const p of primaries()) cli(p, 'CONFIG', 'RESETSTAT');
execFileSync('callgrind_control', ['-i', 'on', String(gw.proc.pid)], { stdio: 'ignore' }); // instrumented from here (startup under valgrind is slow enough)
execFileSync('callgrind_control', ['-z', String(gw.proc.pid)], { stdio: 'ignore' });
let ok = 0;
for (let i = 0; i < N; i++) ok += (await chat(gw, bill.key, body, { agent, timeout: 20000 })).status === 200 ? 1 : 0;
await new Promise((r) => setTimeout(r, 500)); // the releases and settlements of the last ones
execFileSync('callgrind_control', ['-d', String(gw.proc.pid)], { stdio: 'ignore' });
const stats = commandstats();
const dumps = fs.readdirSync(process.env.TG_CG_DIR).filter((f) => f.startsWith(`cg-${label}.out.`));
const last = dumps.sort((a, b) => Number(a.split('.').pop()) - Number(b.split('.').pop())).pop();
const summary = /^summary:\s+(\d+)/m.exec(fs.readFileSync(path.join(process.env.TG_CG_DIR, last), 'utf8'));
const ir = summary ? Number(summary[1]) : NaN;
const upkeep = Object.entries(stats).filter(([k]) => /^(cluster|info|config|ping|client|command)/.test(k));
const work = Object.entries(stats).filter(([k]) => !/^(cluster|info|config|ping|client|command)/.test(k));
const sum = (l) => l.reduce((a, [, v]) => a + v, 0);
const scripts = sum(work.filter(([k]) => /^eval/.test(k)));
const f = (x) => (x / N).toFixed(2);
console.log(`| ${label} | ${ok} of ${N} answered 200 | ${f(sum(work))} | ${f(scripts)} | ${f(sum(work) - scripts)} (${work.filter(([k]) => !/^eval/.test(k)).map(([k, v]) => `${k} ${f(v)}`).join(', ')}) | ${f(sum(upkeep))} (${upkeep.map(([k, v]) => `${k} ${v}`).join(', ')}) | ${Math.round(ir / N).toLocaleString('en-US')} |`);
agent.destroy();
await stopAll();
await bill.db.drop();
