// Periodic budgets (#24): spend limits per day, week, month or N hours of a key, a user
// (every key of that user) or a tenant, with this period's spend, what remains and when
// it resets; create, change, delete; a budget's last periods and its alerts (threshold,
// time, delivery). The gateway checks every value and its 400 is shown at the field.
import { useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Badge, Confirm, Empty, ErrorBox, Field, Form, Modal, PageHead, Select, Spinner, Table, useLoad } from '../components.jsx';
import { ago, money, num, optDecimal, optInt, splitList, when } from '../format.js';
import { navigate, queryParams } from '../router.js';

/** key, user or tenant: whose spend the budget counts. */
export function budgetScope(b) {
  if (b.scope) return b.scope;
  if (b.api_key_id != null) return 'key';
  if (b.user_id != null) return 'user';
  return 'tenant';
}

/** "day (Europe/Berlin)", "every 6 h". */
export function periodText(b) {
  if (b.period === 'hours') return `every ${num(b.period_hours)} h`;
  return b.timezone && b.timezone !== 'UTC' ? `${b.period} (${b.timezone})` : `${b.period} (UTC)`;
}

/** This period's spend, with its share of the amount. */
export function SpendCell({ b }) {
  const c = b.current;
  if (!c) return <span class="muted">—</span>;
  const share = Number(b.amount) > 0 ? Number(c.spend) / Number(b.amount) : 0;
  return (
    <span>
      {money(c.spend)}{' '}
      <span class="muted">({num(share * 100, 1)}%)</span>
    </span>
  );
}

export function RemainingCell({ b }) {
  const c = b.current;
  if (!c) return <span class="muted">—</span>;
  return Number(c.remaining) <= 0 ? <Badge kind="bad">{money(c.remaining)} · spent</Badge> : money(c.remaining);
}

export function ResetCell({ b }) {
  const at = b.current?.resets_at;
  if (!at) return <span class="muted">—</span>;
  return <span title={when(at)}>{when(at)} <span class="muted">({ago(at)})</span></span>;
}

/** The highest threshold reached this period (its alert's delivery on hover), or none. */
export function AlertsCell({ b }) {
  const now = (b.alerts || []).filter((a) => b.current && Date.parse(a.period_start) === Date.parse(b.current.start));
  if (!b.alerts || !b.current) return <span class="muted">—</span>;
  if (!now.length) return <span class="muted">none</span>;
  const top = now.reduce((x, y) => (y.threshold > x.threshold ? y : x));
  const failed = now.some((a) => a.state === 'failed');
  return (
    <Badge kind={top.threshold >= 100 ? 'bad' : 'warn'} title={now.map((a) => `${a.threshold}%: ${a.state.replace('_', ' ')}`).join(', ')}>
      {top.threshold}% reached{failed ? ' · delivery failed' : ''}
    </Badge>
  );
}

/** The fields both forms send: amount, period, hours, zone, thresholds, webhook. Values
 *  the gateway must judge are sent as typed, so its message is the one shown. */
function budgetBody(v, { create }) {
  // Blank thresholds: the default on create, unchanged on edit.
  const body = {
    name: v.name.trim(),
    amount: optDecimal(v.amount) ?? '',
    period: v.period,
    period_hours: v.period === 'hours' ? optInt(v.period_hours) : null,
  };
  if (v.period !== 'hours') body.timezone = v.timezone.trim();
  const th = splitList(v.thresholds);
  if (th.length) body.thresholds = th.map((t) => (/^-?\d+(\.\d+)?$/.test(t) ? Number(t) : t));
  const url = v.webhook_url.trim();
  if (url || !create) body.webhook_url = url || null;
  if (v.webhook_secret) body.webhook_secret = v.webhook_secret;
  else if (v.remove_secret === true) body.webhook_secret = null;
  return body;
}

