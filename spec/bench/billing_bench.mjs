// The driver of spec/bench/billing_bench.sh (run that: it starts the private Postgres
// and Redis this expects in TOLLGATE_PG / TOLLGATE_REDIS, builds tg_loadgen, and
// stops everything afterwards). Three measurements, printed as Markdown:
//
//   A. tg_settle_batch straight from pgbench: sustained settlements per second with
//      batches of N = 1, 10, 100, 200 from 4 concurrent connections, each settlement
//      finding its `reserved` reservation row (pre-inserted) as in the gateway; on the
//      test configuration of Postgres (fsync and synchronous_commit off, as spec/run.sh
//      runs it) and durable (both on); one tenant per connection, and all four on one
//      tenant (the worst case: every settlement updates the same balance row).
//   B. End to end through the gateway (2 workers, access log off, billing on): wrk at
//      full speed with a billed key; usage rows written per second while it runs, the
//      number of tg_settle_batch calls (so the settlements per transaction), and after
//      the run: every 200 has its usage row, nothing spooled, `ledger verify` passes.
//   E. Sustained end to end: the gateway (durable Postgres) under a fixed open-loop
//      rate (tg_loadgen); usage rows written per second during the run, the backlog
//      when it ends and how long it takes to drain: settlement keeps up when rows/s
//      equals the rate and the backlog stays at about one batch.
//   C. What billing costs the client: p50/p99/p99.9 latency at a fixed open-loop rate
//      (tg_loadgen, corrected for coordinated omission) through two gateways started
//      side by side on the same database, billing on and billing = { enabled = false },
//      interleaved in rounds; and wrk throughput of both.
//
// Usage (from billing_bench.sh): node billing_bench.mjs --loadgen PATH [--quick]

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { sleep, startMock, stopAll, tempDir } from '../integration/lib/harness.mjs';
import { applyState, createDb, psql } from '../integration/lib/db.mjs';
import { billedSetup, ledger, startBilledGateway } from '../integration/lib/billing.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const QUICK = argv.includes('--quick');
const LOADGEN = argv[argv.indexOf('--loadgen') + 1];
const SETTLE_SECONDS = QUICK ? 2 : 6;
const WRK_SECONDS = QUICK ? 4 : 10;
const LAT_SECONDS = QUICK ? 3 : 6;
const LAT_ROUNDS = QUICK ? 1 : 3;
const LAT_RATES = [200, 1000];
const SUSTAIN_RATES = QUICK ? [2000] : [2000, 4000, 5000, 6000];
const SUSTAIN_SECONDS = QUICK ? 4 : 10;
const BATCHES = [1, 10, 100, 200];
const CLIENTS = 4;
/** The gateways: 2 workers, access log off, the default reconcile delay (10 min). */
const GW = { log_level: 'warn', billing: { reconcile_after_ms: 600000 } };

const log = (...a) => console.error('billing_bench:', ...a);
const out = [];
const print = (s = '') => {
  out.push(s);
  console.log(s);
};

function run(cmd, args, { env, timeout = 600000 } = {}) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { env: { ...process.env, ...env }, timeout, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err && err.code !== 1) reject(new Error(`${cmd} ${args.join(' ')}: ${stderr || err.message}`));
      else resolve({ stdout, stderr, code: err ? err.code : 0 });
    });
  });
}

const fmt = (n) => Math.round(n).toLocaleString('en-US');
const ms = (us) => (Number.isFinite(Number(us)) ? (us / 1000).toFixed(2) : 'n/a');

// ---- A. tg_settle_batch from pgbench ----------------------------------------------------

async function setDurable(conninfo, on) {
  const server = conninfo.replace(/dbname='?[^' ]+'?/, "dbname='postgres'");
  const v = on ? 'on' : 'off';
  await psql(server, `ALTER SYSTEM SET fsync = ${v}`);
  await psql(server, `ALTER SYSTEM SET synchronous_commit = ${v}`);
  await psql(server, "ALTER SYSTEM SET track_functions = 'pl'");
  await psql(server, 'SELECT pg_reload_conf()');
  await sleep(300);
}

/**
 * The pgbench script: one tg_settle_batch call carrying what N requests give the
 * gateway's batcher (sql/0003_billing.sql): N reservation elements
 * ({"op": "reserve"}: the `reserved` row) and then the N settlements of the same
 * requests (each reconciles its reservation row). With `reserve` false only the N
 * settlements (each then writes its reservation row itself, `awaiting reservation`).
 */
