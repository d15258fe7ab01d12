// Display formats: money, counts, durations, times, and what an API list returns.

/**
 * Dollars as stored: at least `digits` decimals, and every further non-zero one the value
 * holds (a balance of 0.000117 shows as $0.000117, not $0.00). Decimal strings from the
 * API are read as text, so no digit is lost to a float.
 */
export function money(v, digits = 2) {
  if (v === null || v === undefined || v === '') return '—';
  // A JSON number (the API sends money as numbers with the database's digits) is cut at
  // 10 decimals, the database's scale, so float noise (0.1 + 0.2) never shows.
  const t = typeof v === 'number' && Number.isFinite(v) && Math.abs(v) < 1e21 ? v.toFixed(10) : String(v).trim();
  const m = /^(-?)(\d+)(?:\.(\d+))?$/.exec(t);
  if (!m) {
    const n = Number(v);
    if (!Number.isFinite(n)) return String(v);
    const f = n.toFixed(10);
    return /^-?\d+\.\d+$/.test(f) ? money(f, digits) : String(v);
  }
  const frac = (m[3] || '').replace(/0+$/, '');
  const shown = frac.length >= digits ? frac : frac.padEnd(digits, '0');
  const whole = Number(m[2]).toLocaleString('en-US');
  return `${m[1]}$${whole}${shown ? `.${shown}` : ''}`;
}

export function num(v, digits = 0) {
  if (v === null || v === undefined || v === '') return '—';
  const n = Number(v);
  if (!Number.isFinite(n)) return String(v);
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function pct(v, digits = 1) {
  if (v === null || v === undefined || !Number.isFinite(v)) return '—';
  return `${(v * 100).toFixed(digits)}%`;
}

export function ms(v) {
  if (v === null || v === undefined || !Number.isFinite(Number(v))) return '—';
  const n = Number(v);
  return n >= 1000 ? `${(n / 1000).toFixed(2)} s` : `${n.toFixed(n < 10 ? 1 : 0)} ms`;
}

/** One date format everywhere: the browser's locale, date and time to the second. */
export function when(iso) {
  if (!iso) return '—';
  const d = typeof iso === 'number' ? new Date(iso) : new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, { year: 'numeric', month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

export function ago(iso, now = Date.now()) {
  if (!iso) return '';
  const s = Math.round((now - new Date(iso).getTime()) / 1000);
  const a = Math.abs(s);
  const txt = a < 60 ? `${a} s` : a < 3600 ? `${Math.round(a / 60)} min` : a < 86400 ? `${Math.round(a / 3600)} h` : `${Math.round(a / 86400)} d`;
  return s >= 0 ? `${txt} ago` : `in ${txt}`;
}

/** "a, b, c" → ["a","b","c"]; empty → []. */
export function splitList(s) {
  return String(s || '')
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
}

/** A form value that may be blank: blank → null, otherwise a number (or the string when not numeric). */
export function optInt(s) {
  const t = String(s ?? '').trim();
  if (!t) return null;
  const n = Number(t);
  return Number.isInteger(n) ? n : t;
}

export function optDecimal(s) {
  const t = String(s ?? '').trim();
  return t ? t : null;
}
