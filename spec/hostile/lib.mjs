// The hostile-input suite (spec/hostile/*.test.mjs): a data-driven list of hostile
// requests per file, each run against one real gateway with Postgres, Redis, billing
// and plugins on, and for each case the same four checks:
//
//   1. the status (and whether the connection closes, for wire-level cases),
//   2. the error shape of the API that was called (OpenAI on /v1/chat|responses|
//      embeddings|models, Anthropic on /v1/messages, the admin API's own),
//   3. the access log: stdout holds only valid JSON lines, and the case's request
//      (by x-request-id) has one with the status the client saw,
//   4. the worker is still up: a good request on a fresh connection succeeds.
//
// and at the end of each file `tollgate ledger verify` is clean and the tables an
// injection would hit are intact.
//
// A case is {name, kind, run(ctx) → outcome, expect, todo?}; `outcome` is
// {res: {status, headers, json, text} | null, closed, requestId?}. A case that hits
// a defect not fixed on main yet carries `todo: 'D<n> …'` (node:test todo: it runs and
// reports, it does not fail the file), or `logTodo` when only its access-log line is
// missing; a todo on money (D1-D5) runs last, with a tenant of its own. All the defects
// of issue #14 are fixed now and no case is todo. They were, in the issue's order:
//
//   D1  money overflow / saturation, spool quarantine      D8  HEAD with a body
//   D2  reservation bypass                                 D9  access-log lines for
//   D3  stream-reset reservations                              parser-refused/408/413/431
//   D4  top-up bounds                                      D10 log escaping of CR/LF
//   D5  absurd usage                                       D11 CRLF in account base_url /
//   D6  slow reader stalls a non-stream answer > 256 KB        credentials
//   D7  lingering close for early 413/401/431              D12 per-address console lockout
//                                                          D13 plugin runtime fail-closed
//                                                          D14 Anthropic error shape for
//                                                              plugin rejects on /v1/messages

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import {
  ADMIN_TOKEN, HOST, RawConn, REPO, sleep, startGateway, startMock, stopAll, tempDir,
} from '../integration/lib/harness.mjs';
import {
  SUITE_REDIS, applyState, createDb, lit, plainKey, request,
} from '../integration/lib/db.mjs';
import { accountsLoaded, billedEnv, billingConfig, ledger } from '../integration/lib/billing.mjs';

export { RawConn, sleep, ADMIN_TOKEN, HOST };
export const MODEL = 'mock-gpt';
export const CRED = 'sk-hostile-account';

/** A policy plugin: rejects on `x-reject`, throws on `x-boom`, stamps every answer. */
const POLICY = `
return {
  name = "hostile", priority = 10, version = "1",
  on_request = function(ctx)
    if ctx:header("x-reject") then return ctx:reject(403, "blocked_by_policy", "blocked by the hostile policy") end
    if ctx:header("x-boom") then error("boom") end
    ctx:add_header("x-hostile-policy", "1")
  end,
}
`;

export const LIMITS = {
  max_body_bytes: 262144,
  max_header_bytes: 8192,
  header_timeout_ms: 1000,
  body_timeout_ms: 1500,
  idle_timeout_ms: 10000,
  write_timeout_ms: 4000,
  shutdown_timeout_ms: 5000,
};

/**
 * A billed deployment on a fresh database (the suite's Postgres and Redis): one tenant
 * with 1,000 USD, one group, one account on the mock, one key with limits high enough
 * never to refuse (so the limiter's Redis script runs on every request), prices; a
 * gateway with billing, the access log, the `hostile` policy plugin and the shipped
 * plugins directory. Returns {mock, db, gw, key, tenantId, bill}.
 */
