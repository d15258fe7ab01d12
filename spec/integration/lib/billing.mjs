// Helpers for the billing integration tests (spec/integration/billing_*.test.mjs): a
// billed deployment (a fresh migrated database with one tenant, group, account on the
// mock upstream, key and prices), a gateway with billing on, the money as the tests
// read it (Postgres rows and the live Redis balance, both as integer nano-USD), the
// `tollgate ledger verify|reconcile` commands, tg_settle_batch called straight through
// psql, a streaming client that can leave mid-stream, and a private Postgres a test
// may stop and start. Builds on harness.mjs and db.mjs; every wait is bounded.
//
//   const mock = await startMock();
//   const bill = await billedSetup({ mock, balance: '10' });
//   const gw = await startBilledGateway(bill, {}, { mock });
//   const r = await chat(gw, bill.key, body);          // db.mjs
//   const row = await usageRow(bill, r.headers['x-request-id']);
//
// Prices are chosen so that costs are easy to check by hand: by default an input token
// costs 1,000 nano-USD (1.00 USD per million) and an output token 2,000 (2.00 USD per
// million). Money is compared as BigInt nano-USD, never as a float.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { ADMIN_TOKEN, HOST, REPO, TG_BIN, startGateway, tempDir, toLua, waitFor } from './harness.mjs';
import {
  SECRET_KEY,
  SUITE_REDIS,
  applyState,
  conninfoWith,
  createDb,
  lit,
  offsetIds,
  plainKey,
  psql,
  redisCli,
} from './db.mjs';

export const MODEL = 'mock-gpt';
/** USD per million tokens: an input token is 1,000 nano-USD, an output token 2,000. */
export const PRICES = { model: MODEL, input: '1.00', output: '2.00' };
export const IN_NANO = 1000n;
export const OUT_NANO = 2000n;
export const CRED = 'sk-billing-account';

// ---- money ------------------------------------------------------------------------------

/** A decimal string ("0.0030000000", "-1.5") as BigInt nano-USD; throws below 1 nano. */
export function toNano(s) {
  const m = /^(-?)(\d*)(?:\.(\d*))?$/.exec(String(s).trim());
  if (!m) throw new Error(`not a decimal: ${s}`);
  const frac = (m[3] || '').padEnd(9, '0');
  if (/[1-9]/.test(frac.slice(9))) throw new Error(`${s} is not a whole number of nano-USD`);
  const v = BigInt(m[2] || '0') * 1_000_000_000n + BigInt(frac.slice(0, 9));
  return m[1] ? -v : v;
}

/** The gateway's reservation bound for a chat body of `bodyBytes` bytes and max_tokens. */
export function reservationFor(bodyBytes, maxTokens, { inNano = IN_NANO, outNano = OUT_NANO } = {}) {
  return (BigInt(Math.floor(bodyBytes / 3)) + 1n) * inNano + BigInt(maxTokens) * outNano;
}

/** The mock's input tokens for a single user message `text` (see core/src/mock/tg_mock.c). */
export function mockInputTokens(text) {
  return Math.max(1, Math.ceil(Buffer.byteLength(text) / 4));
}

/** The cost of `input` and `output` tokens at the default prices. */
export function costOf(input, output) {
  return BigInt(input) * IN_NANO + BigInt(output) * OUT_NANO;
}

// ---- a billed deployment ----------------------------------------------------------------

/**
 * A fresh database (on the suite's Postgres unless `pg` is a conninfo of a server to
 * create it on) with one tenant (`balance` USD), one group (rate_multiplier), the
 * accounts on the mock (by default one, `up`, with credential CRED), one key, and the
 * prices. Resolves with {db, conninfo, redis, key, tenantId, keyId, groupId,
 * accountId (of `up`), cred}.
 */
