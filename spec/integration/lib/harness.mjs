// The integration-test harness: starts the real `tollgate` binary (the gateway and its
// mock upstream) as child processes on 127.0.0.1, waits until they are ready, captures
// what they print, and stops them by PID. Every test file builds on it:
//
//   const mock = await startMock();
//   const gw = await startGateway({ upstream: { url: mock.url + '/v1' } });
//   ...
//   after(() => stopAll());
//
// The binary is $TG_BIN, by default <repo>/build/tollgate. Every wait here is bounded
// by a deadline; nothing talks to any address but 127.0.0.1.

import { spawn, execFileSync } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const TG_BIN = process.env.TG_BIN || path.join(REPO, 'build', 'tollgate');
export const HOST = '127.0.0.1';
export const CLIENT_KEY = 'tg-test-key';
export const UPSTREAM_KEY = 'sk-upstream-1';
export const ADMIN_TOKEN = 'adm-test';
export const MODEL = 'gpt-4o-mini';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A port that was free a moment ago: listen on port 0, note the port, close. */
export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, HOST);
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

/** Polls fn() every `interval` ms until it returns a truthy value or `timeout` ms pass. */
export async function waitFor(fn, { timeout = 5000, interval = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() >= deadline) {
      const detail = last instanceof Error ? `: ${last.message}` : '';
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${detail}`);
    }
    await sleep(interval);
  }
}

let tmpRoot;
/** A fresh directory under one per-process temp root (removed by stopAll). */
export function tempDir(prefix = 'd') {
  if (!tmpRoot) tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-it-'));
  return fs.mkdtempSync(path.join(tmpRoot, `${prefix}-`));
}

const live = new Set();
const stopped = new Set();

/**
 * A child process with its output captured line by line. `lines.stdout` and
 * `lines.stderr` grow as it prints; `exited` resolves to {code, signal}.
 */
export class Proc {
  constructor(name, args, { env } = {}) {
    if (!fs.existsSync(TG_BIN)) throw new Error(`no tollgate binary at ${TG_BIN} (set TG_BIN or build it)`);
    this.name = name;
    // A null value removes the variable from the child's environment.
    const childEnv = { ...process.env, ...env };
    for (const [k, v] of Object.entries(childEnv)) if (v === null || v === undefined) delete childEnv[k];
    this.child = spawn(TG_BIN, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: childEnv,
    });
    this.pid = this.child.pid;
    this.lines = { stdout: [], stderr: [] };
    this.exit = null;
    this.waiters = [];
    for (const stream of ['stdout', 'stderr']) {
      let partial = '';
      this.child[stream].setEncoding('utf8');
      this.child[stream].on('data', (s) => {
        partial += s;
        const parts = partial.split('\n');
        partial = parts.pop();
        for (const l of parts) this.lines[stream].push(l);
        this.waiters = this.waiters.filter((w) => !w());
      });
      this.child[stream].on('end', () => {
        if (partial) this.lines[stream].push(partial);
        partial = '';
      });
    }
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => {
        this.exit = { code, signal };
        resolve(this.exit);
      });
    });
    // Wait for the pipes to drain too, so every line printed before exit is in `lines`.
    this.closed = new Promise((resolve) => this.child.on('close', () => resolve(this.exit)));
    live.add(this);
  }

  get running() {
    return this.exit === null;
  }

  /** The last n lines of stderr and stdout, for error messages. */
  tail(n = 30) {
    return `--- ${this.name} stderr ---\n${this.lines.stderr.slice(-n).join('\n')}\n` +
      `--- ${this.name} stdout ---\n${this.lines.stdout.slice(-n).join('\n')}`;
  }

  /** Resolves with the first line of `stream` matching re (already printed or future). */
  waitForLine(stream, re, timeout = 5000) {
    const found = () => this.lines[stream].find((l) => re.test(l));
    const hit = found();
    if (hit !== undefined) return Promise.resolve(hit);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        reject(new Error(`${this.name}: no ${stream} line matching ${re} within ${timeout} ms\n${this.tail()}`));
      }, timeout);
      const check = () => {
        const l = found();
        if (l === undefined) return false;
        clearTimeout(timer);
        resolve(l);
        return true;
      };
      this.waiters.push(check);
    });
  }

  signal(sig) {
    if (this.running) process.kill(this.pid, sig);
  }

  /** SIGTERM, then SIGKILL if still alive after `grace` ms. Resolves with the exit. */
  async stop(grace = 5000) {
    if (live.delete(this)) stopped.add(this);
    if (this.running) {
      this.stoppedBySigterm = true;
      try {
        process.kill(this.pid, 'SIGTERM');
      } catch {
        /* already gone */
      }
      const timer = setTimeout(() => {
        try {
          process.kill(this.pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
        this.killed = true;
      }, grace);
      await this.exited;
      clearTimeout(timer);
    }
    await Promise.race([this.closed, sleep(1000)]);
    return this.exit;
  }
}

const SANITIZER = /AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:/;

/**
 * Stops every process the harness started and removes the temp root. Then fails (so
 * the test file's after() hook fails) if any of them printed a sanitizer report, or
 * did not exit 0 on SIGTERM: a clean shutdown is part of the contract.
 */
export async function stopAll() {
  const procs = [...live, ...stopped];
  await Promise.all([...live].map((p) => p.stop()));
  stopped.clear();
  if (tmpRoot && !process.env.TG_KEEP_TMP) fs.rmSync(tmpRoot, { recursive: true, force: true });
  tmpRoot = undefined;
  const problems = [];
  for (const p of procs) {
    const id = `${p.name} (pid ${p.pid})`;
    if (p.lines.stderr.some((l) => SANITIZER.test(l))) problems.push(`${id} printed a sanitizer report`);
    else if (p.exit?.signal && p.exit.signal !== 'SIGTERM' && p.exit.signal !== 'SIGKILL') problems.push(`${id} crashed: ${p.exit.signal}`);
    else if (p.killed) problems.push(`${id} did not exit within 5 s of SIGTERM`);
    else if (p.stoppedBySigterm && p.exit?.code !== 0) problems.push(`${id} exited ${JSON.stringify(p.exit)} on SIGTERM`);
  }
  if (problems.length) {
    throw new Error(`${problems.join('\n')}\n${procs.filter((p) => problems.some((x) => x.includes(`pid ${p.pid}`))).map((p) => p.tail(60)).join('\n')}`);
  }
}

/** Plain fetch with a deadline. */
export function fetchT(url, init = {}, timeout = 10000) {
  return fetch(url, { ...init, signal: init.signal ?? AbortSignal.timeout(timeout) });
}

/**
 * Starts `tollgate mock-upstream` on a free port. Returns
 * {url, port, proc, stats(), reset(), last(), stop()}.
 */
export async function startMock({ args = [] } = {}) {
  const port = await freePort();
  const proc = new Proc('mock', ['mock-upstream', '--listen', `${HOST}:${port}`, ...args]);
  const url = `http://${HOST}:${port}`;
  try {
    await Promise.race([
      proc.waitForLine('stderr', /mock-upstream listening on/, 10000),
      proc.exited.then((e) => {
        throw new Error(`mock exited early (${JSON.stringify(e)})\n${proc.tail()}`);
      }),
    ]);
    await waitFor(async () => (await fetchT(`${url}/_mock/stats`, {}, 1000)).ok, {
      timeout: 5000,
      what: 'mock /_mock/stats',
    });
  } catch (e) {
    await proc.stop();
    throw e;
  }
  const getJson = async (p, init) => {
    const r = await fetchT(url + p, init);
    if (!r.ok) throw new Error(`mock ${p}: HTTP ${r.status}`);
    return r.json();
  };
  return {
    url,
    port,
    proc,
    stats: () => getJson('/_mock/stats'),
    reset: async () => {
      const r = await fetchT(`${url}/_mock/reset`, { method: 'POST' });
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`mock reset: HTTP ${r.status}`);
    },
    last: () => getJson('/_mock/last'),
    stop: () => proc.stop(),
  };
}

