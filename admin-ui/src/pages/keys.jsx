// API keys: create (the plain key is shown once, with a copy button), revoke, limits
// (requests and tokens per minute, concurrency, budget), filtered by tenant.
import { useRef, useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import {
  Badge,
  Confirm,
  CopyButton,
  Empty,
  ErrorBox,
  Field,
  Form,
  Modal,
  Notice,
  PageHead,
  Select,
  Spinner,
  Table,
  useLoad,
} from '../components.jsx';
import { money, num, optDecimal, optInt, splitList, when } from '../format.js';
import { navigate, queryParams } from '../router.js';
import { budgetScope, periodText, RemainingCell, ResetCell, SpendCell } from './budgets.jsx';

/** Every periodic budget that applies to a key (its own, its user's, its tenant's), as
 *  GET /keys/{id} lists them, with this period's spend, what remains and the reset. */
function KeyBudgets({ k, onClose }) {
  const got = useLoad(() => api.get(`/keys/${k.id}`), [k.id]);
  const budgets = got.data?.budgets || [];
  return (
    <Modal title={`Budgets of key ${k.prefix}…`} onClose={onClose} wide>
      <p class="hint">A request with this key is admitted only if it fits every budget below, beside the key's own lifetime budget and the tenant's balance.</p>
      <ErrorBox error={got.error} onRetry={got.reload} />
      {got.loading && !got.data ? (
        <Spinner label="Loading budgets…" />
      ) : (
        <div data-testid="key-budgets">
          <Table
            columns={[
              {
                key: 'name',
                label: 'name',
                render: (b) => (
                  <a href={`/admin/budgets?id=${b.id}`} onClick={(e) => (e.preventDefault(), navigate(`budgets?id=${b.id}`))}>
                    {b.name}
                  </a>
                ),
              },
              { key: 'scope', label: 'of the', render: (b) => <Badge>{budgetScope(b)}</Badge> },
              { key: 'period', label: 'period', render: periodText },
              { key: 'amount', label: 'amount', num: true, render: (b) => money(b.amount) },
              { key: 'spend', label: 'spend this period', num: true, render: (b) => <SpendCell b={b} /> },
              { key: 'remaining', label: 'remaining', num: true, render: (b) => <RemainingCell b={b} /> },
              { key: 'resets', label: 'resets', render: (b) => <ResetCell b={b} /> },
            ]}
            rows={budgets}
            empty={!got.error && <Empty title="No periodic budget applies to this key.">Neither the key, its user nor its tenant has one.</Empty>}
          />
        </div>
      )}
      <div class="form-actions">
        <button type="button" class="primary" onClick={() => navigate(`budgets?key_id=${k.id}`)}>
          Budgets page
        </button>
        <button type="button" onClick={onClose}>
          Close
        </button>
      </div>
    </Modal>
  );
}

function limitsBody(v) {
  const body = {
    rpm: optInt(v.rpm),
    tpm: optInt(v.tpm),
    concurrency: optInt(v.concurrency),
    budget: optDecimal(v.budget),
  };
  for (const k of ['rpm', 'tpm', 'concurrency']) {
    if (body[k] !== null && !(Number.isInteger(body[k]) && body[k] >= 0)) throw { field: k, plain: 'A whole number of 0 or more, or blank for no limit.' };
  }
  if (body.budget !== null && !(Number(body.budget) >= 0)) throw { field: 'budget', plain: 'The budget is an amount in dollars, or blank for none.' };
  return body;
}

/** The expiry of the form (a local date and time) as ISO 8601, or null; a time in the
 *  past is refused: the key would be refused from its first request. */
function expiryValue(v) {
  if (!v.expires_at) return null;
  const t = new Date(v.expires_at);
  if (Number.isNaN(t.getTime())) throw { field: 'expires_at', plain: 'Pick a date and time, or leave it blank for never.' };
  if (t.getTime() <= Date.now())
    throw { field: 'expires_at', plain: 'This time is in the past: the key would be refused from its first request. Pick a later time, or leave it blank for never.' };
  return t.toISOString();
}

/** A datetime-local input's value for an ISO time (local time, minutes). */
function localInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

function LimitFields({ k = {} }) {
  return (
    <>
      <Field label="Requests / minute" hint="blank: no limit">
        <input name="rpm" inputMode="numeric" defaultValue={k.rpm ?? ''} />
      </Field>
      <Field label="Tokens / minute" hint="blank: no limit">
        <input name="tpm" inputMode="numeric" defaultValue={k.tpm ?? ''} />
      </Field>
      <Field label="Concurrent requests" hint="blank: no limit">
        <input name="concurrency" inputMode="numeric" defaultValue={k.concurrency ?? ''} />
      </Field>
      <Field label="Budget (USD)" hint="blank: none">
        <input name="budget" inputMode="decimal" defaultValue={k.budget ?? ''} />
      </Field>
    </>
  );
}

/** The one moment the plain key exists outside the caller's hands. */
function NewKey({ created, onClose }) {
  const ref = useRef(null);
  return (
    <Modal title="Your new key" onClose={onClose}>
      <Notice kind="warn">
        Copy this key now. It is shown this once: the gateway keeps only its hash and cannot show it again.
      </Notice>
      <div class="copy-row">
        <input ref={ref} class="mono" readOnly value={created.key} data-testid="new-key" onFocus={(e) => e.currentTarget.select()} />
        <CopyButton text={created.key} targetRef={ref} />
      </div>
      <p class="hint">
        Use it as the OpenAI API key with this gateway's address as the base URL, e.g.{' '}
        <code>curl {location.origin}/v1/chat/completions -H "Authorization: Bearer {created.prefix}…"</code>
      </p>
      <div class="form-actions">
        <button type="button" class="primary" onClick={onClose}>
          I have copied it
        </button>
      </div>
    </Modal>
  );
}

export function Keys() {
  const [tenantId, setTenantId] = useState(queryParams().tenant_id || '');
  const refs = useLoad(async () => {
    const [tenants, groups] = await Promise.all([listAll('/tenants'), listAll('/groups')]);
    return { tenants, groups };
  });
  const keys = useLoad(() => listAll('/keys', { query: tenantId ? { tenant_id: tenantId } : {} }), [tenantId]);
  const [creating, setCreating] = useState(false);
  const [created, setCreated] = useState(null);
  const [editing, setEditing] = useState(null);
  const [confirm, setConfirm] = useState(null);
  const [budgetsOf, setBudgetsOf] = useState(null);

  const tenants = refs.data?.tenants || [];
  const groups = refs.data?.groups || [];
  const tenantName = (id) => tenants.find((t) => t.id === id)?.name ?? `#${id}`;
  const groupName = (id) => (id == null ? 'none' : groups.find((g) => g.id === id)?.name ?? `#${id}`);

  const pickTenant = (id) => {
    setTenantId(id);
    history.replaceState(null, '', `/admin/keys${id ? `?tenant_id=${id}` : ''}`);
  };

  const limits = (k) => {
    const parts = [];
    if (k.rpm != null) parts.push(`${num(k.rpm)} rpm`);
    if (k.tpm != null) parts.push(`${num(k.tpm)} tpm`);
    if (k.concurrency != null) parts.push(`${num(k.concurrency)} at once`);
    if (k.budget != null) parts.push(`${money(k.budget)} budget`);
    return parts.length ? parts.join(' · ') : <span class="muted">no limits</span>;
  };

  const columns = [
    { key: 'id', label: 'id', num: true },
    { key: 'name', label: 'name', render: (k) => k.name || <span class="muted">unnamed</span> },
    { key: 'prefix', label: 'key', render: (k) => <code>{k.prefix}…</code> },
    { key: 'tenant', label: 'tenant', render: (k) => tenantName(k.tenant_id) },
    {
      key: 'group',
      label: 'group',
      render: (k) =>
        k.group_id == null ? (
          <span class="muted" title="Served by the config's static upstream; Edit moves it to a group.">
            none
          </span>
        ) : (
          groupName(k.group_id)
        ),
    },
    {
      key: 'status',
      label: 'status',
      render: (k) => {
        const expired = k.expires_at && Date.parse(k.expires_at) < Date.now();
        return <Badge kind={k.status === 'active' && !expired ? 'ok' : 'bad'}>{expired && k.status === 'active' ? 'expired' : k.status}</Badge>;
      },
    },
    { key: 'limits', label: 'limits', render: limits },
    { key: 'spend', label: 'spend', num: true, render: (k) => money(k.spend) },
    { key: 'created_at', label: 'created', render: (k) => when(k.created_at) },
    {
      key: 'actions',
      label: '',
      render: (k) => (
        <div class="row-actions">
          <button type="button" class="small" onClick={() => setEditing(k)}>
            Edit
          </button>
          <button type="button" class="small" onClick={() => navigate(`usage?key_id=${k.id}`)}>
            Usage
          </button>
          <button type="button" class="small" onClick={() => setBudgetsOf(k)}>
            Budgets
          </button>
          {k.status === 'active' && (
            <button
              type="button"
              class="small danger"
              onClick={() =>
                setConfirm({
                  title: `Revoke key ${k.prefix}…?`,
                  text: 'Every gateway refuses it within a second (401). This cannot be undone: issue a new key instead.',
                  label: 'Revoke key',
                  run: () => api.patch(`/keys/${k.id}`, { status: 'revoked' }),
                })
              }
            >
              Revoke
            </button>
          )}
        </div>
      ),
    },
  ];

  return (
    <div>
      <PageHead title="Keys" sub="Virtual API keys: the one credential a client holds. Revoked keys are refused at once.">
        <button type="button" class="primary" disabled={!tenants.length} onClick={() => setCreating(true)}>
          New key
        </button>
      </PageHead>
      <div class="filters">
        <Field label="Tenant">
          <select value={tenantId} onChange={(e) => pickTenant(e.currentTarget.value)}>
            <option value="">all tenants</option>
            {tenants.map((t) => (
              <option key={t.id} value={String(t.id)}>
                {t.name}
              </option>
            ))}
          </select>
        </Field>
      </div>
      <ErrorBox error={refs.error || keys.error} onRetry={() => (refs.reload(), keys.reload())} />
      {!refs.loading && !tenants.length && !refs.error && (
        <Empty title="No tenants yet, so no keys.">
          A key belongs to a tenant: <a href="/admin/tenants" onClick={(e) => (e.preventDefault(), navigate('tenants'))}>create a tenant</a> first.
        </Empty>
      )}
      {keys.loading && !keys.data ? (
        <Spinner label="Loading keys…" />
      ) : (
        tenants.length > 0 && (
          <Table
            columns={columns}
            rows={keys.data || []}
            empty={
              !keys.error && (
                <Empty title={tenantId ? 'This tenant has no keys.' : 'No keys yet.'}>
                  Create one with <em>New key</em>; it is shown once, so have somewhere to paste it.
                </Empty>
              )
            }
          />
        )
      )}
      {creating && (
        <Modal title="New key" onClose={() => setCreating(false)} wide>
          {!groups.length && (
            <Notice kind="warn">
              There are no groups yet: a key without a group is served by the gateway's static upstream (config <code>upstream</code>),
              if any. Create a group and an account to route it to your providers.
            </Notice>
          )}
          <Form
            submitLabel="Create key"
            busyLabel="Creating…"
            onCancel={() => setCreating(false)}
            onSubmit={async (v) => {
              const body = {
                tenant_id: Number(v.tenant_id),
                name: v.name.trim(),
                group_id: v.group_id ? Number(v.group_id) : null,
                ...limitsBody(v),
              };
              const models = splitList(v.allowed_models);
              if (models.length) body.allowed_models = models;
              const expires = expiryValue(v);
              if (expires) body.expires_at = expires;
              const k = await api.post('/keys', body);
              setCreating(false);
              setCreated(k);
              keys.reload();
            }}
          >
            <Field label="Tenant">
              <Select
                name="tenant_id"
                initial={tenantId || String(tenants[0]?.id ?? '')}
                options={tenants.map((t) => [String(t.id), t.name])}
              />
            </Field>
            <Field label="Group" hint="Which models and accounts the key uses.">
              <Select
                name="group_id"
                initial={String(groups[0]?.id ?? '')}
                options={[['', 'no group (static upstream)'], ...groups.map((g) => [String(g.id), g.name])]}
              />
            </Field>
            <Field label="Name" hint="What it is for, e.g. the app that uses it.">
              <input name="name" placeholder="billing-service" />
            </Field>
            <Field label="Allowed models" hint="Comma-separated; blank: every model of the group.">
              <input name="allowed_models" placeholder="gpt-4o-mini, claude-sonnet" />
            </Field>
            <Field label="Expires" hint="blank: never">
              <input name="expires_at" type="datetime-local" />
            </Field>
            <LimitFields />
          </Form>
        </Modal>
      )}
      {created && <NewKey created={created} onClose={() => setCreated(null)} />}
      {editing && (
        <Modal title={`Edit key ${editing.prefix}…`} onClose={() => setEditing(null)} wide>
          <Form
            submitLabel="Save key"
            onCancel={() => setEditing(null)}
            onSubmit={async (v) => {
              const body = { name: v.name.trim() || undefined, group_id: v.group_id ? Number(v.group_id) : null, ...limitsBody(v) };
              const was = localInput(editing.expires_at);
              if (v.expires_at !== was) body.expires_at = expiryValue(v);
              await api.patch(`/keys/${editing.id}`, body);
              setEditing(null);
              keys.reload();
            }}
          >
            <Field label="Group" hint="Moves the key: its next request uses the new group's models and accounts.">
              <Select
                name="group_id"
                initial={editing.group_id == null ? '' : String(editing.group_id)}
                options={[['', 'no group (static upstream)'], ...groups.map((g) => [String(g.id), g.name])]}
              />
            </Field>
            <Field label="Name">
              <input name="name" defaultValue={editing.name ?? ''} />
            </Field>
            <Field label="Expires" hint="blank: never">
              <input name="expires_at" type="datetime-local" defaultValue={localInput(editing.expires_at)} />
            </Field>
            <LimitFields k={editing} />
          </Form>
        </Modal>
      )}
      {budgetsOf && <KeyBudgets k={budgetsOf} onClose={() => setBudgetsOf(null)} />}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel={confirm.label}
          danger
          onClose={() => setConfirm(null)}
          onConfirm={async () => {
            await confirm.run();
            keys.reload();
          }}
        >
          {confirm.text}
        </Confirm>
      )}
    </div>
  );
}
