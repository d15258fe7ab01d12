// budgets (#24, items 4 and 5) in the console, in Debian's Chromium driven by
// playwright-core against the real gateway with billing on, Postgres, Redis and the mock
// upstream: an operator creates a key's daily budget on the Budgets page (a time zone
// that does not exist is refused with the admin API's message next to the field), a
// billed request through the OpenAI SDK shows up as the budget's spend this period, the
// budget's detail lists the alert its 1% threshold raised, and the key's budgets (its
// own and its tenant's) are on the key's page. axe-core finds nothing serious on the
// page and its dialogs; no CSP violation, uncaught error or 5xx.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, REPO, startMock, stopAll, waitFor } from '../integration/lib/harness.mjs';
import { adminClient } from '../integration/lib/db.mjs';
import { billedSetup, MODEL, startBilledGateway } from '../integration/lib/billing.mjs';

const CHROMIUM = process.env.TG_CHROMIUM || '/usr/bin/chromium';

let mock;
let bill;
let gw;
let admin;
let ctx;
let page;
let profileDir;
const problems = [];
const serverErrors = [];

before(async () => {
  const { chromium } = await import('playwright-core');
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
  gw = await startBilledGateway(bill, { workers: 1 }, { mock });
  admin = adminClient(gw);
  profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-chromium-'));
  ctx = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1440, height: 900 },
    timeout: 30000,
  });
  page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(15000);
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to (load|execute|apply|connect|frame)/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  page.on('response', (r) => {
    if (r.status() >= 500) serverErrors.push(`${r.status()} ${r.request().method()} ${r.url()}`);
  });
});

after(async () => {
  await ctx?.close().catch(() => {});
  if (profileDir) fs.rmSync(profileDir, { recursive: true, force: true });
  await stopAll();
  await bill?.db.drop();
});

async function axeSerious() {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) {
    await page.evaluate(fs.readFileSync(path.join(REPO, 'spec', 'node_modules', 'axe-core', 'axe.min.js'), 'utf8'));
  }
  return page.evaluate(async () => {
    const r = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return r.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
  });
}

async function go(label) {
  await page.locator('nav.side').getByRole('link', { name: label, exact: true }).click();
  await page.getByRole('heading', { level: 1, name: label, exact: true }).waitFor();
}

const modal = () => page.locator('.modal');
const row = (text) => page.locator('tbody tr', { hasText: text });
const cell = async (r, col) => (await r.locator(`td[data-col="${col}"]`).textContent()).trim();