/** Renders a JS value as a Lua expression (tables, strings, numbers, booleans). */
export function toLua(v, indent = '') {
  if (v === null || v === undefined) return 'nil';
  if (typeof v === 'string') return JSON.stringify(v); // JSON string escapes are valid Lua
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  const inner = indent + '  ';
  if (Array.isArray(v)) return `{ ${v.map((x) => toLua(x, inner)).join(', ')} }`;
  const fields = Object.entries(v)
    .filter(([, x]) => x !== undefined)
    .map(([k, x]) => `${inner}${/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) ? k : `[${JSON.stringify(k)}]`} = ${toLua(x, inner)},`);
  return `{\n${fields.join('\n')}\n${indent}}`;
}

function merge(base, over) {
  const out = { ...base };
  for (const [k, v] of Object.entries(over || {})) {
    out[k] = v && typeof v === 'object' && !Array.isArray(v) && base[k] && typeof base[k] === 'object'
      ? merge(base[k], v)
      : v;
  }
  return out;
}

/**
 * Starts `tollgate serve` with the contract's default config merged with `overrides`
 * (a nested object; `upstream.url` is required unless `mock` is given). Resolves once
 * GET /healthz answers 200. Returns {url, baseURL, port, config, proc, dir, stop()}.
 * With `tls: true` in opts a self-signed certificate is made and a TLS listener added;
 * then `tlsUrl`, `tlsBaseURL` and `ca` (the PEM) are also returned.
 */
