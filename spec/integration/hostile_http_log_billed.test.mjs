// The stderr log with billing on (issue #14, hostile item 7): a model name is client
// input and reaches the "has no price" warning. Before the fix a CR/LF in it was
// written raw, so a client could forge whole log lines; and the warning was written for
// every request, so a client could flood the log. Now the message is escaped (one line,
// CR/LF as \r\n) and the warning is written once per model per minute on each worker,
// with the count of the ones held back. Needs spec/run.sh's Postgres and Redis.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { stopAll, startMock, waitFor } from './lib/harness.mjs';
import { billedSetup, startBilledGateway } from './lib/billing.mjs';
import { requireServices } from './lib/db.mjs';

let mock;
let bill;
let gw;
const WORKERS = 2;

before(async () => {
  requireServices();
  mock = await startMock();
  bill = await billedSetup({ mock });
  gw = await startBilledGateway(bill, { workers: WORKERS }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop?.();
});

async function chat(model) {
  const r = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${bill.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, max_tokens: 5, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }] }),
    signal: AbortSignal.timeout(15000),
  });
  await r.arrayBuffer();
  return r.status;
}

test('a model name with CR/LF and a fake log line gives exactly one escaped stderr line', async () => {
  const forged = '2026-01-01T00:00:00.000Z error FORGED-BY-CLIENT admin password changed';
  const model = `evil-model\r\n${forged}`;
  assert.equal(await chat(model), 200);
  await waitFor(() => gw.proc.lines.stderr.some((l) => l.includes('FORGED-BY-CLIENT')), { timeout: 5000, what: 'the warning line' });
  const hits = gw.proc.lines.stderr.filter((l) => l.includes('FORGED-BY-CLIENT'));
  assert.equal(hits.length, 1, `one line: ${JSON.stringify(hits)}`);
  assert.ok(!hits[0].startsWith('2026-01-01T00:00:00.000Z'), 'the forged text does not start a line');
  assert.match(hits[0], /evil-model\\r\\n2026-01-01T00:00:00\.000Z error FORGED-BY-CLIENT/);
  assert.match(hits[0], / warn request [0-9a-f]{12}-[0-9a-f]{18}: model "evil-model/);
  for (const l of gw.proc.lines.stderr) assert.ok(!/[\r\u0000-\u0008\u000b-\u001f]/.test(l), `a raw control byte on stderr: ${JSON.stringify(l)}`);
});

test('100 requests for an unpriced model write a bounded number of warnings', async () => {
  const model = 'unpriced-model-flood';
  const before_ = gw.proc.lines.stderr.length;
  for (let i = 0; i < 100; i += 10) {
    const got = await Promise.all(Array.from({ length: 10 }, () => chat(model)));
    assert.deepEqual(got, Array(10).fill(200));
  }
  await waitFor(() => gw.proc.lines.stderr.slice(before_).some((l) => l.includes(model)), { timeout: 5000, what: 'a warning' });
  const warnings = gw.proc.lines.stderr.slice(before_).filter((l) => l.includes(model));
  assert.ok(warnings.length >= 1 && warnings.length <= WORKERS, `${warnings.length} warnings for 100 requests (at most one per worker)`);
  assert.match(warnings[0], /has no price: metered at 0/);
});
