// The settlement batch as a function kept in sql/functions/ (issue #17 "pipeline", goal 3):
//
//   * `tollgate migrate` applies sql/functions/*.sql after the numbered migrations, records
//     each file's SHA-256 in schema_functions, applies a file again when it differs from
//     what the database recorded (an older binary's body is replaced), does nothing when
//     it is the same, and a file that fails is rolled back and named;
//   * tg_settle_batch finds the settlements that bill without joining the inserted ids
//     back (sql/functions/tg_settle_batch.sql): a large batch mixing new requests,
//     replays of an earlier batch, conflicts and repeats inside the batch gets each
//     element's own outcome, and the books move by exactly what the winners bill.
// Against the suite's Postgres; the books checked with `tollgate ledger verify`.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, startMock, stopAll } from './lib/harness.mjs';
import { createDb, lit, sha256hex, tool } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  costOf,
  fmtNano,
  reservationRows,
  settleJson,
  settlement,
  verifyLedger,
} from './lib/billing.mjs';

const FN_DIR = path.join(REPO, 'sql', 'functions');
const functions = fs.readdirSync(FN_DIR).filter((f) => f.endsWith('.sql')).sort();
const settleFile = fs.readFileSync(path.join(FN_DIR, 'tg_settle_batch.sql'), 'utf8');

let mock;
let bill;
const dbs = [];
let seq = 0;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '1000' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
  for (const db of dbs) await db.drop();
});

async function emptyDb() {
  const db = await createDb({ migrate: false });
  dbs.push(db);
  return db;
}

/** The body Postgres holds for tg_settle_batch(json). */
const settleSrc = (db) => db.scalar("SELECT prosrc FROM pg_proc WHERE oid = 'tg_settle_batch(json)'::regprocedure");

test('migrate applies sql/functions/ after the migrations, records each file, and is a no-op the second time', async () => {
  assert.ok(functions.includes('tg_settle_batch.sql'), functions.join(', '));
  const db = await emptyDb();
  const first = await tool(['migrate'], { db });
  assert.equal(first.code, 0, first.stderr);
  const lines = first.stdout.split('\n').filter((l) => l.startsWith('applied '));
  assert.deepEqual(lines.slice(-functions.length), functions.map((f) => `applied functions/${f}`),
    'the function files come last, in name order');
  const rows = await db.query('SELECT name, checksum FROM schema_functions ORDER BY name');
  assert.deepEqual(rows.map((r) => r.name), functions);
  for (const r of rows) assert.equal(r.checksum, sha256hex(fs.readFileSync(path.join(FN_DIR, r.name))), r.name);
  const src = await settleSrc(db);
  assert.ok(settleFile.includes(src.trim().split('\n').slice(0, 12).join('\n')), 'the body is the file\'s');
  assert.match(src, /wonords/);

  const second = await tool(['migrate'], { db });
  assert.equal(second.code, 0, second.stderr);
  assert.doesNotMatch(second.stdout, /^applied /m);
  assert.match(second.stdout, /0 of sql\/functions\/ replaced/);
});

test('a database holding another body of a function file (an older binary migrated it) gets the file again', async () => {
  const db = await emptyDb();
  assert.equal((await tool(['migrate'], { db })).code, 0);
  // What the previous binary left: 0023's tg_settle_batch(json), recorded with its file's checksum.
  const old = fs.readFileSync(path.join(REPO, 'sql', '0023_settle_lean.sql'), 'utf8');
  const def = old.slice(old.indexOf('CREATE FUNCTION tg_settle_batch(batch json)'),
    old.indexOf('CREATE OR REPLACE FUNCTION tg_settle_batch(batch jsonb)'));
  await db.exec(def.replace('CREATE FUNCTION', 'CREATE OR REPLACE FUNCTION'));
  await db.exec(`UPDATE schema_functions SET checksum = ${lit(sha256hex('older'))} WHERE name = 'tg_settle_batch.sql'`);
  assert.doesNotMatch(await settleSrc(db), /wonords/);

  const r = await tool(['migrate'], { db });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^applied functions\/tg_settle_batch\.sql$/m);
  assert.match(r.stdout, /\(0 applied now, 1 of sql\/functions\/ replaced\)/);
  assert.match(await settleSrc(db), /wonords/, 'the file\'s body again');
  assert.equal(await db.scalar("SELECT checksum FROM schema_functions WHERE name = 'tg_settle_batch.sql'"),
    sha256hex(fs.readFileSync(path.join(FN_DIR, 'tg_settle_batch.sql'))));
});

test('a function file that fails is rolled back, named, and not recorded; the next migrate applies it', async () => {
  const db = await emptyDb();
  assert.equal((await tool(['migrate'], { db })).code, 0);
  await db.exec(`UPDATE schema_functions SET checksum = ${lit(sha256hex('older'))} WHERE name = 'tg_settle_batch.sql'`);
  const body = await settleSrc(db);
  // The element type it declares is gone: the function cannot be created.
  await db.exec('ALTER TYPE tg_settle_element RENAME TO tg_settle_element_away');
  const r = await tool(['migrate'], { db });
  assert.notEqual(r.code, 0, `migrate must fail; stdout: ${r.stdout}`);
  assert.equal(r.signal, null);
  assert.match(r.stderr, /functions\/tg_settle_batch\.sql/, `the message names the file: ${r.stderr}`);
  assert.equal(await db.scalar("SELECT checksum FROM schema_functions WHERE name = 'tg_settle_batch.sql'"),
    sha256hex('older'), 'not recorded');
  assert.equal(await settleSrc(db), body, 'the body it had');

  await db.exec('ALTER TYPE tg_settle_element_away RENAME TO tg_settle_element');
  const ok = await tool(['migrate'], { db });
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, /^applied functions\/tg_settle_batch\.sql$/m);
});