function BudgetFields({ b = {}, edit }) {
  const [period, setPeriod] = useState(b.period || 'month');
  // Keyed fields: switching the period gives a fresh input (Preact would reuse the
  // element, and the hours typed would become the time zone).
  return (
    <>
      <Field label="Name" hint="Unique, e.g. team-a-monthly.">
        <input name="name" defaultValue={b.name ?? ''} placeholder="team-a-monthly" />
      </Field>
      <Field label="Amount (USD per period)">
        <input name="amount" inputMode="decimal" defaultValue={b.amount ?? ''} placeholder="500" />
      </Field>
      <Field label="Period" hint="Calendar day, ISO week (from Monday) or month in the time zone, or windows of N hours.">
        <select name="period" value={period} onChange={(e) => setPeriod(e.currentTarget.value)}>
          <option value="day">day</option>
          <option value="week">week</option>
          <option value="month">month</option>
          <option value="hours">every N hours</option>
        </select>
      </Field>
      {period === 'hours' ? (
        <Field key="hours" label="Hours per window" hint="1 to 8784, counted from the budget's creation.">
          <input name="period_hours" inputMode="numeric" defaultValue={b.period_hours ?? ''} placeholder="6" />
        </Field>
      ) : (
        <Field key="timezone" label="Time zone" hint="An IANA zone, e.g. Europe/Berlin; the period starts at its midnight.">
          <input name="timezone" defaultValue={b.timezone ?? 'UTC'} />
        </Field>
      )}
      <Field label="Alert thresholds (%)" hint="Comma-separated, 1 to 100; each fires once per period. Blank: 50, 80, 100.">
        <input name="thresholds" defaultValue={(b.thresholds || []).join(', ')} placeholder="50, 80, 100" />
      </Field>
      <Field label="Alert webhook URL" hint="http or https; blank: alerts are only shown here.">
        <input name="webhook_url" defaultValue={b.webhook_url ?? ''} placeholder="https://hooks.example.com/tollgate" />
      </Field>
      <Field label="Webhook secret" hint={edit && b.has_webhook_secret ? 'Set; blank keeps it.' : 'Signs alerts (HMAC-SHA256, X-Tollgate-Signature); blank: unsigned.'}>
        <input name="webhook_secret" type="password" autocomplete="new-password" />
      </Field>
      {edit && b.has_webhook_secret && (
        <label class="check">
          <input type="checkbox" name="remove_secret" /> Remove the secret (alerts unsigned)
        </label>
      )}
    </>
  );
}

function ScopeFields({ tenants, keys, users, initial }) {
  const [scope, setScope] = useState(initial.scope || 'tenant');
  const keyLabel = (k) => `${k.prefix}… ${k.name || 'unnamed'} (${tenants.find((t) => t.id === k.tenant_id)?.name ?? `#${k.tenant_id}`})`;
  return (
    <>
      <Field label="Applies to" hint="A key, every key of a user, or every key of a tenant.">
        <select name="scope" value={scope} onChange={(e) => setScope(e.currentTarget.value)}>
          <option value="tenant">a tenant</option>
          <option value="key">a key</option>
          <option value="user">a user</option>
        </select>
      </Field>
      {scope === 'tenant' && (
        <Field label="Tenant">
          <Select name="tenant_id" initial={initial.tenant_id || String(tenants[0]?.id ?? '')} options={tenants.map((t) => [String(t.id), t.name])} />
        </Field>
      )}
      {scope === 'key' && (
        <Field label="Key">
          <Select name="api_key_id" initial={initial.api_key_id || String(keys[0]?.id ?? '')} options={keys.map((k) => [String(k.id), keyLabel(k)])} />
        </Field>
      )}
      {scope === 'user' && (
        <Field label="User">
          <Select name="user_id" initial={String(users[0]?.id ?? '')} options={users.map((u) => [String(u.id), u.email || u.name || `#${u.id}`])} />
        </Field>
      )}
    </>
  );
}

