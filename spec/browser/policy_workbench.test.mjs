// policy (#22, items 4 and 5): the console's policy workbench, in Debian's Chromium driven
// by playwright-core against the real gateway (Postgres, Redis, the mock upstream, the
// capture on), while the OpenAI SDK keeps a bounded background load on the gateway. An
// operator walks a policy from a blank template to production and back: the first save
// is refused with the line of its syntax error, the fixed one is stored as generation 1;
// its replay against the capture lists where it would have picked another account; it
// runs in shadow for group `pool` (the mock still sees the live choice), is promoted live
// for the group (the mock sees only its account), then for every request, and is rolled
// back. The audit list has each step with the operator's name and its generation. Not one
// background request fails (counted at the client); axe-core finds nothing serious; no
// CSP violation, uncaught error or 5xx.

import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, REPO, sleep, tempDir, waitFor } from '../integration/lib/harness.mjs';
import { MODEL, startRouting } from '../integration/lib/routing.mjs';
import { axeSerious as axeOn, launchConsole } from './lib.mjs';

let rt;
let browser;
let page;

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }],
    gateway: {
      workers: 2,
      plugins: {
        dirs: [path.join(REPO, 'plugins')],
        store: path.join(tempDir('store'), 'policies'),
        watch: false,
        enabled: [],
        capture: { rate: 1, max_per_s: 1000, file: path.join(tempDir('capture'), 'capture.jsonl') },
      },
    },
  });
  browser = await launchConsole();
  page = browser.page;
});

after(async () => {
  await browser?.close();
  await rt?.stop();
});

const axeSerious = () => axeOn(page);

/** A background load through the OpenAI SDK: two at a time, each paced to at most one
 *  request per 25 ms (so that it lasts the whole walk on a fast machine: unpaced, 2,000
 *  requests ended before the shadow step and the shadow saw none), at most 10,000
 *  requests or 120 s, until stopped; every outcome counted at the client. */
function startLoad() {
  const counts = { ok: 0, failed: 0, errors: [] };
  let stop = false;
  const t0 = Date.now();
  const run = async () => {
    const { default: OpenAI } = await import('openai');
    const client = new OpenAI({ apiKey: rt.key, baseURL: rt.gw.baseURL, maxRetries: 0, timeout: 15000 });
    while (!stop && counts.ok + counts.failed < 10000 && Date.now() - t0 < 120000) {
      const pace = sleep(25);
      try {
        const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'bg [mock chunks=1]' }] });
        if (r.choices?.[0]?.message) counts.ok++;
        else throw new Error('no message');
      } catch (e) {
        counts.failed++;
        if (counts.errors.length < 5) counts.errors.push(String(e.message || e));
      }
      await pace;
    }
  };
  const done = Promise.all([run(), run()]);
  return { counts, stop: async () => { stop = true; await done; return counts; } };
}

const policy = (target, broken = false) => `-- routes every request of its groups to account ${target}
return {
  name = "pick-one", priority = 800, version = "1.0.0",
  select_account = function(ctx, conf)
    ${broken ? 'if then end' : ''}
    for i = 1, ctx:naccounts() do
      if ctx:account(i).id == "${target}" then return ctx:select(i) end
    end
  end,
}
`;

const editor = () => page.locator('[data-testid="policy-editor"]');
const notice = () => page.locator('[data-testid="policy-notice"]');

async function click(name) {
  await page.getByRole('button', { name, exact: true }).click();
}

async function expectNotice(re) {
  await waitFor(async () => re.test((await notice().textContent().catch(() => '')) || ''), { timeout: 15000, what: `a notice matching ${re}` });
}

/** Only `target` serves the live group's requests from now on (checked at the mock). */
async function onlyTo(target) {
  await waitFor(async () => {
    await rt.mock.reset();
    await sleep(400);
    const c = await rt.counts();
    return c[target] > 0 && Object.entries(c).every(([k, n]) => k === target || n === 0);
  }, { timeout: 10000, what: `only ${target} to serve` });
}