function settleScript(dir, reserve) {
  const p = path.join(dir, reserve ? 'reserve_settle.sql' : 'settle.sql');
  // Block b of run :run covers request ids r<run>-((b-1)*n+1 .. b*n); the tenant of a
  // connection is the (client_id % nt)-th tenant.
  const tenant = `(SELECT t.id AS tid, (SELECT k.id FROM api_keys k WHERE k.tenant_id = t.id ORDER BY k.id LIMIT 1) AS kid
             FROM tenants t ORDER BY t.id OFFSET (:client_id % :nt) LIMIT 1)`;
  const id = "'r' || :run || '-' || ((:b - 1) * :n + g)";
  const reserveElems = `SELECT 0 AS o, g, jsonb_build_object('op', 'reserve', 'request_id', ${id}, 'attempt', 1,
      'tenant_id', t.tid, 'api_key_id', t.kid, 'amount', '0.000200000', 'model', 'mock-gpt') AS e
    FROM t, generate_series(1, :n) g
    UNION ALL
    `;
  fs.writeFileSync(p, `SELECT nextval('bench_blk') AS b \\gset
SELECT count(*) FROM tg_settle_batch((
  WITH t AS ${tenant}
  SELECT jsonb_agg(e ORDER BY o, g) FROM (
    ${reserve ? reserveElems : ''}SELECT 1 AS o, g, jsonb_build_object(
    'request_id', ${id}, 'fingerprint', md5(g::text), 'tenant_id', t.tid,
    'api_key_id', t.kid, 'group_id', :gid, 'account_id', :aid, 'model', 'mock-gpt', 'attempts', 1,
    'input', 10, 'output', 20, 'cache_read', null, 'cache_write', null, 'reasoning', null,
    'cost', '0.000050000', 'estimated', false, 'status', 200, 'ttft_ms', 12.5, 'total_ms', 40.25) AS e
    FROM t, generate_series(1, :n) g) q));
`);
  return p;
}

