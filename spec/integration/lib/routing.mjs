// Helpers for the integration tests of the routing issue (routing_*.test.mjs): groups
// of upstream accounts that all point at one mock upstream, each account with its own
// credential, so the mock's per-credential counters (GET /_mock/stats) show exactly
// which account a request went to. Builds on harness.mjs and db.mjs.
//
//   const rt = await startRouting({ accounts: [{ name: 'a' }, { name: 'b' }],
//                                   routing: { cooldown_5xx_ms: 1000 } });
//   await rt.fault('a', { status: 500 });         // the mock's per-credential rule
//   const r = await rt.chat('hello [mock chunks=2]');
//   const n = await rt.counts();                   // { a: 3, b: 7 }
//   after(() => rt.stop());
//
// Each file gets a fresh database (db.mjs: migrated, ids offset so its Redis keys are
// its own), a tenant with a large balance, its groups (default one, `pool`) with one
// key each, the accounts and a price. The gateway reads them from Postgres and Redis
// (spec/run.sh's services), with billing on.

import http from 'node:http';

import { MODEL, sleep, startMock, stopAll, tempDir, waitFor } from './harness.mjs';
import { applyState, createDb, lit, plainKey, request, startStateGateway } from './db.mjs';

export { MODEL };

/** The credential of account `name`: what the mock counts its requests under. */
export const credOf = (name) => `sk-rt-${name}`;

/**
 * Starts the mock, a fresh database with the state below, and a gateway. accounts:
 * [{name, concurrency = 16, priority = 0, weight = 100, groups = ['pool']}]; groups:
 * the group names (default ['pool']), each with one key (keys[group]). routing: the
 * gateway's `routing` table (merged over the defaults below). gateway: other config
 * overrides. Waits until the gateway routes a request through every group, then zeroes
 * the mock's stats. Returns {mock, db, gw, key (the first group's), keys, chat(text,
 * extra, opts), chatMessages(), stream(), counts(), stats(name), fault(), clearFaults(),
 * account(name), stop()}.
 */
