// `tollgate policy test` with malformed arguments and inputs: every mistake an operator
// can make on the command line (a missing or unknown policy, a missing, unreadable or
// empty requests file, a bad option, a bad config) is one clear line on stderr and a
// non-zero exit, never a crash, a usage dump or a silent success; bad lines of a
// requests file are named by file and line number.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, TG_BIN, tempDir } from './lib/harness.mjs';

const POLICY = path.join(REPO, 'policies', 'tenant-region.lua');
const EXAMPLE = path.join(REPO, 'policies', 'requests.example.jsonl');
const GOOD_LINE = JSON.stringify({ id: 'r1', model: 'gpt-4o', tenant_id: 'acme', accounts: [{ id: 'eu-1', region: 'eu' }, { id: 'us-1', region: 'us' }] });

function policy(args, { input } = {}) {
  const r = spawnSync(TG_BIN, ['policy', ...args], { cwd: REPO, encoding: 'utf8', timeout: 20000, input, maxBuffer: 64 << 20 });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

function file(name, text) {
  const p = path.join(tempDir('policy'), name);
  fs.writeFileSync(p, text);
  return p;
}

/** Exit 2, nothing on stdout, exactly one line on stderr matching re. */
function assertOneLine(r, re, what) {
  assert.equal(r.signal, null, `${what}: killed by ${r.signal}`);
  assert.equal(r.code, 2, `${what}: exit ${r.code}\n${r.stderr}`);
  assert.equal(r.stdout, '', `${what}: stdout: ${r.stdout}`);
  const lines = r.stderr.split('\n').filter(Boolean);
  assert.equal(lines.length, 1, `${what}: one line, got:\n${r.stderr}`);
  assert.match(lines[0], re, what);
}

test('the example runs (what the error cases below are measured against)', () => {
  const r = policy(['test', POLICY, '--config', '{tenants = {acme = "eu"}}', '--requests', EXAMPLE]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /\d+ requests, 0 plugin errors, 0 bad lines/);
});

test('argument mistakes: one line naming the problem, exit 2', () => {
  const cases = [
    [[], /^tollgate policy: missing subcommand \(expected: test\)/],
    [['tset', POLICY], /^tollgate policy: unknown subcommand "tset" \(expected: test\)$/],
    [['test'], /^tollgate policy test: missing POLICY/],
    [['test', '--requests', EXAMPLE], /^tollgate policy test: missing POLICY/],
    [['test', POLICY], /^tollgate policy test: missing --requests FILE\.jsonl/],
    [['test', POLICY, '--requests'], /^tollgate policy test: --requests needs a value/],
    [['test', POLICY, '--requests', EXAMPLE, '--config'], /^tollgate policy test: --config needs a value/],
    [['test', POLICY, '--requests', EXAMPLE, '--bogus'], /^tollgate policy test: unexpected argument "--bogus"/],
    [['test', POLICY, POLICY, '--requests', EXAMPLE], /^tollgate policy test: unexpected argument ".*tenant-region\.lua"/],
    [['test', POLICY, '--requests', EXAMPLE, '--seed', '12abc'], /^tollgate policy test: --seed: expected a whole number, got "12abc"/],
    [['test', POLICY, '--requests', EXAMPLE, ...Array(17).fill(['--with', 'router']).flat()], /^tollgate policy test: too many --with \(at most 16\)/],
  ];
  for (const [args, re] of cases) assertOneLine(policy(args), re, args.join(' ') || '(no arguments)');
});

test('an unknown, broken or misconfigured policy: one line, exit 2', () => {
  assertOneLine(policy(['test', 'no-such-policy', '--requests', EXAMPLE]),
    /^tollgate policy test: no policy "no-such-policy" \(not a file or folder, not in \/.*\/plugins,\/.*\/policies\)$/, 'unknown name');
  assertOneLine(policy(['test', '/nonexistent/dir/p.lua', '--requests', EXAMPLE]), /^tollgate policy test: no policy "\/nonexistent\/dir\/p\.lua"/, 'missing file');
  const syntax = file('syn.lua', 'return { name = "syn", priority = ');
  assertOneLine(policy(['test', syntax, '--requests', EXAMPLE]), /^tollgate policy test: plugins\.syn: .*syn\.lua:1:/, 'syntax error');
  const throws = file('boom.lua', 'error("boom at load")');
  assertOneLine(policy(['test', throws, '--requests', EXAMPLE]), /^tollgate policy test: plugins\.boom: .*boom at load/, 'throws at load');
  const notable = file('num.lua', 'return 42');
  assertOneLine(policy(['test', notable, '--requests', EXAMPLE]), /^tollgate policy test: plugins\.num: .* must return a table, got number/, 'not a table');
  assertOneLine(policy(['test', POLICY, '--requests', EXAMPLE, '--config', '{strict = "yes"}']),
    /^tollgate policy test: plugins\.tenant-region\.config\.strict: expected boolean, got string$/, 'wrong config type');
  assertOneLine(policy(['test', POLICY, '--requests', EXAMPLE, '--config', '{tenants = ']),
    /^tollgate policy test: plugins\.tenant-region\.config: /, 'config is not Lua');
  assertOneLine(policy(['test', POLICY, '--requests', EXAMPLE, '--config', '{tenatns = {}}']),
    /^tollgate policy test: plugins\.tenant-region\.config\.tenatns: unknown field$/, 'unknown config field');
  assertOneLine(policy(['test', POLICY, '--requests', EXAMPLE, '--with', 'no-such-plugin']),
    /^tollgate policy test: plugins\.no-such-plugin: not found/, 'unknown --with');
});

test('a missing, unreadable or empty requests file: one line, exit 2', () => {
  assertOneLine(policy(['test', POLICY, '--requests', '/nonexistent/requests.jsonl']),
    /^tollgate policy test: --requests \/nonexistent\/requests\.jsonl: No such file or directory/, 'missing');
  const dir = tempDir('reqdir');
  assertOneLine(policy(['test', POLICY, '--requests', dir]), /: not a regular file/, 'a directory');
  const empty = file('empty.jsonl', '# only a comment\n\n');
  const r = policy(['test', POLICY, '--requests', empty]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /^tollgate policy test: .*empty\.jsonl holds no requests \(one JSON object per line\)$/m);
  const stdin = policy(['test', POLICY, '--requests', '-'], { input: '' });
  assert.equal(stdin.code, 2);
  assert.match(stdin.stderr, /- holds no requests/);
});

test('bad lines of a requests file are named by file:line; the good ones still run; exit 2', () => {
  let nested = '1';
  for (let i = 0; i < 5000; i++) nested = `[${nested}]`;
  const lines = [
    GOOD_LINE,
    '{"model": "gpt-4o", ',                                  // 2: truncated JSON
    '[1, 2, 3]',                                             // 3: not an object
    '"just a string"',                                       // 4
    JSON.stringify({ id: 'no-model', tenant_id: 'acme' }),   // 5: model is required
    JSON.stringify({ model: 'gpt-4o', now: 'yesterday' }),   // 6: bad timestamp
    `{"model": "gpt-4o", "x": ${nested}}`,                   // 7: hostile nesting
    JSON.stringify({ model: 'm', pad: 'x'.repeat(2 << 20) }), // 8: a 2 MiB line is fine
    GOOD_LINE,
  ];
  const reqs = file('mixed.jsonl', `${lines.join('\n')}\n`);
  const r = policy(['test', POLICY, '--config', '{tenants = {acme = "eu"}}', '--requests', reqs]);
  assert.equal(r.signal, null);
  assert.equal(r.code, 2, r.stderr);
  const err = r.stderr.split('\n').filter(Boolean);
  const at = (n) => err.find((l) => l.startsWith(`${reqs}:${n}: `));
  assert.match(at(2) || '', /not valid JSON/);
  assert.match(at(3) || '', /expected a JSON object \(a request context\), got an array/);
  assert.match(at(4) || '', /expected a JSON object \(a request context\), got a string/);
  assert.match(at(5) || '', /"model" \(a string\) is required/);
  assert.match(at(6) || '', /"now": expected 2024-01-15T10:00:00Z, got "yesterday"/);
  assert.match(at(7) || '', /not valid JSON/);
  assert.equal(err.length, 6, r.stderr);
  assert.match(r.stdout, /3 requests, 0 plugin errors, 6 bad lines/);
  assert.equal((r.stdout.match(/^r1 {2}model/gm) || []).length, 2, r.stdout);
});