async function benchSettle() {
  const mock = await startMock();
  const db = await createDb();
  await applyState(db, {
    tenants: Array.from({ length: CLIENTS }, (_, i) => ({ name: `t${i}`, balance: '1000000' })),
    groups: [{ name: 'g', models: [] }],
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-x', groups: ['g'] }],
    keys: Array.from({ length: CLIENTS }, (_, i) => ({ name: `k${i}`, tenant: `t${i}`, group: 'g' })),
    prices: [{ model: 'mock-gpt', input: '1.00', output: '2.00' }],
  });
  const gid = await db.scalar("SELECT id FROM groups WHERE name = 'g'");
  const aid = await db.scalar("SELECT id FROM accounts WHERE name = 'up'");
  const dir = tempDir('pgbench');
  const scripts = { true: settleScript(dir, true), false: settleScript(dir, false) };
  const results = [];
  const variants = [
    { name: 'test Postgres, 4 tenants', durable: false, nt: CLIENTS, reserve: true },
    { name: 'durable, 4 tenants', durable: true, nt: CLIENTS, reserve: true },
    { name: 'durable, 1 tenant', durable: true, nt: 1, reserve: true },
    { name: 'durable, 4 tenants, settlement only', durable: true, nt: CLIENTS, reserve: false },
  ];
  // A database that has settled requests before: 100,000 of them (not measured), so
  // that the planner sees tables with history, as in production. (On tables analyzed
  // while empty, the reservation UPDATE of each settlement combines the primary key with
  // the partial index of open reservations and costs O(open reservations): about 3x
  // slower at N = 200; autovacuum's next ANALYZE ends it.)
  await db.exec(`INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model, state, settled_cost)
    SELECT 'h-' || g, 1, (SELECT min(id) FROM tenants), (SELECT min(id) FROM api_keys), 0.0002, 'mock-gpt', 'reconciled', 0.00005
    FROM generate_series(1, 100000) g`);
  // (Since sql/0006 the usage row is its own dedup: billing_dedup is a view over it.)
  await db.exec(`INSERT INTO usage (request_id, tenant_id, api_key_id, model, cost, fingerprint)
    SELECT 'h-' || g, (SELECT min(id) FROM tenants), (SELECT min(id) FROM api_keys), 'mock-gpt', 0.00005, md5(g::text)
    FROM generate_series(1, 100000) g`);
  let runNo = 0;
  for (const v of variants) {
    await setDurable(db.conninfo, v.durable);
    for (const n of BATCHES) {
      runNo++;
      // The tables keep what earlier cells wrote (as a live database does), with fresh
      // statistics; a new block sequence per run.
      await db.exec('DROP SEQUENCE IF EXISTS bench_blk; CREATE SEQUENCE bench_blk');
      await db.exec('VACUUM ANALYZE');
      await db.exec('CHECKPOINT');
      const before = { usage: Number(await db.scalar('SELECT count(*) FROM usage')),
        reconciled: Number(await db.scalar("SELECT count(*) FROM reservations WHERE state = 'reconciled'")) };
      const calls0 = Number(await db.scalar("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'tg_settle_batch'"));
      const r = await run('pgbench', ['-n', '-f', scripts[v.reserve], '-c', String(CLIENTS), '-j', '2', '-T', String(SETTLE_SECONDS),
        '-D', `n=${n}`, '-D', `nt=${v.nt}`, '-D', `run=${runNo}`, '-D', `gid=${gid}`, '-D', `aid=${aid}`, db.conninfo]);
      const tps = Number(/tps = ([\d.]+)/.exec(r.stdout)?.[1]);
      const lat = Number(/latency average = ([\d.]+) ms/.exec(r.stdout)?.[1]);
      const failed = Number(/number of failed transactions: (\d+)/.exec(r.stdout)?.[1] ?? 0);
      const settled = Number(await db.scalar('SELECT count(*) FROM usage')) - before.usage;
      const reconciled = v.reserve ? Number(await db.scalar("SELECT count(*) FROM reservations WHERE state = 'reconciled'")) - before.reconciled : settled;
      const calls = Number(await db.scalar("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'tg_settle_batch'")) - calls0;
      if (!tps) throw new Error(`pgbench gave no tps:\n${r.stdout}\n${r.stderr}`);
      results.push({ ...v, n, tps, perSec: tps * n, lat, failed, settled, reconciled, calls });
      log(`${v.name} N=${n}: ${fmt(tps * n)} settlements/s (${fmt(settled)} settled, ${failed} failed)`);
    }
  }
  await setDurable(db.conninfo, false);
  await db.drop();
  await mock.stop();

  print('### A. tg_settle_batch from pgbench (4 connections)');
  print();
  print(`Each connection loops (${SETTLE_SECONDS} s per cell) on one \`tg_settle_batch\` transaction carrying what N requests give the`);
  print("gateway's batcher: N reservation elements (`op: reserve`, the `reserved` rows) and the N settlements of the same");
  print('requests (dedup row, balance and key spend, usage row, ledger row, reservation reconciled). The last column sends');
  print('only the N settlements. Cells: requests settled per second (time of one transaction). "test Postgres" is how');
  print('spec/run.sh runs it (fsync and synchronous_commit off); "durable" has both on.');
  print();
  print(`| N per batch | ${variants.map((v) => v.name).join(' | ')} |`);
  print(`|---:|${variants.map(() => '---:').join('|')}|`);
  for (const n of BATCHES) {
    const cells = variants.map((v) => {
      const x = results.find((r) => r.name === v.name && r.n === n);
      return `${fmt(x.perSec)}/s (${x.lat.toFixed(2)} ms per batch${x.failed ? `, ${x.failed} failed` : ''})`;
    });
    print(`| ${n} | ${cells.join(' | ')} |`);
  }
  print();
  const checks = results.filter((r) => r.settled !== r.reconciled);
  print(checks.length ? `**Check failed**: settled != reconciled in ${checks.map((r) => `${r.name} N=${r.n}`).join(', ')}`
    : 'Check: in every cell each settled request reconciled its reservation (usage rows = reconciled reservations).');
  print();
  return results;
}

// ---- B and C. Through the gateway -------------------------------------------------------

function wrk(gw, key, seconds, conns = 64) {
  return run('wrk', ['-t2', `-c${conns}`, `-d${seconds}s`, '--latency', '-s', path.join(HERE, 'billing_bench.lua'), `${gw.url}/v1/chat/completions`],
    { env: { TG_BENCH_KEY: key } });
}

