// Driver of billing_evalsha.sh (see there): one binary ($TG_BIN), one Markdown row per
// key kind. Uses the integration tests' helpers (real binary, real Postgres and Redis,
// the mock upstream).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

import { startMock, stopAll } from '../integration/lib/harness.mjs';
import { SUITE_REDIS, applyState, chat, createDb, plainKey, redisCli } from '../integration/lib/db.mjs';
import { CRED, PRICES, chatBody, startBilledGateway } from '../integration/lib/billing.mjs';

const N = 200;
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
  // The whole process (with the gateway's background work: heartbeats, the reconciler's
  // SCAN of the keyspace), and the scripts alone (EVALSHA and EVAL, inclusive: the Lua
  // and the commands it calls, not the parsing and I/O of the call itself).
  return {
    total: num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+PROGRAM TOTALS/m),
    scripts: num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+\S*:evalShaCommand\b/m) + num(/^\s*([\d,]+)(?: \([\d.]+%\))?\s+\S*:evalCommand\b/m),
  };
}

const mock = await startMock();
const db = await createDb();
const keys = { limits: plainKey('ev-lim'), 'no limits': plainKey('ev-none') };
await applyState(db, {
  tenants: [{ name: 'acme', balance: '1000', rpm: 1000000, concurrency: 1000 }, { name: 'plain', balance: '1000' }],
  groups: [{ name: 'g', models: [] }],
  accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: Number(process.env.TG_BENCH_ACCOUNT_CONCURRENCY || 0), groups: ['g'] }],
  keys: [
    { name: 'lim', tenant: 'acme', group: 'g', key: keys.limits, rpm: 1000000, tpm: 100000000, concurrency: 500 },
    { name: 'none', tenant: 'plain', group: 'g', key: keys['no limits'] },
  ],
  prices: [PRICES],
});
const gw = await startBilledGateway({ db, conninfo: db.conninfo, redis: SUITE_REDIS }, {}, { mock });
try {
  for (const [kind, key] of Object.entries(keys)) {
    // Warm: the balance loaded into Redis, the scripts cached.
    for (let i = 0; i < 5; i++) await chat(gw, key, chatBody('warm [mock chunks=2]'));
    await new Promise((r) => setTimeout(r, 300));
    await redisCli(SUITE_REDIS, 'CONFIG', 'RESETSTAT');
    callgrind('zero');
    let ok = 0;
    for (let i = 0; i < N; i += 8) {
      const rs = await Promise.all(Array.from({ length: 8 }, () => chat(gw, key, chatBody('measure [mock chunks=2]'))));
      ok += rs.filter((r) => r.status === 200).length;
    }
    await new Promise((r) => setTimeout(r, process.env.TG_CG_PID ? 3000 : 500)); // the releases and settlements after the responses
    const instr = callgrind('dump');
    const s = await commandstats();
    const scripts = (s.evalsha?.calls || 0) + (s.eval?.calls || 0);
    const usec = (s.evalsha?.usec || 0) + (s.eval?.usec || 0);
    let other = 0;
    for (const [cmd, v] of Object.entries(s)) if (!['evalsha', 'eval', 'info', 'config|resetstat', 'config'].includes(cmd)) other += v.calls;
    console.log(`| ${label} | ${kind} | ${ok} of ${N} answered 200 | ${(scripts / N).toFixed(2)} (evalsha ${s.evalsha?.calls || 0}, eval ${s.eval?.calls || 0}) | ${(usec / N).toFixed(1)} | ${(other / N).toFixed(2)} |${instr === null ? '' : ` ${Math.round(instr.total / N).toLocaleString('en-US')} | ${Math.round(instr.scripts / N).toLocaleString('en-US')} |`}`);
  }
} finally {
  await stopAll();
  await db.drop();
}