export async function hostileSetup({ limits = {}, gateway = {} } = {}) {
  const mock = await startMock();
  const db = await createDb();
  const key = plainKey('hostile');
  // Cases that hit a money defect not fixed yet (D1-D5, todo) run with the key of a
  // tenant of their own, so what they break in the ledger is told apart from the rest.
  const qkey = plainKey('quarantine');
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '1000' }, { name: 'quarantine', balance: '1000' }],
    groups: [{ name: 'g', models: [], rate_multiplier: 1 }],
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['g'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'g', key, rpm: 1000000, tpm: 2000000000, concurrency: 500 },
      { name: 'q', tenant: 'quarantine', group: 'g', key: qkey, rpm: 1000000, tpm: 2000000000, concurrency: 500 }],
    prices: [{ model: MODEL, input: '1.00', output: '2.00' }, { model: 'mock-claude', input: '1.00', output: '2.00' }],
  });
  const [ids] = await db.query(`SELECT (SELECT id FROM tenants WHERE name = 'acme') AS tenant_id,
    (SELECT id FROM api_keys WHERE name = 'k') AS key_id, (SELECT id FROM tenants WHERE name = 'quarantine') AS q_tenant_id`);
  const bill = { db, conninfo: db.conninfo, redis: SUITE_REDIS, key, tenantId: ids.tenant_id, keyId: ids.key_id };
  const dir = tempDir('policies');
  fs.writeFileSync(path.join(dir, 'hostile.lua'), POLICY);
  const gw = await startGateway({
    workers: 2,
    access_log: true,
    limits: { ...LIMITS, ...limits },
    upstream: { first_byte_timeout_ms: 3000, idle_timeout_ms: 3000 },
    billing: billingConfig(tempDir('spool')),
    plugins: { dirs: [path.join(REPO, 'plugins'), dir], enabled: [{ name: 'hostile' }], watch: false },
    ...gateway,
  }, { mock, env: billedEnv(bill) });
  await accountsLoaded(gw, key);
  return { mock, db, gw, key, qkey, bill, tenantId: ids.tenant_id, qTenantId: ids.q_tenant_id, moneyTodo: 0 };
}

/** Stops everything; then ledger verify must be clean and the tables intact. */
export async function hostileTeardown(S) {
  await stopAll();
  if (S?.db) await S.db.drop();
}

/**
 * The checks of the end of a file: settlements have landed (no reservation left
 * `reserved` by a request that ended), `tollgate ledger verify` exits 0, and the
 * tables an injected `'; DROP …` would hit still hold their rows.
 */
