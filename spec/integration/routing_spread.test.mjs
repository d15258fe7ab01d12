// Load spreads over equal accounts within ±15%: four accounts with the same priority,
// weight and concurrency, 400 requests (8 at a time, each on a new connection, so
// both of the gateway's workers route), and each account receives 100 ± 15 of them.
// And in a wide group of 100 equal accounts every account takes part: 2,000 requests
// leave none of them idle (for a fair draw the chance of an idle one is ~1e-7).
// The mock counts the requests per account credential.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sendMany, startRouting, statuses } from './lib/routing.mjs';

const ACCOUNTS = ['a', 'b', 'c', 'd'];
const WIDE = Array.from({ length: 100 }, (_, i) => `w${i}`);
const REQUESTS = 400;
const TOLERANCE = 0.15;
let rt;

before(async () => {
  rt = await startRouting({
    groups: ['pool', 'wide'],
    accounts: [
      ...ACCOUNTS.map((name) => ({ name, concurrency: 16, priority: 0, weight: 100, groups: ['pool'] })),
      ...WIDE.map((name) => ({ name, concurrency: 16, priority: 0, weight: 100, groups: ['wide'] })),
    ],
  });
});

after(() => rt?.stop());

test(`${REQUESTS} requests over ${ACCOUNTS.length} equal accounts: each gets its share ±${TOLERANCE * 100}%`, async () => {
  const rs = await sendMany(rt, REQUESTS, (i) => [`spread ${i} [mock chunks=1]`], { concurrency: 8 });
  assert.deepEqual(statuses(rs), { 200: REQUESTS }, rs.filter((r) => r.status !== 200).slice(0, 3).map((r) => r.text).join('\n'));
  const all = await rt.counts();
  const n = Object.fromEntries(ACCOUNTS.map((a) => [a, all[a]]));
  const share = REQUESTS / ACCOUNTS.length;
  assert.equal(Object.values(n).reduce((x, y) => x + y, 0), REQUESTS, JSON.stringify(n));
  for (const a of ACCOUNTS) {
    assert.ok(Math.abs(n[a] - share) <= share * TOLERANCE,
      `account ${a} received ${n[a]} of ${REQUESTS} requests (want ${share} ± ${share * TOLERANCE}): ${JSON.stringify(n)}`);
  }
});

test(`a group of ${WIDE.length} equal accounts: 2000 requests reach every one of them`, async () => {
  await rt.mock.reset();
  const rs = await sendMany(rt, 2000, (i) => [`wide ${i} [mock chunks=1]`, {}, { key: rt.keys.wide }], { concurrency: 8 });
  assert.deepEqual(statuses(rs), { 200: 2000 });
  const all = await rt.counts();
  const idle = WIDE.filter((a) => all[a] === 0);
  const used = WIDE.filter((a) => all[a] > 0);
  assert.equal(idle.length, 0,
    `${idle.length} of ${WIDE.length} accounts received nothing (${idle.slice(0, 5).join(', ')}...); ` +
    `the other ${used.length} received ${used.reduce((x, a) => x + all[a], 0)} requests`);
});