export async function billedSetup({
  mock,
  balance = '100',
  multiplier = 1,
  prices = [PRICES],
  keyBudget,
  concurrency = 1000,
  pg,
  redis = SUITE_REDIS,
  accounts = [{ name: 'up', credential: CRED, priority: 0 }],
} = {}) {
  const db = pg ? await createDbOn(pg) : await createDb();
  const key = plainKey('bill');
  await applyState(db, {
    tenants: [{ name: 'acme', balance }],
    groups: [{ name: 'g', models: [], rate_multiplier: multiplier }],
    accounts: accounts.map((a) => ({ provider: 'openai', base_url: `${mock.url}/v1`, concurrency, groups: ['g'], ...a })),
    keys: [{ name: 'k', tenant: 'acme', group: 'g', key, budget: keyBudget }],
    prices,
  }, { redis });
  const [ids] = await db.query(`SELECT (SELECT id FROM tenants WHERE name = 'acme') AS tenant_id,
    (SELECT id FROM api_keys WHERE name = 'k') AS key_id, (SELECT id FROM groups WHERE name = 'g') AS group_id,
    (SELECT id FROM accounts WHERE name = 'up') AS account_id`);
  return {
    db,
    conninfo: db.conninfo,
    redis,
    key,
    cred: CRED,
    tenantId: ids.tenant_id,
    keyId: ids.key_id,
    groupId: ids.group_id,
    accountId: ids.account_id,
  };
}