export async function finalChecks(S) {
  const { db } = S;
  // Settlement is asynchronous (a batch within ~1 ms, a reconcile pass for unknown
  // outcomes): wait until nothing is left reserved, then verify.
  const deadline = Date.now() + 20000;
  for (;;) {
    const open = Number(await db.scalar("SELECT count(*) FROM reservations WHERE state = 'reserved'"));
    if (open === 0 || Date.now() > deadline) break;
    await sleep(200);
  }
  const pend = Number(await db.scalar("SELECT count(*) FROM reservations WHERE state = 'pending_reconciliation'"));
  if (pend > 0) {
    const r = await ledger(S.bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(r.code, 0, `ledger reconcile: ${r.stdout}${r.stderr}`);
  }
  const v = await ledger(S.bill, 'verify');
  if (v.code !== 0 && S.moneyTodo > 0) {
    // Only the quarantine tenant (the todo money cases) may be off, and only while such
    // cases remain; every other problem fails the suite.
    const problems = v.stdout.split('\n').filter((l) => /PROBLEM/.test(l));
    const others = problems.filter((l) => !l.includes(`tenant_id=${S.qTenantId} `) && !l.endsWith(`tenant_id=${S.qTenantId}`));
    assert.deepEqual(others, [], `ledger verify: problems outside the quarantine tenant:\n${v.stdout}${v.stderr}`);
    assert.ok(problems.length > 0, `ledger verify exited ${v.code} without naming a problem:\n${v.stdout}${v.stderr}`);
  } else {
    assert.equal(v.code, 0, `ledger verify must be clean:\n${v.stdout}${v.stderr}`);
  }
  for (const t of ['tenants', 'api_keys', 'accounts', 'groups', 'model_prices']) {
    const exists = await db.scalar(`SELECT to_regclass(${lit(t)}) IS NOT NULL`);
    if (exists !== 't') continue; // a table of another name in this schema version
    assert.ok(Number(await db.scalar(`SELECT count(*) FROM ${t}`)) >= 1, `table ${t} still has its rows`);
  }
  assert.ok(S.gw.proc.running, 'the gateway is still running');
}

// ---- the shapes -----------------------------------------------------------------------

const hget = (res, h) => (typeof res.headers?.get === 'function' ? res.headers.get(h) : res.headers?.[h]);

/** OpenAI shape: {"error":{"message","type","code"}} (code a string, or null). */
export function assertOpenAIError(res, ctx = '') {
  const c = `${ctx}: ${res.status} ${String(res.text).slice(0, 300)}`;
  assert.match(hget(res, 'content-type') ?? '', /^application\/json/, `content-type ${c}`);
  assert.ok(res.json && typeof res.json.error === 'object' && res.json.error !== null, `OpenAI error shape ${c}`);
  assert.equal(typeof res.json.error.message, 'string', c);
  assert.ok(res.json.error.message.length > 0, c);
  assert.equal(typeof res.json.error.type, 'string', c);
  assert.ok(res.json.type === undefined, `not the Anthropic shape ${c}`);
}

/** Anthropic shape: {"type":"error","error":{"type","message"}}. */
export function assertAnthropicError(res, ctx = '') {
  const c = `${ctx}: ${res.status} ${String(res.text).slice(0, 300)}`;
  assert.match(hget(res, 'content-type') ?? '', /^application\/json/, `content-type ${c}`);
  assert.ok(res.json && res.json.type === 'error', `Anthropic error shape (type: "error") ${c}`);
  assert.equal(typeof res.json.error?.type, 'string', c);
  assert.equal(typeof res.json.error?.message, 'string', c);
}

/** The admin API's shape: {"error":{"message","type","code"}} with a string code. */
export function assertAdminError(res, ctx = '') {
  assertOpenAIError(res, ctx);
  assert.equal(typeof res.json.error.code, 'string', `admin error code ${ctx}`);
}

const SHAPES = { openai: assertOpenAIError, anthropic: assertAnthropicError, admin: assertAdminError };

// ---- the access log -------------------------------------------------------------------

/** Every stdout line of the gateway so far, each of which must be one JSON object. */
export function logLines(gw) {
  return gw.proc.lines.stdout;
}

/** Asserts every stdout line from `from` on parses as a JSON object (no split lines). */
export function assertLogValid(gw, from = 0, ctx = '') {
  const lines = gw.proc.lines.stdout.slice(from);
  for (const l of lines) {
    let j;
    try {
      j = JSON.parse(l);
    } catch {
      assert.fail(`${ctx}: an access-log line is not JSON: ${JSON.stringify(l.slice(0, 300))}`);
    }
    assert.equal(typeof j, 'object', `${ctx}: access-log line is an object`);
    assert.equal(typeof j.request_id, 'string', `${ctx}: access-log line has request_id: ${l.slice(0, 200)}`);
    assert.equal(typeof j.status, 'number', `${ctx}: access-log line has status: ${l.slice(0, 200)}`);
  }
}

/** Waits (bounded) for the access-log line of request `id`; returns it parsed or null. */
export async function logLineFor(gw, id, timeout = 3000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    for (const l of gw.proc.lines.stdout) {
      if (!l.includes(id)) continue;
      try {
        const j = JSON.parse(l);
        if (j.request_id === id) return j;
      } catch {
        /* assertLogValid reports it */
      }
    }
    if (Date.now() > deadline) return null;
    await sleep(25);
  }
}

// ---- sending ---------------------------------------------------------------------------

/** One HTTP request (node:http, fresh connection). Network errors become {error}. */
export async function http(gw, method, p, { body, headers = {}, key, timeout = 15000 } = {}) {
  const h = { ...headers };
  if (key) h.authorization = `Bearer ${key}`;
  try {
    return await request(`${gw.url}${p}`, { method, headers: h, body, timeout });
  } catch (e) {
    return { status: 0, error: e, headers: {}, text: '' };
  }
}