const settle = (batch) => settleJson(bill.conninfo, batch);
const newId = () => `fn-${process.pid}-${seq++}`;
const BOUND = 40_000_000n;

test('a batch of 1,000 mixing new requests, replays, conflicts and repeats: every outcome, billed once each', async () => {
  const before0 = await accountsMoney(bill);
  // An earlier batch: 400 requests, half of them with their reservation inside.
  const earlier = Array.from({ length: 400 }, (_, i) => ({
    ...settlement(bill, { requestId: newId(), input: 100 + i, output: 10 }),
    ...(i % 2 ? { amount: fmtNano(BOUND), instance: 'fn-test' } : {}),
  }));
  assert.ok((await settle(earlier)).every((o) => o === 'settled'));
  const before = await accountsMoney(bill);
  assert.equal(before0.balance - before.balance, earlier.reduce((s, e) => s + costOf(e.input, e.output), 0n));

  // The batch: 400 new (the first of each id bills), then for them 150 repeats with the
  // same numbers (duplicate) and 50 with others (conflict); 300 replays of the earlier
  // batch (duplicate, those with a reservation inside write it reconciled) and 100
  // earlier ids with other numbers (conflict); shuffled.
  const fresh = Array.from({ length: 400 }, (_, i) => ({
    ...settlement(bill, { requestId: newId(), input: 50 + i, output: 5 }),
    ...(i % 3 === 0 ? { amount: fmtNano(BOUND), instance: 'fn-test' } : {}),
  }));
  const els = [
    ...fresh.map((e) => ({ e, want: 'settled' })),
    ...fresh.slice(0, 150).map((e) => ({ e: { ...e }, want: 'duplicate' })),
    ...fresh.slice(150, 200).map((e) => ({ e: settlement(bill, { requestId: e.request_id, input: 1, output: 1 }), want: 'conflict' })),
    ...earlier.slice(0, 300).map((e) => ({ e: { ...e }, want: 'duplicate' })),
    ...earlier.slice(300).map((e) => ({ e: settlement(bill, { requestId: e.request_id, input: 2, output: 2 }), want: 'conflict' })),
  ];
  // Shuffled. The first element of an id in the batch bills when the id is new (DISTINCT
  // ON request_id, ord): a fresh id's repeats are duplicate or conflict against it,
  // whichever came first.
  let x = 12345;
  const rnd = () => ((x = (x * 1103515245 + 12345) % 2147483648) / 2147483648);
  const order = els.map((_, i) => i).sort(() => rnd() - 0.5);
  const batch = order.map((i) => els[i].e);
  const want = order.map((i) => els[i].want);
  const firstAt = new Map();
  batch.forEach((e, i) => { if (!firstAt.has(e.request_id)) firstAt.set(e.request_id, i); });
  for (const f of fresh) {
    const winner = firstAt.get(f.request_id);
    batch.forEach((e, i) => {
      if (e.request_id !== f.request_id) return;
      want[i] = i === winner ? 'settled' : e.fingerprint === batch[winner].fingerprint ? 'duplicate' : 'conflict';
    });
  }
  assert.equal(batch.length, 1000);

  const got = await settle(batch);
  assert.equal(got.length, 1000);
  const wrong = got.map((o, i) => (o === want[i] ? null : `${i} ${batch[i].request_id}: ${o}, want ${want[i]}`)).filter(Boolean);
  assert.deepEqual(wrong, [], 'each element its own outcome');

  // Billed: each fresh request once, at the numbers of its first element.
  let billed = 0n;
  for (const f of fresh) {
    const w = batch[firstAt.get(f.request_id)];
    billed += costOf(w.input, w.output);
  }
  const after1 = await accountsMoney(bill);
  assert.equal(before.balance - after1.balance, billed, 'the balance moved by what the winners bill');
  const ids = fresh.map((f) => lit(f.request_id)).join(',');
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM usage WHERE request_id IN (${ids})`), '400');
  assert.equal(await bill.db.scalar(`SELECT sum(input_tokens) FROM usage WHERE request_id IN (${ids})`),
    String(fresh.reduce((s, f) => s + batch[firstAt.get(f.request_id)].input, 0)));
  // A replayed element that carried its reservation wrote it, reconciled (0023's rule).
  for (const e of earlier.slice(0, 300).filter((e) => e.amount).slice(0, 20)) {
    const rows = await reservationRows(bill, e.request_id);
    assert.equal(rows.length, 1, e.request_id);
    assert.equal(rows[0].state, 'reconciled', e.request_id);
  }
  // The same batch again: nothing bills.
  const again = await settle(batch);
  assert.ok(again.every((o) => o === 'duplicate' || o === 'conflict'), 'a replay bills nothing');
  assert.equal((await accountsMoney(bill)).balance, after1.balance);
  await verifyLedger(bill);
});
