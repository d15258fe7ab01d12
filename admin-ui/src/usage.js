// The usage reports of the admin API (GET /admin/api/v1/usage/report, usage/capacity,
// usage/export), computed by the server from its hourly and daily rollups: the console
// only asks for a range, a grouping, filters and a page, and shows the answer.
// Free of the DOM.

const HOUR = 3600e3;

/** ISO form the API takes: a whole UTC hour, seconds and milliseconds cut. */
export function hourIso(ms) {
  return new Date(Math.floor(ms / HOUR) * HOUR).toISOString().replace('.000Z', 'Z');
}

/** The range [from, to) of a preset: the last `hours` hours up to the next whole hour. */
export function presetRange(hours, now = Date.now()) {
  const to = Math.floor(now / HOUR) * HOUR + HOUR;
  return { from: hourIso(to - hours * HOUR), to: hourIso(to) };
}

/** A UTC day (YYYY-MM-DD, from a date input) as the API's bound; '' stays ''. */
export function dayBound(day) {
  return /^\d{4}-\d{2}-\d{2}$/.test(day || '') ? `${day}T00:00:00Z` : '';
}

/** The day after a YYYY-MM-DD (an inclusive "to" day becomes the exclusive bound). */
export function nextDay(day) {
  const t = Date.parse(`${day}T00:00:00Z`);
  return Number.isNaN(t) ? '' : new Date(t + 24 * HOUR).toISOString().slice(0, 10);
}

/** Query string of a report request (empty values left out, group_by always sent). */
export function reportQuery({ from, to, groupBy = '', filters = {}, limit, pageToken } = {}) {
  const q = new URLSearchParams();
  if (from) q.set('from', from);
  if (to) q.set('to', to);
  q.set('group_by', groupBy);
  for (const [k, v] of Object.entries(filters)) if (v !== '' && v != null) q.set(k, String(v).trim());
  if (limit) q.set('limit', String(limit));
  if (pageToken) q.set('page_token', pageToken);
  return q.toString();
}

/** The x (Unix seconds) of a report row grouped by hour or day. */
export function rowTime(r) {
  if (r.hour) return Date.parse(r.hour) / 1000;
  if (r.day) return Date.parse(`${r.day}T00:00:00Z`) / 1000;
  return null;
}

/** A report grouped by hour or day as chart columns: [xs, successes, errors, cost]. */
export function seriesOf(rows) {
  const xs = [];
  const ok = [];
  const bad = [];
  const cost = [];
  for (const r of rows) {
    xs.push(rowTime(r));
    ok.push(Number(r.successes));
    bad.push(Number(r.requests) - Number(r.successes));
    cost.push(Number(r.cost));
  }
  return { xs, ok, bad, cost };
}
