// Upstream accounts: the pool the gateway routes to. Status, health (disabled, cooling
// down, no credential), the quota its provider last reported (windows and limits with
// utilisation bars and reset countdowns), recent load from usage rows, enable/disable,
// clearing a cooldown, and the groups each serves.
import { useEffect, useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Badge, Confirm, Empty, ErrorBox, Field, Form, Modal, Notice, PageHead, Select, Spinner, Table, useLoad } from '../components.jsx';
import { ago, ms, num, splitList, when } from '../format.js';
import { navigate } from '../router.js';
import { countdown, quotaLines } from '../quota.js';
import { bedrockFields } from '../bedrock.js';

export function health(a, now = Date.now()) {
  if (a.problem) return { kind: 'bad', text: 'broken', why: a.problem };
  if (a.status !== 'active') return { kind: 'neutral', text: 'disabled' };
  if (a.auth_error) return { kind: 'bad', text: 'token refresh failed', why: `${a.auth_error} (${ago(a.auth_error_at)}); cooled down, fix the credential or settings` };
  if (a.cooldown_until && Date.parse(a.cooldown_until) > now) {
    const left = Math.ceil((Date.parse(a.cooldown_until) - now) / 1000);
    const text = left < 120 ? `${left} s` : left < 7200 ? `${Math.round(left / 60)} min` : `${Math.round(left / 3600)} h`;
    return { kind: 'warn', text: `cooling · ${text}`, title: `cooling down until ${when(a.cooldown_until)}` };
  }
  if (!a.has_credential) return { kind: 'warn', text: 'no credential' };
  return { kind: 'ok', text: 'ok' };
}

function QuotaCell({ q }) {
  const lines = quotaLines(q);
  if (!lines.length) return <span class="muted" title="the provider sent no quota headers the gateway could read (or they expired)">not reported</span>;
  return (
    <div class="quota" data-testid="account-quota">
      {q.blocked_until_ms > 0 && (
        <Badge kind="warn" title="passed over until its provider's reset">
          spent · {countdown(q.blocked_until_ms - q.now_ms)}
        </Badge>
      )}
      {lines.map((l) => (
        <div key={l.key} class="quota-line" title={l.title}>
          <span class="quota-label">{l.label}</span>
          <span class="quota-bar" role="meter" aria-label={`${l.label} used`} aria-valuemin="0" aria-valuemax="100" aria-valuenow={l.used == null ? 0 : Math.round(l.used * 100)}>
            <span class={l.spent ? 'quota-fill bad-fill' : 'quota-fill'} style={{ width: `${Math.round(Math.min(1, Math.max(0, l.used ?? 0)) * 100)}%` }} />
          </span>
          <span class="small-text">
            {l.text}
            {l.reset && <> · resets in {l.reset}</>}
          </span>
        </div>
      ))}
    </div>
  );
}

/** An identity's token: its kind, when it expires and when it was last renewed. */
function Token({ a }) {
  const left = a.token_expires_at ? Date.parse(a.token_expires_at) - Date.now() : null;
  return (
    <div class="muted small-text" data-testid="account-token">
      {a.auth} · {left == null ? 'no token yet' : left > 0 ? `token expires in ${countdown(left)}` : 'token expired'}
      {a.token_refreshed_at && <> · renewed {ago(a.token_refreshed_at)}</>}
    </div>
  );
}

