// Identities in the console (issue #19, item 8), in Debian's Chromium driven by
// playwright-core against the real gateway, Postgres, Redis and the mock upstream (its
// token endpoint verifying the service account's JWT): an operator creates a Vertex
// account with a service account key pasted as JSON (a key that is not one is refused
// with the admin API's message), tests it (a token is obtained, HTTP 200), sees its
// token's expiry and last renewal in the list, and the key is never shown again; an
// OAuth account whose refresh is refused shows "token refresh failed" with the reason.
// axe-core finds nothing serious; no CSP violation, uncaught error or 5xx.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, REPO, fetchT, startMock, stopAll } from '../integration/lib/harness.mjs';
import { billedSetup, startBilledGateway } from '../integration/lib/billing.mjs';

const CHROMIUM = process.env.TG_CHROMIUM || '/usr/bin/chromium';
const EMAIL = 'console@proj-9.iam.gserviceaccount.com';
const CLAUDE = 'claude-sonnet-4@20250514';

let mock;
let bill;
let gw;
let ctx;
let page;
let profileDir;
let saJson;
const problems = [];
const serverErrors = [];

before(async () => {
  const { chromium } = await import('playwright-core');
  mock = await startMock();
  const kp = crypto.generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  saJson = JSON.stringify({
    type: 'service_account', project_id: 'proj-9', private_key_id: 'k9', private_key: kp.privateKey,
    client_email: EMAIL, token_uri: `${mock.url}/token`,
  }, null, 2);
  const r = await fetchT(`${mock.url}/_mock/identity`, {
    method: 'POST', body: JSON.stringify({ lifetime_ms: 600000, service_accounts: { [EMAIL]: kp.publicKey } }),
  });
  assert.equal(r.status, 200);
  bill = await billedSetup({ mock, prices: [{ model: CLAUDE, input: '1.00', output: '2.00' }] });
  gw = await startBilledGateway(bill, { workers: 1 }, { mock });
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
  page.on('response', (res) => {
    if (res.status() >= 500) serverErrors.push(`${res.status()} ${res.request().method()} ${res.url()}`);
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

const modal = () => page.locator('.modal');
const row = (text) => page.locator('tbody tr', { hasText: text });

async function fillAccount(name, { provider, auth, baseUrl, settings, keyJson, credential }) {
  const form = modal();
  await form.locator('input[name="name"]').fill(name);
  await form.locator('select[name="provider"]').selectOption(provider);
  await form.locator('select[name="auth"]').selectOption(auth);
  await form.locator('input[name="base_url"]').fill(baseUrl);
  if (keyJson !== undefined) await form.locator('textarea[name="credential_json"]').fill(keyJson);
  if (credential !== undefined) await form.locator('input[name="credential"]').fill(credential);
  await form.locator('textarea[name="settings"]').fill(JSON.stringify(settings));
  await form.getByLabel('g', { exact: true }).check();
}

test('a Vertex account with a service account key: created, tested, its token shown; a refused refresh shown with its reason', async () => {
  await page.goto(`${gw.url}/admin/accounts`);
  await page.locator('input[name="token"]').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Accounts', exact: true }).waitFor();

  await page.getByRole('button', { name: 'New account' }).click();
  const settings = { project: 'proj-9', region: 'us-east5' };
  await fillAccount('vertex-sa', { provider: 'vertex', auth: 'service_account', baseUrl: mock.url, settings, keyJson: '{"type": "service_account", "private_key": "nope"' });
  await modal().locator('input[name="models"]').fill(CLAUDE);
  await modal().getByRole('button', { name: 'Create account', exact: true }).click();
  await modal().locator('.error, [data-testid^="field-error"]').first().getByText(/not a JSON object/).waitFor();
  assert.deepEqual(await axeSerious(), [], 'axe-core on the form with its error');

  await modal().locator('textarea[name="credential_json"]').fill(saJson);
  await modal().getByRole('button', { name: 'Create account', exact: true }).click();
  await modal().waitFor({ state: 'detached' });
  const r = row('vertex-sa');
  await r.waitFor();
  assert.match(await r.locator('td[data-col="provider"]').textContent(), /vertex.*service_account · no token yet/);

  // The account test obtains a token (the mock verified the JWT) and goes through rawPredict.
  await r.getByRole('button', { name: 'Test' }).click();
  await modal().getByRole('button', { name: 'Send test request' }).click();
  await modal().locator('[data-testid="test-result"]').getByText('works').waitFor();
  assert.equal(await modal().locator('[data-testid="test-status"]').textContent(), 'HTTP 200');
  assert.match(await modal().locator('[data-testid="test-result"]').textContent(), /:rawPredict/);
  await modal().getByRole('button', { name: 'Close' }).click();
  await page.waitForFunction(() => /token expires in .* · renewed/.test(
    [...document.querySelectorAll('[data-testid="account-token"]')].map((e) => e.textContent).join(' ')), null, { timeout: 10000 });

  // The key is write-only: the edit form keeps it blank.
  await r.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await modal().locator('textarea[name="credential_json"]').inputValue(), '');
  assert.equal(await modal().locator('input[name="credential"]').inputValue(), '');
  assert.doesNotMatch(await page.content(), /BEGIN PRIVATE KEY/);
  await modal().getByRole('button', { name: 'Cancel' }).click();

  // An OAuth account whose refresh token the issuer does not know: invalid_grant, shown.
  await page.getByRole('button', { name: 'New account' }).click();
  await fillAccount('refresh-refused', {
    provider: 'openai', auth: 'oauth', baseUrl: `${mock.url}/v1`, credential: 'rt-unknown',
    settings: { token_url: `${mock.url}/oauth/token` },
  });
  await modal().getByRole('button', { name: 'Create account', exact: true }).click();
  await modal().waitFor({ state: 'detached' });
  await row('refresh-refused').getByRole('button', { name: 'Test' }).click();
  await modal().getByRole('button', { name: 'Send test request' }).click();
  await modal().locator('.error').getByText(/invalid_grant/).waitFor().catch(async (e) => {
    throw new Error(`${e.message}\nthe dialog says: ${await modal().textContent().catch(() => '?')}`);
  });
  await modal().getByRole('button', { name: 'Close' }).click();
  await page.waitForFunction(() => /token refresh failed/.test(document.querySelector('tbody')?.textContent || ''), null, { timeout: 10000 });
  assert.match(await row('refresh-refused').locator('td[data-col="health"]').textContent(), /token refresh failed.*invalid_grant/);
  assert.deepEqual(await axeSerious(), [], 'axe-core on the accounts page');
  assert.deepEqual(problems, []);
  assert.deepEqual(serverErrors, []);
});
