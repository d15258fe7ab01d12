// Fifty streams at once through the gateway with the OpenAI SDK: every one completes
// with its full text, they really overlap at the upstream, and nothing is left in
// flight afterwards.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { chatBody, mockDirect, mockText, openaiClient, startGateway, startMock, stopAll, waitFor } from './lib/harness.mjs';

let mock;
let gw;
let client;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
  client = await openaiClient(gw);
});

after(stopAll);

const N = 50;

async function runStream(i) {
  const stream = await client.chat.completions.create(
    chatBody(`stream number ${i} [mock chunks=20 interval_ms=25]`, { stream: true }));
  let content = '';
  let chunks = 0;
  for await (const chunk of stream) {
    const d = chunk.choices?.[0]?.delta?.content;
    if (d) {
      content += d;
      chunks++;
    }
    assert.ok(chunks <= 1000, 'bounded');
  }
  return { content, chunks };
}

test(`${N} concurrent streams all complete with full content and overlap upstream`, async () => {
  const expected = (await mockDirect(mock, chatBody('stream number 0 [mock chunks=20 interval_ms=25]', { stream: true }))).content;
  assert.equal(expected, mockText(20));
  await mock.reset();

  const t0 = Date.now();
  const results = await Promise.allSettled(Array.from({ length: N }, (_, i) => runStream(i)));
  const elapsed = Date.now() - t0;
  const failed = results.map((r, i) => [r, i]).filter(([r]) => r.status === 'rejected');
  assert.equal(failed.length, 0, `failed streams: ${failed.slice(0, 5).map(([r, i]) => `#${i}: ${r.reason}`).join('; ')}`);
  results.forEach((r, i) => {
    assert.equal(r.value.content, expected, `stream #${i} text`);
    assert.equal(r.value.chunks, 20, `stream #${i} chunk count`);
  });

  const s = await waitFor(async () => {
    const st = await mock.stats();
    return st.inflight === 0 ? st : null;
  }, { timeout: 2000, what: 'upstream inflight back to 0' });
  assert.equal(s.total, N, 'one upstream request per client request');
  assert.ok(s.max_inflight >= 2, `streams overlapped upstream (max_inflight ${s.max_inflight})`);
  assert.equal(s.aborted, 0);
  // 50 streams of ~0.5 s each, done one by one, would take 25 s.
  assert.ok(elapsed < 15000, `${N} overlapping streams took ${elapsed} ms`);
});

test('the gateway serves normally right after the burst', async () => {
  const res = await client.chat.completions.create(chatBody('after the burst [mock chunks=2]'));
  assert.equal(res.usage.completion_tokens, 2);
});