function parseWrk(s) {
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(s)?.[1]);
  const total = Number(/(\d+) requests in/.exec(s)?.[1]);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(s)?.[1] ?? 0);
  const errs = /Socket errors: (.*)/.exec(s)?.[1] ?? '';
  const unit = (v, u) => Number(v) * ({ us: 0.001, ms: 1, s: 1000 }[u]);
  const pct = (p) => {
    const m = new RegExp(`\\s${p}%\\s+([\\d.]+)(us|ms|s)`).exec(s);
    return m ? unit(m[1], m[2]) : NaN;
  };
  return { rps, total, non2xx, errs, p50: pct(50), p99: pct(99) };
}

async function e2eRun(bill, mock, name, gwOverrides = {}) {
  const billed = gwOverrides.billing?.enabled !== false;
  const gw = await startBilledGateway(bill, { ...GW, ...gwOverrides }, { mock });
  const usage = async () => Number(await bill.db.scalar('SELECT count(*) FROM usage'));
  const calls = async () => Number(await bill.db.scalar("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'tg_settle_batch'"));
  /** Waits until `want` usage rows exist (at most `ms`); resolves with whether they do. */
  const drained = async (want, ms) => {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline) {
      if ((await usage()) >= want) return true;
      await sleep(250);
    }
    return (await usage()) >= want;
  };
  const rows0 = await usage();
  const warm = parseWrk((await wrk(gw, bill.key, 2)).stdout);
  if (billed) await drained(rows0 + warm.total - warm.non2xx, 120000);
  const u0 = await usage();
  const c0 = await calls();
  const t0 = Date.now();
  const wrkRun = wrk(gw, bill.key, WRK_SECONDS);
  // Usage rows written during the steady part of the run (after 1 s, before the end).
  await sleep(1000);
  const t1 = Date.now();
  const u1 = await usage();
  await sleep((WRK_SECONDS - 2) * 1000);
  const u2 = await usage();
  const t2 = Date.now();
  const w = parseWrk((await wrkRun).stdout);
  const ok = w.total - w.non2xx;
  const atEnd = (await usage()) - u0;
  const tEnd = Date.now();
  // Then every answered request must get its row: wait (at most 3 minutes) and time it.
  const done = billed ? await drained(u0 + ok, 180000) : true;
  const tDrained = Date.now();
  const rows = (await usage()) - u0;
  const batches = (await calls()) - c0;
  const spooled = gw.proc.lines.stderr.filter((l) => /spooled/.test(l)).length;
  const conflicts = gw.proc.lines.stderr.filter((l) => /CONFLICT/.test(l)).length;
  await gw.stop();
  const v = await ledger(bill, 'verify');
  const r = {
    name, off: !billed, wrk: w, ok, rowsPerSec: ((u2 - u1) * 1000) / (t2 - t1), backlog: ok - atEnd,
    drainS: (tDrained - tEnd) / 1000, done, sustained: (rows * 1000) / (tDrained - t0), rows, batches, spooled, conflicts,
    verify: v.code, verifyOut: v.stdout,
  };
  log(`e2e ${name}${billed ? '' : ' (billing off)'}: ${fmt(w.rps)} req/s, ${fmt(r.rowsPerSec)} usage rows/s under load, ` +
    `backlog ${fmt(r.backlog)}, drained in ${r.drainS.toFixed(1)} s`);
  return r;
}

/** tg_loadgen open loop at `rate` against gw; resolves with its key=value output. */
async function openLoop(gw, key, rate, seconds, body) {
  const r = await run(LOADGEN, ['rate', `127.0.0.1:${gw.port}`, '--rate', String(rate), '--conns', '32',
    '--duration', String(seconds), '--warmup', '1', '--body', body, '--auth', key]);
  return Object.fromEntries(r.stdout.trim().split(/\s+/).map((x) => x.split('=')));
}

