// Helpers for the integration tests of the state and limits issues: a private Postgres
// database per test file (created on the suite's server, migrated, dropped after), the
// `tollgate migrate` / `tollgate apply` commands, the admin API, a keep-alive HTTP
// client with a bounded number of sockets, redis-cli, and a private redis-server that a
// test may kill and restart. Builds on harness.mjs; like it, every wait is bounded and
// nothing talks to any address but 127.0.0.1 or a unix socket.
//
//   const db = await createDb();             // tg_<random>, migrated, ids offset
//   const gw = await startStateGateway(db, { workers: 1 }, { mock });
//   const admin = adminClient(gw);
//   const { json } = await admin.post('/tenants', { name: 'acme' });
//   ...
//   after(async () => { await stopAll(); await db.drop(); });
//
// spec/run.sh exports TOLLGATE_PG (a libpq conninfo with dbname=tollgate) and
// TOLLGATE_REDIS (unix:///…/redis.sock). Each file gets its own database named
// tg_<random> on that server. Redis is shared by the files; its keys are
// {t:<tenant id>}:…, so each database starts its id sequences at a random offset and
// the files never touch each other's limiter state (no FLUSHDB, which would also wipe
// the state of unrelated tests running at the same time).

import { execFile, execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';

import { ADMIN_TOKEN, HOST, TG_BIN, sleep, startGateway, tempDir, toLua, waitFor } from './harness.mjs';

/** A fixed 256-bit secret (64 hex digits) for sealing account credentials. */
export const SECRET_KEY = 'c0ffee00'.repeat(8);

export const SUITE_PG = process.env.TOLLGATE_PG;
export const SUITE_REDIS = process.env.TOLLGATE_REDIS;

/** Throws a clear error when spec/run.sh's services are not there. */
export function requireServices() {
  if (!SUITE_PG || !SUITE_REDIS) {
    throw new Error('TOLLGATE_PG and TOLLGATE_REDIS must be set (run through spec/run.sh)');
  }
}

// ---- libpq conninfo ---------------------------------------------------------------------

/** Parses a key=value conninfo (values may be single-quoted) into an object. */
export function parseConninfo(s) {
  const out = {};
  const re = /\s*([A-Za-z_]+)\s*=\s*('((?:[^'\\]|\\.)*)'|\S*)/g;
  let m;
  while ((m = re.exec(s)) !== null) out[m[1]] = m[3] !== undefined ? m[3].replace(/\\(.)/g, '$1') : m[2];
  return out;
}

/** The conninfo `s` with some keys replaced. */
export function conninfoWith(s, over) {
  const all = { ...parseConninfo(s), ...over };
  return Object.entries(all)
    .map(([k, v]) => `${k}='${String(v).replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`)
    .join(' ');
}

// ---- psql -------------------------------------------------------------------------------

const PSQL_ARGS = ['-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1'];

/**
 * Runs one SQL command with psql; resolves with its stdout (unaligned, tuples only). The
 * command goes as an argument, or with `stdin` on psql's standard input (past the 128 kB
 * an argument may hold: a large settlement batch).
 */
export function psql(conninfo, sql, { timeout = 30000, stdin = false } = {}) {
  return new Promise((resolve, reject) => {
    const child = execFile('psql', [...PSQL_ARGS, '-d', conninfo, ...(stdin ? ['-f', '-'] : ['-c', sql])],
      { timeout, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`psql failed: ${stderr || err.message}\nSQL: ${sql.slice(0, 500)}`));
        else resolve(stdout);
      });
    if (stdin) child.stdin.end(sql);
  });
}

/** Synchronous psql, for after() hooks and setup that must finish before anything else. */
export function psqlSync(conninfo, sql, { timeout = 30000 } = {}) {
  return execFileSync('psql', [...PSQL_ARGS, '-d', conninfo, '-c', sql], { timeout, encoding: 'utf8', maxBuffer: 64 << 20 });
}

/** SQL string literal. */
export const lit = (s) => `'${String(s).replace(/'/g, "''")}'`;

/**
 * A fresh database tg_<random> on the suite's server. With `migrate` (the default) the
 * binary's migrations are applied and the id sequences restarted at a random offset
 * (see the top of this file). Returns {name, conninfo, query(sql) → rows as objects,
 * scalar(sql), exec(sql), tables(), dump(), drop()}.
 */