export async function startGateway(overrides = {}, { mock, tls = false, env } = {}) {
  const dir = tempDir('gw');
  const port = await freePort();
  let config = {
    listen: `${HOST}:${port}`,
    workers: 2,
    admin_token: ADMIN_TOKEN,
    keys: [CLIENT_KEY],
    upstream: {
      url: mock ? `${mock.url}/v1` : undefined,
      api_key: UPSTREAM_KEY,
      connect_timeout_ms: 2000,
      first_byte_timeout_ms: 3000,
      idle_timeout_ms: 5000,
    },
    limits: {
      max_body_bytes: 1048576,
      max_header_bytes: 16384,
      header_timeout_ms: 2000,
      body_timeout_ms: 5000,
      idle_timeout_ms: 10000,
      shutdown_timeout_ms: 5000,
    },
  };
  let ca;
  let tlsPort;
  if (tls) {
    tlsPort = await freePort();
    const cert = path.join(dir, 'cert.pem');
    const key = path.join(dir, 'key.pem');
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', `/CN=${HOST}`,
      '-addext', `subjectAltName=IP:${HOST}`, '-days', '1', '-keyout', key, '-out', cert], { stdio: 'ignore' });
    ca = fs.readFileSync(cert, 'utf8');
    config.tls = { listen: `${HOST}:${tlsPort}`, cert, key };
  }
  config = merge(config, overrides);
  const cfgPath = path.join(dir, 'tollgate.lua');
  fs.writeFileSync(cfgPath, `return ${toLua(config)}\n`);
  // The gateway uses Postgres and Redis only when a test asks for them (env or config):
  // spec/run.sh exports TOLLGATE_PG / TOLLGATE_REDIS for the tests that do.
  const proc = new Proc('gateway', ['serve', '-c', cfgPath], {
    env: { TOLLGATE_PG: null, TOLLGATE_REDIS: null, ...env },
  });
  const url = `http://${HOST}:${port}`;
  try {
    await Promise.race([
      waitFor(async () => (await fetchT(`${url}/healthz`, {}, 1000)).status === 200, {
        timeout: 15000,
        what: 'gateway /healthz',
      }),
      proc.exited.then((e) => {
        throw new Error(`gateway exited early (${JSON.stringify(e)})`);
      }),
    ]);
  } catch (e) {
    await proc.stop();
    e.message += `\nconfig:\n${fs.readFileSync(cfgPath, 'utf8')}\n${proc.tail()}`;
    throw e;
  }
  const gw = { url, baseURL: `${url}/v1`, port, config, proc, dir, stop: (g) => proc.stop(g) };
  if (tls) Object.assign(gw, { tlsPort, tlsUrl: `https://${HOST}:${tlsPort}`, tlsBaseURL: `https://${HOST}:${tlsPort}/v1`, ca });
  return gw;
}

