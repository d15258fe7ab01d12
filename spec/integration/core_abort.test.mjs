// A client that goes away aborts the upstream call at once: the mock sees its
// connection closed (aborted, inflight back to 0) within a second, whether the client
// leaves mid-stream or while the gateway still waits for the upstream's first byte.

import assert from 'node:assert/strict';
import { after, before, beforeEach, test } from 'node:test';

import {
  RawConn, UPSTREAM_KEY, chatBody, openaiClient, rawRequest, sleep, startGateway, startMock, stopAll, waitFor,
} from './lib/harness.mjs';

let mock;
let gw;
let client;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
  client = await openaiClient(gw);
});

after(stopAll);

beforeEach(async () => {
  await mock.reset();
});

/** Waits (at most `ms`) until the mock has nothing in flight and counted `aborted` aborts. */
async function expectUpstreamAborted(ms, aborted = 1) {
  const t0 = Date.now();
  let s;
  try {
    await waitFor(async () => {
      s = await mock.stats();
      return s.inflight === 0 && s.aborted >= aborted;
    }, { timeout: ms, interval: 25, what: 'upstream abort' });
  } catch (e) {
    e.message += ` — mock stats: ${JSON.stringify(s)}`;
    throw e;
  }
  assert.ok(s.credentials[UPSTREAM_KEY], 'stats are kept per upstream credential');
  assert.equal(s.credentials[UPSTREAM_KEY].inflight, 0);
  assert.ok(s.credentials[UPSTREAM_KEY].aborted >= aborted);
  return { stats: s, elapsed: Date.now() - t0 };
}

test('SDK stream aborted after 2 chunks cancels the upstream within 1 s', async () => {
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    chatBody('long story [mock chunks=200 interval_ms=50]', { stream: true }), { signal: ac.signal });
  let got = 0;
  let content = '';
  // The SDK ends the iteration (or throws an abort error) once the signal fires.
  try {
    for await (const chunk of stream) {
      const d = chunk.choices?.[0]?.delta?.content;
      if (d) {
        content += d;
        if (++got === 2) ac.abort();
      }
      assert.ok(got <= 2, 'no chunk after the abort');
    }
  } catch (e) {
    assert.ok(e.name === 'AbortError' || /abort/i.test(`${e.constructor?.name} ${e.message}`), `abort error: ${e}`);
  }
  assert.equal(got, 2);
  assert.ok(content.length > 0);

  const during = await mock.stats();
  assert.ok(during.total >= 1, 'the request reached the upstream');
  await expectUpstreamAborted(1000);
});

test('raw socket closed mid-stream cancels the upstream within 1 s', async () => {
  const c = await RawConn.open(gw.port);
  await c.write(rawRequest('POST', '/v1/chat/completions', {
    body: chatBody('raw long [mock chunks=200 interval_ms=50]', { stream: true }),
  }));
  // Wait for the headers and at least one data event, then vanish.
  const ok = await c.until((x) => /\r\n\r\n[\s\S]*data: /.test(x.buf.toString('latin1')), 5000);
  assert.ok(ok, `stream started: ${c.buf.toString('latin1').slice(0, 300)}`);
  assert.equal((await mock.stats()).inflight, 1);
  c.destroy();
  await expectUpstreamAborted(1000);
});

test('client gone while waiting for the upstream first byte cancels the upstream', async () => {
  const ac = new AbortController();
  const p = client.chat.completions.create(
    chatBody('slow start [mock delay_ms=2500]', { stream: true }), { signal: ac.signal });
  await waitFor(async () => (await mock.stats()).inflight === 1, { timeout: 2000, what: 'request at the upstream' });
  ac.abort();
  await assert.rejects(p);
  await expectUpstreamAborted(1000);
});

test('the gateway keeps serving after aborts', async () => {
  await sleep(50);
  const stream = await client.chat.completions.create(chatBody('again [mock chunks=6]', { stream: true }));
  let n = 0;
  for await (const chunk of stream) {
    if (chunk.choices?.[0]?.delta?.content) n++;
    assert.ok(n < 100);
  }
  assert.equal(n, 6);
  const s = await mock.stats();
  assert.equal(s.inflight, 0);
  assert.equal(s.aborted, 0, 'a completed stream is not counted as aborted');
  assert.ok(gw.proc.running, 'gateway still running');
  assert.ok(!gw.proc.lines.stderr.some((l) => /AddressSanitizer|runtime error:/.test(l)), 'no sanitizer reports');
});