export async function createDb({ migrate = true } = {}) {
  requireServices();
  const name = `tg_${crypto.randomBytes(6).toString('hex')}`;
  const server = conninfoWith(SUITE_PG, { dbname: 'postgres' });
  await psql(server, `CREATE DATABASE ${name}`);
  const conninfo = conninfoWith(SUITE_PG, { dbname: name });
  const db = {
    name,
    conninfo,
    exec: (sql) => psql(conninfo, sql),
    /** Rows of a SELECT as plain objects (through row_to_json, so types are JSON's). */
    async query(sql) {
      const out = await psql(conninfo, `SELECT row_to_json(q)::text FROM (${sql}) q`);
      return out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    },
    async scalar(sql) {
      return (await psql(conninfo, sql)).trim();
    },
    /** Every table of the public schema. */
    async tables() {
      const out = await psql(conninfo,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1");
      return out.split('\n').filter(Boolean);
    },
    /** {table: [row_to_json text, ...]} of every table. */
    async dump() {
      const out = {};
      for (const t of await db.tables()) {
        out[t] = (await psql(conninfo, `SELECT row_to_json(t)::text FROM "${t}" t`)).split('\n').filter(Boolean);
      }
      return out;
    },
    dropped: false,
    async drop() {
      if (db.dropped) return;
      db.dropped = true;
      await psql(server, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    },
  };
  if (migrate) {
    const r = await tool(['migrate'], { db });
    if (r.code !== 0) throw new Error(`migrate failed (${r.code}): ${r.stderr}${r.stdout}`);
    await offsetIds(db);
  }
  return db;
}

/** Restarts every id sequence at one random offset, so Redis keys differ per database. */
export async function offsetIds(db) {
  const base = 1_000_000 + crypto.randomInt(0, 1_000_000_000);
  const seqs = (await psql(db.conninfo,
    "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public'")).split('\n').filter(Boolean);
  for (const s of seqs) await psql(db.conninfo, `ALTER SEQUENCE "${s}" RESTART WITH ${base}`);
  return base;
}

// ---- the tollgate commands --------------------------------------------------------------

/** A minimal config file for `tollgate migrate/apply` (the database comes from env). */
export function toolConfig(extra = {}) {
  const dir = tempDir('cfg');
  const p = path.join(dir, 'tollgate.lua');
  fs.writeFileSync(p, `return ${toLua({ upstream: { url: `http://${HOST}:9/v1` }, ...extra })}\n`);
  return p;
}

/**
 * Runs `tollgate <args[0]> -c CFG <args[1..]>` against db. Resolves with
 * {code, signal, stdout, stderr}. TOLLGATE_PG is the test database; TOLLGATE_REDIS is
 * the suite's (apply publishes the invalidation there) unless `redis` is given (null:
 * none).
 */
export function tool(args, { db, config, env = {}, redis = SUITE_REDIS, timeout = 30000 } = {}) {
  const cfg = config || toolConfig();
  const [cmd, ...rest] = args;
  const childEnv = { ...process.env, TOLLGATE_PG: db.conninfo, TOLLGATE_SECRET_KEY: SECRET_KEY, ...env };
  if (redis) childEnv.TOLLGATE_REDIS = redis;
  else delete childEnv.TOLLGATE_REDIS;
  for (const [k, v] of Object.entries(childEnv)) if (v === null || v === undefined) delete childEnv[k];
  return new Promise((resolve) => {
    execFile(TG_BIN, [cmd, '-c', cfg, ...rest], { env: childEnv, timeout, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, signal: err?.signal ?? null, stdout, stderr });
    });
  });
}

/** Writes a state file (a JS object rendered as Lua) and returns its path. */
export function stateFile(state) {
  const p = path.join(tempDir('state'), 'state.lua');
  fs.writeFileSync(p, `return ${toLua(state)}\n`);
  return p;
}

/** Applies `state` to db; throws with the command's output unless it exits 0. */
export async function applyState(db, state, opts = {}) {
  const r = await tool(['apply', stateFile(state)], { db, ...opts });
  if (r.code !== 0) throw new Error(`apply failed (${r.code}): ${r.stderr}${r.stdout}`);
  return r;
}

/** The id of api key `name` (of any tenant) in db. */
export async function keyId(db, name) {
  return Number(await db.scalar(`SELECT id FROM api_keys WHERE name = ${lit(name)}`));
}

// ---- gateways ---------------------------------------------------------------------------

/** The environment of a gateway that uses db and Redis (the suite's unless given). */
export function stateEnv(db, { redis = SUITE_REDIS } = {}) {
  return {
    TOLLGATE_PG: db.conninfo,
    TOLLGATE_REDIS: redis,
    TOLLGATE_SECRET_KEY: SECRET_KEY,
    TOLLGATE_ADMIN_TOKEN: ADMIN_TOKEN,
  };
}

/**
 * harness.startGateway with Postgres (db) and Redis. Billing is off unless `billing` is
 * true: with it, every request also reserves its maximum cost in Redis and records the
 * reservation in Postgres before the upstream call, and money fails closed. The
 * billing files test that; here it would turn the faults these tests inject on purpose
 * (a stuck key table, a dead Redis) into billing_unavailable and hide what they check.
 * With billing on, its spool goes to a temp dir.
 */
export function startStateGateway(db, overrides = {}, { mock, redis, env = {}, billing = false, ...opts } = {}) {
  const o = { ...overrides };
  o.billing = billing ? { spool_dir: tempDir('spool'), ...(overrides.billing || {}) } : { enabled: false, ...(overrides.billing || {}) };
  return startGateway(o, { mock, env: { ...stateEnv(db, { redis }), ...env }, ...opts });
}

// ---- HTTP -------------------------------------------------------------------------------

/** A keep-alive agent with at most `sockets` connections to one origin. */
export function keepAliveAgent(sockets = 100) {
  return new http.Agent({ keepAlive: true, maxSockets: sockets, maxFreeSockets: sockets });
}

/**
 * One HTTP request with node:http. body: object (sent as JSON), string or Buffer.
 * Resolves with {status, headers, text, json}; rejects on a network error or after
 * `timeout` ms. agent false = a fresh connection that is closed afterwards.
 */
export function request(url, { method = 'GET', headers = {}, body, agent = false, timeout = 15000 } = {}) {
  return new Promise((resolve, reject) => {
    const h = { ...headers };
    let data;
    if (body !== undefined) {
      data = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
      if (!Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) h['content-type'] = 'application/json';
      h['content-length'] = String(data.length);
    }
    const req = http.request(url, { method, headers: h, agent }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => {
        clearTimeout(timer);
        const text = Buffer.concat(parts).toString('utf8');
        let json;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
      res.on('error', (e) => {
        clearTimeout(timer);
        reject(e);
      });
    });
    const timer = setTimeout(() => req.destroy(new Error(`${method} ${url}: no answer within ${timeout} ms`)), timeout);
    req.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    if (data) req.write(data);
    req.end();
  });
}

/** POST /v1/chat/completions with `key`; resolves like request(). */
export function chat(gw, key, body, opts = {}) {
  return request(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, ...(opts.headers || {}) },
    body,
    ...opts,
  });
}

