// usage (#18, items 2 and 5): the hourly rollups the settlement batch writes equal an
// aggregate over the usage rows after a random load through the real gateway —
// successes (OpenAI SDK, plain and streamed), upstream 429s and 500s retried on the
// other account, clients that leave mid-stream, upstream first-byte timeouts (usage
// unknown, settled afterwards by `tollgate ledger reconcile`) — and `tollgate usage
// rebuild` recomputes the same rollups from the rows. The expected aggregate is computed
// here, in JS, from the rows (classes, TTFT buckets, list value), not by the SQL under
// test. The coarse rollups (sql/0014: hour × group × account × model, what most reports
// and the capacity report read) equal the same aggregate after the compaction and after
// late settlements of compacted hours, and a report gives the same totals on both paths.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { after, before, test } from 'node:test';

import { openaiClient, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import {
  billedSetup,
  chatBody,
  costOf,
  ledger,
  settleBatch,
  settlement,
  startBilledGateway,
  streamChat,
  toNano,
  verifyLedger,
} from './lib/billing.mjs';
import { tool } from './lib/db.mjs';

let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({
    mock,
    balance: '100',
    accounts: [{ name: 'up', credential: 'sk-usage-a', priority: 10 }, { name: 'up2', credential: 'sk-usage-b', priority: 10 }],
  });
  gw = await startBilledGateway(bill, {
    // errors here are the point: no account cools down for them
    routing: { max_attempts: 2, cooldown_429_ms: 0, cooldown_5xx_ms: 0 },
    upstream: { first_byte_timeout_ms: 600 },
  }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

/** A small seeded PRNG (mulberry32): the same load on every run. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The class of a status, as the issue names them. */
function klass(status) {
  if (status >= 200 && status <= 399) return 'successes';
  if (status === 429) return 'err_429';
  if (status === 504 || status === 408 || status === 0 || status === null) return 'err_timeout';
  if (status >= 500 && status <= 599) return 'err_5xx';
  if (status === 499) return 'err_client_gone';
  return 'err_other';
}

/** The TTFT bucket: four per doubling from 20 ms, 48 in all. */
function bucket(ms) {
  if (ms < 20) return 0;
  return Math.min(1 + Math.floor(4 * Math.log2(ms / 20)), 47);
}

const hourOf = (row) => {
  const t = new Date(row.started_at ?? row.created_at);
  t.setUTCMinutes(0, 0, 0);
  return t.toISOString();
};

/** usage rows -> {key: aggregate}, with BigInt money and token sums. */
function aggregate(rows) {
  const out = {};
  for (const r of rows) {
    const k = [hourOf(r), r.tenant_id, r.api_key_id, r.group_id ?? 0, r.account_id ?? 0, r.model].join('|');
    const a = (out[k] ??= {
      requests: 0, successes: 0, err_429: 0, err_5xx: 0, err_timeout: 0, err_client_gone: 0, err_other: 0,
      estimated: 0, input_tokens: 0n, output_tokens: 0n, cost: 0n, list_value: 0n, busy_ms: 0, ttft_n: 0,
      hist: new Array(48).fill(0),
    });
    const c = klass(r.status);
    a.requests++;
    a[c]++;
    if (r.estimated) a.estimated++;
    a.input_tokens += BigInt(r.input_tokens ?? 0);
    a.output_tokens += BigInt(r.output_tokens ?? 0);
    a.cost += toNano(r.cost);
    if (c === 'successes') a.list_value += costOf(r.input_tokens ?? 0, r.output_tokens ?? 0);
    a.busy_ms += r.total_ms ?? 0;
    if (r.ttft_ms !== null) {
      a.ttft_n++;
      a.hist[bucket(r.ttft_ms)]++;
    }
  }
  return out;
}

async function rollups() {
  const rows = await bill.db.query(`SELECT to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.000"Z"') AS hour,
    tenant_id, api_key_id, group_id, account_id, model, requests, successes, err_429, err_5xx, err_timeout,
    err_client_gone, err_other, estimated, input_tokens, output_tokens, cost::text AS cost,
    list_value::text AS list_value, busy_ms, ttft_n, ARRAY[${Array.from({ length: 48 }, (_, i) => `h${i}`).join(',')}] AS hist
    FROM usage_hourly ORDER BY 1, 2, 3, 4, 5, 6`);
  const out = {};
  for (const r of rows) {
    out[[r.hour, r.tenant_id, r.api_key_id, r.group_id, r.account_id, r.model].join('|')] = {
      requests: r.requests, successes: r.successes, err_429: r.err_429, err_5xx: r.err_5xx, err_timeout: r.err_timeout,
      err_client_gone: r.err_client_gone, err_other: r.err_other, estimated: r.estimated,
      input_tokens: BigInt(r.input_tokens), output_tokens: BigInt(r.output_tokens), cost: toNano(r.cost),
      list_value: toNano(r.list_value), busy_ms: r.busy_ms, ttft_n: r.ttft_n, hist: r.hist,
    };
  }
  return out;
}

function assertSame(got, want, what) {
  assert.deepEqual(Object.keys(got).sort(), Object.keys(want).sort(), `${what}: the same combinations`);
  for (const k of Object.keys(want)) {
    const { busy_ms: gb, ...g } = got[k];
    const { busy_ms: wb, ...w } = want[k];
    assert.deepEqual(g, w, `${what}: ${k}`);
    assert.ok(Math.abs(gb - wb) < 1e-6 * Math.max(1, wb), `${what}: ${k}: busy_ms ${gb} vs ${wb}`);
  }
}

test('rollups = an aggregate over the usage rows after a random load; rebuild gives them back', async () => {
  const client = await openaiClient(gw, { apiKey: bill.key });
  const rand = rng(18);
  const kinds = ['sdk', 'sdk_stream', 'sdk', 'status429', 'sdk', 'status500', 'gone', 'timeout', 'sdk_stream', 'gone'];
  // Upstream errors last: an account that keeps failing is skipped for a while (its
  // health), and a request no account can take is refused before anything is held.
  const plan = Array.from({ length: 48 }, (_, i) => kinds[Math.floor(rand() * kinds.length)] + `:${i}`)
    .sort((a, b) => Number(/^status/.test(a)) - Number(/^status/.test(b)));
  const seen = { status: {} };
  const one = async (item) => {
    try {
      await one1(item);
    } catch (e) {
      // A request the gateway refused before reserving anything (no account free this
      // instant) has no usage row: it is not part of the comparison.
      if (e?.status !== 503) throw e;
      seen.refused = (seen.refused ?? 0) + 1;
    }
  };
  const one1 = async (item) => {
    const [kind, i] = item.split(':');
    const n = 1 + Math.floor(rand() * 6);
    if (kind === 'sdk') {
      const r = await client.chat.completions.create(chatBody(`q${i} [mock chunks=${n}]`, { maxTokens: 50 }));
      assert.ok(r.choices[0].message.content.length > 0);
    } else if (kind === 'sdk_stream') {
      const s = await client.chat.completions.create({ ...chatBody(`s${i} [mock chunks=${n} ttft_ms=${Math.floor(rand() * 120)}]`, { maxTokens: 50 }), stream: true });
      for await (const _ of s); // eslint-disable-line no-unused-vars
    } else if (kind === 'status429' || kind === 'status500') {
      const status = kind === 'status429' ? 429 : 500;
      const r = await streamChat(gw, bill.key, { ...chatBody(`e${i} [mock status=${status}]`, { maxTokens: 50 }), stream: false });
      seen.status[r.status] = (seen.status[r.status] ?? 0) + 1;
    } else if (kind === 'gone') {
      const r = await streamChat(gw, bill.key, chatBody(`g${i} [mock chunks=60 interval_ms=20]`, { maxTokens: 100, stream: true }), { abortAfterChunks: 2 + (n % 3) });
      seen.status[r.aborted ? 'gone' : r.status] = (seen.status[r.aborted ? 'gone' : r.status] ?? 0) + 1;
    } else {
      const r = await streamChat(gw, bill.key, { ...chatBody(`t${i} [mock delay_ms=1500]`, { maxTokens: 50 }), stream: false });
      seen.status[r.status] = (seen.status[r.status] ?? 0) + 1;
    }
  };
  // four at a time
  const queue = [...plan];
  await Promise.all(Array.from({ length: 4 }, async () => {
    while (queue.length) await one(queue.shift());
  }));

  // Every request has ended: its settlement reaches Postgres within milliseconds; the
  // timed-out ones wait as unknown usage, settled now as the reconciler would.
  await sleep(500);
  const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
  assert.equal(rec.code, 0, rec.stderr);
  // (a request settled in the batch of its reservation has no reservation row: sql/0017)
  await waitFor(async () => Number(await bill.db.scalar(
    `SELECT count(DISTINCT r.request_id) FROM reservations r WHERE NOT EXISTS (SELECT 1 FROM usage u WHERE u.request_id = r.request_id)`)) === 0,
  { timeout: 10000, what: 'a usage row for every reserved request' });

  const rows = await bill.db.query('SELECT * FROM usage');
  // (a 503 from the gateway: no account free this instant, refused before anything was held)
  assert.ok(rows.length >= plan.length - (seen.refused ?? 0) - (seen.status[503] ?? 0), `one usage row per request (${rows.length} of ${plan.length}; ${JSON.stringify(seen)})`);
  const want = aggregate(rows);
  const classes = Object.values(want).reduce((s, a) => {
    for (const c of ['successes', 'err_429', 'err_5xx', 'err_timeout', 'err_client_gone']) s[c] = (s[c] ?? 0) + a[c];
    return s;
  }, {});
  for (const c of ['successes', 'err_429', 'err_5xx', 'err_timeout', 'err_client_gone']) {
    assert.ok(classes[c] > 0, `the load had ${c} (${JSON.stringify(classes)}, statuses ${JSON.stringify(seen.status)})`);
  }
  assert.ok(rows.some((r) => r.attempts > 1), 'some requests were retried');
  assertSame(await rollups(), want, 'rollups written by the settlement batches');

  // Percentiles from the summed buckets, within the stated error of the exact ones.
  const ttfts = rows.map((r) => r.ttft_ms).filter((x) => x !== null && x >= 20).sort((a, b) => a - b);
  if (ttfts.length >= 5) {
    const exact = ttfts[Math.ceil(0.5 * ttfts.length) - 1];
    const hist = Object.values(want).reduce((h, a) => h.map((v, i) => v + a.hist[i]), new Array(48).fill(0));
    const est = Number(await bill.db.scalar(`SELECT tg_ttft_quantile(ARRAY[${hist.join(',')}]::bigint[], 0.5)`));
    assert.ok(Math.abs(est - exact) / exact <= 0.0906 || hist[0] > 0,
      `P50 ${est} ms within 9.1% of the exact ${exact} ms`);
  }

  const rb = await tool(['usage', 'rebuild'], { db: bill.db, redis: null });
  assert.equal(rb.code, 0, rb.stderr + rb.stdout);
  assert.match(rb.stdout, new RegExp(`usage rebuild: \\d+ day\\(s\\), ${rows.length} usage row\\(s\\)`));
  assertSame(await rollups(), want, 'rollups rebuilt from the rows');

  await verifyLedger(bill);
});

/** The coarse rollups (sql/0014: hour × group × account × model) below the watermark. */
async function coarse() {
  const rows = await bill.db.query(`SELECT to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.000"Z"') AS hour,
    group_id, account_id, model, requests, successes, err_429, err_5xx, err_timeout, err_client_gone, err_other,
    estimated, input_tokens, output_tokens, cost::text AS cost, list_value::text AS list_value, busy_ms, ttft_n,
    ARRAY[${Array.from({ length: 48 }, (_, i) => `h${i}`).join(',')}] AS hist
    FROM usage_hourly_acct WHERE hour < (SELECT upto FROM usage_acct_until) ORDER BY 1, 2, 3, 4`);
  const out = {};
  for (const r of rows) {
    out[[r.hour, r.group_id, r.account_id, r.model].join('|')] = {
      requests: r.requests, successes: r.successes, err_429: r.err_429, err_5xx: r.err_5xx, err_timeout: r.err_timeout,
      err_client_gone: r.err_client_gone, err_other: r.err_other, estimated: r.estimated,
      input_tokens: BigInt(r.input_tokens), output_tokens: BigInt(r.output_tokens), cost: toNano(r.cost),
      list_value: toNano(r.list_value), busy_ms: r.busy_ms, ttft_n: r.ttft_n, hist: r.hist,
    };
  }
  return out;
}

test('coarse rollups: compaction and late settlements keep them equal to the usage rows; reports agree on both paths', async () => {
  const HOUR = 3600e3;
  const idAt = (ms) => `${Math.floor(ms).toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;
  // As a database upgraded before any compaction: nothing below the watermark yet.
  await bill.db.exec(`UPDATE usage_acct_until SET upto = '-infinity'`);
  const t0 = Date.now() - 3 * HOUR;
  const early = Array.from({ length: 9 }, (_, i) =>
    settlement(bill, { requestId: idAt(t0 + (i % 3) * HOUR + i), input: 5 + i, output: 3, status: i === 2 ? 429 : 200 }));
  await settleBatch(bill.conninfo, early);
  const compacted = Number(await bill.db.scalar('SELECT tg_usage_compact()'));
  assert.ok(compacted >= 3, `${compacted} hour(s) compacted`);
  const upto = Date.parse(await bill.db.scalar(`SELECT to_char(upto AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') FROM usage_acct_until`));
  assert.equal(upto, Math.floor(Date.now() / HOUR) * HOUR, 'the watermark is the current hour');
  // One tenant and one key here: the coarse combinations are the fine ones without them.
  const below = async () => {
    const want = {};
    for (const [k, v] of Object.entries(aggregate(await bill.db.query('SELECT * FROM usage')))) {
      const [hour, , , g, a, m] = k.split('|');
      if (Date.parse(hour) >= upto) continue;
      const ck = [hour, g, a, m].join('|');
      assert.equal(want[ck], undefined, `one fine combination per coarse one (${ck})`);
      want[ck] = v;
    }
    return want;
  };
  assertSame(await coarse(), await below(), 'coarse rollups after the compaction');

  // Late settlements (a spool replay, the reconciler) of compacted hours: the batch
  // recomputes the coarse rows it touched.
  const late = Array.from({ length: 4 }, (_, i) =>
    settlement(bill, { requestId: idAt(t0 + (i % 2) * HOUR + 100 + i), input: 50 + i, output: 9, status: i === 1 ? 500 : 200 }));
  await settleBatch(bill.conninfo, late);
  assertSame(await coarse(), await below(), 'coarse rollups after late settlements');

  // The report by model reads the coarse rows (and the current hour's fine ones), by
  // tenant only the fine ones: the same totals.
  const from = new Date(upto - 4 * HOUR).toISOString();
  const to = new Date(upto + HOUR).toISOString();
  const rep = async (g) => JSON.parse(await bill.db.scalar(
    `SELECT tg_usage_report('${from}', '${to}', '{${g}}', NULL, NULL, NULL, NULL, NULL, 100, 0)`)).data;
  const byModel = await rep('model');
  const byTenant = await rep('tenant');
  const sum = (rows, f) => rows.reduce((s, r) => s + f(r), 0);
  assert.equal(sum(byModel, (r) => r.requests), Number(await bill.db.scalar('SELECT count(*) FROM usage')));
  assert.equal(sum(byModel, (r) => r.requests), sum(byTenant, (r) => r.requests));
  assert.equal(sum(byModel, (r) => r.errors['429']), sum(byTenant, (r) => r.errors['429']));
  assert.equal(sum(byModel, (r) => Number(toNano(Number(r.cost).toFixed(9)))), sum(byTenant, (r) => Number(toNano(Number(r.cost).toFixed(9)))));
  // (no ledger verify here: these settlements went to Postgres only, as a replay of
  // another instance's spool would, so Redis's balance does not know them)
});

/** Sums fine aggregates (from aggregate()) into those of another key (`keyOf(fineKey)`). */
function regroup(fine, keyOf) {
  const out = {};
  for (const [k, v] of Object.entries(fine)) {
    const ck = keyOf(k.split('|'));
    if (ck === null) continue;
    const a = out[ck];
    if (!a) {
      out[ck] = { ...v, hist: [...v.hist] };
      continue;
    }
    for (const f of Object.keys(v)) {
      if (f === 'hist') a.hist = a.hist.map((x, i) => x + v.hist[i]);
      else a[f] += v[f];
    }
  }
  return out;
}

/**
 * Every cube table (sql/0016) in one query: {"<table>": {key: aggregate}}, keyed by its
 * time and dimensions; hourly rows below `upto` only.
 */
async function cubeRows(cubes, upto) {
  const FINE = ['tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'];
  const parts = [];
  for (const [cube, dims] of Object.entries(cubes)) {
    const cols = FINE.map((d) => (dims.includes(d) ? d : `NULL${d === 'model' ? '::text' : '::bigint'} AS ${d}`)).join(', ');
    parts.push(`SELECT 'usage_hourly_${cube}' AS tbl, to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.000"Z"') AS t,
      ${cols}, ${MEASURES} FROM usage_hourly_${cube} WHERE hour < '${new Date(upto).toISOString()}'`);
    parts.push(`SELECT 'usage_daily_${cube}', to_char(day, 'YYYY-MM-DD'), ${cols}, ${MEASURES} FROM usage_daily_${cube}`);
  }
  const out = {};
  for (const r of await bill.db.query(parts.join(' UNION ALL '))) {
    const dims = cubes[r.tbl.replace(/^usage_(hourly|daily)_/, '')];
    (out[r.tbl] ??= {})[[r.t, ...dims.map((d) => r[d])].join('|')] = {
      requests: r.requests, successes: r.successes, err_429: r.err_429, err_5xx: r.err_5xx, err_timeout: r.err_timeout,
      err_client_gone: r.err_client_gone, err_other: r.err_other, estimated: r.estimated,
      input_tokens: BigInt(r.input_tokens), output_tokens: BigInt(r.output_tokens), cost: toNano(r.cost),
      list_value: toNano(r.list_value), busy_ms: r.busy_ms, ttft_n: r.ttft_n, hist: r.hist,
    };
  }
  return out;
}
const MEASURES = `requests, successes, err_429, err_5xx, err_timeout, err_client_gone, err_other, estimated, input_tokens,
  output_tokens, cost::text AS cost, list_value::text AS list_value, busy_ms, ttft_n,
  ARRAY[${Array.from({ length: 48 }, (_, i) => `h${i}`).join(',')}] AS hist`;

test('usage cubes (sql/0016): every cube equals the usage rows summed by its dimensions, per hour and per day, after a load, late settlements and a rebuild; reports on each cube agree with the rows', async () => {
  const HOUR = 3600e3;
  const DAY = 24 * HOUR;
  const FINE = ['tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'];
  const CUBES = {
    acct: ['group_id', 'account_id', 'model'],
    key: ['tenant_id', 'api_key_id', 'group_id', 'model'],
    tenant: ['tenant_id', 'group_id', 'model'],
    model: ['group_id', 'model'],
    account_group: ['group_id', 'account_id'],
  };
  // Two more tenants with a key in each of two groups, a second model priced as the first.
  await bill.db.exec(`INSERT INTO groups (name) VALUES ('cube-g2');
    INSERT INTO tenants (name, balance, opening_balance) VALUES ('cube-t1', 100, 100), ('cube-t2', 100, 100);
    INSERT INTO api_keys (tenant_id, group_id, name, key_hash, prefix)
    SELECT t.id, g.id, t.name || '-k' || n, sha256(convert_to(t.name || '-' || n, 'UTF8')), 'tg-cube'
    FROM tenants t, generate_series(1, 2) n, groups g
    WHERE t.name LIKE 'cube-t%' AND g.name = CASE WHEN n = 1 THEN 'g' ELSE 'cube-g2' END;
    INSERT INTO model_prices (model, input, output) SELECT 'cube-model', input, output FROM model_prices WHERE model = 'mock-gpt'`);
  const keys = await bill.db.query('SELECT id, tenant_id, group_id FROM api_keys ORDER BY id');
  const accounts = (await bill.db.query('SELECT id FROM accounts ORDER BY id')).map((r) => r.id);
  assert.ok(keys.length >= 5 && accounts.length >= 2);
  const rand = rng(1816);
  const pick = (xs) => xs[Math.floor(rand() * xs.length)];
  const idAt = (ms) => `${Math.floor(ms).toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;
  const now = Date.now();
  const yesterday = Math.floor(now / DAY) * DAY - DAY;
  // hours of yesterday (compacted into daily rows) and of today before this hour
  const hours = [yesterday + 2 * HOUR, yesterday + 3 * HOUR, yesterday + 20 * HOUR, now - 2 * HOUR, now - HOUR];
  const load = (n) => Array.from({ length: n }, () => {
    const k = pick(keys);
    return {
      ...settlement(bill, {
        requestId: idAt(pick(hours) + Math.floor(rand() * 1000)),
        input: 1 + Math.floor(rand() * 90),
        output: Math.floor(rand() * 40),
        status: pick([200, 200, 200, 200, 429, 500, 499, 504, 400]),
      }),
      tenant_id: k.tenant_id,
      api_key_id: k.id,
      group_id: k.group_id,
      account_id: pick(accounts),
      model: pick(['mock-gpt', 'cube-model']),
    };
  });
  await settleBatch(bill.conninfo, load(80));
  await bill.db.scalar('SELECT tg_usage_compact()');

  const check = async (what) => {
    const [w] = await bill.db.query(`SELECT (SELECT to_char(upto AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
      FROM usage_acct_until) AS upto, ARRAY(SELECT to_char(day, 'YYYY-MM-DD') FROM usage_days_compacted) AS days`);
    const upto = Date.parse(w.upto);
    const days = new Set(w.days);
    assert.ok(days.has(new Date(yesterday).toISOString().slice(0, 10)), 'yesterday is compacted');
    const detail = await bill.db.query('SELECT * FROM usage');
    const fine = aggregate(detail);
    const got = await cubeRows(CUBES, upto);
    for (const [cube, dims] of Object.entries(CUBES)) {
      const pos = dims.map((d) => 1 + FINE.indexOf(d));
      const hourly = regroup(fine, (f) => (Date.parse(f[0]) < upto ? [f[0], ...pos.map((i) => f[i])].join('|') : null));
      assertSame(got[`usage_hourly_${cube}`] ?? {}, hourly, `${what}: usage_hourly_${cube}`);
      const daily = regroup(fine, (f) => (days.has(f[0].slice(0, 10)) ? [f[0].slice(0, 10), ...pos.map((i) => f[i])].join('|') : null));
      assertSame(got[`usage_daily_${cube}`] ?? {}, daily, `${what}: usage_daily_${cube}`);
    }
    // A report from yesterday to now on each cube (and on the fine rows: tenant and
    // account) counts every request in the range, per group as the rows do.
    const from = new Date(yesterday).toISOString();
    const to = new Date(Math.floor(now / HOUR) * HOUR + HOUR).toISOString();
    const rows = detail.filter((r) => hourOf(r) >= from);
    const field = { tenant: 'tenant_id', key: 'api_key_id', group: 'group_id', account: 'account_id', model: 'model' };
    const groupings = ['model', 'hour', 'day', 'group', 'account', 'day,account', 'tenant', 'account,model', 'key',
      'key,model', 'tenant,account'];
    const reports = await bill.db.query(`SELECT g, tg_usage_report('${from}', '${to}', string_to_array(g, ','), NULL, NULL,
      NULL, NULL, NULL, 1000, 0) AS r FROM unnest(ARRAY['${groupings.join("','")}']) g`);
    for (const { g, r } of reports) {
      const want = {};
      for (const u of rows) {
        const k = g.split(',').map((x) => (x === 'hour' ? hourOf(u) : x === 'day' ? hourOf(u).slice(0, 10) : String(u[field[x]] ?? 0))).join('|');
        want[k] = (want[k] ?? 0) + 1;
      }
      const gotBy = {};
      for (const x of JSON.parse(r).data) {
        const k = g.split(',').map((y) => (y === 'hour' ? new Date(x.hour).toISOString() : y === 'day' ? x.day
          : String(x[field[y]] ?? 0))).join('|');
        gotBy[k] = x.requests;
      }
      assert.deepEqual(gotBy, want, `${what}: report group_by=${g}`);
    }
  };
  await check('after the compaction');

  // Late settlements of compacted hours and of yesterday: each batch recomputes the
  // cube rows it touched, new combinations too.
  await settleBatch(bill.conninfo, load(30));
  await check('after late settlements');

  // The rebuild recomputes every cube from the usage rows.
  await bill.db.exec(`TRUNCATE usage_hourly_key, usage_daily_key, usage_hourly_tenant, usage_daily_tenant,
    usage_hourly_model, usage_daily_model, usage_hourly_acct, usage_daily_acct`);
  const rb = await tool(['usage', 'rebuild'], { db: bill.db, redis: null });
  assert.equal(rb.code, 0, rb.stderr + rb.stdout);
  await check('after `tollgate usage rebuild`');
});

test('the list value of a settlement batch (priced per combination since sql/0022) equals the per-row sum: every token kind, reasoning priced apart or as output, a model without a price, errors not counted; rebuild gives the same', async () => {
  // Prices with 4 decimals: a row's value (tokens × price / 10^6) has at most 10, the
  // rollups' scale, so per-row and per-combination sums must agree to the last digit.
  const prices = {
    'lv-a': { input: '2.5', output: '10', cache_read: '1.25', cache_write: '3.125', reasoning: null },
    'lv-b': { input: '0.15', output: '0.6', cache_read: '0.075', cache_write: '0.1875', reasoning: '2.4' },
  };
  for (const [m, p] of Object.entries(prices)) {
    await bill.db.exec(`INSERT INTO model_prices (model, input, output, cache_read, cache_write, reasoning)
      VALUES ('${m}', ${p.input}, ${p.output}, ${p.cache_read}, ${p.cache_write}, ${p.reasoning ?? 'NULL'})
      ON CONFLICT (model) DO UPDATE SET input = EXCLUDED.input, output = EXCLUDED.output,
        cache_read = EXCLUDED.cache_read, cache_write = EXCLUDED.cache_write, reasoning = EXCLUDED.reasoning`);
  }
  const units = (s) => { // a decimal string -> BigInt of 10^-4 (prices) or 10^-10 (values)
    const [i, f = ''] = String(s).split('.');
    return (d) => BigInt(i + f.padEnd(d, '0').slice(0, d));
  };
  const rand = rng(22);
  const models = ['lv-a', 'lv-b', 'lv-none'];
  const statuses = [200, 200, 201, 429, 500, 499, 504, 200];
  const idNow = () => `${Date.now().toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;
  const tok = (max) => (rand() < 0.25 ? null : Math.floor(rand() * max));
  const want = {};
  for (let b = 0; b < 3; b++) {
    const batch = Array.from({ length: 40 }, () => {
      const model = models[Math.floor(rand() * models.length)];
      const e = {
        ...settlement(bill, { requestId: idNow(), status: statuses[Math.floor(rand() * statuses.length)] }),
        model, input: tok(200000), output: tok(40000), cache_read: tok(90000), cache_write: tok(5000),
        reasoning: tok(60000), // at times more than the output: least(reasoning, output) is priced apart
      };
      const w = (want[model] ??= { value: 0n, output: 0n, reasoning: 0n });
      w.output += BigInt(e.output ?? 0);
      w.reasoning += BigInt(e.reasoning ?? 0);
      const p = prices[model];
      if (p && e.status >= 200 && e.status <= 399) {
        const o = BigInt(e.output ?? 0);
        const r = BigInt(e.reasoning ?? 0) < o ? BigInt(e.reasoning ?? 0) : o;
        const P = (x) => units(x)(4);
        // tokens × price(10^-4) / 10^6 = value in 10^-10
        w.value += BigInt(e.input ?? 0) * P(p.input) + (o - r) * P(p.output) + r * P(p.reasoning ?? p.output)
          + BigInt(e.cache_read ?? 0) * P(p.cache_read) + BigInt(e.cache_write ?? 0) * P(p.cache_write);
      }
      return e;
    });
    const out = await settleBatch(bill.conninfo, batch);
    assert.equal(out.filter((x) => x.outcome === 'settled').length, batch.length, JSON.stringify(out.slice(0, 3)));
  }
  const got = async () => {
    const rows = await bill.db.query(`SELECT model, sum(list_value)::text AS v, sum(output_tokens)::text AS o,
      sum(reasoning_tokens)::text AS r FROM usage_hourly WHERE model IN ('lv-a', 'lv-b', 'lv-none') GROUP BY model`);
    return Object.fromEntries(rows.map((x) => [x.model, { value: units(x.v)(10), output: BigInt(x.o), reasoning: BigInt(x.r) }]));
  };
  assert.ok(want['lv-a'].value > 0n && want['lv-b'].value > 0n && want['lv-none'], JSON.stringify(Object.keys(want)));
  assert.deepEqual(await got(), want, 'rollups written by the settlement batches');
  const rb = await tool(['usage', 'rebuild'], { db: bill.db, redis: null });
  assert.equal(rb.code, 0, rb.stderr + rb.stdout);
  assert.deepEqual(await got(), want, 'rollups rebuilt from the usage rows');
});