test('a key budget: created in the console, a bad time zone refused at its field, its spend after a billed request, its alerts, on the key page', async () => {
  // The tenant's own budget exists already (by the API): the key page must list both.
  const tenantBudget = await admin.create('/budgets', { name: 'acme-monthly', tenant_id: Number(bill.tenantId), amount: '50', period: 'month' });
  await page.goto(`${gw.url}/admin/budgets`);
  await page.locator('input[name="token"]').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Budgets', exact: true }).waitFor();
  await row('acme-monthly').waitFor();
  assert.match(await cell(row('acme-monthly'), 'scope'), /tenant\s+tenant acme/);

  // Create: a key's daily budget in a time zone that does not exist.
  await page.getByRole('button', { name: 'New budget' }).click();
  const form = modal();
  await form.locator('select[name="scope"]').selectOption('key');
  await form.locator('select[name="api_key_id"]').selectOption(String(bill.keyId));
  await form.locator('input[name="name"]').fill('k-daily');
  await form.locator('input[name="amount"]').fill('0.001');
  await form.locator('select[name="period"]').selectOption('day');
  await form.locator('input[name="timezone"]').fill('Mars/Olympus_Mons');
  await form.locator('input[name="thresholds"]').fill('1, 80');
  await form.getByRole('button', { name: 'Create budget', exact: true }).click();
  const tzError = form.locator('[data-testid="field-error-timezone"]');
  await tzError.waitFor();
  // The API's own words, next to the field, which is marked invalid and focused.
  const api = await admin.post('/budgets', { name: 'x', api_key_id: Number(bill.keyId), amount: '0.001', period: 'day', timezone: 'Mars/Olympus_Mons' });
  assert.equal(api.status, 400);
  assert.equal(api.json.error.param, 'timezone');
  const said = (await tzError.textContent()).trim();
  assert.ok(said.length > 5 && api.json.error.message.toLowerCase().includes(said.slice(1, 20).toLowerCase()), `field says "${said}", the API "${api.json.error.message}"`);
  assert.equal(await form.locator('input[name="timezone"]').getAttribute('aria-invalid'), 'true');
  assert.equal(await page.evaluate(() => document.activeElement?.name), 'timezone');
  assert.deepEqual(await axeSerious(), [], 'axe-core on the form with its error');

  await form.locator('input[name="timezone"]').fill('Europe/Berlin');
  await form.getByRole('button', { name: 'Create budget', exact: true }).click();
  await form.waitFor({ state: 'detached' });
  const r = row('k-daily');
  await r.waitFor();
  assert.match(await cell(r, 'scope'), /^key\s+key /);
  assert.equal(await cell(r, 'period'), 'day (Europe/Berlin)');
  assert.equal(await cell(r, 'amount'), '$0.001');
  assert.match(await cell(r, 'spend'), /^\$0\.00 \(0%\)$/);
  assert.equal(await cell(r, 'remaining'), '$0.001');
  const [created] = (await admin.read('/budgets')).data.filter((b) => b.name === 'k-daily');
  assert.equal(created.timezone, 'Europe/Berlin');
  assert.deepEqual(created.thresholds, [1, 80]);
  // It resets at the next midnight in Berlin.
  const resets = new Date(created.current.resets_at);
  assert.equal(new Intl.DateTimeFormat('en-GB', { timeZone: 'Europe/Berlin', hour: '2-digit', minute: '2-digit' }).format(resets), '00:00');
  assert.ok((await cell(r, 'resets')).length > 5);

  // A billed request with the key (the official OpenAI client): the spend shows.
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: bill.key, baseURL: gw.baseURL, maxRetries: 0, timeout: 15000 });
  await client.chat.completions.create({ model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: 'budget [mock chunks=3]' }] });
  let b;
  await waitFor(async () => {
    b = await admin.read(`/budgets/${created.id}`);
    return Number(b.current.spend) > 0 && b.alerts.length > 0;
  }, { timeout: 15000, interval: 250, what: 'the request settled in the budget and its 1% alert raised' }).catch((e) => {
    throw new Error(`${e.message}; the budget: ${JSON.stringify(b)}`);
  });
  const cost = await bill.db.scalar('SELECT sum(cost) FROM usage');
  assert.equal(Number(b.current.spend), Number(cost), 'the period spend is the usage row');
  await page.reload();
  await r.waitFor();
  const spendText = await cell(r, 'spend');
  assert.ok(spendText.startsWith(`$${Number(cost).toFixed(10).replace(/0+$/, '')}`), `spend cell "${spendText}" for cost ${cost}`);
  assert.ok(!spendText.startsWith('$0.00 '), spendText);
  // The alert shows in the list: the highest threshold this period reached.
  assert.equal(await cell(r, 'alerts'), '1% reached');
  assert.equal(await cell(row('acme-monthly'), 'alerts'), 'none');
  assert.deepEqual(await axeSerious(), [], 'axe-core on the list');

  // The detail: this period, the period's spend, the alert with its threshold and delivery.
  await r.getByRole('button', { name: 'k-daily' }).click();
  const detail = page.locator('[data-testid="budget-detail"]');
  await detail.waitFor();
  assert.match(page.url(), new RegExp(`/admin/budgets\\?id=${created.id}$`));
  const alertRow = detail.locator('tbody tr', { hasText: '1%' });
  await alertRow.waitFor();
  assert.equal((await alertRow.locator('td[data-col="state"]').textContent()).trim(), 'no webhook');
  assert.ok((await alertRow.locator('td[data-col="raised_at"]').textContent()).trim().length > 5);
  assert.equal(await detail.locator('tbody tr', { hasText: '80%' }).count(), 0, '80% is not reached');
  assert.deepEqual(await axeSerious(), [], 'axe-core on the detail');
  await page.keyboard.press('Escape');
  await detail.waitFor({ state: 'detached' });

  // Edit: the amount changes; a bad period length is refused at its field.
  await r.getByRole('button', { name: 'Edit' }).click();
  await modal().locator('select[name="period"]').selectOption('hours');
  await modal().locator('input[name="period_hours"]').fill('0');
  await modal().getByRole('button', { name: 'Save budget' }).click();
  await modal().locator('[data-testid="field-error-period_hours"]').waitFor();
  await modal().locator('select[name="period"]').selectOption('day');
  await modal().locator('input[name="amount"]').fill('0.002');
  await modal().getByRole('button', { name: 'Save budget' }).click();
  await modal().waitFor({ state: 'detached', timeout: 5000 }).catch(async (e) => {
    throw new Error(`${e.message}: ${await modal().textContent()}`);
  });
  await waitFor(async () => (await cell(r, 'amount')) === '$0.002', { timeout: 5000, what: 'the new amount listed' });

  // The key's page: every budget that applies to it, with spend and remaining.
  await go('Keys');
  await row('acme').first().waitFor();
  await page.locator(`tbody tr[data-row="${bill.keyId}"]`).getByRole('button', { name: 'Budgets' }).click();
  const kb = page.locator('[data-testid="key-budgets"]');
  await kb.waitFor();
  const names = await kb.locator('tbody td[data-col="name"]').allTextContents();
  assert.deepEqual(names.map((s) => s.trim()).sort(), ['acme-monthly', 'k-daily']);
  const kRow = kb.locator('tbody tr', { hasText: 'k-daily' });
  assert.equal((await kRow.locator('td[data-col="scope"]').textContent()).trim(), 'key');
  assert.equal((await kb.locator('tbody tr', { hasText: 'acme-monthly' }).locator('td[data-col="scope"]').textContent()).trim(), 'tenant');
  assert.ok((await kRow.locator('td[data-col="spend"]').textContent()).startsWith(spendText.split(' ')[0]));
  assert.deepEqual(await axeSerious(), [], 'axe-core on the key budgets dialog');
  // Its name leads to the budget's detail.
  await kRow.getByRole('link', { name: 'k-daily' }).click();
  await page.locator('[data-testid="budget-detail"]').waitFor();
  await page.keyboard.press('Escape');

  // Delete the tenant's budget.
  await row('acme-monthly').getByRole('button', { name: 'Delete' }).click();
  await modal().getByRole('button', { name: 'Delete budget' }).click();
  await row('acme-monthly').waitFor({ state: 'detached' });
  assert.equal((await admin.get(`/budgets/${tenantBudget.id}`)).status, 404);

  assert.deepEqual(problems, []);
  assert.deepEqual(serverErrors, []);
});