/** A small non-streaming chat body for `model` whose text carries mock directives. */
export function chatReq(model, text = 'hello [mock chunks=2]', extra = {}) {
  return { model, messages: [{ role: 'user', content: text }], ...extra };
}

/**
 * The admin API of gateway gw: get/post/patch/del(path, body, {token, headers}) resolve
 * with {status, headers, text, json}; `path` is relative to /admin/api/v1.
 */
export function adminClient(gw, { token = ADMIN_TOKEN, agent } = {}) {
  const call = (method, p, body, o = {}) => {
    const headers = { ...(o.headers || {}) };
    const tok = o.token === undefined ? token : o.token;
    if (tok !== null) headers.authorization = `Bearer ${tok}`;
    return request(`${gw.url}/admin/api/v1${p}`, { method, headers, body, agent: o.agent ?? agent ?? false, timeout: o.timeout ?? 15000 });
  };
  const ok = async (method, p, body, want) => {
    const r = await call(method, p, body);
    if (r.status !== want) throw new Error(`${method} ${p}: expected ${want}, got ${r.status}: ${r.text}`);
    return r.json;
  };
  return {
    get: (p, o) => call('GET', p, undefined, o),
    post: (p, b, o) => call('POST', p, b, o),
    patch: (p, b, o) => call('PATCH', p, b, o),
    del: (p, o) => call('DELETE', p, undefined, o),
    call,
    /** POST expecting 201; resolves with the JSON. */
    create: (p, b) => ok('POST', p, b, 201),
    update: (p, b) => ok('PATCH', p, b, 200),
    read: (p) => ok('GET', p, undefined, 200),
  };
}

