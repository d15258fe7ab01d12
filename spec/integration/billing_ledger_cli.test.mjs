// `tollgate ledger` with bad arguments: every mistake gets one clear line on stderr and
// exit 2 (not 1, which means "the ledger is wrong", and never a crash), and nothing is
// written. An unreachable database is an error to report, not a verdict on the ledger.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { TG_BIN } from './lib/harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-ledger-cli-'));
const write = (name, text) => {
  const p = path.join(dir, name);
  fs.writeFileSync(p, text);
  return p;
};
const good = write('good.lua', 'return { upstream = { url = "http://127.0.0.1:9/v1" } }\n');
const syntax = write('syntax.lua', 'return {\n');
const noPg = write('nopg.lua', 'return { upstream = { url = "http://127.0.0.1:9/v1" }, postgres = "host=/nonexistent-socket-dir" }\n');

function run(args, env = {}) {
  const e = { ...process.env, ...env };
  for (const [k, v] of Object.entries(e)) if (v === null) delete e[k];
  return spawnSync(TG_BIN, ['ledger', ...args], { env: e, encoding: 'utf8', timeout: 30000 });
}

function assertUsageError(r, what, pattern) {
  assert.equal(r.signal, null, `${what}: no crash`);
  assert.equal(r.status, 2, `${what}: exit 2 (got ${r.status}; stderr ${r.stderr})`);
  const lines = r.stderr.trim().split('\n').filter(Boolean);
  assert.equal(lines.length, 1, `${what}: one line on stderr, got ${JSON.stringify(r.stderr)}`);
  if (pattern) assert.match(lines[0], pattern, what);
  assert.equal(r.stdout, '', `${what}: nothing on stdout`);
}

test('missing or unknown subcommands and options: one line, exit 2', () => {
  assertUsageError(run([]), 'no subcommand', /usage: tollgate ledger/);
  assertUsageError(run(['audit']), 'unknown subcommand', /usage: tollgate ledger/);
  assertUsageError(run(['verify']), 'no -c', /-c FILE/);
  assertUsageError(run(['reconcile']), 'reconcile without -c', /-c FILE/);
  assertUsageError(run(['verify', '-c']), '-c without a file');
  assertUsageError(run(['verify', '--bogus', '-c', good]), 'unknown option');
  assertUsageError(run(['verify', '-c', good, 'extra']), 'a stray argument');
  assertUsageError(run(['verify', '-c', 'x'.repeat(100000)]), 'a huge path');
});

test('bad configuration files: one line naming the problem, exit 2', () => {
  assertUsageError(run(['verify', '-c', path.join(dir, 'missing.lua')]), 'missing file', /cannot open/);
  assertUsageError(run(['verify', '-c', syntax]), 'Lua syntax error', /syntax\.lua/);
  assertUsageError(run(['verify', '-c', dir]), 'a directory');
});

test('no database, or one that cannot be reached: an error (exit 2), not a ledger verdict', () => {
  // libpq's own message may span lines; what matters is the exit code and that it says why.
  const none = run(['verify', '-c', noPg], { TOLLGATE_PG: null, TOLLGATE_REDIS: null });
  assert.equal(none.signal, null);
  assert.equal(none.status, 2, `no database configured: exit 2 (got ${none.status}; ${none.stderr})`);
  assert.match(none.stderr.split('\n')[0], /postgres/i);
  const r = run(['verify', '-c', good], { TOLLGATE_PG: 'host=/nonexistent-socket-dir dbname=x connect_timeout=2', TOLLGATE_REDIS: null });
  assert.equal(r.signal, null);
  assert.equal(r.status, 2, `unreachable database: exit 2 (got ${r.status}; ${r.stderr})`);
  assert.ok(r.stderr.trim().length > 0);
});
