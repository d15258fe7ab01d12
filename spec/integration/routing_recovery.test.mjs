// A failing account stops receiving traffic within a few requests and gets it back
// after it recovers. Three equal accounts a, b, c in one group; the mock answers every
// request for a's credential with a 500. The client sees only 200s (each 500 is held
// back and retried on another account) and a receives only a few of 30 requests. Then
// the fault is cleared and the test waits past routing.cooldown_5xx_ms: a must be given
// traffic again (a trial request, then its share of the load).
//
// The gateway runs one worker, so the account health the test drives (error EWMA,
// cooldown, half-open trial) is one state machine and the counts do not depend on how
// the kernel spreads connections over workers.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { diff, sendMany, sleep, startRouting, statuses } from './lib/routing.mjs';

const COOLDOWN_5XX_MS = 1000;
let rt;

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }],
    routing: { max_attempts: 3, cooldown_5xx_ms: COOLDOWN_5XX_MS },
    gateway: { workers: 1 },
  });
});

after(() => rt?.stop());

test('a failing account gets only a few of 30 requests, and the client sees none of its 500s', async () => {
  await rt.fault('a', { status: 500 });
  const rs = await sendMany(rt, 30, (i) => [`request ${i} [mock chunks=2]`]);
  assert.deepEqual(statuses(rs), { 200: 30 }, rs.filter((r) => r.status !== 200).map((r) => r.text).join('\n'));
  const n = await rt.counts();
  assert.equal(n.b + n.c, 30, `each request answered exactly once by a healthy account: ${JSON.stringify(n)}`);
  // The error EWMA (alpha 0.2) crosses 0.5 after the 4th consecutive failure at the
  // latest; past that a is cooling and skipped.
  assert.ok(n.a >= 1 && n.a <= 4, `a (failing) received ${n.a} of 30 requests (want 1..4): ${JSON.stringify(n)}`);
});

test('after recovery and cooldown_5xx_ms the account gets a trial, then its share of the load', async () => {
  await rt.clearFaults();
  await sleep(COOLDOWN_5XX_MS + 500);
  const before = await rt.counts();
  const rs = await sendMany(rt, 60, (i) => [`after recovery ${i} [mock chunks=2]`]);
  assert.deepEqual(statuses(rs), { 200: 60 });
  const n = diff(await rt.counts(), before);
  // An equal share is 20 of 60; a recovered account must get a real part of it.
  const row = await rt.account('a');
  const cooling = rt.gw.proc.lines.stderr.filter((l) => / cools down /.test(l)).length;
  assert.ok(n.a >= 10, `a (recovered ${COOLDOWN_5XX_MS + 500} ms ago) received ${n.a} of 60 requests (want >= 10): ` +
    `${JSON.stringify(n)}; accounts.cooldown_until of a: ${row.cooldown_until_ms ?? 'NULL'}; ` +
    `cooldowns logged by the gateway: ${cooling}`);
});
