// Groups: the product boundary. The models offered, a price multiplier, plugin settings,
// and (from the accounts side) which upstream accounts serve it.
import { useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Confirm, Empty, ErrorBox, Field, Form, Modal, PageHead, Spinner, Table, useLoad } from '../components.jsx';
import { splitList, when } from '../format.js';
import { navigate } from '../router.js';

function GroupForm({ group, onDone, onCancel }) {
  return (
    <Form
      submitLabel={group ? 'Save group' : 'Create group'}
      busyLabel="Saving…"
      onCancel={onCancel}
      onSubmit={async (v) => {
        if (!v.name.trim()) throw { plain: 'Give the group a name.' };
        let plugins;
        try {
          plugins = v.plugins.trim() ? JSON.parse(v.plugins) : {};
        } catch (e) {
          throw { plain: `Plugin settings must be a JSON object: ${e.message}` };
        }
        if (typeof plugins !== 'object' || Array.isArray(plugins) || plugins === null) throw { plain: 'Plugin settings must be a JSON object, like {}.' };
        const body = { name: v.name.trim(), models: splitList(v.models), plugins };
        if (v.rate_multiplier.trim()) body.rate_multiplier = v.rate_multiplier.trim();
        if (group) await api.patch(`/groups/${group.id}`, body);
        else await api.post('/groups', body);
        onDone();
      }}
    >
      <Field label="Name">
        <input name="name" defaultValue={group?.name ?? ''} placeholder="standard" />
      </Field>
      <Field label="Models" hint="Comma-separated; blank: every model its accounts serve.">
        <input name="models" defaultValue={(group?.models || []).join(', ')} placeholder="gpt-4o-mini, gpt-4o" />
      </Field>
      <Field label="Rate multiplier" hint="Multiplies list prices for this group's keys; 1 is list price.">
        <input name="rate_multiplier" inputMode="decimal" defaultValue={group?.rate_multiplier ?? '1'} />
      </Field>
      <Field label="Plugin settings (JSON)" hint="Per-group plugin configuration, validated by the plugins' schemas." wide>
        <textarea name="plugins" rows={4} class="mono" defaultValue={JSON.stringify(group?.plugins ?? {}, null, 2)} />
      </Field>
    </Form>
  );
}

export function Groups() {
  const { data, error, loading, reload } = useLoad(async () => {
    const [groups, accounts] = await Promise.all([listAll('/groups'), listAll('/accounts')]);
    return { groups, accounts };
  });
  const [editing, setEditing] = useState(null); // null | 'new' | group
  const [confirm, setConfirm] = useState(null);
  const groups = data?.groups || [];
  const accounts = data?.accounts || [];

  const columns = [
    { key: 'id', label: 'id', num: true },
    { key: 'name', label: 'name', render: (g) => <strong>{g.name}</strong> },
    { key: 'models', label: 'models', render: (g) => (g.models?.length ? g.models.join(', ') : <span class="muted">any its accounts serve</span>) },
    { key: 'rate_multiplier', label: 'rate ×', num: true },
    {
      key: 'accounts',
      label: 'accounts',
      render: (g) => {
        const names = accounts.filter((a) => (a.groups || []).includes(g.id)).map((a) => a.name);
        return names.length ? names.join(', ') : <span class="bad">none: its keys get 503</span>;
      },
    },
    {
      key: 'plugins',
      label: 'plugin settings',
      render: (g) => (Object.keys(g.plugins || {}).length ? <code class="clip">{JSON.stringify(g.plugins)}</code> : <span class="muted">none</span>),
    },
    { key: 'created_at', label: 'created', render: (g) => when(g.created_at) },
    {
      key: 'actions',
      label: '',
      render: (g) => (
        <div class="row-actions">
          <button type="button" class="small" onClick={() => setEditing(g)}>
            Edit
          </button>
          <button
            type="button"
            class="small danger-text"
            onClick={() =>
              setConfirm({
                title: `Delete group ${g.name}?`,
                text: 'Its keys lose their group (they fall back to the static upstream, if any) and its accounts leave it.',
                run: () => api.del(`/groups/${g.id}`),
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
      <PageHead title="Groups" sub="What a key may use: models, price multiplier, plugin settings, and the accounts that serve it.">
        <button type="button" class="primary" onClick={() => setEditing('new')}>
          New group
        </button>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {loading && !data ? (
        <Spinner label="Loading groups…" />
      ) : (
        <Table
          columns={columns}
          rows={groups}
          empty={
            !error && (
              <Empty title="No groups yet.">
                Create a group, then add upstream accounts to it on the{' '}
                <a href="/admin/accounts" onClick={(e) => (e.preventDefault(), navigate('accounts'))}>
                  Accounts
                </a>{' '}
                page and give keys that group.
              </Empty>
            )
          }
        />
      )}
      {editing && (
        <Modal title={editing === 'new' ? 'New group' : `Edit ${editing.name}`} onClose={() => setEditing(null)} wide>
          <GroupForm
            group={editing === 'new' ? null : editing}
            onCancel={() => setEditing(null)}
            onDone={() => {
              setEditing(null);
              reload();
            }}
          />
        </Modal>
      )}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel="Delete"
          danger
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