/** Raw bytes on a fresh connection: the first response (or null) and whether it closed. */
export async function rawOnce(gw, bytes, { timeout = 5000, closeWait = 1500 } = {}) {
  const c = await RawConn.open(gw.port);
  await c.write(bytes);
  const res = await c.response(timeout);
  const closed = closeWait ? await c.waitClose(closeWait) : c.closed;
  c.destroy();
  return { res, closed };
}

/** A raw HTTP/1.1 request head + body (latin1 head; body string or Buffer). */
export function raw(method, p, { headers = {}, body, key } = {}) {
  const h = { host: HOST, ...headers };
  if (key && !Object.keys(h).some((k) => k.toLowerCase() === 'authorization')) h.authorization = `Bearer ${key}`;
  const b = body === undefined ? null : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  if (b && !Object.keys(h).some((k) => /^(content-length|transfer-encoding)$/i.test(k))) h['content-length'] = String(b.length);
  if (b && !Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) h['content-type'] = 'application/json';
  const head = `${method} ${p} HTTP/1.1\r\n${Object.entries(h).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
  return b ? Buffer.concat([Buffer.from(head, 'latin1'), b]) : Buffer.from(head, 'latin1');
}

export const chat = (text = 'hi [mock chunks=2]', extra = {}) => ({ model: MODEL, messages: [{ role: 'user', content: text }], max_tokens: 16, ...extra });
export const anth = (text = 'hi [mock chunks=2]', extra = {}) => ({ model: MODEL, max_tokens: 16, messages: [{ role: 'user', content: text }], ...extra });
export const resp = (text = 'hi [mock chunks=2]', extra = {}) => ({ model: MODEL, input: text, max_output_tokens: 16, ...extra });

/** The follow-up: a good chat request on a fresh connection succeeds. */
export async function stillServes(S, ctx = '') {
  const r = await http(S.gw, 'POST', '/v1/chat/completions', { key: S.key, body: chat('follow-up [mock chunks=1]'), headers: { connection: 'close' } });
  assert.equal(r.status, 200, `${ctx}: the follow-up good request must succeed (gateway ${S.gw.proc.running ? 'running' : `exited ${JSON.stringify(S.gw.proc.exit)}`}): ${r.text?.slice(0, 300) ?? r.error}`);
  assert.equal(r.json?.object, 'chat.completion', ctx);
}

// ---- the data-driven runner -----------------------------------------------------------

/**
 * Registers one node:test test per case. Each case:
 *   name     what it sends
 *   run(S)   sends it; resolves with {res, closed?, requestId?}
 *   status   the expected status: a number, an array of allowed numbers, or null for
 *            "no response at all" (the client left, or the gateway closed at once)
 *   shape    'openai' | 'anthropic' | 'admin' | null (no JSON error body expected)
 *   code     optional: the error code (or list of codes) expected
 *   close    optional: true when the connection must be closed after the answer
 *   log      false when no access-log line can exist (nothing reached the gateway as a
 *            request, e.g. the client left mid-headers); default true when there is
 *            a response with an x-request-id
 *   check(o, S) optional further assertions
 *   todo     'D<n> …' while the case hits a defect of issue #14 not fixed on main
 * `S` is the hostileSetup() result (a getter: the setup runs in before()).
 */
export function runCases(getS, list) {
  const names = new Set();
  const seen = new Map();
  // Cases on a money defect not fixed yet go last: one that poisons a settlement batch
  // (D1) must not hold back the settlements of the cases that check the ledger.
  const isMoney = (c) => /^D[1-5]\b/.test(c.todo || '');
  const cases = [...list.filter((c) => !isMoney(c)), ...list.filter(isMoney)];
  for (const c of cases) {
    assert.ok(!names.has(c.name), `duplicate case name ${c.name}`);
    names.add(c.name);
    const opts = c.todo ? { todo: c.todo } : {};
    const money = /^D[1-5]\b/.test(c.todo || '');
    test(c.name, opts, async () => {
      let S = getS();
      const errFrom = S.gw.proc.lines.stderr.length;
      if (money) {
        S.moneyTodo++;
        S = { ...S, key: S.qkey };
      }
      const from = S.gw.proc.lines.stdout.length;
      const o = await c.run(S);
      const res = o.res;
      if (c.status === null || (Array.isArray(c.status) && c.status.includes(null) && !res)) {
        assert.equal(res ?? null, null, `${c.name}: expected no response, got ${res?.status} ${res?.text?.slice(0, 200)}`);
      } else {
        assert.ok(res && res.status, `${c.name}: expected a response, got none${o.error ? ` (${o.error.message})` : ''}`);
        const want = Array.isArray(c.status) ? c.status : [c.status];
        assert.ok(want.includes(res.status), `${c.name}: status ${res.status}, expected ${want.join('|')}: ${String(res.text).slice(0, 300)}`);
        if (c.shape && res.status >= 400) SHAPES[c.shape](res, c.name);
        if (c.code !== undefined) {
          const codes = Array.isArray(c.code) ? c.code : [c.code];
          const got = c.shape === 'anthropic' ? res.json?.error?.type : res.json?.error?.code;
          assert.ok(codes.includes(got), `${c.name}: error code ${got}, expected ${codes.join('|')}`);
        }
        if (c.close !== undefined) assert.equal(o.closed, c.close, `${c.name}: connection ${c.close ? 'closed' : 'kept open'}`);
      }
      if (c.check) await c.check(o, S);
      await stillServes(S, c.name);
      // The access log: every line valid; the case's request has its line.
      const id = o.requestId ?? (res ? hget(res, 'x-request-id') : undefined);
      seen.set(c.name, { id, status: res?.status });
      if (c.log !== false && res && !c.logTodo) {
        assert.ok(id, `${c.name}: the response carries x-request-id`);
        const line = await logLineFor(S.gw, id);
        assert.ok(line, `${c.name}: an access-log line for ${id}`);
        assert.equal(line.status, res.status, `${c.name}: the access-log status is the one the client saw`);
      }
      assertLogValid(S.gw, from, c.name);
      // The diagnostic log (stderr): one line per message, each starting with its time,
      // whatever the client put in a string the gateway quotes.
      for (const l of S.gw.proc.lines.stderr.slice(errFrom)) {
        assert.match(l, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d/, `${c.name}: a stderr line that does not start with its time (a client string split it): ${JSON.stringify(l.slice(0, 200))}`);
      }
    });
    // A case whose access-log line is missing because of a defect not fixed yet checks
    // everything else above and its line here, as a todo of its own.
    if (c.logTodo) {
      test(`${c.name} — its access-log line`, { todo: c.logTodo }, async () => {
        const S = getS();
        const o = seen.get(c.name);
        assert.ok(o?.id, `${c.name}: the response carried x-request-id`);
        const line = await logLineFor(S.gw, o.id, 200);
        assert.ok(line, `${c.name}: an access-log line for ${o.id}`);
        assert.equal(line.status, o.status, `${c.name}: the access-log status is the one the client saw`);
      });
    }
  }
}

/** A chat/responses/messages/embeddings case over node:http with the key. */
export function httpCase(name, method, p, body, expect, { headers, key = true } = {}) {
  return {
    name,
    ...expect,
    run: async (S) => {
      // '%KEY%' in a header value stands for the suite's key (known once set up).
      const h = Object.fromEntries(Object.entries(headers || {}).map(([k, v]) => [k, String(v).replace('%KEY%', S.key)]));
      return { res: await http(S.gw, method, p, { body, headers: h, key: key === true ? S.key : key || undefined }) };
    },
  };
}

/** A raw-bytes case on a fresh connection. */
export function rawCase(name, bytes, expect, opts = {}) {
  return {
    name,
    ...expect,
    run: async (S) => rawOnce(S.gw, typeof bytes === 'function' ? bytes(S) : bytes, opts),
  };
}

export { tempDir, startMock, applyState, plainKey };
