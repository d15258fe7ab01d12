// Driver of budgets_bench.sh (see there): one binary ($TG_BIN), one Markdown row per key
// kind — a key under no periodic budget, and a key under two (its own daily budget in
// Europe/Berlin and its tenant's monthly one). Each kind has a tenant of its own with the
// same balance and no limits, so the admission scripts differ only by the budgets. Uses
// the integration tests' helpers (real binary, real Postgres and Redis, the mock upstream).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

import { startMock, stopAll } from '../integration/lib/harness.mjs';
import { SUITE_REDIS, applyState, chat, createDb, keepAliveAgent, plainKey, redisCli } from '../integration/lib/db.mjs';
import { CRED, PRICES, chatBody, startBilledGateway } from '../integration/lib/billing.mjs';

const N = Number(process.env.TG_BENCH_N || 400);
const label = process.argv[2] || 'tollgate';

async function commandstats() {
  const out = await redisCli(SUITE_REDIS, 'INFO', 'commandstats');
  const stats = {};
  for (const m of out.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) stats[m[1]] = { calls: Number(m[2]), usec: Number(m[3]) };
  return stats;
}

/** Under --callgrind: zero Redis's counters, or dump them and return the instructions. */
function callgrind(op) {
  const pid = process.env.TG_CG_PID;
  if (!pid) return null;
  execFileSync('callgrind_control', [op === 'zero' ? '-z' : '-d', pid], { stdio: 'ignore' });
  if (op === 'zero') return null;
  const dir = process.env.TG_CG_DIR;
  const dumps = fs.readdirSync(dir).filter((f) => /^redis\.out\.\d+$/.test(f));
  const last = dumps.sort((a, b) => Number(a.split('.').pop()) - Number(b.split('.').pop())).pop();
  const out = execFileSync('callgrind_annotate', ['--inclusive=yes', `${dir}/${last}`], { maxBuffer: 64 << 20 }).toString();
  const num = (re) => {
    const m = re.exec(out);
    return m ? Number(m[1].replace(/,/g, '')) : 0;
  };
  return {
    total: num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+PROGRAM TOTALS/m),
    scripts: num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+\S*:evalShaCommand\b/m) + num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+\S*:evalCommand\b/m),
  };
}

const mock = await startMock();
const db = await createDb();
const keys = { 'no budget': plainKey('bb-none'), 'two budgets': plainKey('bb-two') };
await applyState(db, {
  tenants: [{ name: 'plain', balance: '100000' }, { name: 'budgeted', balance: '100000' }],
  groups: [{ name: 'g', models: [] }],
  accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 0, groups: ['g'] }],
  keys: [
    { name: 'none', tenant: 'plain', group: 'g', key: keys['no budget'] },
    { name: 'two', tenant: 'budgeted', group: 'g', key: keys['two budgets'] },
  ],
  prices: [PRICES],
  budgets: [
    { name: 'two-daily', tenant: 'budgeted', key: 'two', amount: '50000', period: 'day', timezone: 'Europe/Berlin' },
    { name: 'budgeted-monthly', tenant: 'budgeted', amount: '90000', period: 'month' },
  ],
});
const gw = await startBilledGateway({ db, conninfo: db.conninfo, redis: SUITE_REDIS }, { workers: 1 }, { mock });
const agent = keepAliveAgent(4);
const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))];
try {
  // Alternate the kinds in rounds, so the box's load falls on both alike.
  const res = {};
  for (const kind of Object.keys(keys)) {
    for (let i = 0; i < 10; i++) await chat(gw, keys[kind], chatBody('warm [mock chunks=2]'), { agent });
    res[kind] = { lat: [], ok: 0 };
  }
  await new Promise((r) => setTimeout(r, 300));
  for (const kind of Object.keys(keys)) {
    await redisCli(SUITE_REDIS, 'CONFIG', 'RESETSTAT');
    callgrind('zero');
    for (let i = 0; i < N; i++) {
      const t0 = process.hrtime.bigint();
      const r = await chat(gw, keys[kind], chatBody('measure [mock chunks=2]'), { agent });
      res[kind].lat.push(Number(process.hrtime.bigint() - t0) / 1000);
      if (r.status === 200) res[kind].ok++;
    }
    await new Promise((r) => setTimeout(r, process.env.TG_CG_PID ? 3000 : 500));
    const instr = callgrind('dump');
    const s = await commandstats();
    const lat = res[kind].lat.sort((a, b) => a - b);
    const scripts = (s.evalsha?.calls || 0) + (s.eval?.calls || 0);
    const usec = (s.evalsha?.usec || 0) + (s.eval?.usec || 0);
    console.log(`| ${label} | ${kind} | ${res[kind].ok} of ${N} answered 200 | ${(scripts / N).toFixed(2)} | ${(usec / N).toFixed(1)} | ${pct(lat, 50).toFixed(0)} | ${pct(lat, 90).toFixed(0)} |${instr === null ? '' : ` ${Math.round(instr.total / N).toLocaleString('en-US')} | ${Math.round(instr.scripts / N).toLocaleString('en-US')} |`}`);
  }
} finally {
  agent.destroy?.();
  await stopAll();
  await db.drop();
}
