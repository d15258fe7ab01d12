// Back-pressure with slow readers (issue #14, hostile item 2). A client that reads more
// slowly than the upstream sends fills the gateway's write queue; the upstream read
// pauses and must resume as the client catches up. Before the fix a flush the kernel took
// whole resumed nothing: the response stopped after ~256 KB and the client waited until
// it gave up. Each response kind is read by a raw socket at about 2 MB/s after a stall
// (what `curl --limit-rate 2M` does), and the whole body must arrive intact: passed
// through and translated, stream and not, chat, Messages, Responses and embeddings.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import tls from 'node:tls';

import { HOST, mockText, parseResponse, rawRequest, sseContent, startGateway, startMock, stopAll } from './lib/harness.mjs';

let mock;
let gwOpenAI; // an OpenAI-kind upstream
let gwAnthropic; // an Anthropic-kind upstream
let gwSmall; // an OpenAI-kind upstream with a 64 KB write buffer
let gwTls; // an OpenAI-kind upstream, read through the TLS listener

before(async () => {
  mock = await startMock();
  gwOpenAI = await startGateway({ workers: 1 }, { mock });
  gwAnthropic = await startGateway({ workers: 1, upstream: { provider: 'anthropic' } }, { mock });
  gwSmall = await startGateway({ workers: 1, limits: { max_write_buffer: 65536 } }, { mock });
  gwTls = await startGateway({ workers: 1 }, { mock, tls: true });
});

after(stopAll);

/**
 * Sends `req` on a new socket, reads nothing for `stallMs`, then reads at about `rate`
 * bytes per second until one whole response is parsed, the peer closes, or `timeout` ms
 * pass. Resolves with {res (parsed or null), bytes received, closed}.
 */
function slowRead(port, req, { stallMs = 400, rate = 2 * 1024 * 1024, timeout = 30000, ca } = {}) {
  return new Promise((resolve) => {
    const sock = ca ? tls.connect({ port, host: HOST, ca, servername: HOST }) : net.connect(port, HOST);
    let buf = Buffer.alloc(0);
    let done = false;
    let closed = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(deadline);
      let res = null;
      try {
        res = parseResponse(buf, closed);
      } catch {
        res = null;
      }
      sock.destroy();
      resolve({ res, bytes: buf.length, closed });
    };
    const deadline = setTimeout(finish, timeout);
    sock.on(ca ? 'secureConnect' : 'connect', () => {
      sock.write(req);
      sock.pause();
      setTimeout(() => sock.resume(), stallMs);
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      let complete = false;
      try {
        complete = parseResponse(buf) !== null;
      } catch {
        complete = true;
      }
      if (complete) return finish();
      sock.pause();
      setTimeout(() => sock.resume(), Math.max(1, Math.round((d.length / rate) * 1000)));
    });
    sock.on('error', () => {});
    sock.on('close', () => {
      closed = true;
      finish();
    });
  });
}

function post(gw, path, body) {
  return rawRequest('POST', path, { body, port: gw.port, headers: { connection: 'close' } });
}

/** The text of an Anthropic Messages event stream (content_block_delta text deltas). */
function messagesStreamText(text) {
  let out = '';
  for (const line of text.split('\n')) {
    const m = /^data: ?(.*)$/.exec(line.replace(/\r$/, ''));
    if (!m) continue;
    const ev = JSON.parse(m[1]);
    if (ev.type === 'content_block_delta') out += ev.delta?.text ?? '';
  }
  return out;
}

/** Compares long texts without printing them whole. */
function sameText(got, want, what) {
  if (got === want) return;
  let i = 0;
  while (i < got.length && got[i] === want[i]) i++;
  assert.fail(`${what}: got ${got.length} chars, want ${want.length}; first difference at ${i}: ${JSON.stringify(got.slice(i, i + 40))}`);
}

/** The text of a Responses event stream (response.output_text.delta events). */
function responsesStreamText(text) {
  let out = '';
  for (const line of text.split('\n')) {
    const m = /^data: ?(.*)$/.exec(line.replace(/\r$/, ''));
    if (!m) continue;
    const ev = JSON.parse(m[1]);
    if (ev.type === 'response.output_text.delta') out += ev.delta ?? '';
  }
  return out;
}

/** The text of a non-stream Responses answer. */
function responsesText(json) {
  return json.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text ?? '').join('');
}

function assertComplete(got, what) {
  assert.ok(got.res, `${what}: the whole response arrived (got ${got.bytes} bytes, closed=${got.closed})`);
  assert.equal(got.res.status, 200, `${what}: ${got.res.text.slice(0, 300)}`);
}

const BIG = 100000; // the mock's largest answer: ~890 KB of chat JSON
const STREAM = 12000; // stream chunks: ~2 MB of SSE

test('non-stream chat passed through (~890 KB, Content-Length) reaches a slow reader whole', async () => {
  const got = await slowRead(gwOpenAI.port, post(gwOpenAI, '/v1/chat/completions', {
    model: 'gpt-4o-mini', messages: [{ role: 'user', content: `long [mock chunks=${BIG}]` }],
  }));
  assertComplete(got, 'chat passthrough');
  assert.ok(got.res.body.length > 800000, `body is ${got.res.body.length} bytes`);
  sameText(got.res.json.choices[0].message.content, mockText(BIG), 'text');
  assert.equal(got.res.json.usage.completion_tokens, BIG);
});