function AccountForm({ account, groups, onDone, onCancel }) {
  const inGroups = new Set(account?.groups || []);
  const [provider, setProvider] = useState(account?.provider ?? 'openai');
  const bedrock = provider === 'bedrock';
  return (
    <Form
      submitLabel={account ? 'Save account' : 'Create account'}
      busyLabel="Saving…"
      onCancel={onCancel}
      onSubmit={async (v) => {
        if (!v.name.trim()) throw { field: 'name', plain: 'Give the account a name.' };
        if (!/^https?:\/\/[^/\s]/.test(v.base_url.trim())) throw { field: 'base_url', plain: 'The base URL is http:// or https:// and a host, e.g. https://api.openai.com/v1.' };
        let modelMap, settings;
        try {
          modelMap = v.model_map.trim() ? JSON.parse(v.model_map) : {};
        } catch (e) {
          throw { field: 'model_map', plain: `The model map must be a JSON object: ${e.message}` };
        }
        try {
          settings = (v.settings || '').trim() ? JSON.parse(v.settings) : {};
        } catch (e) {
          throw { field: 'settings', plain: `The settings must be a JSON object of strings: ${e.message}` };
        }
        const body = {
          name: v.name.trim(),
          provider: v.provider,
          auth: v.auth ?? 'key',
          settings,
          base_url: v.base_url.trim(),
          kind: v.kind,
          models: splitList(v.models),
          model_map: modelMap,
          groups: (v.groups || []).map(Number),
        };
        for (const k of ['concurrency', 'priority', 'weight']) {
          if (v[k].trim() === '') continue;
          const n = Number(v[k]);
          if (!Number.isInteger(n)) throw { field: k, plain: `${k[0].toUpperCase()}${k.slice(1)} is a whole number.` };
          body[k] = n;
        }
        if (v.cost_multiplier.trim()) body.cost_multiplier = v.cost_multiplier.trim();
        if (v.provider === 'bedrock') Object.assign(body, bedrockFields(v, account));
        else {
          if (v.credential) body.credential = v.credential;
          if (v.credential_json.trim()) body.credential = v.credential_json;
        }
        if (account) await api.patch(`/accounts/${account.id}`, body);
        else await api.post('/accounts', body);
        onDone();
      }}
    >
      <Field label="Name">
        <input name="name" defaultValue={account?.name ?? ''} placeholder="openai-main" />
      </Field>
      <div style="display: contents" onChange={(e) => e.target.name === 'provider' && setProvider(e.target.value)}>
        <Field label="Provider">
          <Select name="provider" initial={account?.provider ?? 'openai'} options={[['openai', 'openai'], ['anthropic', 'anthropic'], ['gemini', 'gemini'], ['azure', 'azure'], ['bedrock', 'bedrock (AWS)'], ['vertex', 'vertex']]} />
        </Field>
      </div>
      {!bedrock && (
        <>
          <Field label="Authentication" hint="An API key, or an identity the gateway exchanges for a token and renews.">
            <Select
              name="auth"
              initial={account?.auth ?? 'key'}
              options={[
                ['key', 'API key'],
                ['entra', 'Microsoft Entra ID app (azure)'],
                ['service_account', 'Google service account (vertex)'],
                ['oauth', 'OAuth refresh token'],
              ]}
            />
          </Field>
        </>
      )}
      <Field label="Base URL" hint={bedrock ? 'e.g. https://bedrock-runtime.us-east-1.amazonaws.com' : 'e.g. https://api.openai.com/v1'} wide>
        <input name="base_url" defaultValue={account?.base_url ?? ''} placeholder={bedrock ? 'https://bedrock-runtime.us-east-1.amazonaws.com' : 'https://api.openai.com/v1'} />
      </Field>
      {bedrock ? (
        <>
          <Field label="AWS region" hint="Signed into every request (SigV4).">
            <input name="aws_region" defaultValue={account?.settings?.region ?? ''} placeholder="us-east-1" />
          </Field>
          <Field label="Access key id">
            <input name="aws_access_key_id" defaultValue={account?.settings?.access_key_id ?? ''} placeholder="AKIA…" autocomplete="off" />
          </Field>
          <Field label="Secret access key" hint={account?.has_credential ? 'Stored sealed; blank keeps it.' : 'Stored sealed (AES-256-GCM), never shown again.'}>
            <input name="aws_secret" type="password" autocomplete="off" placeholder={account?.has_credential ? '••••••• (unchanged)' : ''} />
          </Field>
          <Field label="Session token" hint="Optional (temporary credentials); sealed with the secret.">
            <input name="aws_session_token" type="password" autocomplete="off" />
          </Field>
        </>
      ) : (
        <>
          <Field
            label="Credential"
            hint={account ? (account.has_credential ? 'Stored sealed; blank keeps it.' : 'None stored yet.') : 'The provider API key; stored sealed (AES-256-GCM), never shown again.'}
            wide
          >
            <input name="credential" type="password" autocomplete="off" placeholder={account?.has_credential ? '••••••• (unchanged)' : 'sk-…'} />
          </Field>
          <Field label="Service account key (JSON)" hint="Vertex: paste the key file; it replaces the credential, stored sealed, never shown." wide>
            <textarea name="credential_json" rows={2} class="mono" autocomplete="off" placeholder='{"type": "service_account", ...}' />
          </Field>
          <Field
            label="Settings (JSON)"
            hint='azure: {"api_version"}; entra: {"tenant_id", "client_id"}; vertex: {"project", "region"}; oauth: {"token_url", "client_id"}'
            wide
          >
            <textarea name="settings" rows={2} class="mono" defaultValue={JSON.stringify(account?.settings ?? {})} />
          </Field>
        </>
      )}
      <Field label="Kind">
        <Select name="kind" initial={account?.kind ?? 'metered'} options={[['metered', 'metered'], ['subscription', 'subscription']]} />
      </Field>
      <Field label="Concurrency" hint="Requests at once.">
        <input name="concurrency" inputMode="numeric" defaultValue={account?.concurrency ?? 16} />
      </Field>
      <Field label="Priority" hint="Higher is tried first.">
        <input name="priority" inputMode="numeric" defaultValue={account?.priority ?? 0} />
      </Field>
      <Field label="Weight" hint="Share among equal priority.">
        <input name="weight" inputMode="numeric" defaultValue={account?.weight ?? 100} />
      </Field>
      <Field label="Cost multiplier">
        <input name="cost_multiplier" inputMode="decimal" defaultValue={account?.cost_multiplier ?? '1'} />
      </Field>
      <Field label="Models" hint="Comma-separated; blank: any model." wide>
        <input name="models" defaultValue={(account?.models || []).join(', ')} placeholder="gpt-4o-mini, gpt-4o" />
      </Field>
      <Field label="Model map (JSON)" hint={bedrock ? 'Client model → Bedrock modelId, e.g. {"claude-sonnet": "anthropic.claude-3-5-sonnet-20240620-v1:0"}' : 'Client model → upstream model, e.g. {"gpt-4o-mini": "gpt-4o-mini-2024-07-18"}'} wide>
        <textarea name="model_map" rows={2} class="mono" defaultValue={JSON.stringify(account?.model_map ?? {})} />
      </Field>
      <fieldset class="field wide">
        <legend class="field-label">Groups it serves</legend>
        {groups.length ? (
          <div class="checks">
            {groups.map((g) => (
              <label key={g.id} class="check">
                <input type="checkbox" name="groups" data-multi="1" value={String(g.id)} defaultChecked={inGroups.has(g.id)} /> {g.name}
              </label>
            ))}
          </div>
        ) : (
          <span class="hint">No groups yet: create one on the Groups page so keys can reach this account.</span>
        )}
      </fieldset>
    </Form>
  );
}

