// The console as the gateway serves it, checked on the wire against the real binary
// (no browser, no database): content types, caching, the Content-Security-Policy and
// the other security headers, gzip, ETags, the single-page-app fallback, and the login
// session that stands in for the admin token (cookie attributes, CSRF on writes, Origin,
// logout, the failed-login limit, Secure over TLS).

import assert from 'node:assert/strict';
import http from 'node:http';
import https from 'node:https';
import { after, before, test } from 'node:test';
import zlib from 'node:zlib';

import { ADMIN_TOKEN, fetchT, startGateway, startMock, stopAll } from '../integration/lib/harness.mjs';

const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
  "frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
});
after(() => stopAll());

const get = (p, init = {}) => fetchT(gw.url + p, { redirect: 'manual', ...init });

function assertSecurityHeaders(r, what) {
  assert.equal(r.headers.get('content-security-policy'), CSP, `${what}: CSP`);
  assert.equal(r.headers.get('x-content-type-options'), 'nosniff', `${what}: nosniff`);
  assert.equal(r.headers.get('referrer-policy'), 'no-referrer', `${what}: referrer policy`);
  assert.equal(r.headers.get('x-frame-options'), 'DENY', `${what}: frame options`);
}

/** Logs in; returns {cookie: "tg_session=…", value, csrf, setCookie}. */
async function login(base = gw.url, token = ADMIN_TOKEN) {
  const r = await fetchT(`${base}/admin/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token }) });
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  const setCookie = r.headers.get('set-cookie');
  const m = /^tg_session=([0-9a-f]{64});/.exec(setCookie);
  assert.ok(m, `Set-Cookie: ${setCookie}`);
  return { cookie: `tg_session=${m[1]}`, value: m[1], csrf: body.csrf, setCookie, body };
}

async function reload(s, headers = {}) {
  return fetchT(`${gw.url}/admin/api/v1/plugins/reload`, { method: 'POST', headers: { cookie: s.cookie, ...headers } });
}

test('/admin redirects to /admin/, which is index.html with the security headers and no-cache', async () => {
  const red = await get('/admin');
  assert.equal(red.status, 308);
  assert.equal(red.headers.get('location'), '/admin/');

  const r = await get('/admin/');
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.equal(r.headers.get('cache-control'), 'no-cache');
  assert.match(r.headers.get('etag') || '', /^W\/"[0-9a-f]{16}"$/);
  assertSecurityHeaders(r, 'index.html');
  const html = await r.text();
  assert.match(html, /<div id="app">/);
  assert.match(html, /<script type="module" crossorigin src="\/admin\/assets\/[^"]+\.js"><\/script>/);
  assert.doesNotMatch(html, /<script>|<style|style="/, 'no inline script or style (the CSP forbids them)');
});

test('hashed assets: right content type, cached for a year as immutable, gzip when accepted', async () => {
  const html = await (await get('/admin/')).text();
  const assets = [...html.matchAll(/(?:src|href)="(\/admin\/assets\/[^"]+)"/g)].map((m) => m[1]);
  assert.ok(assets.some((a) => a.endsWith('.js')) && assets.some((a) => a.endsWith('.css')), `assets: ${assets}`);
  for (const a of assets) {
    const plain = await get(a, { headers: { 'accept-encoding': 'identity' } });
    const type = a.endsWith('.js') ? 'text/javascript; charset=utf-8' : 'text/css; charset=utf-8';
    assert.equal(plain.status, 200, a);
    assert.equal(plain.headers.get('content-type'), type, a);
    assert.equal(plain.headers.get('cache-control'), 'public, max-age=31536000, immutable', a);
    assert.equal(plain.headers.get('content-encoding'), null, `${a}: identity when gzip is not accepted`);
    assertSecurityHeaders(plain, a);
    const body = Buffer.from(await plain.arrayBuffer());
    assert.ok(body.length > 1000, `${a}: ${body.length} bytes`);

    // node's fetch would decompress: look at the bytes with node:http.
    const gz = await rawGet(a, { 'accept-encoding': 'gzip, deflate, br' });
    assert.equal(gz.headers['content-encoding'], 'gzip', a);
    assert.equal(gz.headers.vary, 'Accept-Encoding');
    assert.ok(gz.body.length < body.length, `${a}: compressed ${gz.body.length} < ${body.length}`);
    assert.deepEqual(zlib.gunzipSync(gz.body), body, `${a}: gzip decodes to the same bytes`);

    const refused = await rawGet(a, { 'accept-encoding': 'gzip;q=0, identity' });
    assert.equal(refused.headers['content-encoding'], undefined, `${a}: gzip;q=0 is a refusal`);
  }
  const icon = await get('/admin/favicon.svg');
  assert.equal(icon.status, 200);
  assert.equal(icon.headers.get('content-type'), 'image/svg+xml');
  assert.equal(icon.headers.get('cache-control'), 'no-cache', 'unhashed files are revalidated');
});

/** GET with node:http, which does not decompress: the bytes as sent. */
function rawGet(p, headers = {}) {
  return new Promise((resolve, reject) => {
    const r = http.get(gw.url + p, { headers }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts) }));
    });
    r.on('error', reject);
    r.setTimeout(10000, () => r.destroy(new Error(`GET ${p}: no answer within 10 s`)));
  });
}

test('ETag revalidation answers 304 without a body', async () => {
  const first = await get('/admin/');
  const etag = first.headers.get('etag');
  await first.arrayBuffer();
  const again = await rawGet('/admin/', { 'if-none-match': etag });
  assert.equal(again.status, 304);
  assert.equal(again.body.length, 0);
  assert.equal(again.headers.etag, etag);
  const changed = await rawGet('/admin/', { 'if-none-match': 'W/"0000000000000000"' });
  assert.equal(changed.status, 200);
});

test('console routes fall back to index.html; missing files are 404; writes are 405', async () => {
  const index = await (await get('/admin/')).text();
  for (const p of ['/admin/keys', '/admin/usage?tenant_id=3', '/admin/tenants/7/anything', '/admin/login', '/admin/logout']) {
    const r = await get(p);
    assert.equal(r.status, 200, p);
    assert.equal(r.headers.get('content-type'), 'text/html; charset=utf-8', p);
    assert.equal(await r.text(), index, `${p} serves index.html`);
  }
  for (const p of ['/admin/assets/nope-123.js', '/admin/nope.png', '/admin/x/y.css']) {
    const r = await get(p);
    assert.equal(r.status, 404, p);
    assertSecurityHeaders(r, p);
    await r.arrayBuffer();
  }
  const w = await get('/admin/keys', { method: 'POST', body: '{}' });
  assert.equal(w.status, 405);
  assert.equal(w.headers.get('allow'), 'GET, HEAD');
  const h = await get('/admin/', { method: 'HEAD', headers: { 'accept-encoding': 'identity' } });
  assert.equal(h.status, 200);
  assert.equal(Number(h.headers.get('content-length')), Buffer.byteLength(index));
  assert.equal((await h.arrayBuffer()).byteLength, 0);
});

test('login: a wrong or malformed token is refused without a cookie; the right one gets a session', async () => {
  for (const [body, status, code] of [
    [{ token: 'adm-wrong' }, 401, 'invalid_admin_token'],
    [{ token: `${ADMIN_TOKEN}x` }, 401, 'invalid_admin_token'],
    [{ token: '' }, 401, 'invalid_admin_token'],
    [{ tok: ADMIN_TOKEN }, 400, 'invalid_json'],
    ['not json', 400, 'invalid_json'],
  ]) {
    const r = await get('/admin/login', { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
    const j = await r.json();
    assert.equal(r.status, status, JSON.stringify(body));
    assert.equal(j.error.code, code);
    assert.equal(r.headers.get('set-cookie'), null, 'no cookie for a failed login');
  }
  const s = await login();
  assert.equal(s.setCookie, `tg_session=${s.value}; HttpOnly; SameSite=Strict; Path=/admin; Max-Age=43200`);
  assert.match(s.csrf, /^[0-9a-f]{64}$/);
  assert.notEqual(s.csrf, s.value);
  const exp = s.body.expires_at_ms - Date.now();
  assert.ok(exp > 43190e3 && exp <= 43200e3, `expires in ${exp} ms`);

  const again = await login();
  assert.notEqual(again.value, s.value, 'every login is a new session');
  assert.notEqual(again.csrf, s.csrf);
});

test('GET /admin/session gives a reloaded page its CSRF token back; no cookie, no session', async () => {
  const s = await login();
  const r = await get('/admin/session', { headers: { cookie: `other=1; ${s.cookie}; x=y` } });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('cache-control'), 'no-store');
  assert.equal((await r.json()).csrf, s.csrf);
  for (const cookie of [undefined, 'tg_session=', `tg_session=${'0'.repeat(64)}`, `tg_session=${s.value.slice(1)}`, `xtg_session=${s.value}`]) {
    const n = await get('/admin/session', { headers: cookie ? { cookie } : {} });
    assert.equal(n.status, 401, String(cookie));
    assert.equal((await n.json()).error.code, 'no_session');
  }
});

test('the admin API accepts the cookie for reads, and for writes only with the CSRF header from our origin', async () => {
  const s = await login();
  const read = await get('/admin/api/v1/plugins', { headers: { cookie: s.cookie } });
  assert.equal(read.status, 200, 'a GET needs only the cookie');
  assert.equal(typeof (await read.json()).enabled, 'boolean');

  for (const [what, headers] of [
    ['no CSRF header', {}],
    ['a wrong CSRF header', { 'x-csrf-token': 'f'.repeat(64) }],
    ["another session's CSRF token", { 'x-csrf-token': (await login()).csrf }],
    ['a foreign Origin', { 'x-csrf-token': s.csrf, origin: 'http://evil.example' }],
    ['Origin null', { 'x-csrf-token': s.csrf, origin: 'null' }],
  ]) {
    const r = await reload(s, headers);
    assert.equal(r.status, 401, what);
    assert.equal((await r.json()).error.code, 'invalid_admin_token', what);
  }
  const ok = await reload(s, { 'x-csrf-token': s.csrf, origin: gw.url });
  assert.equal(ok.status, 200, await ok.clone().text());
  assert.equal((await ok.json()).ok, true);

  // A database-backed route behind the cookie: auth passes, and without a database the
  // answer is the database's 503, not a 401.
  const t = await get('/admin/api/v1/tenants', { headers: { cookie: s.cookie } });
  assert.equal(t.status, 503);
  assert.equal((await t.json()).error.code, 'database_unavailable');

  // The bearer token keeps working, with no CSRF header (it is not a browser credential).
  const bearer = await fetchT(`${gw.url}/admin/api/v1/plugins/reload`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  assert.equal(bearer.status, 200);
  await bearer.arrayBuffer();
});

test('logout needs the CSRF header, ends that session only, and clears the cookie', async () => {
  const a = await login();
  const b = await login();
  const noCsrf = await get('/admin/logout', { method: 'POST', headers: { cookie: a.cookie } });
  assert.equal(noCsrf.status, 403);
  assert.equal((await noCsrf.json()).error.code, 'invalid_csrf_token');
  assert.equal((await get('/admin/session', { headers: { cookie: a.cookie } })).status, 200, 'still logged in');

  const out = await get('/admin/logout', { method: 'POST', headers: { cookie: a.cookie, 'x-csrf-token': a.csrf } });
  assert.equal(out.status, 204);
  assert.equal(out.headers.get('set-cookie'), 'tg_session=; HttpOnly; SameSite=Strict; Path=/admin; Max-Age=0');
  assert.equal((await get('/admin/session', { headers: { cookie: a.cookie } })).status, 401);
  const after = await get('/admin/api/v1/plugins', { headers: { cookie: a.cookie } });
  assert.equal(after.status, 401, 'the old cookie no longer opens the admin API');
  await after.arrayBuffer();
  assert.equal((await get('/admin/session', { headers: { cookie: b.cookie } })).status, 200, 'the other session lives on');

  const anon = await get('/admin/logout', { method: 'POST' });
  assert.equal(anon.status, 204, 'logging out without a session just clears the cookie');
});

test('the console requests are in the access log under route admin_ui, without cookies', async () => {
  const s = await login();
  await (await get('/admin/session', { headers: { cookie: s.cookie } })).arrayBuffer();
  const lines = gw.proc.lines.stdout.filter((l) => l.includes('"route":"admin_ui"')).map((l) => JSON.parse(l));
  assert.ok(lines.some((l) => l.path === '/admin/session' && l.status === 200), 'session request logged');
  assert.ok(lines.some((l) => l.path === '/admin/login' && l.status === 401), 'failed login logged');
  assert.ok(!gw.proc.lines.stdout.some((l) => l.includes(s.value)), 'the session id is never logged');
  assert.ok(!gw.proc.lines.stderr.some((l) => l.includes(s.value)), 'the session id is never logged');
});

test('over TLS the cookie is Secure', async () => {
  const tgw = await startGateway({}, { mock, tls: true });
  const r = await new Promise((resolve, reject) => {
    const req = https.request(`${tgw.tlsUrl}/admin/login`, { method: 'POST', ca: tgw.ca, headers: { 'content-type': 'application/json' } }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(parts).toString() }));
    });
    req.on('error', reject);
    req.end(JSON.stringify({ token: ADMIN_TOKEN }));
  });
  assert.equal(r.status, 200, r.text);
  assert.match(r.headers['set-cookie'][0], /^tg_session=[0-9a-f]{64}; HttpOnly; SameSite=Strict; Path=\/admin; Max-Age=43200; Secure$/);
  // The same gateway's plain listener does not mark it Secure.
  const plain = await login(tgw.url);
  assert.doesNotMatch(plain.setCookie, /Secure/);
  await tgw.stop();
});

test('without an admin token, login is refused with a clear reason and the page still loads', async () => {
  const ngw = await startGateway({ admin_token: undefined }, { mock, env: { TOLLGATE_ADMIN_TOKEN: null } });
  const r = await fetchT(`${ngw.url}/admin/login`, { method: 'POST', body: JSON.stringify({ token: ADMIN_TOKEN }) });
  assert.equal(r.status, 403);
  assert.equal((await r.json()).error.code, 'admin_disabled');
  const page = await fetchT(`${ngw.url}/admin/`);
  assert.equal(page.status, 200);
  await page.arrayBuffer();
  await ngw.stop();
});

test('five failed logins in a row lock that address with 429, even with the right token', async () => {
  const lgw = await startGateway({}, { mock });
  const attempt = async (token) => {
    const r = await fetchT(`${lgw.url}/admin/login`, { method: 'POST', body: JSON.stringify({ token }) });
    return { status: r.status, retry: r.headers.get('retry-after'), json: await r.json() };
  };
  for (let i = 0; i < 5; i++) assert.equal((await attempt(`wrong-${i}`)).status, 401, `attempt ${i}`);
  const blocked = await attempt(ADMIN_TOKEN);
  assert.equal(blocked.status, 429);
  assert.equal(blocked.json.error.code, 'too_many_attempts');
  assert.ok(['1', '2'].includes(blocked.retry), `Retry-After ${blocked.retry}`);
  // The bearer token is not affected.
  const api = await fetchT(`${lgw.url}/admin/api/v1/plugins`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  assert.equal(api.status, 200);
  await api.arrayBuffer();
  await lgw.stop();
});