/** An OpenAI SDK client for the gateway: no retries, a bounded timeout. */
export async function openaiClient(gw, opts = {}) {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: CLIENT_KEY, baseURL: gw.baseURL, maxRetries: 0, timeout: 30000, ...opts });
}

/** A chat request body whose user message carries a mock directive. */
export function chatBody(text, extra = {}) {
  return { model: MODEL, messages: [{ role: 'user', content: text }], ...extra };
}

/** POSTs JSON with fetch to `base` + path; resolves with {status, headers, text, json}. */
export async function postJson(base, p, body, { key = CLIENT_KEY, headers = {}, timeout = 15000 } = {}) {
  const h = { 'content-type': 'application/json', ...headers };
  if (key !== null) h.authorization = `Bearer ${key}`;
  const r = await fetchT(base + p, { method: 'POST', headers: h, body: typeof body === 'string' ? body : JSON.stringify(body) }, timeout);
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, text, json };
}

/**
 * What the mock itself answers to `body` (sent straight to it, not via the gateway):
 * for a stream, the concatenated delta text; otherwise the parsed JSON.
 */
export async function mockDirect(mock, body) {
  const r = await fetchT(`${mock.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${UPSTREAM_KEY}` },
    body: JSON.stringify(body),
  }, 30000);
  const text = await r.text();
  if (!body.stream) return { status: r.status, headers: r.headers, text, json: JSON.parse(text) };
  return { status: r.status, headers: r.headers, text, content: sseContent(text) };
}

/** Concatenates choices[0].delta.content over the data: events of an SSE body. */
export function sseContent(text) {
  let out = '';
  for (const line of text.split('\n')) {
    const m = /^data: ?(.*)$/.exec(line.replace(/\r$/, ''));
    if (!m || m[1] === '[DONE]') continue;
    const ev = JSON.parse(m[1]);
    out += ev.choices?.[0]?.delta?.content ?? '';
  }
  return out;
}

/**
 * A raw TCP connection to host:port with everything it receives buffered. Used for
 * the tests that need exact bytes on the wire (pipelining, hostile requests, timeouts).
 */
export class RawConn {
  static async open(port, host = HOST) {
    const c = new RawConn(net.connect(port, host));
    await Promise.race([once(c.sock, 'connect'), c.closedP.then(() => {
      throw new Error(`connect to ${host}:${port} failed: ${c.error?.code}`);
    })]);
    return c;
  }

  constructor(sock) {
    this.sock = sock;
    this.buf = Buffer.alloc(0);
    this.closed = false;
    this.error = null;
    this.waiters = [];
    sock.on('data', (d) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.notify();
    });
    sock.on('error', (e) => {
      this.error = e;
    });
    this.closedP = new Promise((resolve) => sock.on('close', () => {
      this.closed = true;
      this.closedAt = Date.now();
      this.notify();
      resolve();
    }));
  }

  notify() {
    this.waiters = this.waiters.filter((w) => !w());
  }

  /** Writes bytes; write errors (EPIPE, ECONNRESET) are recorded, not thrown. */
  write(data) {
    return new Promise((resolve) => {
      if (this.closed || this.sock.destroyed) return resolve(false);
      this.sock.write(data, (err) => resolve(!err));
    });
  }

  /** Resolves when pred(this) holds, the socket closes, or timeout ms pass. */
  until(pred, timeout) {
    return new Promise((resolve) => {
      let timer;
      const check = () => {
        if (pred(this) || this.closed) {
          clearTimeout(timer);
          resolve(pred(this));
          return true;
        }
        return false;
      };
      if (check()) return;
      timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        resolve(false);
      }, timeout);
      this.waiters.push(check);
    });
  }

  /** Resolves with the next complete HTTP response (consumed from the buffer) or null. */
  async response(timeout = 10000) {
    let res = null;
    await this.until(() => (res = parseResponse(this.buf)) !== null, timeout);
    if (!res) res = parseResponse(this.buf, this.closed);
    if (res) this.buf = this.buf.subarray(res.size);
    return res;
  }

  /** Resolves true once the peer closes the connection, false after timeout ms. */
  async waitClose(timeout) {
    await this.until(() => false, timeout);
    return this.closed;
  }

  destroy() {
    this.sock.destroy();
  }
}

