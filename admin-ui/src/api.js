// The console's only way to the gateway: the admin API under /admin/api/v1 with the
// session cookie (HttpOnly, set by POST /admin/login) and, on every write, the session's
// CSRF token in the x-csrf-token header. The admin token itself is sent once, at login,
// and never stored.
//
// Every failure becomes an ApiError whose `plain` text says in plain words what went
// wrong and, where there is one, what to do about it.

const BASE = '/admin/api/v1';

let csrf = null;
let onSessionLost = () => {};
let actor = '';

/** The name sent with every write as x-tollgate-actor (the policy workbench's audit list
 *  records it): printable ASCII, 64 characters at most. */
export function setActor(name) {
  actor = String(name || '').replace(/[^\x20-\x7e]/g, '?').slice(0, 64).trim();
}

/** Registers what to do when the gateway answers 401 (the session expired or was lost). */
export function setSessionLostHandler(fn) {
  onSessionLost = fn;
}

export class ApiError extends Error {
  constructor(status, code, detail, plain, param = null) {
    super(plain);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.plain = plain;
    this.param = param; // the request field the error concerns (shown next to it)
  }
}

/** Plain words for an error answer of the gateway (status, code, the API's message). */
export function plainError(status, code, detail) {
  const d = detail ? ` (${detail})` : '';
  switch (code) {
    case 'invalid_admin_token':
      return 'That admin token is wrong.';
    case 'admin_disabled':
      return 'The admin API is switched off on this gateway: start it with admin_token in the config or TOLLGATE_ADMIN_TOKEN.';
    case 'too_many_attempts':
      return 'Too many failed logins from this address. Wait a little, then try again.';
    case 'no_session':
      return 'You are not logged in.';
    case 'invalid_csrf_token':
      return 'The page lost its security token. Reload the page and try again.';
    case 'database_unavailable':
      return 'The database is unavailable, so nothing can be read or changed right now. Check that Postgres runs and that the gateway has TOLLGATE_PG.';
    case 'database_timeout':
      return 'The database did not answer in time. Try again in a moment.';
    case 'conflict':
    case 'in_use':
    case 'invalid_reference':
    case 'account_unusable':
      // The gateway's sentence says what to do (tg_admin_errors.c).
      return detail || (code === 'conflict' ? 'That already exists: pick another name.' : 'That refers to something that does not exist (any more).');
    case 'not_found':
      return 'It does not exist (any more): someone may have deleted it. Reload the list.';
    case 'reload_failed':
      return `The new plugins were refused, and the ones loaded before keep serving: ${detail}`;
    case 'method_not_allowed':
      return `The gateway does not allow this here${d}.`;
    case 'invalid_json':
    case 'invalid_request':
    case 'invalid_value':
      if (!detail) return 'The gateway refused the values: check the form.';
      return /[.!?]$/.test(detail) ? detail : `${detail[0].toUpperCase()}${detail.slice(1)}.`;
    default:
      break;
  }
  if (status === 401) return 'Your session has ended. Log in again.';
  if (status === 403) return `Not allowed${d}.`;
  if (status === 404) return 'Not found: this gateway may be older than the console, or the object was deleted.';
  if (status === 429) return 'The gateway is rate limiting this: wait a moment and try again.';
  if (status >= 500) return `The gateway had a problem (HTTP ${status})${d}. Try again; if it persists, look at the gateway's log.`;
  return `The gateway answered HTTP ${status}${d}.`;
}

async function errorOf(res) {
  let code = null;
  let detail = null;
  let param = null;
  try {
    const j = await res.json();
    code = j?.error?.code ?? null;
    detail = j?.error?.message ?? null;
    param = j?.error?.param ?? null;
  } catch {
    /* not JSON */
  }
  return new ApiError(res.status, code, detail, plainError(res.status, code, detail), param);
}

function networkError(e) {
  if (e?.name === 'AbortError') return e;
  return new ApiError(0, 'network', String(e?.message || e), 'Cannot reach the gateway. Is it running, and is this the right address?');
}

/** fetch with the session: JSON in, JSON out. Resolves with the parsed body (null for 204).
 *  A write refused with 401 is retried once after fetching the CSRF token again (another
 *  tab may have logged in anew, which replaces the session cookie). */
export async function request(method, path, body, { signal, base = BASE, retried = false } = {}) {
  const headers = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && method !== 'HEAD' && csrf) headers['x-csrf-token'] = csrf;
  if (method !== 'GET' && method !== 'HEAD' && actor) headers['x-tollgate-actor'] = actor;
  let res;
  try {
    res = await fetch(base + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin',
      cache: 'no-store',
      signal,
    });
  } catch (e) {
    throw networkError(e);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    const write = method !== 'GET' && method !== 'HEAD';
    if (res.status === 401 && base === BASE && write && !retried && (await resumeSession().catch(() => false))) {
      return request(method, path, body, { signal, base, retried: true });
    }
    if (res.status === 401 && base === BASE) {
      csrf = null;
      onSessionLost(err);
    }
    throw err;
  }
  if (res.status === 204) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export const api = {
  get: (p, o) => request('GET', p, undefined, o),
  post: (p, b, o) => request('POST', p, b ?? {}, o),
  patch: (p, b, o) => request('PATCH', p, b, o),
  del: (p, o) => request('DELETE', p, undefined, o),
};

/** Asks the gateway whether the session cookie is still good; returns true and keeps
 *  the CSRF token when it is. */
export async function resumeSession() {
  try {
    const s = await request('GET', '/session', undefined, { base: '/admin' });
    csrf = s.csrf;
    return true;
  } catch (e) {
    if (e.status === 401) return false;
    throw e;
  }
}

export async function login(token) {
  const s = await request('POST', '/login', { token }, { base: '/admin' });
  csrf = s.csrf;
}

export async function logout() {
  try {
    await request('POST', '/logout', {}, { base: '/admin' });
  } finally {
    csrf = null;
  }
}

/**
 * Every row of a paginated list (?limit=&after=, {data, has_more, next_after}), page by
 * page; onProgress(rowsSoFar) after each page. Stops after maxRows.
 */
export async function listAll(path, { query = {}, limit = 500, maxRows = 20000, onProgress, signal } = {}) {
  const rows = [];
  let after = null;
  for (;;) {
    const q = new URLSearchParams({ ...query, limit: String(limit) });
    if (after !== null) q.set('after', String(after));
    const page = await api.get(`${path}?${q}`, { signal });
    const data = page?.data ?? [];
    rows.push(...data);
    onProgress?.(rows.length);
    const more = page?.has_more ?? data.length === limit;
    if (!more || !data.length || page.next_after == null || rows.length >= maxRows) break;
    after = page.next_after;
  }
  return rows;
}

/** GET /metrics as text (public, no session needed). */
export async function fetchMetrics(signal) {
  let res;
  try {
    res = await fetch('/metrics', { cache: 'no-store', signal });
  } catch (e) {
    throw networkError(e);
  }
  if (!res.ok) throw await errorOf(res);
  return res.text();
}