/** A budget's last periods and alerts. */
export function BudgetDetail({ id, onClose, onEdit }) {
  const b = useLoad(() => api.get(`/budgets/${id}`), [id]);
  const d = b.data;
  const state = (a) => {
    const kinds = { delivered: 'ok', failed: 'bad', pending: 'warn', no_webhook: 'neutral' };
    const words = { delivered: 'delivered', failed: 'failed', pending: 'pending', no_webhook: 'no webhook' };
    return (
      <Badge kind={kinds[a.state] || 'neutral'} title={a.last_error || undefined}>
        {words[a.state] || a.state}
      </Badge>
    );
  };
  return (
    <Modal title={d ? `Budget ${d.name}` : 'Budget'} onClose={onClose} wide>
      <ErrorBox error={b.error} onRetry={b.reload} />
      {!d ? (
        !b.error && <Spinner label="Loading the budget…" />
      ) : (
        <div data-testid="budget-detail">
          <dl class="kv">
            <dt>Applies to</dt>
            <dd>{budgetScope(d)}{d.api_key_id != null ? ` #${d.api_key_id}` : d.user_id != null ? ` #${d.user_id}` : ` #${d.tenant_id}`}</dd>
            <dt>Amount</dt>
            <dd>{money(d.amount)} per {periodText(d)}</dd>
            <dt>This period</dt>
            <dd>
              {d.current ? (
                <>
                  {when(d.current.start)} – {when(d.current.end)}: spent <SpendCell b={d} />, remaining <RemainingCell b={d} />
                </>
              ) : (
                '—'
              )}
            </dd>
            <dt>Resets</dt>
            <dd><ResetCell b={d} /></dd>
            <dt>Alerts at</dt>
            <dd>{(d.thresholds || []).map((t) => `${t}%`).join(', ')} {d.webhook_url ? <>to <code>{d.webhook_url}</code>{d.has_webhook_secret ? ' (signed)' : ' (unsigned)'}</> : <span class="muted">(no webhook)</span>}</dd>
          </dl>
          <h3>Last periods</h3>
          <Table
            rowKey={(p) => p.start}
            sticky="start"
            columns={[
              { key: 'start', label: 'period start', render: (p) => when(p.start) },
              { key: 'spend', label: 'spend', num: true, render: (p) => money(p.spend) },
            ]}
            rows={d.periods || []}
            empty={<p class="muted">No spend recorded yet.</p>}
          />
          <h3>Alerts</h3>
          <Table
            rowKey={(a) => `${a.period_start}-${a.threshold}`}
            sticky="threshold"
            columns={[
              { key: 'threshold', label: 'threshold', num: true, render: (a) => `${a.threshold}%` },
              { key: 'raised_at', label: 'raised', render: (a) => when(a.raised_at) },
              { key: 'spend', label: 'spend then', num: true, render: (a) => money(a.spend) },
              { key: 'state', label: 'delivery', render: state },
              { key: 'attempts', label: 'attempts', num: true, render: (a) => num(a.attempts) },
              { key: 'delivered_at', label: 'delivered', render: (a) => (a.delivered_at ? when(a.delivered_at) : a.last_error ? <span class="muted">{a.last_error}</span> : '—') },
            ]}
            rows={d.alerts || []}
            empty={<p class="muted">No alert in the recent periods: none of the thresholds was reached.</p>}
          />
          <div class="form-actions">
            {onEdit && (
              <button type="button" class="primary" onClick={() => onEdit(d)}>
                Edit
              </button>
            )}
            <button type="button" onClick={onClose}>
              Close
            </button>
          </div>
        </div>
      )}
    </Modal>
  );
}

