// An account's learned quota (GET accounts/{id}/quota) as the Accounts page shows it:
// one line per plan window and per limit, the share used and the countdown to its reset.
import { num } from './format.js';

/** "12 s", "7 min", "3 h", "2 d": the time until a reset. */
export function countdown(msLeft) {
  const s = Math.max(0, Math.ceil(msLeft / 1000));
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`;
}

const WINDOW_NAMES = { short: 'plan window (5 h / primary)', long: 'plan window (7 d / secondary)' };

/**
 * What the provider last said about an account's quota (GET accounts/{id}/quota): one
 * line per window and per limit, a bar of the share used and the countdown to its reset.
 * (spec/browser/console_logic.test.mjs tests it.)
 */
export function quotaLines(q, now = Date.now()) {
  if (!q || !q.known) return [];
  const skew = now - q.now_ms; // the gateway's clock against the browser's
  const lines = [];
  for (const w of q.windows || []) {
    if (w.used == null && !w.reset_at_ms) continue;
    lines.push({
      key: `w-${w.name}`,
      label: w.name === 'short' ? '5 h' : '7 d',
      title: WINDOW_NAMES[w.name],
      used: w.used,
      text: w.used == null ? w.status : `${Math.round(w.used * 100)}%`,
      reset: w.reset_at_ms ? countdown(w.reset_at_ms + skew - now) : null,
      spent: w.status === 'rejected' || (w.used != null && w.used >= 1 && w.reset_at_ms + skew > now),
    });
  }
  for (const l of q.limits || []) {
    const used = l.limit > 0 && l.remaining >= 0 ? 1 - l.remaining / l.limit : null;
    lines.push({
      key: `l-${l.name}`,
      label: l.name.replace('_', ' '),
      title: `${l.name}: ${l.remaining} of ${l.limit} left`,
      used,
      text: l.remaining >= 0 ? `${num(l.remaining)}${l.limit > 0 ? ` / ${num(l.limit)}` : ''} left` : '?',
      reset: l.reset_at_ms ? countdown(l.reset_at_ms + skew - now) : null,
      spent: l.remaining === 0 && l.reset_at_ms + skew > now,
    });
  }
  return lines;
}