export async function startRouting({ accounts, groups = ['pool'], routing = {}, gateway = {} } = {}) {
  const mock = await startMock();
  const db = await createDb();
  const keys = Object.fromEntries(groups.map((g) => [g, plainKey(`routing-${g}`)]));
  const key = keys[groups[0]];
  await applyState(db, {
    tenants: [{ name: 'rt', balance: '1000000' }],
    groups: groups.map((g) => ({ name: g, models: [] })),
    accounts: accounts.map((a) => ({
      name: a.name,
      provider: 'openai',
      base_url: `${mock.url}/v1`,
      credential: credOf(a.name),
      concurrency: a.concurrency ?? 16,
      priority: a.priority ?? 0,
      weight: a.weight ?? 100,
      groups: a.groups ?? [groups[0]],
    })),
    keys: groups.map((g) => ({ name: `rt-${g}`, tenant: 'rt', group: g, key: keys[g] })),
    prices: [{ model: MODEL, input: '0.15', output: '0.60' }],
  });
  const config = {
    routing: {
      max_attempts: 3,
      deadline_ms: 120000,
      cooldown_429_ms: 30000,
      cooldown_529_ms: 10000,
      cooldown_auth_ms: 300000,
      cooldown_5xx_ms: 15000,
      ...routing,
    },
    upstream: { first_byte_timeout_ms: 10000, idle_timeout_ms: 10000 },
    // Billing on, as in production (each attempt reserves, the tenant's balance is large);
    // its spool in a temp dir rather than ./var/spool.
    billing: { enabled: true, spool_dir: tempDir('spool') },
    ...gateway,
  };
  const gw = await startStateGateway(db, config, { mock });
  const rt = {
    mock,
    db,
    gw,
    key,
    keys,
    names: accounts.map((a) => a.name),
    /**
     * POST /v1/chat/completions with a one-message conversation. opts: key (default
     * the first group's), gw (default this gateway; say one from another()), headers
     * (added to the request's), the rest goes to db.mjs request(). Every request is a
     * new connection. Resolves {status, headers, text, json}.
     */
    chat: (text = 'hello [mock chunks=2]', extra = {}, opts = {}) =>
      rt.chatMessages([{ role: 'user', content: text }], extra, opts),
    /** The same with a full message list (conversation stickiness). */
    chatMessages: (messages, extra = {}, { headers = {}, key: k = key, gw: g = gw, ...opts } = {}) =>
      request(`${g.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${k}`, ...headers },
        body: { model: MODEL, messages, ...extra },
        ...opts,
      }),
    /**
     * A streamed chat request on a new connection (opts: key, gw, headers, timeout).
     * Resolves {status, headers, text, complete, error}: complete is false when the
     * connection ended before the chunked body's last chunk (a truncated stream).
     */
    stream: (text, extra = {}, { headers = {}, key: k = key, gw: g = gw, timeout = 30000 } = {}) =>
      new Promise((resolve, reject) => {
        const data = Buffer.from(JSON.stringify({ model: MODEL, stream: true, messages: [{ role: 'user', content: text }], ...extra }));
        const req = http.request(`${g.url}/v1/chat/completions`, {
          method: 'POST',
          agent: false,
          headers: { authorization: `Bearer ${k}`, 'content-type': 'application/json', 'content-length': data.length, ...headers },
        }, (res) => {
          let body = '';
          let error = null;
          res.setEncoding('utf8');
          res.on('data', (d) => {
            body += d;
          });
          res.on('error', (e) => {
            error = e;
          });
          res.on('close', () => {
            clearTimeout(timer);
            resolve({ status: res.statusCode, headers: res.headers, text: body, complete: res.complete, error: error?.message ?? null });
          });
        });
        const timer = setTimeout(() => req.destroy(new Error(`stream: no end within ${timeout} ms`)), timeout);
        req.on('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
        req.end(data);
      }),
    /** Requests the mock received per account name since the last reset. */
    async counts() {
      const c = (await mock.stats()).credentials || {};
      const out = {};
      for (const n of rt.names) out[n] = c[credOf(n)]?.requests ?? 0;
      return out;
    },
    /** The mock's per-credential stats entry of account `name` (requests, max_inflight, ...). */
    async stats(name) {
      const c = (await mock.stats()).credentials || {};
      return c[credOf(name)] || { requests: 0, inflight: 0, max_inflight: 0, aborted: 0 };
    },
    /** Installs the mock's fault rule for account `name` (count omitted: until cleared). */
    fault: (name, rule) => rt.faultCredential(credOf(name), rule),
    /** The same for any upstream credential (the static upstream's, say). */
    async faultCredential(credential, rule) {
      const r = await fetch(`${mock.url}/_mock/faults`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ credential, ...rule }),
      });
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`mock faults: HTTP ${r.status}`);
    },
    async clearFaults() {
      const r = await fetch(`${mock.url}/_mock/faults`, { method: 'DELETE' });
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`mock faults DELETE: HTTP ${r.status}`);
    },
    /** The accounts row of `name`: {id, cooldown_until_ms (null when never cooled), now_ms}. */
    async account(name) {
      const [row] = await db.query(
        'SELECT id, (extract(epoch FROM cooldown_until) * 1000)::bigint AS cooldown_until_ms, ' +
          `(extract(epoch FROM now()) * 1000)::bigint AS now_ms FROM accounts WHERE name = ${lit(name)}`);
      return row;
    },
    /**
     * Another gateway instance on the same database, Redis, mock and config (top-level
     * keys of `overrides` replace the config's). Resolves once it routes through each
     * of `wait` (default every group). stop() stops it too.
     */
    async another(overrides = {}, { wait = groups } = {}) {
      const g = await startStateGateway(db, { ...config, ...overrides }, { mock });
      await waitRouted(g, wait);
      return g;
    },
    async stop() {
      await stopAll();
      await db.drop();
    },
  };
  // The account snapshot loads asynchronously after /healthz answers: wait until every
  // group is served (one request each), then start the tests from zeroed counters.
  const waitRouted = async (g, which) => {
    for (const grp of which) {
      await waitFor(async () => (await rt.chat('warm-up [mock chunks=1]', {}, { key: keys[grp], gw: g })).status === 200, {
        timeout: 10000,
        what: `the gateway to route through the accounts of group ${grp}`,
      });
    }
  };
  await waitRouted(gw, groups);
  await mock.reset();
  return rt;
}

/**
 * Sends `n` requests, at most `concurrency` at a time, each on a fresh connection
 * unless an agent is given (fresh connections spread over the gateway's workers).
 * `make(i)` returns [text, extra, opts]. Resolves with the responses in order.
 */
export async function sendMany(rt, n, make = () => [], { concurrency = 1 } = {}) {
  const out = new Array(n);
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      const [text, extra, opts] = make(i);
      out[i] = await rt.chat(text, extra, opts);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, n) }, worker));
  return out;
}

/** Counts of each status in a list of responses: {200: 30}. */
export function statuses(rs) {
  const out = {};
  for (const r of rs) out[r.status] = (out[r.status] || 0) + 1;
  return out;
}

/** The difference a - b of two count objects. */
export function diff(a, b) {
  const out = {};
  for (const k of Object.keys(a)) out[k] = a[k] - (b[k] || 0);
  return out;
}

export { sleep, waitFor };
