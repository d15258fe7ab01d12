// What the console's browser tests share: Debian's Chromium launched headless through
// playwright-core on a throw-away profile, the page's problems collected (CSP
// violations, uncaught errors, 5xx answers), and axe-core's serious and critical WCAG
// 2.1 A/AA violations on the page as it is.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { REPO } from '../integration/lib/harness.mjs';

export const CHROMIUM = process.env.TG_CHROMIUM || '/usr/bin/chromium';

/**
 * Launches Chromium; resolves {ctx, page, problems, serverErrors, close()}. problems and
 * serverErrors fill while the page runs; close() ends the browser and removes its profile.
 */
export async function launchConsole({ width = 1440, height = 900 } = {}) {
  const { chromium } = await import('playwright-core');
  const profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'tollgate-chromium-'));
  const ctx = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width, height },
    timeout: 30000,
  });
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(15000);
  const problems = [];
  const serverErrors = [];
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to (load|execute|apply|connect|frame)/i.test(m.text())) problems.push(`CSP: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  page.on('response', (r) => {
    if (r.status() >= 500) serverErrors.push(`${r.status()} ${r.request().method()} ${r.url()}`);
  });
  const close = async () => {
    await ctx.close().catch(() => {});
    fs.rmSync(profileDir, { recursive: true, force: true });
  };
  return { ctx, page, problems, serverErrors, close };
}

/** axe-core's serious and critical WCAG 2.1 A/AA violations on `page`, one line each. */
export async function axeSerious(page) {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) {
    await page.evaluate(fs.readFileSync(path.join(REPO, 'spec', 'node_modules', 'axe-core', 'axe.min.js'), 'utf8'));
  }
  return page.evaluate(async () => {
    const r = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return r.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.id} (${v.impact}): ${v.help} — ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
  });
}
