// The chaos run (spec/chaos/run.sh starts it; see there for the knobs). Three gateway
// instances share one private Postgres and one private Redis and serve a mixed load
// (streams and not, Messages, retries onto a second account, refusals by the key's
// concurrency limit and by a small balance, clients that leave mid-stream) while a
// schedule kills an instance with SIGKILL and restarts it, restarts Redis (empty: it
// keeps no data) and Postgres, and has the mock answer 429, 5xx, resets and hangs.
//
// At the end every instance is running again, the load stops, the reconciler gets its
// chance (README, Billing: a pass every reconcile_after_ms; `tollgate ledger reconcile`
// once every instance has stopped), and the run fails unless `tollgate ledger verify`
// is clean and every bound of the README holds:
//   money (closed when Redis is down): no tenant's balance below zero, no key over its
//     budget — the over-spend is 0;
//   concurrency C of the key, N instances, limiter.on_redis_down_concurrency = local:
//     at most (N + 2)·C of its requests at the upstream at once (Limits table);
//   every spool drained (depth 0) once Postgres is back.
// It prints the figures as one block (requests, admitted, refused, billed, estimated,
// pending, over-admission against the bounds, spool depth).
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { HOST, REPO, TG_BIN, sleep, startGateway, startMock, stopAll, tempDir, toLua, waitFor } from '../integration/lib/harness.mjs';
import { SECRET_KEY, applyState, offsetIds, plainKey, psql, redisCli, startRedis, tool } from '../integration/lib/db.mjs';
import { startPrivatePg } from '../integration/lib/billing.mjs';

const SECONDS = Number(process.env.TG_CHAOS_SECONDS || 60);
const N = 3; // instances
const C = 4; // the busy key's concurrency limit
const CLIENTS = Number(process.env.TG_CHAOS_CLIENTS || 24);
const MODEL = 'mock-gpt';
const ADMIN_TOKEN = 'adm-chaos';
const log = (...a) => console.log(`[${((Date.now() - T0) / 1000).toFixed(1).padStart(6)}s]`, ...a);
const T0 = Date.now();

const figures = {
  requests: 0, ok: 0, refused_limit: 0, refused_balance: 0, refused_budget: 0, unavailable: 0, upstream_errors: 0,
  client_aborts: 0, network_errors: 0, other: {}, unavailable_by: {}, upstream_by: {},
};
const events = [];
const allProcs = []; // every gateway process started, the killed ones too (their logs)

function count(status, code) {
  figures.requests++;
  if (status === 200) figures.ok++;
  else if (status === 429 && /concurrency|rate|tokens|limit/.test(code || '')) figures.refused_limit++;
  else if (status === 402 && code === 'budget_exceeded') figures.refused_budget++;
  else if (status === 402) figures.refused_balance++;
  else if (status === 503 && /_unavailable$/.test(code || '')) {
    figures.unavailable++;
    figures.unavailable_by[code] = (figures.unavailable_by[code] || 0) + 1;
  }
  else if (status >= 429) {
    figures.upstream_errors++;
    const k = `${status} ${code}`;
    figures.upstream_by[k] = (figures.upstream_by[k] || 0) + 1;
  }
  else figures.other[status] = (figures.other[status] || 0) + 1;
}

// ---- setup --------------------------------------------------------------------------

const pg = await startPrivatePg();
const redis = await startRedis();
const mock = await startMock();
const db = { conninfo: pg.conninfo };
const q = async (sql) => (await psql(db.conninfo, sql)).trim();