test('blank policy -> upload (a syntax error named by line, then fixed) -> replay diff -> shadow -> promote -> all -> rollback, with no failed request', async () => {
  const load = startLoad();
  await waitFor(() => load.counts.ok >= 10, { timeout: 30000, what: 'the background load to run' });
  const seen = await rt.counts();
  const target = Object.keys(seen).sort((x, y) => seen[x] - seen[y])[0];

  await page.goto(`${rt.gw.url}/admin/plugins`);
  await page.locator('input[name="token"]').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Plugins', exact: true }).waitFor();
  await page.getByRole('heading', { level: 2, name: 'Policy workbench' }).waitFor();
  await page.locator('input[name="actor"]').fill('dana');

  // A blank policy: the template, then a first save refused with its line.
  await click('New policy');
  assert.match(await editor().locator('textarea[name="source"]').inputValue(), /name = "my-policy"/);
  await editor().locator('input[name="policy-name"]').fill('pick-one');
  await editor().locator('textarea[name="source"]').fill(policy(target, true));
  await click('Validate and save');
  const err = page.locator('[data-testid="policy-error"] [role="alert"]');
  await err.waitFor();
  assert.match(await err.textContent(), /pick-one\.lua:5: unexpected symbol near 'then'/);
  assert.deepEqual(await axeSerious(), [], 'axe-core on the editor with its error');

  await editor().locator('textarea[name="source"]').fill(policy(target));
  await click('Validate and save');
  await expectNotice(/Saved pick-one as generation 1/);
  await page.locator('[data-testid="policy-generation"]', { hasText: 'generation 1' }).waitFor();

  // Replay the capture: where it would have picked `target` instead of the live choice.
  await click('Replay the capture');
  const result = page.locator('[data-testid="replay-result"]');
  await result.waitFor({ timeout: 30000 });
  // Counts are shown grouped by thousands ("1,719").
  const m = /([\d,]+) captured requests replayed: ([\d,]+) decided otherwise/.exec(await result.textContent());
  const n = (s) => Number(s.replaceAll(',', ''));
  assert.ok(m && n(m[1]) >= 10 && n(m[2]) > 0, await result.textContent());
  assert.ok((await result.locator('tbody tr').count()) > 0);
  assert.match(await result.locator('tbody tr').first().locator('td[data-col="candidate"]').textContent(), new RegExp(`^${target}`));
  assert.deepEqual(await axeSerious(), [], 'axe-core on the replay diff');

  // Shadow for pool: counted, never applied.
  await page.locator('select[name="group"]').selectOption({ label: 'pool' });
  await click('Shadow in group');
  await expectNotice(/In shadow: generation 2/);
  await page.locator('[data-testid="policy-deployed"]', { hasText: 'shadow in pool' }).waitFor();
  await waitFor(async () => {
    const st = await (await fetch(`${rt.gw.url}/admin/api/v1/plugins`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json();
    const h = st.shadow.hooks.select_account;
    return h.agree + h.disagree >= 5;
  }, { timeout: 30000, what: 'the shadow to run on the load' });
  await rt.mock.reset();
  await sleep(500);
  const shadowed = await rt.counts();
  assert.ok(Object.entries(shadowed).some(([k, n]) => k !== target && n > 0), `the shadow decided nothing: ${JSON.stringify(shadowed)}`);

  // Promote for pool: the mock sees only target.
  await click('Promote in group');
  await expectNotice(/Promoted: generation 3/);
  await page.locator('[data-testid="policy-deployed"]', { hasText: 'live in pool' }).waitFor();
  await onlyTo(target);

  // Promote for every request (asked first).
  await click('Promote for all');
  await page.locator('.modal').getByRole('button', { name: 'Promote for all' }).click();
  await expectNotice(/Live for every request: generation 4/);
  await page.locator('[data-testid="policy-deployed"]', { hasText: 'live for every request' }).waitFor();

  // Roll back: generation 3's deployment again.
  await click('Roll back');
  assert.deepEqual(await axeSerious(), [], 'axe-core on the confirmation');
  await page.locator('.modal').getByRole('button', { name: 'Roll back' }).click();
  await expectNotice(/Rolled back: generation 5 — back to generation 3/);
  await page.locator('[data-testid="policy-deployed"]', { hasText: 'live in pool' }).waitFor();
  await onlyTo(target);

  // The audit list: each step, by dana, with its generation.
  const audit = page.locator('[data-testid="audit-table"] tbody tr');
  await waitFor(async () => (await audit.count()) === 5, { timeout: 5000, what: 'five audit rows' });
  const rows = [];
  for (let i = 0; i < 5; i++) {
    const r = audit.nth(i);
    rows.push([(await r.locator('td[data-col="action"]').textContent()).trim(), (await r.locator('td[data-col="generation"]').textContent()).trim(),
      (await r.locator('td[data-col="actor"]').textContent()).trim().split(' ')[0]]);
  }
  assert.deepEqual(rows, [['rollback', '5', 'dana'], ['promote', '4', 'dana'], ['promote', '3', 'dana'], ['shadow', '2', 'dana'], ['upload', '1', 'dana']]);
  assert.deepEqual(await axeSerious(), [], 'axe-core on the workbench after the walk');

  const counts = await load.stop();
  assert.ok(counts.ok > 20, `background requests: ${JSON.stringify(counts)}`);
  assert.equal(counts.failed, 0, `failed background requests: ${JSON.stringify(counts)}`);
  assert.deepEqual(browser.problems, []);
  assert.deepEqual(browser.serverErrors, []);
});
