// scale (#21, item 4): examples/systemd/tollgate.service is a valid, hardened unit.
// systemd-analyze verify reads it (with ExecStart pointing at this build's binary, since
// verify checks that the program exists) and says nothing; systemd-analyze security
// --offline rates its exposure "OK" (at most 2.0 of 10); the hardening an SRE looks for
// is there. Skipped (77) where systemd-analyze is not installed.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, TG_BIN } from './lib/harness.mjs';

const UNIT = path.join(REPO, 'examples/systemd/tollgate.service');
if (spawnSync('systemd-analyze', ['--version']).status !== 0) {
  console.log('skipped: no systemd-analyze');
  process.exit(77);
}

function copy() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-unit-'));
  const p = path.join(dir, 'tollgate.service');
  fs.writeFileSync(p, fs.readFileSync(UNIT, 'utf8').replaceAll('/usr/local/bin/tollgate', TG_BIN));
  return p;
}

test('systemd-analyze verify accepts the unit without a word', () => {
  const p = copy();
  const r = spawnSync('systemd-analyze', ['verify', p], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(`${r.stdout}${r.stderr}`.trim(), '', 'no warning (an unknown or misspelt setting is only a warning)');
});

test('systemd-analyze security rates its exposure OK', () => {
  const p = copy();
  const r = spawnSync('systemd-analyze', ['security', '--offline=true', p], { encoding: 'utf8' });
  const m = /Overall exposure level for \S+: ([0-9.]+) (\w+)/.exec(r.stdout);
  assert.ok(m, r.stdout + r.stderr);
  assert.ok(Number(m[1]) <= 2.0, `exposure ${m[1]} ${m[2]}`);
});

test('the hardening and the limits are there', () => {
  const text = fs.readFileSync(UNIT, 'utf8');
  for (const line of ['DynamicUser=yes', 'ProtectSystem=strict', 'NoNewPrivileges=yes', 'LimitNOFILE=1048576',
    'StateDirectory=tollgate', 'ProtectHome=yes', 'PrivateTmp=yes', 'CapabilityBoundingSet=', 'KillSignal=SIGTERM',
    'ExecReload=/bin/kill -HUP $MAINPID']) {
    assert.ok(text.split('\n').includes(line), `missing: ${line}`);
  }
  assert.ok(!/^MemoryDenyWriteExecute=yes/m.test(text), 'LuaJIT needs to write machine code');
});