let exitCode = 1;
const gws = [];
try {
  const m = await tool(['migrate'], { db, redis: redis.url });
  if (m.code !== 0) throw new Error(`migrate: ${m.stderr}`);
  await offsetIds(db);
  const keyA = plainKey('chaosA');
  const keyB = plainKey('chaosB');
  const keyB2 = plainKey('chaosB2');
  await applyState(db, {
    tenants: [{ name: 'rich', balance: '1000' }, { name: 'poor', balance: '0.003' }],
    groups: [{ name: 'ga', models: [], rate_multiplier: 1 }, { name: 'gb', models: [], rate_multiplier: 1 }],
    accounts: [
      { name: 'a1', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-chaos-a1', concurrency: 1000, groups: ['ga'] },
      { name: 'a2', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-chaos-a2', concurrency: 1000, groups: ['ga'] },
      { name: 'b1', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-chaos-b1', concurrency: 1000, groups: ['gb'] },
    ],
    keys: [
      { name: 'busy', tenant: 'rich', group: 'ga', key: keyA, concurrency: C, rpm: 1000000 },
      { name: 'thin', tenant: 'poor', group: 'gb', key: keyB },
      { name: 'capped', tenant: 'poor', group: 'gb', key: keyB2, budget: '0.0005' },
    ],
    prices: [{ model: MODEL, input: '1.00', output: '2.00' }],
  }, { redis: redis.url });

  const env = { TOLLGATE_PG: db.conninfo, TOLLGATE_REDIS: redis.url, TOLLGATE_SECRET_KEY: SECRET_KEY, TOLLGATE_ADMIN_TOKEN: ADMIN_TOKEN };
  const spools = Array.from({ length: N }, () => tempDir('spool'));
  const cfg = (i) => ({
    workers: 1,
    access_log: false,
    upstream: { first_byte_timeout_ms: 2000, idle_timeout_ms: 2000, connect_timeout_ms: 1000 },
    limiter: { queue_max: 4, queue_timeout_ms: 300 },
    billing: { spool_dir: spools[i], reconcile_after_ms: 2000, unknown_usage: 'charge' },
    routing: { max_attempts: 2 },
  });
  const start = async (i) => {
    gws[i] = await startGateway(cfg(i), { mock, env });
    allProcs.push({ i, proc: gws[i].proc });
    log(`instance ${i} up on :${gws[i].port} (pid ${gws[i].proc.pid})`);
  };
  for (let i = 0; i < N; i++) await start(i);
  // The account pool is loaded a moment after /healthz.
  await sleep(1500);

  // ---- the load ----------------------------------------------------------------------

  const live = () => gws.filter((g) => g && g.proc.running);
  const pick = () => {
    const l = live();
    return l[Math.floor(Math.random() * l.length)];
  };
  let stop = false;
  const deadline = Date.now() + SECONDS * 1000;

  function send(gw, p, key, body, { abortAfterChunks, timeout = 15000 } = {}) {
    const data = Buffer.from(JSON.stringify(body));
    return new Promise((resolve) => {
      let chunks = 0;
      let done = false;
      const finish = (status, code) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve({ status, code });
      };
      const req = http.request(`${gw.url}${p}`, {
        method: 'POST', agent: false,
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': data.length },
      }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (s) => {
          if (text.length < 4096) text += s;
          if (abortAfterChunks && res.statusCode === 200 && (chunks += (s.match(/"content"/g) || []).length) >= abortAfterChunks) {
            figures.client_aborts++;
            req.destroy();
            finish(200, 'client_abort');
          }
        });
        res.on('end', () => {
          let code;
          try {
            code = JSON.parse(text).error?.code ?? JSON.parse(text).error?.type;
          } catch { /* a stream or a non-JSON body */ }
          finish(res.statusCode, code);
        });
        res.on('error', () => finish(res.statusCode, 'reset'));
        res.on('close', () => finish(res.statusCode, 'closed'));
      });
      const timer = setTimeout(() => req.destroy(new Error('timeout')), timeout);
      req.on('error', () => {
        if (done) return;
        figures.network_errors++;
        finish(0, 'network');
      });
      req.end(data);
    });
  }

  const chat = (text, extra = {}) => ({ model: MODEL, max_tokens: 16, messages: [{ role: 'user', content: text }], ...extra });
  async function client(n) {
    while (!stop && Date.now() < deadline) {
      const gw = pick();
      if (!gw) {
        await sleep(50);
        continue;
      }
      const r = Math.random();
      let out;
      if (r < 0.30) out = await send(gw, '/v1/chat/completions', keyA, chat(`c${n} [mock chunks=6 delay_ms=30]`));
      else if (r < 0.55) out = await send(gw, '/v1/chat/completions', keyA, chat(`s${n} [mock chunks=8 interval_ms=25]`, { stream: true }));
      else if (r < 0.65) out = await send(gw, '/v1/chat/completions', keyA, chat(`a${n} [mock chunks=12 interval_ms=25]`, { stream: true }), { abortAfterChunks: 3 });
      else if (r < 0.75) out = await send(gw, '/v1/messages', keyA, chat(`m${n} [mock chunks=5]`));
      else if (r < 0.80) out = await send(gw, '/v1/chat/completions', keyA, chat(`r${n} [mock chunks=10 interval_ms=20 close_after=3]`, { stream: true }));
      else if (r < 0.81) out = await send(gw, '/v1/chat/completions', keyA, chat(`e${n} [mock status=503]`));
      else out = await send(gw, '/v1/chat/completions', r < 0.92 ? keyB : keyB2, chat(`b${n} [mock chunks=4]`));
      count(out.status, out.code);
      if (out.status !== 200) await sleep(50);
    }
  }

  // Concurrency at the upstream of the busy key: its two credentials, sampled.
  let maxInflightA = 0;
  const sampler = (async () => {
    while (!stop) {
      try {
        const s = await mock.stats();
        const c = s.credentials || {};
        const v = (c['sk-chaos-a1']?.inflight || 0) + (c['sk-chaos-a2']?.inflight || 0);
        if (v > maxInflightA) maxInflightA = v;
      } catch { /* mock busy */ }
      await sleep(25);
    }
  })();

  // ---- the schedule ------------------------------------------------------------------

  const fault = async (body) => {
    const r = await fetch(`${mock.url}/_mock/faults`, { method: 'POST', body: JSON.stringify(body) });
    await r.arrayBuffer();
  };
  const T0load = Date.now();
  // One cycle of six events per 30-120 s of load (the whole run when shorter).
  const cycle = Math.max(30, Math.min(SECONDS, 120)) * 1000;
  const steps = [];
  for (let base = 0; base + cycle <= SECONDS * 1000; base += cycle) {
    const s = (f) => base + f * cycle;
    steps.push(
      [s(0.10), 'kill -9 instance 0, restart after 2 s', async () => {
        gws[0].proc.signal('SIGKILL');
        await gws[0].proc.exited;
        await sleep(2000);
        await start(0);
      }],
      [s(0.25), 'mock: 429 for 20 requests on a1, 5xx for 20 on a2', async () => {
        await fault({ credential: 'sk-chaos-a1', count: 20, status: 429, retry_after: 1 });
        await fault({ credential: 'sk-chaos-a2', count: 20, status: 500 });
      }],
      [s(0.35), 'restart Redis (comes back empty)', async () => {
        await redis.restart();
      }],
      [s(0.50), 'mock: resets (close_after=1) for 15 requests, hangs for 6', async () => {
        await fault({ credential: 'sk-chaos-a1', count: 15, close_after: 1, chunks: 6, interval_ms: 20 });
        await fault({ credential: 'sk-chaos-a2', count: 6, hang: 1 });
      }],
      [s(0.60), 'restart Postgres (stopped for 3 s)', async () => {
        await pg.stop();
        await sleep(3000);
        await pg.start();
      }],
      [s(0.75), 'kill -9 instance 1 and 2, restart after 1 s', async () => {
        for (const i of [1, 2]) gws[i].proc.signal('SIGKILL');
        await Promise.all([1, 2].map((i) => gws[i].proc.exited));
        await sleep(1000);
        await start(1);
        await start(2);
      }],
    );
  }
  const schedule = (async () => {
    for (const [when, what, fn] of steps) {
      const wait = T0load + when - Date.now();
      if (wait > 0) await sleep(wait);
      if (stop) break;
      log(`chaos: ${what}`);
      events.push(what);
      try {
        await fn();
      } catch (e) {
        log(`chaos step failed: ${e.message}`);
        throw e;
      }
    }
  })();

  log(`load: ${CLIENTS} clients for ${SECONDS} s on ${N} instances`);
  await Promise.all([...Array.from({ length: CLIENTS }, (_, i) => client(i)), schedule]);
  stop = true;
  await sampler;
  await fetch(`${mock.url}/_mock/faults`, { method: 'DELETE' }).then((r) => r.arrayBuffer());
  log(`load done: ${figures.requests} requests`);

  // ---- the end: every instance up, settlements landed, the reconciler's pass --------

  for (let i = 0; i < N; i++) if (!gws[i].proc.running) await start(i);
  const spoolDepth = () => spools.reduce((a, d) => a + fs.readdirSync(d).reduce((b, f) => {
    const p = path.join(d, f);
    return b + fs.readFileSync(p, 'utf8').split('\n').filter(Boolean).length;
  }, 0), 0);
  const spoolAtEnd = spoolDepth();
  const pendingAtEnd = Number(await q("SELECT count(*) FROM reservations WHERE state = 'pending_reconciliation'"));
  const reservedAtEnd = Number(await q("SELECT count(*) FROM reservations WHERE state = 'reserved'"));
  log('end: every instance up; draining the spools, then the reconciler');
  await waitFor(() => spoolDepth() === 0, { timeout: 20000, interval: 250, what: 'the spools to drain' }).catch(() => {});
  // The running instances' reconciler (reconcile_after_ms 2 s) settles what the killed
  // ones left once their heartbeat (15 s) has expired: their open rows, and their holds
  // that no row describes (README, Billing: holds without a row; only a running
  // gateway's reconciler finds those, `tollgate ledger reconcile` settles rows).
  const tenantIds = (await q('SELECT string_agg(id::text, \' \') FROM tenants')).split(' ').filter(Boolean);
  const holdsLeft = async () => {
    let n = 0;
    for (const t of tenantIds) n += Number(await redisCli(redis.url, 'HLEN', `{t:${t}}:holds`));
    return n;
  };
  await waitFor(async () => Number(await q("SELECT count(*) FROM reservations WHERE state IN ('reserved', 'pending_reconciliation')")) === 0 &&
    (await holdsLeft()) === 0,
  { timeout: 30000, interval: 500, what: 'open reservations and holds to be reconciled' }).catch(() => {});
  log('end: stopping the instances');
  for (const g of gws) await g.stop(10000);
  const cfgFile = path.join(tempDir('cfg'), 'tollgate.lua');
  fs.writeFileSync(cfgFile, `return ${toLua({ upstream: { url: `http://${HOST}:9/v1` }, billing: { unknown_usage: 'charge' } })}\n`);
  const ledger = (sub, args = []) => new Promise((resolve) => execFile(TG_BIN, ['ledger', sub, '-c', cfgFile, ...args],
    { env: { ...process.env, ...env }, timeout: 60000 }, (err, stdout, stderr) => resolve({ code: err ? err.code ?? 1 : 0, out: stdout + stderr })));
  let verify;
  for (let i = 0; i < 20; i++) {
    await ledger('reconcile', ['--older-than-ms', '0']);
    verify = await ledger('verify');
    if (verify.code === 0) break;
    log('end: ledger verify not clean yet, reconciling again');
    await sleep(2000);
  }

  // ---- figures and bounds -----------------------------------------------------------

  const money = await q(`SELECT string_agg(name || '=' || balance::text, ' ') FROM tenants`);
  const negative = Number(await q('SELECT count(*) FROM tenants WHERE balance < 0'));
  const overBudget = Number(await q('SELECT count(*) FROM api_keys WHERE budget IS NOT NULL AND spend > budget'));
  const overspend = await q('SELECT coalesce(sum(-balance), 0)::text FROM tenants WHERE balance < 0');
  const billed = Number(await q('SELECT count(*) FROM usage'));
  const estimated = Number(await q('SELECT count(*) FROM usage WHERE estimated'));
  const byState = await q("SELECT string_agg(state || '=' || n, ' ') FROM (SELECT state, count(*) n FROM reservations GROUP BY 1 ORDER BY 1) s");
  const spoolFinal = spoolDepth();
  const concBound = (N + 2) * C;
  const admitted = figures.ok + figures.upstream_errors;
  const problems = [];
  if (verify.code !== 0) problems.push(`ledger verify is not clean:\n${verify.out}`);
  if (negative) problems.push(`${negative} tenant(s) below zero (over-spend ${overspend} USD; bound 0)`);
  if (overBudget) problems.push(`${overBudget} key(s) over budget (bound 0)`);
  if (maxInflightA > concBound) problems.push(`busy key: ${maxInflightA} at the upstream at once, bound (N+2)·C = ${concBound}`);
  if (spoolFinal !== 0) problems.push(`spool depth ${spoolFinal} after Postgres came back (bound 0)`);
  if (figures.ok === 0) problems.push('no request succeeded');
  if (figures.refused_limit === 0) problems.push('no refusal by the concurrency limit (the load did not reach it)');
  if (figures.refused_balance + figures.refused_budget === 0) problems.push('no refusal by balance or budget (the load did not reach it)');

  // A verify that stays unclean: what a human needs to tell a transient from a loss, kept
  // in a folder that outlives the run (the mismatching tenants' reservation rows and
  // Redis holds, every gateway's log, the killed ones' too).
  async function keepArtefacts(verifyOut) {
    const dir = fs.mkdtempSync(path.join(process.env.TG_CHAOS_ARTEFACTS || '/tmp', 'tollgate-chaos-fail-'));
    const put = (name, text) => fs.writeFileSync(path.join(dir, name), text);
    put('verify.txt', verifyOut);
    put('events.txt', events.join('\n') + '\n');
    const tenants = [...new Set([...verifyOut.matchAll(/tenant_id=(\d+)/g)].map((m) => m[1]))];
    for (const t of tenants) {
      put(`tenant-${t}-reservations.txt`, await q(`SELECT request_id, attempt, state, amount, note, instance, model, created_at, updated_at FROM reservations WHERE tenant_id = ${t} AND (state <> 'reconciled' OR note IS NOT NULL) ORDER BY created_at`).catch((e) => e.message));
      put(`tenant-${t}-reservations-all.txt`, await q(`SELECT * FROM reservations WHERE tenant_id = ${t} ORDER BY created_at`).catch((e) => e.message));
      const r = [];
      for (const args of [['HGETALL', `{t:${t}}:money`], ['HGETALL', `{t:${t}}:holds`], ['--scan', '--pattern', `{t:${t}}:*`]])
        r.push(`> ${args.join(' ')}\n${await redisCli(redis.url, ...args).catch((e) => e.message)}`);
      const resKeys = (await redisCli(redis.url, '--scan', '--pattern', `{t:${t}}:res:*`).catch(() => '')).split('\n').filter(Boolean);
      for (const k of resKeys) r.push(`> GET ${k}: ${await redisCli(redis.url, 'GET', k).catch((e) => e.message)}`);
      put(`tenant-${t}-redis.txt`, r.join('\n') + '\n');
    }
    for (const { i, proc } of allProcs) put(`gateway-${i}-pid${proc.pid}.log`, proc.lines.stderr.join('\n') + '\n' + proc.lines.stdout.join('\n') + '\n');
    console.log(`artefacts of the unclean verify kept in ${dir}`);
  }

  const commit = await new Promise((resolve) => execFile('git', ['-C', REPO, 'rev-parse', '--short', 'HEAD'], (e, o) => resolve(e ? '?' : o.trim())));
  const lines = [
    `chaos run: ${SECONDS} s, ${N} instances, ${CLIENTS} clients, commit ${commit}`,
    `events: ${events.length} (${[...new Set(events)].join('; ')})`,
    `requests ${figures.requests}: ok ${figures.ok}, refused by limit ${figures.refused_limit}, by balance ${figures.refused_balance}, by budget ${figures.refused_budget}, unavailable ${figures.unavailable} ${JSON.stringify(figures.unavailable_by)}, upstream errors ${figures.upstream_errors} ${JSON.stringify(figures.upstream_by)}, network errors ${figures.network_errors}, other ${JSON.stringify(figures.other)}`,
    `admitted ${admitted} (answered 200 or an upstream error), client aborts ${figures.client_aborts}`,
    `billed ${billed} usage rows, estimated ${estimated}; reservations at the end of the load: pending ${pendingAtEnd}, reserved ${reservedAtEnd}; after reconciliation: ${byState}`,
    `over-admission: busy key concurrency max ${maxInflightA} at the upstream vs limit ${C} (bound (N+2)·C = ${concBound}); over-spend ${negative ? overspend : '0'} USD (bound 0); keys over budget ${overBudget} (bound 0)`,
    `spool depth: ${spoolAtEnd} at the end of the load, ${spoolFinal} after the drain (bound 0)`,
    `balances: ${money}`,
    `ledger verify: ${verify.code === 0 ? 'clean' : 'PROBLEMS'}`,
  ];
  console.log(`\n${lines.join('\n')}\n`);
  if (problems.length) {
    console.log(`FAIL:\n- ${problems.join('\n- ')}`);
    for (const g of gws) console.log(g.proc.tail(20));
    if (verify.code !== 0) await keepArtefacts(verify.out);
  } else {
    console.log('PASS: ledger verify clean, every bound held');
    exitCode = 0;
  }
} catch (e) {
  console.log(`FAIL: ${e.stack || e}`);
  for (const g of gws) if (g) console.log(g.proc.tail(20));
} finally {
  await redis.stop().catch(() => {});
  try {
    await stopAll();
  } catch (e) {
    console.log(`stopAll: ${e.message}`);
    exitCode = 1;
  }
  await pg.remove().catch(() => {});
}
process.exit(exitCode);