/** createDb() on another server (a private Postgres): same shape, migrated, ids offset. */
async function createDbOn(serverConninfo) {
  const name = `tg_${crypto.randomBytes(6).toString('hex')}`;
  const server = conninfoWith(serverConninfo, { dbname: 'postgres' });
  await psql(server, `CREATE DATABASE ${name}`);
  const conninfo = conninfoWith(serverConninfo, { dbname: name });
  const db = {
    name,
    conninfo,
    exec: (sql) => psql(conninfo, sql),
    async query(sql) {
      const out = await psql(conninfo, `SELECT row_to_json(q)::text FROM (${sql}) q`);
      return out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    },
    async scalar(sql) {
      return (await psql(conninfo, sql)).trim();
    },
    async drop() {
      await psql(server, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    },
  };
  const r = await runTool(['migrate', '-c', toolConfigFile()], { TOLLGATE_PG: conninfo });
  if (r.code !== 0) throw new Error(`migrate failed (${r.code}): ${r.stderr}${r.stdout}`);
  await offsetIds(db);
  return db;
}

/** The `billing` table of a test gateway: its own spool, a 2 s reconcile delay. */
export function billingConfig(spoolDir = tempDir('spool'), extra = {}) {
  return { spool_dir: spoolDir, reconcile_after_ms: 2000, unknown_usage: 'charge', ...extra };
}

/** The environment of a gateway or a command on `bill`'s database and Redis. */
export function billedEnv(bill) {
  return {
    TOLLGATE_PG: bill.conninfo,
    TOLLGATE_REDIS: bill.redis,
    TOLLGATE_SECRET_KEY: SECRET_KEY,
    TOLLGATE_ADMIN_TOKEN: ADMIN_TOKEN,
  };
}

/**
 * harness.startGateway on `bill`'s database and Redis with billing on: two workers, the
 * access log off (these tests read the ledger, not stdout), `billing` = billingConfig()
 * merged with overrides.billing. A restart passes the same spoolDir.
 */
export async function startBilledGateway(bill, overrides = {}, { mock, spoolDir, env = {} } = {}) {
  const { billing, ...rest } = overrides;
  const cfg = { workers: 2, access_log: false, ...rest, billing: { ...billingConfig(spoolDir), ...billing } };
  const gw = await startGateway(cfg, { mock, env: { ...billedEnv(bill), ...env } });
  await accountsLoaded(gw, bill.key);
  return gw;
}

/**
 * Waits until the gateway's workers have loaded the account pool: /healthz answers
 * before they have, and a chat request meanwhile gets 503 accounts_unavailable. GET
 * /v1/models goes through account selection but is never billed, so it is what this
 * polls, on fresh connections (any worker), until 8 in a row are not that 503.
 */
export async function accountsLoaded(gw, key) {
  let streak = 0;
  await waitFor(async () => {
    const r = await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key}`, connection: 'close' } });
    const text = await r.text();
    streak = r.status === 503 && /accounts_unavailable/.test(text) ? 0 : streak + 1;
    return streak >= 8;
  }, { timeout: 10000, interval: 20, what: 'the account pool to be loaded' });
}

// ---- the tollgate commands --------------------------------------------------------------

function toolConfigFile(extra = {}) {
  const p = path.join(tempDir('cfg'), 'tollgate.lua');
  fs.writeFileSync(p, `return ${toLua({ upstream: { url: `http://${HOST}:9/v1` }, ...extra })}\n`);
  return p;
}

function runTool(args, env, timeout = 60000) {
  const childEnv = { ...process.env, TOLLGATE_SECRET_KEY: SECRET_KEY, ...env };
  for (const [k, v] of Object.entries(childEnv)) if (v === null || v === undefined) delete childEnv[k];
  return new Promise((resolve) => {
    execFile(TG_BIN, args, { env: childEnv, timeout, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, signal: err?.signal ?? null, stdout, stderr });
    });
  });
}

/**
 * `tollgate ledger <sub> -c CFG [args]` against bill's database and Redis. Resolves with
 * {code, stdout, stderr}.
 */
export function ledger(bill, sub, args = [], { billing = {} } = {}) {
  const cfg = toolConfigFile({ billing: { unknown_usage: 'charge', ...billing } });
  return runTool(['ledger', sub, '-c', cfg, ...args], billedEnv(bill));
}

/** Asserts-style helper: `ledger verify` output, throwing with it unless it exits 0. */
export async function verifyLedger(bill) {
  const r = await ledger(bill, 'verify');
  if (r.code !== 0) throw new Error(`ledger verify exited ${r.code}:\n${r.stdout}${r.stderr}`);
  return r.stdout;
}

// ---- reading the money ------------------------------------------------------------------

const nanoCol = (expr, as) => `((${expr}) * 1000000000)::bigint::text AS ${as}`;

/** The tenant's balance and spend and the key's spend, as BigInt nano-USD. */
export async function accountsMoney(bill) {
  const [r] = await bill.db.query(`SELECT ${nanoCol('t.balance', 'balance')}, ${nanoCol('t.spend', 'spend')},
    ${nanoCol('k.spend', 'key_spend')} FROM tenants t, api_keys k WHERE t.id = ${bill.tenantId} AND k.id = ${bill.keyId}`);
  return { balance: BigInt(r.balance), spend: BigInt(r.spend), keySpend: BigInt(r.key_spend) };
}

/** The live balance in Redis: {avail, reserved} as BigInt nano-USD (null: not loaded yet). */
export async function liveMoney(bill, redis = bill.redis) {
  const out = await redisCli(redis, 'HMGET', `{t:${bill.tenantId}}:money`, 'avail', 'reserved');
  const [a, r] = out.split('\n');
  return { avail: a ? BigInt(a) : null, reserved: r ? BigInt(r) : null };
}

/** Whether the Redis reservation of request `id`, attempt `attempt` still exists. */
export async function liveReservation(bill, id, attempt = 1, redis = bill.redis) {
  const v = await redisCli(redis, 'GET', `{t:${bill.tenantId}}:res:${id}:${attempt}`);
  return v === '' ? null : BigInt(v);
}

/** The usage rows of request `id` (money as BigInt nano-USD). */
export async function usageRows(bill, id) {
  const rows = await bill.db.query(`SELECT request_id, input_tokens, output_tokens, cache_read_tokens, estimated,
    attempts, status, ${nanoCol('cost', 'cost')}, api_key_id, tenant_id, group_id, account_id, model
    FROM usage WHERE request_id = ${lit(id)} ORDER BY id`);
  return rows.map((r) => ({ ...r, cost: BigInt(r.cost) }));
}

/** The one usage row of request `id`; throws unless there is exactly one. */
export async function usageRow(bill, id) {
  const rows = await usageRows(bill, id);
  if (rows.length !== 1) throw new Error(`request ${id}: ${rows.length} usage rows, expected exactly 1`);
  return rows[0];
}

/** Waits until request `id` has a usage row (settlement is asynchronous); returns it. */
export async function waitUsageRow(bill, id, timeout = 10000) {
  await waitFor(async () => (await usageRows(bill, id)).length > 0, { timeout, what: `usage row of ${id}` });
  return usageRow(bill, id);
}

/** The reservation rows of request `id`: [{attempt, state, amount (BigInt), settled_cost}]. */
export async function reservationRows(bill, id) {
  const rows = await bill.db.query(`SELECT attempt, state, ${nanoCol('amount', 'amount')},
    ${nanoCol('settled_cost', 'settled_cost')}, note FROM reservations WHERE request_id = ${lit(id)} ORDER BY attempt`);
  return rows.map((r) => ({ ...r, amount: BigInt(r.amount), settled_cost: r.settled_cost === null ? null : BigInt(r.settled_cost) }));
}

/**
 * What request `id` reserved for its billed (last) attempt, nano-USD: its reservation
 * row's amount, or — settled in the batch of its reservation, it has no row (sql/0017) —
 * its usage row's `reserved`. Waits for the usage row.
 */
export async function reservedBound(bill, id) {
  await waitUsageRow(bill, id);
  const rows = await reservationRows(bill, id);
  if (rows.length) return rows[rows.length - 1].amount;
  const v = await bill.db.scalar(`SELECT (reserved * 1000000000)::bigint FROM usage WHERE request_id = ${lit(id)}`);
  assert.ok(v !== null && v !== '', `${id}: neither a reservation row nor usage.reserved`);
  return BigInt(v);
}

/**
 * The ledger's debits of request `id` (amount as BigInt nano-USD): since sql/0006 its
 * share of its batch's entry (one `usage` entry per tenant per batch, named by
 * usage.ledger_id), before that a row of its own (ledger.request_id).
 */
export async function ledgerRows(bill, id) {
  const rows = await bill.db.query(`SELECT l.kind, ${nanoCol('-u.cost', 'amount')} FROM usage u
      JOIN ledger l ON l.id = u.ledger_id AND l.tenant_id = u.tenant_id WHERE u.request_id = ${lit(id)}
    UNION ALL SELECT kind, ${nanoCol('amount', 'amount')} FROM ledger WHERE request_id = ${lit(id)}`);
  return rows.map((r) => ({ ...r, amount: BigInt(r.amount) }));
}

/** How many rows `table` has (optionally WHERE `where`). */
export async function count(bill, table, where = 'true') {
  return Number(await bill.db.scalar(`SELECT count(*) FROM ${table} WHERE ${where}`));
}

// ---- tg_settle_batch through psql -------------------------------------------------------

/**
 * A settlement element as the gateway sends it (see tg__billing_settlement_text in tg_billing_settle.c).
 * `cost` is a decimal string; the fingerprint defaults to a hash of the billed numbers.
 */
export function settlement(bill, { requestId, input = 10, output = 20, cost, estimated = false, fingerprint, status = 200 }) {
  const c = cost ?? fmtNano(costOf(input, output));
  return {
    request_id: requestId,
    fingerprint: fingerprint ?? crypto.createHash('sha256').update(`${bill.keyId}|${MODEL}|${input}|${output}|${c}`).digest('hex'),
    tenant_id: bill.tenantId,
    api_key_id: bill.keyId,
    group_id: bill.groupId,
    account_id: bill.accountId,
    model: MODEL,
    attempts: 1,
    input,
    output,
    cache_read: null,
    cache_write: null,
    reasoning: null,
    cost: c,
    estimated,
    status,
    ttft_ms: 12.5,
    total_ms: 40.25,
  };
}

/** BigInt nano-USD as a decimal string with 9 fractional digits. */
export function fmtNano(n) {
  const neg = n < 0n;
  const a = neg ? -n : n;
  return `${neg ? '-' : ''}${a / 1_000_000_000n}.${String(a % 1_000_000_000n).padStart(9, '0')}`;
}

/** The SQL that settles `batch` (an array of settlement elements). */
export function settleSql(batch) {
  return `SELECT request_id || ' ' || outcome FROM tg_settle_batch(${lit(JSON.stringify(batch))}::jsonb)`;
}

/** Settles `batch` with one psql; resolves with [{request_id, outcome}]. */
export async function settleBatch(conninfo, batch) {
  const out = await psql(conninfo, settleSql(batch));
  return out.split('\n').filter(Boolean).map((l) => {
    const [request_id, outcome] = l.split(' ');
    return { request_id, outcome };
  });
}

/** Settles `batch` through the json form, the one the gateway calls; the outcomes in element order. */
export async function settleJson(conninfo, batch) {
  const out = await psql(conninfo,
    `SELECT request_id || ' ' || outcome FROM tg_settle_batch(${lit(JSON.stringify(batch))}::json)`, { stdin: true });
  return out.split('\n').filter(Boolean).map((l) => l.split(' ')[1]);
}

/**
 * Runs `sql` from `n` separate psql processes (n connections) that all connect first
 * and then fire at the same instant (pg_sleep until a common start time). Resolves with
 * each process's stdout lines.
 */
export async function psqlConcurrent(conninfo, sqls, { startInMs = 2500, timeout = 120000 } = {}) {
  const at = new Date(Date.now() + startInMs).toISOString();
  const gate = `SELECT pg_sleep(greatest(0, extract(epoch FROM (${lit(at)}::timestamptz - clock_timestamp()))))`;
  return Promise.all(sqls.map((sql) => new Promise((resolve, reject) => {
    execFile('psql', ['-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', conninfo, '-c', gate, '-c', sql],
      { timeout, maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
        const lines = stdout.split('\n').filter(Boolean);
        if (err) reject(new Error(`psql failed: ${stderr || err.message}`));
        else if (!lines.length) reject(new Error(`psql printed no result (stdout ${JSON.stringify(stdout)}, stderr ${JSON.stringify(stderr)})`));
        else resolve(lines);
      });
  })));
}

// ---- clients ----------------------------------------------------------------------------

/** A chat body for `text` (with mock directives) and max_tokens (omitted when null). */
export function chatBody(text, { maxTokens = 100, stream = false, model = MODEL } = {}) {
  const b = { model, messages: [{ role: 'user', content: text }] };
  if (maxTokens !== null) b.max_tokens = maxTokens;
  if (stream) b.stream = true;
  return b;
}

/**
 * A chat request (streamed unless body.stream === false) that counts the content
 * chunks it receives and can leave: after `abortAfterChunks` content chunks, or
 * `abortAfterMs` ms after the request was sent (whether or not a response head came).
 * Resolves with {status (0: no head yet), requestId, chunks, aborted, text} once the
 * response ended or the client left. `onChunk(n)` runs after each content chunk.
 */
export function streamChat(gw, key, body, { abortAfterChunks, abortAfterMs, onHead, onChunk, timeout = 60000 } = {}) {
  const data = Buffer.from(JSON.stringify({ stream: true, ...body }));
  return new Promise((resolve, reject) => {
    const out = { status: 0, requestId: null, chunks: 0, aborted: false, text: '', bytes: data.length };
    let pending = '';
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(out);
    };
    const req = http.request(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      agent: false,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': String(data.length) },
    }, (res) => {
      out.status = res.statusCode;
      out.requestId = res.headers['x-request-id'];
      onHead?.(out);
      res.setEncoding('utf8');
      res.on('data', (s) => {
        if (done) return;
        out.text += s;
        pending += s;
        const events = pending.split('\n\n');
        pending = events.pop();
        for (const ev of events) {
          const m = /^data: ?(.*)$/m.exec(ev);
          if (!m || m[1] === '[DONE]') continue;
          let j;
          try {
            j = JSON.parse(m[1]);
          } catch {
            continue;
          }
          if (j.choices?.[0]?.delta?.content) {
            out.chunks++;
            onChunk?.(out.chunks, out);
            if (abortAfterChunks !== undefined && out.chunks >= abortAfterChunks) return leave();
          }
        }
      });
      res.on('end', finish);
      res.on('error', finish);
      res.on('close', finish);
    });
    const leave = () => {
      if (done) return;
      out.aborted = true;
      req.destroy();
      finish();
    };
    if (abortAfterMs !== undefined) setTimeout(leave, abortAfterMs);
    const timer = setTimeout(() => req.destroy(new Error(`stream did not end within ${timeout} ms`)), timeout);
    req.on('error', (e) => {
      if (out.aborted || done) return finish();
      if (out.status) {
        out.error = e;
        return finish();
      }
      clearTimeout(timer);
      done = true;
      reject(e);
    });
    req.write(data);
    req.end();
  });
}

// ---- a private Postgres -----------------------------------------------------------------

function services(cmd, dir) {
  return new Promise((resolve, reject) => {
    execFile('bash', ['-c', `. "${REPO}/spec/lib/services.sh" && ${cmd} "$1" && echo "PG=$TOLLGATE_PG"`, 'services', dir],
      { timeout: 90000 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`${cmd} ${dir} failed: ${stderr || err.message}`));
        else resolve(stdout);
      });
  });
}

/**
 * A private Postgres in a fresh directory under /tmp (mode 755, so the postgres user can
 * reach it when the tests run as root). Returns {dir, conninfo, stop(), start()}; stop
 * is a fast shutdown by the PID in its pidfile. Register `stop` with after().
 */
export async function startPrivatePg() {
  const dir = fs.mkdtempSync('/tmp/tgpg-');
  fs.chmodSync(dir, 0o755);
  const out = await services('tg_pg_start', dir);
  const conninfo = /PG=(.*)/.exec(out)[1].trim();
  return {
    dir,
    conninfo,
    stop: () => services('tg_pg_stop', dir),
    start: () => services('tg_pg_start', dir),
    async remove() {
      await services('tg_pg_stop', dir).catch(() => {});
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Runs `fn` for every element of `items` with at most `limit` in flight. */
export async function pool(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }));
  return out;
}