/** Parses GET /metrics into {name or name{k="v"}: value}. */
export async function metrics(gw) {
  const r = await request(`${gw.url}/metrics`, { timeout: 5000 });
  const out = {};
  for (const line of r.text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// ---- Redis ------------------------------------------------------------------------------

/** redis-cli connection arguments for a unix:///path or redis://host:port URL. */
export function redisCliArgs(url) {
  if (url.startsWith('unix://')) return ['-s', url.slice('unix://'.length)];
  const m = /^redis:\/\/(?:[^@]*@)?([^:/]+)(?::(\d+))?(?:\/(\d+))?/.exec(url);
  if (!m) throw new Error(`unsupported Redis URL ${url}`);
  return ['-h', m[1], '-p', m[2] || '6379', ...(m[3] ? ['-n', m[3]] : [])];
}

/** Runs redis-cli against url; resolves with its trimmed stdout. */
export function redisCli(url, ...args) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', [...redisCliArgs(url), ...args], { timeout: 10000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`redis-cli ${args.join(' ')}: ${stderr || err.message}`));
      else resolve(stdout.trim());
    });
  });
}

/**
 * Every command a private redis-server (startRedis's `sock`) runs from now on, as arrays
 * of arguments, read from MONITOR: { cmds, ready (resolves once MONITOR is on), stop }.
 */
export function redisMonitor(sock) {
  const cmds = [];
  const c = net.createConnection(sock);
  let buf = '';
  c.on('data', (d) => {
    buf += d.toString('latin1');
    let i;
    while ((i = buf.indexOf('\r\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const args = [...line.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]);
      if (args.length) cmds.push(args);
    }
  });
  const ready = new Promise((resolve) => c.once('data', resolve));
  c.write('MONITOR\r\n');
  return { cmds, ready, stop: () => c.destroy() };
}

/**
 * A private redis-server on a unix socket in a temp dir (no TCP port, no persistence).
 * Returns {url, sock, pid, stop(sig), restart()}; stop() kills by PID and waits for the
 * exit. restart() starts a new server on the same socket. Register it with after().
 * `args` are added to redis-server's (e.g. a --tls-port; `url` stays the socket's).
 */
export async function startRedis({ args = [] } = {}) {
  const dir = tempDir('redis');
  const sock = path.join(dir, 'redis.sock');
  const r = { dir, sock, url: `unix://${sock}`, proc: null, pid: null };
  const launch = async () => {
    const child = spawn('redis-server', ['--port', '0', '--unixsocket', sock, '--unixsocketperm', '700', '--save', '',
      '--appendonly', 'no', '--dir', dir, '--daemonize', 'no', '--logfile', '', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      if (out.length > 1 << 16) out = out.slice(-(1 << 15));
    });
    child.stderr.on('data', (d) => {
      out += d;
    });
    const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    r.proc = child;
    r.pid = child.pid;
    r.exited = exited;
    r.output = () => out;
    try {
      await waitFor(async () => (await redisCli(r.url, 'PING')) === 'PONG', { timeout: 10000, what: 'redis PING' });
    } catch (e) {
      try {
        child.kill('SIGKILL');
      } catch {
        /* gone */
      }
      throw new Error(`${e.message}\n${out}`);
    }
  };
  r.stop = async (sig = 'SIGKILL') => {
    const { proc } = r;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    process.kill(proc.pid, sig);
    await Promise.race([r.exited, sleep(5000)]);
    if (proc.exitCode === null && proc.signalCode === null) {
      process.kill(proc.pid, 'SIGKILL');
      await r.exited;
    }
  };
  r.restart = async () => {
    await r.stop();
    await launch();
  };
  await launch();
  return r;
}

// ---- small utilities --------------------------------------------------------------------

export const sha256hex = (s) => crypto.createHash('sha256').update(s).digest('hex');

/** A plain API key that is easy to search for in dumps. */
export const plainKey = (tag = 'k') => `tgk-${tag}-${crypto.randomBytes(12).toString('hex')}`;

/** Counts of each value in a list: {200: 20, 429: 10}. */
export function tally(list) {
  const out = {};
  for (const v of list) out[v] = (out[v] || 0) + 1;
  return out;
}