export function Budgets() {
  const q = queryParams();
  const refs = useLoad(async () => {
    const [tenants, keys, users] = await Promise.all([listAll('/tenants'), listAll('/keys'), listAll('/users').catch(() => [])]);
    return { tenants, keys, users };
  });
  const list = useLoad(() => listAll('/budgets'));
  const [creating, setCreating] = useState(false);
  const [editing, setEditing] = useState(null);
  const [showing, setShowing] = useState(q.id ? Number(q.id) : null);
  const [confirm, setConfirm] = useState(null);

  const tenants = refs.data?.tenants || [];
  const keys = refs.data?.keys || [];
  const users = refs.data?.users || [];
  const tenantName = (id) => tenants.find((t) => t.id === id)?.name ?? `#${id}`;
  const whose = (b) => {
    const s = budgetScope(b);
    if (s === 'key') {
      const k = keys.find((x) => x.id === b.api_key_id);
      return k ? `key ${k.prefix}… ${k.name || ''}`.trim() : `key #${b.api_key_id}`;
    }
    if (s === 'user') {
      const u = users.find((x) => x.id === b.user_id);
      return `user ${u?.email || u?.name || `#${b.user_id}`}`;
    }
    return `tenant ${tenantName(b.tenant_id)}`;
  };
  const show = (id) => {
    setShowing(id);
    history.replaceState(null, '', `/admin/budgets${id ? `?id=${id}` : ''}`);
  };

  const columns = [
    { key: 'id', label: 'id', num: true },
    {
      key: 'name',
      label: 'name',
      render: (b) => (
        <button type="button" class="link" onClick={() => show(b.id)}>
          {b.name}
        </button>
      ),
    },
    { key: 'scope', label: 'applies to', render: (b) => <span><Badge>{budgetScope(b)}</Badge> {whose(b)}</span> },
    { key: 'period', label: 'period', render: periodText },
    { key: 'amount', label: 'amount', num: true, render: (b) => money(b.amount) },
    { key: 'spend', label: 'spend this period', num: true, render: (b) => <SpendCell b={b} /> },
    { key: 'remaining', label: 'remaining', num: true, render: (b) => <RemainingCell b={b} /> },
    { key: 'resets', label: 'resets', render: (b) => <ResetCell b={b} /> },
    { key: 'alerts', label: 'alerts this period', render: (b) => <AlertsCell b={b} /> },
    {
      key: 'actions',
      label: '',
      render: (b) => (
        <div class="row-actions">
          <button type="button" class="small" onClick={() => setEditing(b)}>
            Edit
          </button>
          <button
            type="button"
            class="small danger"
            onClick={() =>
              setConfirm({
                title: `Delete budget ${b.name}?`,
                text: 'Its keys are no longer held to it from their next request. The spend recorded for its periods stays in the database.',
                run: () => api.del(`/budgets/${b.id}`),
              })
            }
          >
            Delete
          </button>
        </div>
      ),
    },
  ];

  return (
    <div>
      <PageHead title="Budgets" sub="Spend limits per period for keys, users and tenants: a request is admitted only if it fits every one that applies.">
        <button type="button" class="primary" disabled={!tenants.length} onClick={() => setCreating(true)}>
          New budget
        </button>
      </PageHead>
      <ErrorBox error={refs.error || list.error} onRetry={() => (refs.reload(), list.reload())} />
      {!refs.loading && !tenants.length && !refs.error && (
        <Empty title="No tenants yet, so no budgets.">
          A budget belongs to a tenant: <a href="/admin/tenants" onClick={(e) => (e.preventDefault(), navigate('tenants'))}>create a tenant</a> first.
        </Empty>
      )}
      {list.loading && !list.data ? (
        <Spinner label="Loading budgets…" />
      ) : (
        tenants.length > 0 && (
          <Table
            columns={columns}
            rows={list.data || []}
            empty={
              !list.error && (
                <Empty title="No budgets yet.">
                  Create one with <em>New budget</em>, e.g. $500 a month for a tenant or $20 a day for a key.
                </Empty>
              )
            }
          />
        )
      )}
      {creating && (
        <Modal title="New budget" onClose={() => setCreating(false)} wide>
          <Form
            submitLabel="Create budget"
            busyLabel="Creating…"
            onCancel={() => setCreating(false)}
            onSubmit={async (v) => {
              const body = budgetBody(v, { create: true });
              if (v.scope === 'key') body.api_key_id = Number(v.api_key_id);
              else if (v.scope === 'user') body.user_id = Number(v.user_id);
              else body.tenant_id = Number(v.tenant_id);
              await api.post('/budgets', body);
              setCreating(false);
              list.reload();
            }}
          >
            <ScopeFields tenants={tenants} keys={keys} users={users} initial={{ scope: q.key_id ? 'key' : 'tenant', api_key_id: q.key_id }} />
            <BudgetFields />
          </Form>
        </Modal>
      )}
      {editing && (
        <Modal title={`Edit budget ${editing.name}`} onClose={() => setEditing(null)} wide>
          <Form
            submitLabel="Save budget"
            onCancel={() => setEditing(null)}
            onSubmit={async (v) => {
              await api.patch(`/budgets/${editing.id}`, budgetBody(v, { create: false }));
              setEditing(null);
              list.reload();
            }}
          >
            <p class="hint">Applies to {whose(editing)} (fixed: create another budget for someone else).</p>
            <BudgetFields b={editing} edit />
          </Form>
        </Modal>
      )}
      {showing && !editing && (
        <BudgetDetail
          id={showing}
          onClose={() => show(null)}
          onEdit={(b) => {
            show(null);
            setEditing(b);
          }}
        />
      )}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel="Delete budget"
          danger
          onClose={() => setConfirm(null)}
          onConfirm={async () => {
            await confirm.run();
            list.reload();
          }}
        >
          {confirm.text}
        </Confirm>
      )}
    </div>
  );
}