/** The model a test sends by default: the account's own, else one its groups list. */
function testModel(account, groups) {
  const own = account.models?.[0] || Object.keys(account.model_map || {})[0];
  if (own) return own;
  const g = groups.find((x) => (account.groups || []).includes(x.id) && x.models?.length);
  return g ? g.models[0] : '';
}

/** One small request through the account (POST accounts/{id}/test), and its last requests. */
function TestInfo({ account, recent, groups, onClose }) {
  const rows = recent.filter((r) => r.account_id === account.id).slice(-20).reverse();
  const [result, setResult] = useState(null);
  return (
    <Modal title={`Test ${account.name}`} onClose={onClose} wide>
      {account.problem && <Notice kind="bad">The gateway cannot use this account: {account.problem}</Notice>}
      <Form
        submitLabel="Send test request"
        busyLabel="Waiting for the upstream…"
        onSubmit={async (v) => {
          setResult(null);
          const body = v.model.trim() ? { model: v.model.trim() } : {};
          setResult(await api.post(`/accounts/${account.id}/test`, body));
        }}
      >
        <Field label="Model" hint="Sent through this account's model map; the reply is capped at 8 tokens." wide>
          <input name="model" defaultValue={testModel(account, groups)} placeholder="gpt-4o-mini" />
        </Field>
      </Form>
      {result && <TestResult r={result} />}
      <h3>Last requests through this account (past hour)</h3>
      {rows.length ? (
        <table class="compact">
          <thead>
            <tr>
              <th>when</th>
              <th>model</th>
              <th>status</th>
              <th class="num">TTFT</th>
              <th class="num">total</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.id}>
                <td>{ago(r.created_at)}</td>
                <td>{r.model}</td>
                <td>
                  <Badge kind={r.status >= 200 && r.status < 300 ? 'ok' : 'bad'}>{r.status ?? '—'}</Badge>
                </td>
                <td class="num">{ms(r.ttft_ms)}</td>
                <td class="num">{ms(r.total_ms)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <Empty title="No billed requests through this account in the past hour.">Test requests are not billed and not listed here.</Empty>
      )}
      {!(account.groups || []).length && <p>This account serves no group yet, so no key can reach it: edit it and tick a group.</p>}
    </Modal>
  );
}