/**
 * Parses one HTTP/1.1 response from the start of buf. Returns null while incomplete;
 * otherwise {status, reason, headers (lower-case names; arrays for repeats via
 * rawHeaders), body (Buffer), text, json, size (bytes consumed)}. With `eof` true a
 * body delimited by connection close is complete.
 */
export function parseResponse(buf, eof = false) {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const head = buf.subarray(0, end).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3}) ?(.*)$/.exec(head[0]);
  if (!m) throw new Error(`not an HTTP response: ${JSON.stringify(head[0])}`);
  const headers = {};
  const rawHeaders = [];
  for (const l of head.slice(1)) {
    const i = l.indexOf(':');
    const k = l.slice(0, i).trim().toLowerCase();
    const v = l.slice(i + 1).trim();
    rawHeaders.push([k, v]);
    headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
  }
  const status = Number(m[1]);
  let pos = end + 4;
  let body;
  if (status === 204 || status === 304 || (status >= 100 && status < 200)) {
    body = Buffer.alloc(0);
  } else if (/chunked/i.test(headers['transfer-encoding'] || '')) {
    const parts = [];
    for (;;) {
      const le = buf.indexOf('\r\n', pos);
      if (le < 0) return null;
      const n = parseInt(buf.subarray(pos, le).toString('latin1'), 16);
      if (Number.isNaN(n)) throw new Error('bad chunk size');
      if (n === 0) {
        const te = buf.indexOf('\r\n\r\n', le);
        if (te < 0) {
          if (buf.length >= le + 4 && buf.subarray(le, le + 4).toString() === '\r\n\r\n') break;
          return null;
        }
        pos = te + 4;
        break;
      }
      if (buf.length < le + 2 + n + 2) return null;
      parts.push(buf.subarray(le + 2, le + 2 + n));
      pos = le + 2 + n + 2;
    }
    body = Buffer.concat(parts);
  } else if (headers['content-length'] !== undefined) {
    const n = Number(headers['content-length']);
    if (buf.length < pos + n) return null;
    body = buf.subarray(pos, pos + n);
    pos += n;
  } else {
    if (!eof) return null;
    body = buf.subarray(pos);
    pos = buf.length;
  }
  const text = body.toString('utf8');
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status, reason: m[2], headers, rawHeaders, body, text, json, size: pos };
}

/** Builds a raw HTTP/1.1 request. body may be a string, Buffer or undefined. */
export function rawRequest(method, p, { body, headers = {}, key = CLIENT_KEY, port } = {}) {
  const h = { host: `${HOST}${port ? `:${port}` : ''}`, ...headers };
  if (key !== null && !('authorization' in h)) h.authorization = `Bearer ${key}`;
  const b = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  if (b && !('content-length' in h) && !('transfer-encoding' in h)) h['content-length'] = String(b.length);
  if (b && !('content-type' in h)) h['content-type'] = 'application/json';
  const headText = `${method} ${p} HTTP/1.1\r\n${Object.entries(h).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
  return b ? Buffer.concat([Buffer.from(headText, 'latin1'), b]) : Buffer.from(headText, 'latin1');
}

/** Parses Prometheus text into [{name, labels:{}, value}]. */
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const lm of (m[2] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/**
 * The mock's usage formula (see the top of core/src/mock/tg_mock.c): input tokens are
 * ceil(UTF-8 bytes of the text in system/instructions/messages/input / 4), at least 1.
 */
export function mockInputTokens(body) {
  const bytes = (v) => {
    if (typeof v === 'string') return Buffer.byteLength(v, 'utf8');
    if (Array.isArray(v)) return v.reduce((a, x) => a + bytes(x), 0);
    if (v && typeof v === 'object') return bytes(v.text) + bytes(v.content);
    return 0;
  };
  const n = ['system', 'instructions', 'messages', 'input'].reduce((a, k) => a + bytes(body[k]), 0);
  return Math.max(1, Math.ceil(n / 4));
}

/** The mock's answer of n chunks: "tok1 tok2 ... tokN ". */
export function mockText(n) {
  let s = '';
  for (let i = 1; i <= n; i++) s += `tok${i} `;
  return s;
}
