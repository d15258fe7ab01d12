// newcomer: examples/tollgate.lua documents every configuration key (issue #23). The
// loader's keys are read from its sources — each `keys[] = {...}` list of
// core/src/base/tg_config.c with the section its `c->prefix = "x."` names (none: the top
// level), and the `plugins` section's list in tg_config_plugins.c — and compared with the
// keys the example writes, commented-out ones included (a line `-- key = value` or
// `-- }` is the example's way of showing a key without a default). A key the loader
// reads and the example leaves out fails the test, and so does a key in the example the
// loader refuses: `tollgate check` must accept the example as it is and with every
// commented-out key switched on. Each key carries a comment saying what it means.

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, TG_BIN } from './lib/harness.mjs';

const EXAMPLE = path.join(REPO, 'examples/tollgate.lua');

/** Every key path the loader accepts ("listen", "upstream.url", "plugins.watch"). */
export function loaderKeys(root = REPO) {
  const keys = new Set();
  const lists = (text) => [...text.matchAll(/static const char \*const keys\[\] = \{([^}]*)\}/g)];
  const names = (body) => [...body.matchAll(/"([a-z_0-9]+)"/g)].map((m) => m[1]);
  const cfg = fs.readFileSync(path.join(root, 'core/src/base/tg_config.c'), 'utf8');
  for (const m of lists(cfg)) {
    const after = cfg.slice(m.index + m[0].length, m.index + m[0].length + 400);
    const prefix = /^;?\s*c->prefix = "([a-z_]+\.)";/.exec(after)?.[1] ?? '';
    for (const k of names(m[1])) keys.add(prefix + k);
  }
  const plug = fs.readFileSync(path.join(root, 'core/src/base/tg_config_plugins.c'), 'utf8');
  for (const m of lists(plug)) for (const k of names(m[1])) keys.add(`plugins.${k}`);
  for (const m of plug.matchAll(/static const char \*const capture_keys\[\] = \{([^}]*)\}/g)) {
    for (const k of names(m[1])) keys.add(`plugins.capture.${k}`);
  }
  // A section name is a key too; its members say what it holds.
  for (const k of [...keys]) if (k.includes('.')) keys.add(k.split('.')[0]);
  return keys;
}

/** The example with its commented-out keys switched on. */
export function everythingOn(text) {
  return text
    .split('\n')
    .map((l) => l.replace(/^(\s*)--\s*(?=[A-Za-z_][A-Za-z0-9_]*\s*=|\},?\s*(--.*)?$)/, '$1'))
    .join('\n');
}

/** Key paths of a config file, read by LuaJIT (tables with string keys are sections). */
function exampleKeys(file) {
  const lua = `
    os.getenv = function() return "set" end -- every key the environment may fill is shown
    local f = assert(loadfile(arg[1]))
    local function walk(t, prefix)
      for k, v in pairs(t) do
        if type(k) == "string" then
          print(prefix .. k)
          if type(v) == "table" and next(v) ~= nil and type(next(v)) == "string" then walk(v, prefix .. k .. ".") end
        end
      end
    end
    walk(f(), "")`;
  const script = path.join(path.dirname(file), 'keys.lua');
  fs.writeFileSync(script, lua);
  const out = execFileSync('luajit', [script, file], { encoding: 'utf8' });
  return new Set(out.split('\n').filter(Boolean));
}

function check(file) {
  const env = { ...process.env };
  for (const k of ['TOLLGATE_PG', 'TOLLGATE_REDIS']) delete env[k];
  return spawnSync(TG_BIN, ['check', '-c', file], { cwd: REPO, encoding: 'utf8', env });
}

test('the loader keys are found in its sources (the extraction itself works)', () => {
  const k = loaderKeys();
  for (const want of ['listen', 'workers', 'upstream.url', 'limits.max_body_bytes', 'limiter.queue_max', 'routing.max_attempts',
    'billing.unknown_usage', 'plugins.max_hook_ms', 'tls.cert', 'max_tokens_models']) {
    assert.ok(k.has(want), `${want} among ${[...k].join(' ')}`);
  }
  assert.ok(k.size > 50, `${k.size} keys`);
});

test('examples/tollgate.lua writes every key the loader accepts, and none it refuses', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-cfg-'));
  try {
    const on = path.join(tmp, 'tollgate.lua');
    fs.writeFileSync(on, everythingOn(fs.readFileSync(EXAMPLE, 'utf8')));
    const ex = exampleKeys(on);
    const loader = loaderKeys();
    const missing = [...loader].filter((k) => !ex.has(k)).sort();
    const refused = [...ex].filter((k) => !loader.has(k)).sort();
    assert.deepEqual(missing, [], `keys the loader accepts that examples/tollgate.lua does not document: ${missing.join(', ')}`);
    assert.deepEqual(refused, [], `keys in examples/tollgate.lua the loader does not know: ${refused.join(', ')}`);
    const r = check(on);
    assert.equal(r.status, 0, `tollgate check of the example with every key on:\n${r.stdout}${r.stderr}`);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test('tollgate check accepts examples/tollgate.lua as shipped', () => {
  const r = check(EXAMPLE);
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /config ok: listen 127\.0\.0\.1:8080/);
});

test('every key in the example says what it means (a comment on its line or just above)', () => {
  const lines = fs.readFileSync(EXAMPLE, 'utf8').split('\n');
  const undocumented = [];
  for (const key of loaderKeys()) {
    const name = key.split('.').pop();
    const re = new RegExp(`^\\s*(--\\s*)?${name}\\s*=`);
    const ok = lines.some((l, i) => re.test(l) && (/=.*--/.test(l.replace(/^\s*--/, '')) || /^\s*--/.test(lines[i - 1] || '')));
    if (!ok) undocumented.push(key);
  }
  assert.deepEqual(undocumented, []);
});

test('the checker fails on a key the example leaves out, and on one the loader refuses', () => {
  const text = everythingOn(fs.readFileSync(EXAMPLE, 'utf8'));
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-cfg-'));
  try {
    const f = path.join(tmp, 'c.lua');
    fs.writeFileSync(f, text.replace(/^\s*queue_timeout_ms = .*$/m, ''));
    assert.ok(!exampleKeys(f).has('limiter.queue_timeout_ms'));
    fs.writeFileSync(f, text.replace('workers = 0,', 'workers = 0, worker_count = 2,'));
    assert.ok(exampleKeys(f).has('worker_count') && !loaderKeys().has('worker_count'));
    const r = check(f);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /config: worker_count: unknown key/);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