/** What the upstream answered to a test, in words an operator can act on. */
function TestResult({ r }) {
  const hint =
    r.status === 401 || r.status === 403
      ? 'The upstream refused the credential: edit the account and store the right API key.'
      : r.status === 404
        ? 'The upstream does not know this path or model: check the base URL (it usually ends in /v1) and the model name.'
        : r.status === 429
          ? 'The upstream is rate limiting this account right now.'
          : r.error?.kind === 'connect'
            ? 'The gateway could not connect: check the base URL host and port, and that the gateway can reach it.'
            : r.error && /timeout/.test(r.error.kind)
              ? 'The upstream did not answer in time.'
              : '';
  return (
    <div class="test-result" data-testid="test-result" role="status">
      <p>
        <Badge kind={r.ok ? 'ok' : 'bad'}>{r.ok ? 'works' : 'failed'}</Badge>{' '}
        <span data-testid="test-status">{r.status ? `HTTP ${r.status}` : 'no answer'}</span> · first byte {ms(r.first_byte_ms)} · total{' '}
        {ms(r.total_ms)} · model {r.model}
        {r.upstream_model !== r.model ? ` → ${r.upstream_model}` : ''} · POST …{r.path}
      </p>
      {r.error && (
        <p class="bad" data-testid="test-error">
          {r.error.message}
        </p>
      )}
      {hint && <p class="hint">{hint}</p>}
      {r.ok && r.reply != null && <p class="muted">Reply: {r.reply}</p>}
    </div>
  );
}

/** Accounts and groups are read again every REFRESH_MS while the page is visible (a
 *  cooldown starts and ends in seconds); the past hour's usage every USAGE_MS. */
const REFRESH_MS = 2000;
const USAGE_MS = 30000;

