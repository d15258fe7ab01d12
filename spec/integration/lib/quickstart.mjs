// examples/quickstart.sh run the way a new user runs it, in a clean checkout: the
// repository's files (tracked, plus new ones not ignored: what a commit of the working
// tree would hold) copied to a fresh directory, no build/, no var/, no node_modules. The
// binary under test is passed in (TOLLGATE_BIN) instead of built again; everything else
// — its private Postgres and Redis under var/, the mock upstream, migrations, the demo
// state, the sample request — is the script's own. Used by the newcomer tests:
//
//   const co = cleanCheckout();
//   const qs = await startQuickstart(co, { env: {...} });   // resolves once it printed the cost
//   qs.out.TOLLGATE_KEY, qs.out.TOLLGATE_SAMPLE_COST, qs.consoleUrl, qs.pids
//   await qs.stop();                                         // SIGTERM, waits, checks the PIDs are gone
//
// Every wait is bounded; the quickstart is stopped by its PID, and it stops what it
// started by theirs.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { REPO, TG_BIN, freePort, sleep } from './harness.mjs';

/** A fresh directory (mode 755, so Postgres' user reaches it when run as root). */
export function scratchDir(prefix) {
  const base = process.env.TG_TEST_TMP || os.tmpdir();
  const d = fs.mkdtempSync(path.join(base, `${prefix}-`));
  fs.chmodSync(d, 0o755);
  return d;
}

/** The files of the checkout as git sees them, copied to a new directory. */
export function cleanCheckout() {
  const dest = scratchDir('qs');
  let files;
  try {
    files = execFileSync('git', ['-C', REPO, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], {
      encoding: 'utf8',
      maxBuffer: 64 << 20,
    }).split('\0');
  } catch {
    files = null; // no git, or no .git: everything but what a build or a run leaves
  }
  if (files) {
    for (const f of files) {
      if (!f) continue;
      const src = path.join(REPO, f);
      if (!fs.existsSync(src)) continue; // deleted in the working tree
      fs.mkdirSync(path.join(dest, path.dirname(f)), { recursive: true });
      fs.cpSync(src, path.join(dest, f), { preserveTimestamps: true });
    }
  } else {
    const skip = new Set(['.git', 'var', 'node_modules']);
    fs.cpSync(REPO, dest, {
      recursive: true,
      filter: (src) => !skip.has(path.basename(src)) && !/^build/.test(path.relative(REPO, src)),
    });
  }
  return dest;
}

/** Parses the quickstart's NAME=value lines. */
function parseOut(lines) {
  const out = {};
  for (const l of lines) {
    const m = /^(TOLLGATE_[A-Z_]+)=(.*)$/.exec(l);
    if (m) out[m[1]] = m[2];
  }
  return out;
}

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * Starts examples/quickstart.sh in `dir` on free ports and waits (up to `timeout` ms)
 * for its `console:` line. Returns {proc, dir, port, stdout, stderr, out, consoleUrl,
 * pids, pgConninfo, stop()}.
 */
export async function startQuickstart(dir, { env = {}, timeout = 90000 } = {}) {
  const port = await freePort();
  let mockPort = await freePort();
  while (mockPort === port) mockPort = await freePort();
  const childEnv = {
    ...process.env,
    TG_QUICKSTART_NO_DEPS: '1',
    TOLLGATE_BIN: TG_BIN,
    TOLLGATE_PORT: String(port),
    TOLLGATE_MOCK_PORT: String(mockPort),
    ...env,
  };
  // The suite's own services must not leak into the quickstart's.
  for (const k of ['TOLLGATE_PG', 'TOLLGATE_REDIS', 'TOLLGATE_ADMIN_TOKEN', 'TOLLGATE_SECRET_KEY']) delete childEnv[k];
  for (const [k, v] of Object.entries(childEnv)) if (v === null || v === undefined) delete childEnv[k];
  const proc = spawn('bash', ['examples/quickstart.sh'], { cwd: dir, env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  const qs = { proc, dir, port, mockPort, stdout: [], stderr: [], exit: null };
  for (const s of ['stdout', 'stderr']) {
    let partial = '';
    proc[s].setEncoding('utf8');
    proc[s].on('data', (d) => {
      partial += d;
      const parts = partial.split('\n');
      partial = parts.pop();
      qs[s].push(...parts);
    });
  }
  qs.exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve((qs.exit = { code, signal }))));
  qs.tail = () => `--- quickstart stdout ---\n${qs.stdout.join('\n')}\n--- stderr ---\n${qs.stderr.slice(-40).join('\n')}`;

  const deadline = Date.now() + timeout;
  while (!qs.stdout.some((l) => l.startsWith('console: ')) && !qs.stderr.some((l) => /usage row did not appear/.test(l))) {
    if (qs.exit) throw new Error(`quickstart exited ${JSON.stringify(qs.exit)} before it was ready\n${qs.tail()}`);
    if (Date.now() > deadline) {
      await stopQuickstart(qs);
      throw new Error(`quickstart not ready within ${timeout} ms\n${qs.tail()}`);
    }
    await sleep(100);
  }
  // The "running" line follows the cost lines at once.
  while (!qs.stderr.some((l) => /running \(gateway pid \d+\)/.test(l)) && Date.now() < deadline) await sleep(50);
  qs.out = parseOut(qs.stdout);
  qs.consoleUrl = /^console: (\S+)/.exec(qs.stdout.find((l) => l.startsWith('console: ')) || '')?.[1];
  const pidOf = (re) => Number(re.exec(qs.stderr.find((l) => re.test(l)) || '')?.[1]) || null;
  const varDir = path.join(dir, 'var');
  const readPid = (f) => (fs.existsSync(f) ? Number(fs.readFileSync(f, 'utf8').split('\n')[0]) || null : null);
  qs.pids = {
    quickstart: proc.pid,
    gateway: pidOf(/running \(gateway pid (\d+)\)/),
    mock: pidOf(/mock upstream on \S+ \(pid (\d+)\)/),
    postgres: readPid(path.join(varDir, 'pg', 'pgdata', 'postmaster.pid')),
    redis: readPid(path.join(varDir, 'redis', 'redis.pid')),
  };
  qs.pgConninfo = `host=${path.join(varDir, 'pg')} dbname=tollgate user=postgres`;
  qs.stop = () => stopQuickstart(qs);
  return qs;
}

/** SIGTERM to the quickstart; resolves with {exit, leftover: [names of PIDs still alive]}. */
export async function stopQuickstart(qs, grace = 40000) {
  if (!qs.exit) {
    try {
      process.kill(qs.proc.pid, 'SIGTERM');
    } catch {
      /* gone */
    }
    const timer = setTimeout(() => {
      try {
        process.kill(qs.proc.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }, grace);
    await qs.exited;
    clearTimeout(timer);
  }
  const leftover = Object.entries(qs.pids || {})
    .filter(([, pid]) => pid && alive(pid))
    .map(([name, pid]) => `${name} (pid ${pid})`);
  return { exit: qs.exit, leftover };
}

/** psql against the quickstart's own Postgres: rows of unaligned, tab-separated fields. */
export function qsPsql(qs, sql) {
  const bindir = fs
    .readdirSync('/usr/lib/postgresql')
    .sort((a, b) => Number(b) - Number(a))
    .map((v) => `/usr/lib/postgresql/${v}/bin/psql`)
    .find((p) => fs.existsSync(p));
  const out = execFileSync(bindir || 'psql', [qs.pgConninfo, '-AtqF', '\t', '-c', sql], { encoding: 'utf8', timeout: 20000 });
  return out.split('\n').filter(Boolean).map((l) => l.split('\t'));
}
