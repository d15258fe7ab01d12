// usage (#18, item 3) in the console, in Debian's Chromium driven by playwright-core
// against the real gateway with billing on, Postgres, Redis and the mock upstream: the
// Usage page shows the admin API's report (totals, a chart over time, the grouped rows a
// page at a time, the CSV export streamed by the server) and the Capacity page its
// capacity report per account and per group with the rule of its recommendation. What
// the test checks is what an operator reads: the numbers equal the usage rows the test
// created (140 settled over the last 5 days, one a 429, plus live requests through the
// OpenAI SDK) and the API's answers; the console never downloads usage rows
// (GET /admin/api/v1/usage) — every number comes from usage/report and usage/capacity.
// axe-core finds nothing serious; no CSP violation, uncaught error or 5xx.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, startMock, stopAll } from '../integration/lib/harness.mjs';
import { billedSetup, MODEL, settleBatch, settlement, startBilledGateway, waitUsageRow } from '../integration/lib/billing.mjs';
import { adminClient } from '../integration/lib/db.mjs';
import { axeSerious, launchConsole } from './lib.mjs';

const HOUR = 3600e3;
const SETTLED = 140;
const idAt = (ms) => `${Math.floor(ms).toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;

let mock;
let bill;
let gw;
let admin;
let ui;
let page;
const rawUsage = [];

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  // 140 requests settled over the last 5 days (as a spool replay would), each in an hour
  // of its own: more hourly groups than a page (100) holds. The 7th is a 429.
  const now = Date.now();
  const els = [];
  for (let i = 0; i < SETTLED; i++) {
    els.push(settlement(bill, { requestId: idAt(now - (2 + i * 0.8) * HOUR), input: 100 + i, output: 10 + (i % 7), status: i === 6 ? 429 : 200 }));
  }
  await settleBatch(bill.conninfo, els);
  gw = await startBilledGateway(bill, { workers: 1 }, { mock });
  admin = adminClient(gw);
  // Live requests through the official OpenAI client.
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: bill.key, baseURL: gw.baseURL, maxRetries: 0, timeout: 15000 });
  for (let i = 0; i < 3; i++) {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 50, messages: [{ role: 'user', content: `usage ${i} [mock chunks=2]` }] }).withResponse();
    await waitUsageRow(bill, r.response.headers.get('x-request-id'));
  }
  ui = await launchConsole();
  page = ui.page;
  page.on('request', (r) => {
    if (/\/admin\/api\/v1\/usage(\?|$)/.test(r.url())) rawUsage.push(r.url());
  });
});

after(async () => {
  await ui?.close();
  await stopAll();
  await bill?.db.drop();
});

/** With TG_SCREENSHOT_DIR set, the page as it is (admin-ui/screenshots/ holds reviewed ones). */
async function shot(name) {
  if (!process.env.TG_SCREENSHOT_DIR) return;
  fs.mkdirSync(process.env.TG_SCREENSHOT_DIR, { recursive: true });
  await page.evaluate(() => document.querySelector('main')?.scrollTo?.(0, 0) ?? window.scrollTo(0, 0));
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: `${process.env.TG_SCREENSHOT_DIR}/${name}.png` });
}

async function go(label) {
  await page.locator('nav.side').getByRole('link', { name: label, exact: true }).click();
  await page.getByRole('heading', { level: 1, name: label, exact: true }).waitFor();
}

const text = async (sel) => (await page.locator(sel).first().textContent()).trim();
const dollars = (s) => Number(s.replace(/[$,]/g, ''));
const count = (s) => Number(s.replace(/[^0-9]/g, ''));
/** The report the page asked for last, as the API answers it (same range). */
async function apiReport(query) {
  const r = await admin.get(`/usage/report?${query}`);
  assert.equal(r.status, 200, r.text);
  return r.json;
}

test('usage page: totals, chart, grouped rows a page at a time and the CSV export are the server\'s report of the rows created', async () => {
  await page.goto(`${gw.url}/admin/usage`);
  await page.locator('input[name="token"]').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Usage', exact: true }).waitFor();
  await page.locator('[data-testid="usage-count"]').waitFor();

  // The last 7 days, per hour: every row the test created.
  await page.locator('select[name="range"]').selectOption('7d');
  await page.waitForFunction(() => /range=7d/.test(location.search));
  const rows = await bill.db.query(`SELECT count(*)::int AS n, count(*) FILTER (WHERE status = 429)::int AS n429,
    sum(cost)::text AS cost, sum(input_tokens + output_tokens)::bigint AS tokens FROM usage`);
  const db = rows[0];
  assert.equal(db.n, SETTLED + 3);
  await page.waitForFunction((n) => document.querySelector('[data-testid="usage-count"]')?.textContent === n.toLocaleString('en-US'), db.n);
  assert.equal(await text('[data-testid="usage-429"]'), '1 × 429');
  assert.equal(dollars(await text('[data-testid="usage-cost"]')), Number(db.cost), 'the cost as billed');
  assert.equal(count(await text('[data-testid="usage-tokens"]')), Number(db.tokens));
  const url = new URL(page.url());
  const range = await text('[data-testid="usage-range"]');
  const m = /^From (\S+) (\S+) UTC to (\S+) (\S+) UTC/.exec(range);
  assert.ok(m, range);
  const from = `${m[1]}T${m[2]}Z`;
  const to = `${m[3]}T${m[4]}Z`;
  assert.equal(Date.parse(to) - Date.parse(from), 7 * 24 * HOUR, `${range} (${url.search})`);
  const total = (await apiReport(`from=${from}&to=${to}&group_by=`)).data[0];
  assert.equal(total.requests, db.n, 'the API agrees with the rows');
  assert.match(await text('[data-testid="usage-success"]'), new RegExp(`^${(total.success_rate * 100).toFixed(1)}% succeeded`));
  assert.equal(await text('[data-testid="usage-ttft"]'), total.ttft.p95_ms >= 1000 ? `${(total.ttft.p95_ms / 1000).toFixed(2)} s` : `${total.ttft.p95_ms.toFixed(total.ttft.p95_ms < 10 ? 1 : 0)} ms`);
  await page.locator('[data-testid="usage-chart-requests"] canvas').waitFor();
  await page.locator('[data-testid="usage-chart-cost"] canvas').waitFor();

  // Per hour: 140 settled hours and the live one(s): two pages of 100.
  const hours = await apiReport(`from=${from}&to=${to}&group_by=hour&limit=1000`);
  assert.ok(hours.data.length > 100, `${hours.data.length} hours`);
  const table = page.locator('[data-testid="usage-table"] tbody tr');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="usage-table"] tbody tr').length === 100);
  assert.equal(await table.first().locator('td[data-col="hour"]').textContent(), hours.data[0].hour.replace('T', ' ').replace(':00:00Z', ':00 UTC'));
  assert.equal(await page.getByRole('button', { name: 'Previous page' }).isDisabled(), true);
  await page.getByRole('button', { name: 'Next page' }).click();
  await page.locator('[data-testid="usage-pager"]').getByText('Page 2 (last)').waitFor();
  assert.equal(await table.count(), hours.data.length - 100);
  const p2 = await table.first();
  assert.equal(await p2.locator('td[data-col="hour"]').textContent(), hours.data[100].hour.replace('T', ' ').replace(':00:00Z', ':00 UTC'));
  assert.equal(count(await p2.locator('td[data-col="requests"]').textContent()), hours.data[100].requests);
  assert.equal(dollars(await p2.locator('td[data-col="cost"]').textContent()), Number(hours.data[100].cost));
  assert.deepEqual(await axeSerious(page), [], 'axe-core on the usage page');
  await shot('usage-report');
  await page.getByRole('button', { name: 'Previous page' }).click();
  await page.locator('[data-testid="usage-pager"]').getByText('Page 1', { exact: true }).waitFor();

  // The CSV export of this grouping, streamed by the server: a header and one line per hour.
  const [download] = await Promise.all([page.waitForEvent('download'), page.locator('[data-testid="usage-export"]').click()]);
  const csv = fs.readFileSync(await download.path(), 'utf8').trim().split('\n');
  assert.match(csv[0], /^hour,requests,successes,err_429,/);
  assert.equal(csv.length - 1, hours.data.length);
  assert.equal(csv.slice(1).reduce((s, l) => s + Number(l.split(',')[1]), 0), db.n);
  assert.ok(csv[1].startsWith(`${hours.data[0].hour},${hours.data[0].requests},`), csv[1]);

  // No time, by model: one row, the model's numbers.
  await page.locator('select[name="time"]').selectOption('');
  await page.locator('select[name="dim"]').selectOption('model');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="usage-table"] tbody tr').length === 1 &&
    document.querySelector('[data-testid="usage-table"] td[data-col="model"]'));
  assert.equal(await table.first().locator('td[data-col="model"]').textContent(), MODEL);
  assert.equal(count(await table.first().locator('td[data-col="requests"]').textContent()), db.n);
  assert.equal(count(await table.first().locator('td[data-col="429"]').textContent()), 1);

  // A custom range with "From" after "To" says so, and asks the API nothing.
  await page.locator('select[name="range"]').selectOption('custom');
  await page.locator('input[name="from_day"]').fill('2026-11-20');
  await page.locator('input[name="to_day"]').fill('2026-11-10');
  await page.getByRole('button', { name: 'Show', exact: true }).click();
  await page.getByText('"From" is after "To": swap them.').waitFor();

  assert.deepEqual(rawUsage, [], 'the console never downloads usage rows');
  assert.deepEqual(ui.problems, []);
  assert.deepEqual(ui.serverErrors, []);
});

test('capacity page: per account and per group, the API\'s capacity report with its rule and recommendation', async () => {
  await go('Capacity');
  const row = page.locator('[data-testid="capacity-table"] tbody tr', { hasText: 'up' });
  await row.waitFor();
  await page.getByRole('button', { name: '14 days', pressed: true }).waitFor();
  const range = await text('[data-testid="capacity-range"]');
  const m = /^From (\S+) to (\S+),/.exec(range);
  assert.ok(m, range);
  const cap = (await admin.get(`/usage/capacity?from=${m[1]}&to=${m[2]}&by=account`)).json;
  const up = cap.data.find((a) => a.name === 'up');
  assert.ok(up, JSON.stringify(cap));
  const db = (await bill.db.query(`SELECT count(*)::int AS n, count(*) FILTER (WHERE status = 429)::int AS n429 FROM usage WHERE account_id = ${bill.accountId}`))[0];
  assert.equal(up.requests, db.n, 'the API counts every row of the account');
  const cell = async (col) => (await row.locator(`td[data-col="${col}"]`).textContent()).trim();
  assert.equal(count(await cell('requests')), db.n);
  assert.equal(await cell('share_429'), `${((db.n429 / db.n) * 100).toFixed(1)}%`);
  assert.equal(await cell('success_rate'), `${(up.success_rate * 100).toFixed(1)}%`);
  assert.equal(dollars(await cell('value')), Number(up.list_value));
  assert.ok(Number(up.list_value) > 0);
  assert.equal(await cell('ttft_p95'), `${up.ttft_p95_ms.toFixed(up.ttft_p95_ms < 10 ? 1 : 0)} ms`);
  assert.equal(await cell('utilisation'), `${(up.utilisation * 100).toFixed(2)}%`);
  assert.equal(count(await cell('recommended')), up.recommended_concurrency);
  assert.ok(up.recommended_concurrency >= 1);
  assert.ok((await text('[data-testid="capacity-rule"]')).includes(cap.rule), 'the rule next to the numbers');
  assert.match(cap.rule, /recommended_concurrency/);
  await page.locator('[data-testid="capacity-chart"] canvas').waitFor();
  assert.deepEqual(await axeSerious(page), [], 'axe-core on the capacity page');
  await shot('capacity-report');

  // Per group, 7 days.
  await page.getByRole('button', { name: 'per group' }).click();
  await page.getByRole('button', { name: '7 days' }).click();
  await page.getByRole('button', { name: '7 days', pressed: true }).waitFor();
  const g = page.locator('[data-testid="capacity-table"] tbody tr', { hasText: /^g/ });
  await page.locator('[data-testid="capacity-table"] th', { hasText: 'recommended oversubscription' }).waitFor();
  await g.first().waitFor();
  const range7 = /^From (\S+) to (\S+),/.exec(await text('[data-testid="capacity-range"]'));
  const capg = (await admin.get(`/usage/capacity?from=${range7[1]}&to=${range7[2]}&by=group`)).json;
  const gg = capg.data.find((x) => x.name === 'g');
  assert.ok(gg, JSON.stringify(capg));
  assert.equal(count(await g.first().locator('td[data-col="requests"]').textContent()), gg.requests);
  assert.equal(gg.requests, db.n, 'all of it in the last 7 days');
  assert.ok((await text('[data-testid="capacity-rule"]')).includes(capg.rule));
  assert.match(capg.rule, /recommended_oversubscription/);
  assert.deepEqual(await axeSerious(page), [], 'axe-core on the capacity page per group');

  assert.deepEqual(rawUsage, [], 'the console never downloads usage rows');
  assert.deepEqual(ui.problems, []);
  assert.deepEqual(ui.serverErrors, []);
});