export function Accounts() {
  const { data, error, loading, reload } = useLoad(async () => {
    const [accounts, groups] = await Promise.all([listAll('/accounts'), listAll('/groups')]);
    // What each account's provider last said (the fleet's copy in Redis); one small GET each.
    const quota = Object.fromEntries(
      await Promise.all(accounts.map(async (a) => [a.id, await api.get(`/accounts/${a.id}/quota`).catch(() => null)])),
    );
    return { accounts, groups, quota };
  });
  const usage = useLoad(async () => {
    const since = new Date(Date.now() - 3600e3).toISOString();
    // Load over the past hour, from usage rows; without usage rows this is empty.
    return listAll('/usage', { query: { from: since }, limit: 1000, maxRows: 5000 }).catch(() => []);
  });
  const [, setTick] = useState(0);
  useEffect(() => {
    let n = 0;
    const t = setInterval(() => {
      if (document.hidden) return;
      n += 1;
      reload();
      if ((n * REFRESH_MS) % USAGE_MS === 0) usage.reload();
      setTick(n); // countdowns move even when nothing changed
    }, REFRESH_MS);
    return () => clearInterval(t);
  }, [reload, usage.reload]);
  const [editing, setEditing] = useState(null);
  const [testing, setTesting] = useState(null);
  const [confirm, setConfirm] = useState(null);
  const accounts = data?.accounts || [];
  const groups = data?.groups || [];
  const recent = usage.data || [];

  const load = (a) => {
    const rs = recent.filter((r) => r.account_id === a.id);
    if (!rs.length) return <span class="muted">idle</span>;
    const busy = rs.reduce((s, r) => s + (Number(r.total_ms) || 0), 0) / 3600e3;
    const okN = rs.filter((r) => r.status >= 200 && r.status < 300).length;
    return (
      <span title="from usage rows of the past hour">
        {num(rs.length)} req/h · {num(busy, 2)} of {num(a.concurrency)} slots · {Math.round((100 * okN) / rs.length)}% ok
      </span>
    );
  };

  const columns = [
    { key: 'id', label: 'id', num: true },
    {
      key: 'name',
      label: 'name',
      render: (a) => (
        <>
          <strong>{a.name}</strong>
          <div class="muted small-text">{a.base_url}</div>
        </>
      ),
    },
    {
      key: 'provider',
      label: 'provider',
      render: (a) => (
        <>
          {a.provider} · {a.kind}
          {a.auth && a.auth !== 'key' && <Token a={a} />}
        </>
      ),
    },
    { key: 'status', label: 'status', render: (a) => <Badge kind={a.status === 'active' ? 'ok' : 'neutral'}>{a.status}</Badge> },
    {
      key: 'health',
      label: 'health',
      render: (a) => {
        const h = health(a);
        return (
          <>
            <Badge kind={h.kind} title={h.title}>
              {h.text}
            </Badge>
            {h.why && <div class="bad small-text" data-testid="account-problem">{h.why}</div>}
          </>
        );
      },
    },
    { key: 'quota', label: 'quota (as its provider said)', render: (a) => <QuotaCell q={data?.quota?.[a.id]} /> },
    { key: 'load', label: 'load (past hour)', render: load },
    { key: 'prio', label: 'priority / weight', render: (a) => `${a.priority} / ${a.weight}` },
    { key: 'models', label: 'models', render: (a) => (a.models?.length ? a.models.join(', ') : <span class="muted">any</span>) },
    {
      key: 'groups',
      label: 'groups',
      render: (a) =>
        (a.groups || []).length ? (
          a.groups.map((id) => groups.find((g) => g.id === id)?.name ?? `#${id}`).join(', ')
        ) : (
          <span class="bad">none</span>
        ),
    },
    {
      key: 'actions',
      label: '',
      render: (a) => (
        <div class="row-actions">
          <button type="button" class="small" onClick={() => setTesting(a)}>
            Test
          </button>
          <button type="button" class="small" onClick={() => setEditing(a)}>
            Edit
          </button>
          <button
            type="button"
            class={`small ${a.status === 'active' ? 'danger' : 'primary'}`}
            onClick={() =>
              setConfirm({
                title: a.status === 'active' ? `Disable ${a.name}?` : `Enable ${a.name}?`,
                text: a.status === 'active' ? 'No new request is routed to it; requests in flight finish.' : 'It takes requests again.',
                label: a.status === 'active' ? 'Disable' : 'Enable',
                danger: a.status === 'active',
                run: () => api.patch(`/accounts/${a.id}`, { status: a.status === 'active' ? 'disabled' : 'active' }),
              })
            }
          >
            {a.status === 'active' ? 'Disable' : 'Enable'}
          </button>
          <button
            type="button"
            class="small danger-text"
            onClick={() =>
              setConfirm({
                title: `Delete ${a.name}?`,
                text: 'The account and its credential are deleted and no request is routed to it again; its past usage rows keep its id. To pause it, disable it instead.',
                label: 'Delete account',
                danger: true,
                run: () => api.del(`/accounts/${a.id}`),
              })
            }
          >
            Delete
          </button>
          {a.cooldown_until && Date.parse(a.cooldown_until) > Date.now() && (
            <button
              type="button"
              class="small"
              onClick={() =>
                setConfirm({
                  title: `End the cooldown of ${a.name}?`,
                  text: 'It is routed to again at once.',
                  label: 'End cooldown',
                  run: () => api.patch(`/accounts/${a.id}`, { cooldown_until: null }),
                })
              }
            >
              End cooldown
            </button>
          )}
        </div>
      ),
    },
  ];

  return (
    <div>
      <PageHead title="Accounts" sub="Upstream provider accounts the gateway routes to, by group, priority and weight.">
        <button type="button" class="primary" onClick={() => setEditing('new')}>
          New account
        </button>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {loading && !data ? (
        <Spinner label="Loading accounts…" />
      ) : (
        <Table
          columns={columns}
          rows={accounts}
          empty={
            !error && (
              <Empty title="No upstream accounts yet.">
                Add the provider accounts requests go to (base URL and API key), and tick the{' '}
                <a href="/admin/groups" onClick={(e) => (e.preventDefault(), navigate('groups'))}>
                  groups
                </a>{' '}
                they serve. Until then, only keys without a group work, through the config's static upstream.
              </Empty>
            )
          }
        />
      )}
      {accounts.length > 0 && (
        <p class="hint">
          Load comes from the usage rows of the past hour (requests, average slots busy, share answered 2xx); live in-flight
          counts per account are not exposed by the API.
        </p>
      )}
      {editing && (
        <Modal title={editing === 'new' ? 'New account' : `Edit ${editing.name}`} onClose={() => setEditing(null)} wide>
          <AccountForm
            account={editing === 'new' ? null : editing}
            groups={groups}
            onCancel={() => setEditing(null)}
            onDone={() => {
              setEditing(null);
              reload();
            }}
          />
        </Modal>
      )}
      {testing && <TestInfo account={testing} recent={recent} groups={groups} onClose={() => setTesting(null)} />}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel={confirm.label}
          danger={confirm.danger}
          onClose={() => setConfirm(null)}
          onConfirm={async () => {
            await confirm.run();
            reload();
          }}
        >
          {confirm.text}
        </Confirm>
      )}
    </div>
  );
}