async function benchGateway() {
  const mock = await startMock();
  const bill = await billedSetup({ mock, balance: '1000000' });
  const budgeted = await billedSetup({ mock, balance: '1000000', keyBudget: '1000000' });

  // B. usage rows per second.
  const rows = [];
  await setDurable(bill.conninfo, false);
  rows.push(await e2eRun(bill, mock, 'test Postgres, key without budget', { billing: { enabled: false } }));
  rows[0].off = true;
  rows.push(await e2eRun(bill, mock, 'test Postgres, key without budget'));
  rows.push(await e2eRun(budgeted, mock, 'test Postgres, key with a budget'));
  await setDurable(bill.conninfo, true);
  rows.push(await e2eRun(bill, mock, 'durable Postgres, key without budget'));
  rows.push(await e2eRun(budgeted, mock, 'durable Postgres, key with a budget'));
  await setDurable(bill.conninfo, false);

  print('### B. End to end: usage rows written per second through the gateway');
  print();
  print(`wrk -t2 -c64 -d${WRK_SECONDS}s, non-stream requests with a billed key (each: a hold in Redis, then one reservation`);
  print('element and one settlement through the batcher); gateway with 2 workers, access log off; mock, Postgres, Redis and');
  print('wrk on the same 2 cores. After wrk the gateway keeps running until every answered request has its usage row (at');
  print('most 3 minutes). The first row is the same gateway with `billing = { enabled = false }`.');
  print();
  print('| gateway | requests/s (wrk) | p50 / p99 (wrk) | usage rows/s under load | not yet settled when wrk ended | drained after | settled per second, load + drain | settlements per call | spooled / conflicts | ledger verify |');
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---|');
  for (const r of rows) {
    if (r.off) {
      print(`| billing off | ${fmt(r.wrk.rps)} | ${r.wrk.p50.toFixed(1)} / ${r.wrk.p99.toFixed(1)} ms | - | - | - | - | - | - | - |`);
      continue;
    }
    print(`| ${r.name} | ${fmt(r.wrk.rps)} | ${r.wrk.p50.toFixed(1)} / ${r.wrk.p99.toFixed(1)} ms | ${fmt(r.rowsPerSec)} | ` +
      `${fmt(r.backlog)} of ${fmt(r.ok)} | ${r.done ? `${r.drainS.toFixed(1)} s` : `not within 180 s (${fmt(r.rows)} rows)`} | ` +
      `${fmt(r.sustained)} | ${(r.rows / Math.max(1, r.batches)).toFixed(1)} | ${r.spooled} / ${r.conflicts} | ${r.verify === 0 ? 'exit 0' : `exit ${r.verify}`} |`);
  }
  print();
  for (const r of rows) {
    if (r.verify !== 0 && !r.off) print(`ledger verify (${r.name}) output:\n\n\`\`\`\n${r.verifyOut.split('\n').slice(0, 14).join('\n')}\n\`\`\`\n`);
    if (r.wrk.non2xx || r.wrk.errs) print(`wrk (${r.name}${r.off ? ', billing off' : ''}): ${r.wrk.non2xx} non-2xx, socket errors: ${r.wrk.errs || 'none'}`);
  }
  print();

  const body = fs.readFileSync(path.join(HERE, 'billing_bench.lua'), 'utf8').match(/wrk\.body = '(.*)'/)[1];

  // E. Sustained: a fixed rate, durable Postgres; does settlement keep up?
  await setDurable(bill.conninfo, true);
  const sus = [];
  for (const rate of SUSTAIN_RATES) {
    const gw = await startBilledGateway(bill, GW, { mock });
    const usage = async () => Number(await bill.db.scalar('SELECT count(*) FROM usage'));
    const u0 = await usage();
    const samples = [];
    let running = true;
    const sampler = (async () => {
      while (running) {
        samples.push([Date.now(), await usage()]);
        await sleep(500);
      }
    })();
    const t0 = Date.now();
    const kv = await openLoop(gw, bill.key, rate, SUSTAIN_SECONDS, body);
    running = false;
    await sampler;
    const tEnd = Date.now();
    const atEnd = await usage();
    // Steady window: from 2 s after the start (after the 1 s warm-up) to the end.
    const win = samples.filter(([t]) => t >= t0 + 2000);
    const rowsPerSec = win.length > 1 ? ((win.at(-1)[1] - win[0][1]) * 1000) / (win.at(-1)[0] - win[0][0]) : NaN;
    let last = atEnd;
    let tLast = Date.now();
    for (let same = 0, i = 0; same < 8 && i < 480; i++) {
      await sleep(250);
      const n = await usage();
      if (n === last) same++;
      else {
        same = 0;
        last = n;
        tLast = Date.now();
      }
    }
    const spooled = gw.proc.lines.stderr.filter((l) => /spooled/.test(l)).length;
    await gw.stop();
    const r = { rate, kv, rowsPerSec, backlog: last - atEnd, drainS: Math.max(0, (tLast - tEnd) / 1000), rows: last - u0, spooled };
    sus.push(r);
    log(`sustained ${rate}/s: ${fmt(Number(kv.measured_rate))}/s answered, ${fmt(rowsPerSec)} usage rows/s, backlog ${fmt(r.backlog)}`);
  }
  await setDurable(bill.conninfo, false);
  const vE = await ledger(bill, 'verify');
  print('### E. Sustained end to end at a fixed rate (durable Postgres)');
  print();
  print(`tg_loadgen open loop, 32 connections, ${SUSTAIN_SECONDS} s (1 s warm-up) per rate, a fresh gateway (2 workers) each; usage rows counted`);
  print('every 0.5 s. "usage rows/s" is over the steady part (from 2 s to the end); "backlog" is what was still queued when the');
  print('load stopped, "drained after" how long it then took.');
  print();
  print('| target rate | answered/s | service p50 / p99 | usage rows/s | backlog at the end | drained after | usage rows (all) | spooled |');
  print('|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of sus) {
    print(`| ${fmt(r.rate)}/s | ${fmt(Number(r.kv.measured_rate))}/s | ${ms(r.kv.svc_p50_us)} / ${ms(r.kv.svc_p99_us)} ms | ` +
      `${fmt(r.rowsPerSec)} | ${fmt(r.backlog)} | ${r.drainS.toFixed(1)} s | ${fmt(r.rows)} | ${r.spooled} |`);
  }
  print();
  print(`\`ledger verify\` after these runs: exit ${vE.code}.`);
  print();

  // C. billing on vs off, same database, same mock, side by side; open loop.
  const on = await startBilledGateway(bill, GW, { mock });
  const off = await startBilledGateway(bill, { ...GW, billing: { enabled: false } }, { mock });
  const lat = {};
  const latency = async (rate) => {
    lat[rate] = { on: [], off: [] };
    for (let round = 0; round < LAT_ROUNDS; round++) {
      for (const [name, gw] of [['on', on], ['off', off]]) {
        const kv = await openLoop(gw, bill.key, rate, LAT_SECONDS, body);
        lat[rate][name].push(kv);
        log(`latency ${rate}/s ${name} round ${round + 1}: p50 ${ms(kv.cor_p50_us)} ms p99 ${ms(kv.cor_p99_us)} ms`);
      }
    }
  };
  await latency(LAT_RATES[0]);

  // D. Settlement is off the response path: the same open loop while every settlement
  // is stalled (the usage table locked for 4.5 s, under postgres_timeout_ms).
  const stalledUsage0 = Number(await bill.db.scalar('SELECT count(*) FROM usage'));
  const normal = await openLoop(on, bill.key, LAT_RATES[0], 4, body);
  const locker = run('psql', ['-X', '-q', '-d', bill.conninfo, '-c', 'BEGIN; LOCK TABLE usage IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4.5); COMMIT;']);
  await sleep(200);
  const stalled = await openLoop(on, bill.key, LAT_RATES[0], 4, body);
  await locker;
  await sleep(3000);
  const stalledRows = Number(await bill.db.scalar('SELECT count(*) FROM usage')) - stalledUsage0;
  const spooledD = on.proc.lines.stderr.filter((l) => /spooled/.test(l)).length;
  await sleep(2500);
  const stalledRows2 = Number(await bill.db.scalar('SELECT count(*) FROM usage')) - stalledUsage0;

  for (const rate of LAT_RATES.slice(1)) await latency(rate);
  // Let the settlements of the open-loop runs land before stopping (usage rows stable
  // for 3 s, at most 2 minutes), so that ledger verify sees a drained ledger.
  for (let last = -1, same = 0, i = 0; same < 12 && i < 480; i++) {
    const n = Number(await bill.db.scalar('SELECT count(*) FROM usage'));
    same = n === last ? same + 1 : 0;
    last = n;
    await sleep(250);
  }
  await on.stop();
  await off.stop();
  const v = await ledger(bill, 'verify');

  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  print('### C. What billing adds to the client\'s latency');
  print();
  print(`Open loop (tg_loadgen), 32 connections, ${LAT_SECONDS} s per round, ${LAT_ROUNDS} round(s) alternating between a gateway with billing on`);
  print('and one with `billing = { enabled = false }` (same database, Redis, mock and key; median over rounds). "service" is');
  print('from the request\'s first byte written to its response\'s last byte read; "corrected" from when the request was due');
  print('(it adds any wait for a free connection, and tg_loadgen\'s own pacing lag, about 5 ms at 200/s, to both gateways).');
  print();
  print('| rate | gateway | service p50 | p90 | p99 | p99.9 | corrected p50 | corrected p99 | completed (rate) | errors / non-2xx |');
  print('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const rate of LAT_RATES) {
    const q = (name, k) => median(lat[rate][name].map((x) => Number(x[k])));
    for (const name of ['off', 'on']) {
      const errs = lat[rate][name].reduce((sum, x) => sum + Number(x.errors) + Number(x.non2xx), 0);
      print(`| ${rate}/s | billing ${name} | ${ms(q(name, 'svc_p50_us'))} ms | ${ms(q(name, 'svc_p90_us'))} ms | ${ms(q(name, 'svc_p99_us'))} ms | ` +
        `${ms(q(name, 'svc_p999_us'))} ms | ${ms(q(name, 'cor_p50_us'))} ms | ${ms(q(name, 'cor_p99_us'))} ms | ` +
        `${fmt(q(name, 'completed'))} (${fmt(q(name, 'measured_rate'))}/s) | ${errs} |`);
    }
    const ratio = (k) => {
      const a = q('on', k);
      const b = q('off', k);
      if (!Number.isFinite(a) || !Number.isFinite(b)) return 'n/a';
      return `${(a / b).toFixed(2)}x (${a >= b ? '+' : ''}${((a - b) / 1000).toFixed(2)} ms)`;
    };
    print(`| ${rate}/s | on / off | ${ratio('svc_p50_us')} | ${ratio('svc_p90_us')} | ${ratio('svc_p99_us')} | ${ratio('svc_p999_us')} | ` +
      `${ratio('cor_p50_us')} | ${ratio('cor_p99_us')} | | |`);
  }
  print();
  print('### D. Settlement is off the response path');
  print();
  print(`The billing-on gateway at ${LAT_RATES[0]} req/s (open loop, 4 s), normally and while every settlement is stalled in Postgres`);
  print('(the usage table locked for 4.5 s from another session; reservations still go through).');
  print();
  print('| settlements | service p50 | p99 | p99.9 | corrected p50 | corrected p99 | completed | errors / non-2xx |');
  print('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const [name, kv] of [['flowing', normal], ['stalled', stalled]]) {
    print(`| ${name} | ${ms(kv.svc_p50_us)} ms | ${ms(kv.svc_p99_us)} ms | ${ms(kv.svc_p999_us)} ms | ${ms(kv.cor_p50_us)} ms | ${ms(kv.cor_p99_us)} ms | ` +
      `${kv.completed} | ${Number(kv.errors) + Number(kv.non2xx)} |`);
  }
  print();
  print(`After the lock: ${stalledRows} usage rows 3 s later, ${stalledRows2} after 5.5 s (requests sent: ${Number(normal.completed) + Number(stalled.completed)} measured + warm-up); ` +
    `settlement batches spooled meanwhile: ${spooledD}. \`ledger verify\` after everything: exit ${v.code}.`);
  print();
  await bill.db.drop();
  await budgeted.db.drop();
}

try {
  const t0 = Date.now();
  print(`## Billing benchmark (${new Date().toISOString().slice(0, 16)}Z${QUICK ? ', --quick' : ''})`);
  print();
  const cpu = fs.readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*: (.*)/)?.[1] ?? '?';
  print(`Machine: ${fs.readFileSync('/proc/cpuinfo', 'utf8').split('\n').filter((l) => l.startsWith('processor')).length} × ${cpu}; everything below shares it. ` +
    `Load average at the start: ${fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')} (other work on the box competes for the CPU).`);
  print();
  await benchSettle();
  await benchGateway();
  print(`Load average at the end: ${fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}; run took ${Math.round((Date.now() - t0) / 1000)} s.`);
  log(`done in ${Math.round((Date.now() - t0) / 1000)} s`);
} finally {
  await stopAll();
}
