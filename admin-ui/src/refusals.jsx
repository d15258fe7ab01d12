// The gateway's own refusals by reason (tollgate_refusals_total in GET /metrics), in
// words, with where to look: a spike of "no account available" points to the accounts
// cooling down at that moment.
import { navigate } from './router.js';
import { num } from './format.js';

/** code → [status, what it means, the page where the cause is]. */
export const REASONS = {
  invalid_api_key: [401, 'unknown, revoked or suspended key', 'keys'],
  key_expired: [401, 'key past its expiry', 'keys'],
  model_not_allowed: [403, 'model not allowed for the key', 'keys'],
  ip_not_allowed: [403, 'client address not allowed for the key', 'keys'],
  insufficient_balance: [402, "tenant's balance too low", 'tenants'],
  insufficient_quota: [402, 'no money left (balance or budget)', 'tenants'],
  budget_exceeded: [402, 'budget reached', 'tenants'],
  rate_limit_exceeded: [429, 'requests-per-minute limit', 'keys'],
  tokens_limit_exceeded: [429, 'tokens-per-minute limit', 'keys'],
  concurrency_limit_exceeded: [429, 'concurrency limit', 'keys'],
  accounts_busy: [429, 'every account of the group at its concurrency', 'accounts'],
  no_account_available: [503, 'no account could take it: cooling down, disabled or failing', 'accounts'],
  accounts_unavailable: [503, 'the account list is not loaded (database)', 'accounts'],
  limiter_unavailable: [503, 'rate limiter (Redis) unavailable', null],
  billing_unavailable: [503, 'billing unavailable (Redis or database)', null],
  auth_unavailable: [503, 'key lookup unavailable (database)', null],
  upstream_error: [502, 'the upstream failed after retries', 'accounts'],
  upstream_unreachable: [502, 'the upstream could not be reached', 'accounts'],
  upstream_timeout: [504, 'the upstream did not answer in time', 'accounts'],
  upstream_request_refused: [502, 'a value unfit for the upstream request', 'accounts'],
  rejected_by_plugin: [null, 'rejected by a plugin policy', 'plugins'],
  invalid_request: [400, 'malformed request', null],
  invalid_json: [400, 'body is not JSON', null],
  missing_model: [400, 'no model named', null],
  internal_error: [500, 'internal error (see the log)', null],
  other: [null, 'other refusals (bad requests of other kinds)', null],
};

/**
 * rows: refusalRows(); cooling: accounts cooling down now ([{name, cooldown_until}]).
 * `recentLabel` names the recent window ("last 10 s").
 */
export function RefusalsTable({ rows, cooling = [], recentLabel }) {
  return (
    <table class="compact" data-testid="refusals-table">
      <thead>
        <tr>
          <th>reason</th>
          <th class="num">status</th>
          {recentLabel && <th class="num">{recentLabel}</th>}
          <th class="num">since start</th>
          <th>where to look</th>
        </tr>
      </thead>
      <tbody>
        {rows.map((r) => {
          const [status, text, where] = REASONS[r.code] || [null, r.code, null];
          return (
            <tr key={r.code} data-code={r.code}>
              <td>
                {text} <code class="muted">{r.code}</code>
              </td>
              <td class="num">{status ?? '—'}</td>
              {recentLabel && <td class="num">{num(r.recent)}</td>}
              <td class="num">{num(r.total)}</td>
              <td>
                {where === 'accounts' && cooling.length > 0 && (
                  <span class="warn-text" data-testid="refusal-cooling">
                    {cooling.length === 1 ? '1 account' : `${cooling.length} accounts`} cooling down now ({cooling.map((a) => a.name).join(', ')}){' '}
                  </span>
                )}
                {where && (
                  <a href={`/admin/${where}`} onClick={(e) => (e.preventDefault(), navigate(where))}>
                    {where[0].toUpperCase() + where.slice(1)}
                  </a>
                )}
              </td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}