test('streamed chat passed through (~2 MB of SSE) reaches a slow reader whole', async () => {
  const got = await slowRead(gwOpenAI.port, post(gwOpenAI, '/v1/chat/completions', {
    model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: `long [mock chunks=${STREAM}]` }],
  }));
  assertComplete(got, 'chat stream passthrough');
  sameText(sseContent(got.res.text), mockText(STREAM), 'text');
  assert.match(got.res.text, /data: \[DONE\]/);
});

test('embeddings of 4,000 inputs (~390 KB) reach a slow reader whole through a 64 KB write buffer', async () => {
  const input = Array.from({ length: 4000 }, (_, i) => `input number ${i}`);
  const got = await slowRead(gwSmall.port, post(gwSmall, '/v1/embeddings', { model: 'text-embedding-3-small', input }));
  assertComplete(got, 'embeddings');
  assert.ok(got.res.body.length > 256 * 1024, `body is ${got.res.body.length} bytes`);
  assert.equal(got.res.json.data.length, 4000);
  assert.equal(got.res.json.data[3999].index, 3999);
});

test('chat client -> Anthropic-kind account (translated), non-stream and stream, slow reader', async () => {
  const got = await slowRead(gwAnthropic.port, post(gwAnthropic, '/v1/chat/completions', {
    model: 'gpt-4o-mini', max_tokens: BIG, messages: [{ role: 'user', content: `long [mock chunks=${BIG}]` }],
  }));
  assertComplete(got, 'chat -> anthropic');
  sameText(got.res.json.choices[0].message.content, mockText(BIG), 'text');

  const st = await slowRead(gwAnthropic.port, post(gwAnthropic, '/v1/chat/completions', {
    model: 'gpt-4o-mini', max_tokens: STREAM, stream: true, messages: [{ role: 'user', content: `long [mock chunks=${STREAM}]` }],
  }));
  assertComplete(st, 'chat stream -> anthropic');
  sameText(sseContent(st.res.text), mockText(STREAM), 'text');
});

test('Messages client -> OpenAI-kind account (translated), non-stream and stream, slow reader', async () => {
  const got = await slowRead(gwOpenAI.port, post(gwOpenAI, '/v1/messages', {
    model: 'mock-claude', max_tokens: BIG, messages: [{ role: 'user', content: `long [mock chunks=${BIG}]` }],
  }));
  assertComplete(got, 'messages -> openai');
  sameText(got.res.json.content[0].text, mockText(BIG), 'text');

  const st = await slowRead(gwOpenAI.port, post(gwOpenAI, '/v1/messages', {
    model: 'mock-claude', max_tokens: STREAM, stream: true, messages: [{ role: 'user', content: `long [mock chunks=${STREAM}]` }],
  }));
  assertComplete(st, 'messages stream -> openai');
  sameText(messagesStreamText(st.res.text), mockText(STREAM), 'text');
});

test('Messages client -> Anthropic-kind account (passed through), non-stream and stream, slow reader', async () => {
  const got = await slowRead(gwAnthropic.port, post(gwAnthropic, '/v1/messages', {
    model: 'mock-claude', max_tokens: BIG, messages: [{ role: 'user', content: `long [mock chunks=${BIG}]` }],
  }));
  assertComplete(got, 'messages passthrough');
  sameText(got.res.json.content[0].text, mockText(BIG), 'text');

  const st = await slowRead(gwAnthropic.port, post(gwAnthropic, '/v1/messages', {
    model: 'mock-claude', max_tokens: STREAM, stream: true, messages: [{ role: 'user', content: `long [mock chunks=${STREAM}]` }],
  }));
  assertComplete(st, 'messages stream passthrough');
  sameText(messagesStreamText(st.res.text), mockText(STREAM), 'text');
});

for (const [kind, how, gwOf] of [['OpenAI', 'passed through', () => gwOpenAI], ['Anthropic', 'translated', () => gwAnthropic]]) {
  test(`Responses client -> ${kind}-kind account (${how}), non-stream and stream, slow reader`, async () => {
    const gw = gwOf();
    const got = await slowRead(gw.port, post(gw, '/v1/responses', {
      model: 'gpt-4o-mini', max_output_tokens: BIG, input: `long [mock chunks=${BIG}]`,
    }));
    assertComplete(got, `responses -> ${kind}`);
    sameText(responsesText(got.res.json), mockText(BIG), 'text');

    const st = await slowRead(gw.port, post(gw, '/v1/responses', {
      model: 'gpt-4o-mini', max_output_tokens: STREAM, stream: true, input: `long [mock chunks=${STREAM}]`,
    }));
    assertComplete(st, `responses stream -> ${kind}`);
    sameText(responsesStreamText(st.res.text), mockText(STREAM), 'text');
  });
}

test('non-stream chat over the TLS listener reaches a slow reader whole', async () => {
  const got = await slowRead(gwTls.tlsPort, post(gwTls, '/v1/chat/completions', {
    model: 'gpt-4o-mini', messages: [{ role: 'user', content: `long [mock chunks=${BIG}]` }],
  }), { ca: gwTls.ca });
  assertComplete(got, 'chat over TLS');
  sameText(got.res.json.choices[0].message.content, mockText(BIG), 'text');
});
