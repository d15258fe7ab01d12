// newcomer: the command line answers like a well-kept tool (issue #23). `tollgate --help`
// lists every command and the exit codes; `tollgate COMMAND --help` (and `tollgate help
// COMMAND`) prints that command's usage and runs nothing; `tollgate --version` names the
// git revision the build was configured from ("unknown" without git: core/git_rev.cmake);
// mistakes get one line that says what to do next, with exit 2.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, TG_BIN } from './lib/harness.mjs';

const run = (...args) => {
  const env = { ...process.env };
  for (const k of ['TOLLGATE_PG', 'TOLLGATE_REDIS']) delete env[k];
  return spawnSync(TG_BIN, args, { encoding: 'utf8', env, cwd: REPO, timeout: 10000 });
};
const COMMANDS = ['serve', 'check', 'migrate', 'apply', 'policy', 'ledger', 'usage', 'mock-upstream', 'version'];

test('tollgate --help lists every command and the exit codes, exit 0', () => {
  for (const flag of ['--help', '-h', 'help']) {
    const r = run(flag);
    assert.equal(r.status, 0, flag);
    for (const c of COMMANDS) assert.match(r.stdout, new RegExp(`^  ${c}\\b`, 'm'), `${flag} lists ${c}`);
    assert.match(r.stdout, /exit codes:\n {2}0 {2}success\n {2}1 {2}.*\n.*\n {2}2 {2}bad usage or configuration/);
  }
  const bare = run();
  assert.equal(bare.status, 2);
  assert.match(bare.stderr, /^usage: tollgate COMMAND/);
});

test('tollgate COMMAND --help prints that command\'s usage and runs nothing, for every command', () => {
  for (const c of COMMANDS) {
    for (const args of [[c, '--help'], [c, '-h'], ['help', c]]) {
      const r = run(...args);
      assert.equal(r.status, 0, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stdout, new RegExp(`^usage: tollgate ${c}\\b`), `${args.join(' ')}:\n${r.stdout}`);
      assert.equal(r.stderr, '', args.join(' '));
    }
  }
  // After other arguments too, and without running the command (no config is read).
  const r = run('serve', '-c', '/nonexistent.lua', '--help');
  assert.equal(r.status, 0);
  assert.match(r.stdout, /^usage: tollgate serve -c FILE/);
  const sub = run('ledger', 'verify', '--help');
  assert.equal(sub.status, 0);
  assert.match(sub.stdout, /ledger verify -c FILE/);
});

test('tollgate --version names the git revision the build was configured from', () => {
  for (const flag of ['--version', 'version', '-V']) {
    const r = run(flag);
    assert.equal(r.status, 0);
    assert.match(r.stdout, /^tollgate \d+\.\d+\.\d+ \(git ([0-9a-f]{12}|unknown)\)\n$/);
  }
  const head = spawnSync('git', ['-C', REPO, 'rev-parse', '--short=12', 'HEAD'], { encoding: 'utf8' });
  const top = spawnSync('git', ['-C', REPO, 'rev-parse', '--show-toplevel'], { encoding: 'utf8' });
  if (head.status === 0 && fs.realpathSync(top.stdout.trim()) === fs.realpathSync(REPO)) {
    assert.equal(run('--version').stdout, `tollgate 0.1.0 (git ${head.stdout.trim()})\n`);
  }
});

test('core/git_rev.cmake: the checkout\'s revision, "unknown" without .git or in a folder of another checkout', () => {
  const rev = (src) => {
    const r = spawnSync('cmake', [`-DSRC=${src}`, '-P', path.join(REPO, 'core/git_rev.cmake')], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    return r.stderr.trim();
  };
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-norev-'));
  try {
    fs.cpSync(path.join(REPO, 'core/git_rev.cmake'), path.join(tmp, 'git_rev.cmake'));
    assert.equal(rev(tmp), 'unknown', 'a copy without .git');
    assert.equal(rev(path.join(REPO, 'examples')), 'unknown', 'a folder inside a checkout is not its top');
    const head = spawnSync('git', ['-C', REPO, 'rev-parse', '--short=12', 'HEAD'], { encoding: 'utf8' });
    if (head.status === 0) assert.equal(rev(REPO), head.stdout.trim());
    // A fresh repository with one commit: its own revision.
    const git = (...a) => spawnSync('git', ['-C', tmp, '-c', 'user.name=t', '-c', 'user.email=t@t', ...a], { encoding: 'utf8' });
    if (git('init', '-q').status === 0) {
      git('add', '.');
      git('commit', '-qm', 'x');
      assert.equal(rev(tmp), git('rev-parse', '--short=12', 'HEAD').stdout.trim());
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test('mistakes get one line saying what to do next, exit 2', () => {
  const cases = [
    [['serv'], /unknown command "serv"; did you mean "serve"\? \(tollgate --help lists them\)/],
    [['frobnicate'], /unknown command "frobnicate" \(tollgate --help lists the commands\)/],
    [['help', 'aply'], /did you mean "apply"/],
    [['serve'], /tollgate serve: missing -c FILE, the configuration file \(e\.g\. -c examples\/tollgate\.lua; see tollgate serve --help\)/],
    [['check', '-c', '/nonexistent/tollgate.lua'], /config: cannot open \/nonexistent\/tollgate\.lua/],
    [['ledger'], /expected verify or reconcile .*see tollgate ledger --help/],
    [['migrate', '-c', 'examples/tollgate.lua'], /no database: set postgres in the config or TOLLGATE_PG \(a libpq conninfo, e\.g\./],
    [['mock-upstream'], /--listen HOST:PORT is required/],
  ];
  for (const [args, re] of cases) {
    const r = run(...args);
    assert.equal(r.status, 2, `${args.join(' ')}: exit ${r.status}\n${r.stderr}`);
    assert.match(r.stderr, re, args.join(' '));
    assert.equal(r.stdout, '', args.join(' '));
  }
});
