// A sticky conversation stays on one account while that account is healthy, and moves
// when it starts returning 429, without the client noticing. Three equal accounts;
// the conversation is bound by the x-session-id header (and, in the later tests, by
// prompt_cache_key and by the hash of the first two messages of a conversation of
// three or more). The binding lives in Redis, so it holds across the gateway's two
// workers (every request here is a new connection).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { diff, startRouting, statuses } from './lib/routing.mjs';

let rt;

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }],
    routing: { cooldown_429_ms: 30000 },
  });
});

after(() => rt?.stop());

/** The one account that received requests in `n`, or a failure naming the spread. */
function only(n, total, what) {
  const used = Object.entries(n).filter(([, v]) => v > 0);
  assert.equal(used.length, 1, `${what}: ${total} requests went to ${used.length} accounts: ${JSON.stringify(n)}`);
  assert.equal(used[0][1], total, `${what}: ${JSON.stringify(n)}`);
  return used[0][0];
}

const session = { headers: { 'x-session-id': 's1' } };

test('x-session-id: 10 requests of one session reach one account', async () => {
  const before = await rt.counts();
  const rs = [];
  for (let i = 0; i < 10; i++) rs.push(await rt.chat(`turn ${i} [mock chunks=2]`, {}, session));
  assert.deepEqual(statuses(rs), { 200: 10 });
  only(diff(await rt.counts(), before), 10, 'session s1');
});

test('the session moves when its account returns 429, and the client still gets 200s', async () => {
  let before = await rt.counts();
  const r0 = await rt.chat('which account [mock chunks=2]', {}, session);
  assert.equal(r0.status, 200);
  const bound = only(diff(await rt.counts(), before), 1, 'session s1');
  await rt.fault(bound, { status: 429, retry_after: 30 });
  before = await rt.counts();
  const rs = [];
  for (let i = 0; i < 10; i++) rs.push(await rt.chat(`after 429 ${i} [mock chunks=2]`, {}, session));
  assert.deepEqual(statuses(rs), { 200: 10 }, rs.filter((r) => r.status !== 200).map((r) => r.text).join('\n'));
  const n = diff(await rt.counts(), before);
  // The bound account answered the first of them with its 429 (held back, retried) and
  // then cools for 30 s; the session continues on one other account.
  assert.equal(n[bound], 1, `the rate-limited account ${bound} was tried once: ${JSON.stringify(n)}`);
  const rest = { ...n };
  delete rest[bound];
  only(rest, 10, `session s1 after ${bound} returned 429`);
  await rt.clearFaults();
});

test('prompt_cache_key binds a conversation too', async () => {
  const before = await rt.counts();
  const rs = [];
  for (let i = 0; i < 10; i++) rs.push(await rt.chat(`cached ${i} [mock chunks=2]`, { prompt_cache_key: 'pck-1' }));
  assert.deepEqual(statuses(rs), { 200: 10 });
  only(diff(await rt.counts(), before), 10, 'prompt_cache_key pck-1');
});

test('a conversation of three or more messages stays where its first two went', async () => {
  const opening = [
    { role: 'system', content: 'you are terse' },
    { role: 'user', content: 'first question [mock chunks=2]' },
  ];
  const before = await rt.counts();
  const rs = [];
  let history = [...opening, { role: 'assistant', content: 'tok1 tok2 ' }];
  for (let i = 0; i < 10; i++) {
    history = [...history, { role: 'user', content: `follow-up ${i} [mock chunks=2]` }];
    rs.push(await rt.chatMessages(history));
    history = [...history, { role: 'assistant', content: 'tok1 tok2 ' }];
  }
  assert.deepEqual(statuses(rs), { 200: 10 });
  only(diff(await rt.counts(), before), 10, 'conversation hash');
});
