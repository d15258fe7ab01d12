// newcomer: the console's first screen says what to do next (issue #23), in Debian's
// Chromium driven by playwright-core. It starts where a new user starts: the console URL
// examples/quickstart.sh prints (run in a clean checkout, its own services, stopped by
// PID), logs in with the admin token it printed, finds the sample request with the cost
// the quickstart printed, and on the dashboard a guide that says the deployment is set up
// and where to look next. On an empty database the same guide lists the six steps to a
// first billed request, ticks what exists, links the next one, and stays hidden once
// the operator hides it.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, startMock, stopAll } from '../integration/lib/harness.mjs';
import { createDb, startStateGateway } from '../integration/lib/db.mjs';
import { cleanCheckout, startQuickstart } from '../integration/lib/quickstart.mjs';

const CHROMIUM = process.env.TG_CHROMIUM || '/usr/bin/chromium';

let ctx;
let page;
let profileDir;
let dir;
let qs;
let db;
const problems = [];

before(async () => {
  const { chromium } = await import('playwright-core');
  profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-chromium-'));
  ctx = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 900 },
    timeout: 30000,
  });
  page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(15000);
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
});

after(async () => {
  await ctx?.close().catch(() => {});
  if (profileDir) fs.rmSync(profileDir, { recursive: true, force: true });
  if (qs && !qs.exit) await qs.stop();
  await stopAll();
  await db?.drop();
  if (dir && !process.env.TG_KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true });
});

async function logIn(token) {
  const input = page.locator('input[name="token"]');
  await input.waitFor();
  await input.fill(token);
  await page.getByRole('button', { name: 'Log in' }).click();
}

test("from the quickstart's console URL: log in, the sample request with its printed cost, a dashboard that says what next", async () => {
  dir = cleanCheckout();
  qs = await startQuickstart(dir);
  assert.ok(qs.consoleUrl, qs.tail());
  await page.goto(qs.consoleUrl);
  await logIn(qs.out.TOLLGATE_ADMIN_TOKEN);
  await page.getByRole('heading', { level: 1, name: 'Usage' }).waitFor();
  // The Usage page reports from the rollups (the server's usage/report): the sample is
  // the one request of the range, at its printed cost — money shown as stored
  // ($0.00000975 for 0.00000975).
  await page.locator('[data-testid="usage-count"]', { hasText: /^1$/ }).waitFor();
  assert.match((await page.locator('[data-testid="usage-cost"]').textContent()).trim(),
    new RegExp(`^\\$${qs.out.TOLLGATE_SAMPLE_COST.replace('.', '\\.')}$`));

  await page.locator('nav.side').getByRole('link', { name: 'Dashboard', exact: true }).click();
  const guide = page.locator('[data-testid="guide"]');
  await guide.waitFor();
  assert.equal(await guide.getAttribute('data-state'), 'ready');
  await guide.getByRole('heading', { name: 'Set up and serving' }).waitFor();
  assert.match(await guide.textContent(), /1 tenant \(demo, balance \$[\d.]+\), 1 key, 3 active accounts in 1 group/);
  await guide.locator('[data-testid="guide-usage"]').click();
  await page.getByRole('heading', { level: 1, name: 'Usage' }).waitFor();
  assert.deepEqual(problems, []);

  const { exit, leftover } = await qs.stop();
  assert.deepEqual(leftover, []);
  assert.equal(exit.code, 0);
});

test('an empty database: six steps, the next one linked, ticked as they are done, hidden when hidden', async (t) => {
  if (!process.env.TOLLGATE_PG || !process.env.TOLLGATE_REDIS) {
    t.skip('needs TOLLGATE_PG and TOLLGATE_REDIS (spec/run.sh)');
    return;
  }
  db = await createDb();
  const mock = await startMock();
  const gw = await startStateGateway(db, {}, { mock });
  await ctx.clearCookies();
  await page.goto(`${gw.url}/admin/`);
  await logIn(ADMIN_TOKEN);
  const guide = page.locator('[data-testid="guide"]');
  await guide.waitFor();
  assert.equal(await guide.getAttribute('data-state'), 'setup');
  await guide.getByRole('heading', { name: 'Get started: 6 steps to a first billed request' }).waitFor();
  const steps = await guide.locator('li[data-step]').evaluateAll((ls) => ls.map((l) => [l.dataset.step, l.dataset.done]));
  assert.deepEqual(steps, [['group', 'false'], ['account', 'false'], ['price', 'false'], ['tenant', 'false'], ['key', 'false'], ['request', 'false']]);
  assert.match(await guide.textContent(), /curl http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions/);
  // The next step is a link to the page that does it.
  await guide.locator('[data-testid="guide-next"]').click();
  await page.getByRole('heading', { level: 1, name: 'Groups' }).waitFor();

  // A group and a price exist now: those are ticked, the account is next.
  await db.exec("INSERT INTO groups (name) VALUES ('g1'); INSERT INTO model_prices (model, input, output) VALUES ('m1', 1, 2)");
  await page.locator('nav.side').getByRole('link', { name: 'Dashboard', exact: true }).click();
  await guide.getByRole('heading', { name: 'Get started: 4 steps to a first billed request' }).waitFor();
  assert.equal(await guide.locator('li[data-step="group"]').getAttribute('data-done'), 'true');
  assert.equal(await guide.locator('li[data-step="price"]').getAttribute('data-done'), 'true');
  assert.equal((await guide.locator('[data-testid="guide-next"]').textContent()).trim(), 'Add an account →');

  await guide.getByRole('button', { name: 'Hide this guide' }).click();
  await guide.waitFor({ state: 'detached' });
  await page.reload();
  await page.locator('[data-testid="stat-requests"]').waitFor();
  assert.equal(await page.locator('[data-testid="guide"]').count(), 0, 'hidden stays hidden');
  assert.deepEqual(problems, []);
});
