// `tollgate migrate` from an empty database: every migration in sql/ applied once, in
// order, each in its own transaction and recorded with its checksum; a second run is a
// no-op; an applied migration that no longer matches its recorded checksum is refused
// with a message naming the file; a migration that fails leaves nothing behind; two
// migrates started at once do the work once.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, test } from 'node:test';

import { REPO, stopAll } from './lib/harness.mjs';
import { createDb, sha256hex, tool } from './lib/db.mjs';

const dbs = [];
after(async () => {
  await stopAll();
  for (const db of dbs) await db.drop();
});

async function emptyDb() {
  const db = await createDb({ migrate: false });
  dbs.push(db);
  return db;
}

const files = fs.readdirSync(path.join(REPO, 'sql')).filter((f) => /^\d+_.*\.sql$/.test(f)).sort();
const functions = fs.readdirSync(path.join(REPO, 'sql', 'functions')).filter((f) => f.endsWith('.sql')).sort();

test('sql/ holds at least the migrations 0001 and 0002', () => {
  assert.ok(files.includes('0001_init.sql') && files.includes('0002_limits.sql'), files.join(', '));
});

test('migrate from an empty database applies every migration once, then is a no-op', async () => {
  const db = await emptyDb();
  assert.deepEqual(await db.tables(), [], 'the database starts empty');

  const first = await tool(['migrate'], { db });
  assert.equal(first.code, 0, first.stderr);
  const applied = first.stdout.split('\n').filter((l) => l.startsWith('applied ') && !l.startsWith('applied functions/'))
    .map((l) => l.slice(8));
  assert.deepEqual(applied, files, 'each file applied once, in order');
  assert.match(first.stdout, new RegExp(`\\(${files.length} applied now, ${functions.length} of sql/functions/ replaced\\)`));

  const rows = await db.query('SELECT version, name, checksum FROM schema_migrations ORDER BY version');
  assert.deepEqual(rows.map((r) => r.name), files);
  for (const r of rows) {
    assert.equal(r.version, parseInt(r.name, 10));
    const sum = sha256hex(fs.readFileSync(path.join(REPO, 'sql', r.name)));
    assert.equal(r.checksum, sum, `${r.name}: recorded checksum is the SHA-256 of the file`);
  }
  const tables = await db.tables();
  for (const t of ['tenants', 'users', 'groups', 'api_keys', 'accounts', 'account_groups', 'model_prices',
    'reservations', 'usage', 'ledger']) {
    assert.ok(tables.includes(t), `table ${t} exists (have ${tables.join(', ')})`);
  }
  // 0006 ran: the dedup is the usage row's key, billing_dedup a view over usage.
  assert.ok(!tables.includes('billing_dedup'));
  assert.equal(await db.scalar("SELECT count(*) FROM information_schema.views WHERE table_name = 'billing_dedup'"), '1');
  // 0002 ran: the limit columns exist.
  const cols = await db.query("SELECT table_name, column_name FROM information_schema.columns WHERE column_name IN ('rpm_burst', 'concurrency') AND table_schema = 'public'");
  assert.ok(cols.some((c) => c.table_name === 'tenants' && c.column_name === 'rpm_burst'));
  assert.ok(cols.some((c) => c.table_name === 'api_keys' && c.column_name === 'rpm_burst'));

  const second = await tool(['migrate'], { db });
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stdout, /\(0 applied now, 0 of sql\/functions\/ replaced\)/);
  assert.doesNotMatch(second.stdout, /^applied /m);
  assert.equal(await db.scalar('SELECT count(*) FROM schema_migrations'), String(files.length));
});

test('an applied migration whose checksum no longer matches is refused, naming the file', async () => {
  const db = await emptyDb();
  assert.equal((await tool(['migrate'], { db })).code, 0);
  const before = await db.scalar('SELECT string_agg(checksum, \',\' ORDER BY version) FROM schema_migrations');
  await db.exec("UPDATE schema_migrations SET checksum = repeat('0', 64) WHERE version = 1");

  const r = await tool(['migrate'], { db });
  assert.notEqual(r.code, 0, `migrate must fail; stdout: ${r.stdout}`);
  assert.equal(r.signal, null);
  assert.match(r.stderr, /0001_init\.sql/, `the message names the file: ${r.stderr}`);
  assert.match(r.stderr, /changed|checksum/i);
  // Nothing else was touched: the tampered row is still what we wrote.
  const after = await db.scalar('SELECT string_agg(checksum, \',\' ORDER BY version) FROM schema_migrations');
  assert.equal(after, ['0'.repeat(64), ...before.split(',').slice(1)].join(','));
});

test('a migration that fails is rolled back completely and not recorded', async () => {
  const db = await emptyDb();
  // A table 0001 creates, already there with another shape: 0001 fails part-way.
  await db.exec('CREATE TABLE ledger (x integer)');
  const r = await tool(['migrate'], { db });
  assert.notEqual(r.code, 0, `migrate must fail; stdout: ${r.stdout}`);
  assert.match(r.stderr, /0001_init\.sql/, `the message names the file: ${r.stderr}`);
  const tables = await db.tables();
  assert.deepEqual(tables.filter((t) => t !== 'schema_migrations' && t !== 'ledger'), [],
    `nothing of 0001 is left behind (tables: ${tables.join(', ')})`);
  assert.equal(await db.scalar('SELECT count(*) FROM schema_migrations'), '0');
  assert.equal(await db.scalar("SELECT count(*) FROM pg_proc WHERE proname = 'tg_usage_immutable'"), '0');

  // Remove the obstacle: the same command now succeeds.
  await db.exec('DROP TABLE ledger');
  const ok = await tool(['migrate'], { db });
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(await db.scalar('SELECT count(*) FROM schema_migrations'), String(files.length));
});

test('two migrates started at once apply each migration exactly once', async () => {
  const db = await emptyDb();
  const [a, b] = await Promise.all([tool(['migrate'], { db }), tool(['migrate'], { db })]);
  assert.equal(a.code, 0, a.stderr);
  assert.equal(b.code, 0, b.stderr);
  const appliedLines = [a, b].flatMap((r) => r.stdout.split('\n')
    .filter((l) => l.startsWith('applied ') && !l.startsWith('applied functions/')));
  assert.deepEqual(appliedLines.sort(), files.map((f) => `applied ${f}`).sort(), 'each file applied by one of them');
  const fnLines = [a, b].flatMap((r) => r.stdout.split('\n').filter((l) => l.startsWith('applied functions/')));
  assert.deepEqual(fnLines.sort(), functions.map((f) => `applied functions/${f}`), 'each function file applied once');
  assert.equal(await db.scalar('SELECT count(*) FROM schema_migrations'), String(files.length));
});

test('migrate without a database says so and exits non-zero', async () => {
  const db = { conninfo: '' };
  const r = await tool(['migrate'], { db, env: { TOLLGATE_PG: null } });
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /database|postgres/i);
});
