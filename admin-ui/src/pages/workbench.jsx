// The policy workbench, on the Plugins page: every plugin and policy with its source
// (shipped ones read-only), a policy written or edited here and validated as a reload
// would validate it (the refusal names the line), replayed against the gateway's capture
// (where it decides otherwise than the live policy did), then run in shadow for a group,
// promoted live for that group and then for every request, and rolled back to the
// generation before. Every change is a generation in Postgres that reaches every gateway
// of the fleet; the audit list says who did what, when, and which generation it made.
import { useEffect, useState } from 'preact/hooks';

import { api, request, setActor } from '../api.js';
import { ActionButton, Badge, Confirm, Empty, ErrorBox, Notice, Table, useLoad } from '../components.jsx';
import { num, when } from '../format.js';

const BLANK = (name) => `-- A policy: one file, its schema inline (plugins/README.md, "Writing a plugin").
return {
  name = "${name}", priority = 800, version = "0.1.0",
  schema = { fields = {} },
  -- select_account = function(ctx, conf)
  --   for i = 1, ctx:naccounts() do
  --     if ctx:account(i).region == "eu" then return ctx:select(i) end
  --   end
  -- end,
}
`;

/** Where a stored policy runs, in words. */
function deployedText(d, groupName) {
  if (!d) return '—';
  if (d.all) return 'live for every request';
  const parts = Object.entries(d.groups || {}).map(([id, g]) =>
    `${g.mode === 'shadow' ? 'shadow' : 'live'} in ${groupName(id)}${g.mode === 'shadow' && g.sample < 1 ? ` (${g.sample * 100}%)` : ''}`);
  return parts.length ? parts.join(', ') : 'stored, not running';
}

function ReplayResult({ r }) {
  const hooks = Object.entries(r.differences_by_hook || {}).filter(([, n]) => n > 0);
  return (
    <div data-testid="replay-result">
      <p>
        <strong>{num(r.compared)}</strong> captured requests replayed: <strong>{num(r.differ)}</strong> decided otherwise than live,{' '}
        {num(r.same)} the same{hooks.length ? ` (${hooks.map(([h, n]) => `${h} ${n}`).join(', ')})` : ''}.
        {r.plugin_errors > 0 && <Badge kind="bad"> {r.plugin_errors} errors</Badge>}
      </p>
      {r.diffs?.length > 0 && (
        <Table
          class="compact"
          rowKey={(d) => `${d.id}-${d.hook}-${d.attempt || 0}`}
          columns={[
            { key: 'id', label: 'request', render: (d) => <code>{d.id}</code> },
            { key: 'hook', label: 'hook' },
            { key: 'live', label: 'live' },
            { key: 'candidate', label: 'this policy' },
            { key: 'why', label: 'why', render: (d) => <span class="mono">{d.why || ''}</span> },
          ]}
          rows={r.diffs.slice(0, 50)}
        />
      )}
    </div>
  );
}

export function PolicyWorkbench({ onChanged }) {
  const list = useLoad(() => api.get('/policies'));
  const groups = useLoad(() => api.get('/groups?limit=500'));
  const audit = useLoad(() => api.get('/policy-audit?limit=50'));
  const [sel, setSel] = useState(null); // {name, isNew}
  const [doc, setDoc] = useState(null); // GET policies/{name}
  const [source, setSource] = useState('');
  const [config, setConfig] = useState('{}');
  const [newName, setNewName] = useState('');
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState(null);
  const [replay, setReplay] = useState(null);
  const [group, setGroup] = useState('');
  const [confirm, setConfirm] = useState(null); // 'all' | 'rollback'
  const [actor, setActorName] = useState(() => localStorage.getItem('tg-actor') || '');

  useEffect(() => setActor(actor), [actor]);
  const groupRows = groups.data?.data || [];
  const groupName = (id) => groupRows.find((g) => String(g.id) === String(id))?.name || `group ${id}`;
  useEffect(() => {
    if (!group && groupRows.length) setGroup(String(groupRows[0].id));
  }, [groupRows.length]);

  const open = async (name) => {
    setError(null);
    setNotice(null);
    setReplay(null);
    const d = await api.get(`/policies/${encodeURIComponent(name)}`);
    setSel({ name, isNew: false });
    setDoc(d);
    setSource(d.source);
    setConfig(JSON.stringify(d.config || {}, null, 2));
  };
  const startNew = () => {
    setError(null);
    setNotice(null);
    setReplay(null);
    setDoc(null);
    setSel({ name: '', isNew: true });
    setNewName('my-policy');
    setSource(BLANK('my-policy'));
    setConfig('{}');
  };
  const refresh = async (name) => {
    await Promise.all([list.reload(), audit.reload()]);
    if (name) await open(name);
    onChanged?.();
  };

  const name = sel?.isNew ? newName.trim() : sel?.name;
  const shipped = !!doc?.shipped;

  const save = async () => {
    setError(null);
    setNotice(null);
    let conf;
    try {
      conf = JSON.parse(config || '{}');
    } catch (e) {
      setError({ plain: `The config is not JSON: ${e.message}` });
      return;
    }
    try {
      const r = await request('PUT', `/policies/${encodeURIComponent(name)}`, { source, config: conf });
      setSel({ name: r.name, isNew: false });
      await refresh(r.name);
      setNotice(`Saved ${r.name} as generation ${r.generation} (${r.detail}); this gateway serves plugin generation ${r.serving_generation}.`);
    } catch (e) {
      setError(e);
    }
  };
  const act = async (path, body, what) => {
    setError(null);
    setNotice(null);
    try {
      const r = await api.post(`/policies/${encodeURIComponent(name)}/${path}`, body);
      await refresh(name);
      setNotice(`${what}: generation ${r.generation} — ${r.detail}.`);
    } catch (e) {
      setError(e);
      throw e;
    }
  };
  const doReplay = async () => {
    setError(null);
    setReplay(null);
    try {
      setReplay(await api.post(`/policies/${encodeURIComponent(name)}/replay`, {}));
    } catch (e) {
      setError(e);
    }
  };

  if (list.error?.code === 'workbench_off' || (list.data && !list.data.store)) {
    return (
      <section class="card workbench" aria-labelledby="wb-title">
        <h2 id="wb-title">Policy workbench</h2>
        <Empty title="The policy workbench is off on this gateway.">
          Set <code>plugins.store</code> (a folder the gateway owns) and <code>postgres</code> in the config, then restart: policies
          written here are stored in Postgres and reach every gateway.
        </Empty>
      </section>
    );
  }
  return (
    <section class="card workbench" aria-labelledby="wb-title">
      <h2 id="wb-title">Policy workbench</h2>
      <p class="sub">
        Write a policy, replay the captured traffic through it, run it in shadow for a group, then promote it. Every change is a
        generation every gateway loads; a policy that does not validate never goes live.
      </p>
      <ErrorBox error={list.error} onRetry={list.reload} />
      <div class="wb-bar">
        <label class="field">
          <span class="field-label">Your name, for the audit list</span>
          <input
            name="actor"
            value={actor}
            maxLength={64}
            onInput={(e) => {
              setActorName(e.currentTarget.value);
              localStorage.setItem('tg-actor', e.currentTarget.value);
            }}
          />
        </label>
        <button type="button" class="primary" onClick={startNew}>
          New policy
        </button>
      </div>
      <Table
        class="compact"
        rowKey={(p) => p.name}
        columns={[
          { key: 'name', label: 'name', render: (p) => <strong>{p.name}</strong> },
          {
            key: 'kind',
            label: 'kind',
            render: (p) => (p.shipped ? <Badge>shipped {p.kind}</Badge> : <Badge kind="ok">stored</Badge>),
          },
          { key: 'generation', label: 'generation', num: true, render: (p) => p.generation ?? '—' },
          {
            key: 'runs',
            label: 'runs',
            render: (p) => (p.shipped ? (p.enabled ? 'for every request (config file)' : 'where a group enables it') : deployedText(p.deployed, groupName)),
          },
          {
            key: 'actions',
            render: (p) => (
              <ActionButton onClick={() => open(p.name)} onError={setError} aria-label={`${p.shipped ? 'View' : 'Open'} ${p.name}`}>
                {p.shipped ? 'View' : 'Open'}
              </ActionButton>
            ),
          },
        ]}
        rows={list.data?.data || []}
        empty={<Empty title="No plugin or policy yet.">Write one with New policy.</Empty>}
      />

      {sel && (
        <div class="wb-editor" data-testid="policy-editor">
          <h3>
            {sel.isNew ? 'New policy' : sel.name}
            {doc?.generation && (
              <span data-testid="policy-generation">
                {' '}
                — generation {doc.generation}
              </span>
            )}
          </h3>
          {!sel.isNew && !shipped && (
            <p data-testid="policy-deployed">
              Runs: <strong>{deployedText(doc?.deployed, groupName)}</strong>
            </p>
          )}
          {shipped && <Notice>Shipped with the gateway ({doc.file}): read-only here. Upload your own policy under another name.</Notice>}
          {sel.isNew && (
            <label class="field">
              <span class="field-label">Name (a-z, 0-9, - and _; the source's name must match)</span>
              <input name="policy-name" value={newName} onInput={(e) => setNewName(e.currentTarget.value)} />
            </label>
          )}
          <label class="field wide">
            <span class="field-label">Source (Lua){shipped && doc?.schema_file ? ` — ${doc.file}` : ''}</span>
            <textarea
              name="source"
              class="mono"
              rows={16}
              spellcheck={false}
              readOnly={shipped}
              value={source}
              onInput={(e) => setSource(e.currentTarget.value)}
            />
          </label>
          {shipped && doc?.schema_source && (
            <label class="field wide">
              <span class="field-label">Schema — {doc.schema_file}</span>
              <textarea name="schema" class="mono" rows={8} readOnly value={doc.schema_source} />
            </label>
          )}
          {!shipped && (
            <label class="field wide">
              <span class="field-label">Config (JSON, checked against the schema)</span>
              <textarea name="config" class="mono" rows={3} spellcheck={false} value={config} onInput={(e) => setConfig(e.currentTarget.value)} />
            </label>
          )}
          <div data-testid="policy-error">
            <ErrorBox error={error} />
          </div>
          {notice && (
            <div data-testid="policy-notice">
              <Notice kind="ok">{notice}</Notice>
            </div>
          )}
          <div class="form-actions wb-actions">
            {!shipped && (
              <ActionButton class="primary" busyLabel="Validating…" onClick={save}>
                Validate and save
              </ActionButton>
            )}
            {!sel.isNew && (
              <ActionButton busyLabel="Replaying…" onClick={doReplay}>
                Replay the capture
              </ActionButton>
            )}
          </div>
          {!sel.isNew && !shipped && (
            <div class="form-actions wb-actions">
              <label class="field">
                <span class="field-label">Group</span>
                <select name="group" value={group} onChange={(e) => setGroup(e.currentTarget.value)}>
                  {groupRows.map((g) => (
                    <option key={g.id} value={String(g.id)}>
                      {g.name}
                    </option>
                  ))}
                </select>
              </label>
              <ActionButton onClick={() => act('shadow', { group_id: Number(group) }, 'In shadow').catch(() => {})} disabled={!group}>
                Shadow in group
              </ActionButton>
              <ActionButton onClick={() => act('promote', { group_id: Number(group) }, 'Promoted').catch(() => {})} disabled={!group}>
                Promote in group
              </ActionButton>
              <button type="button" onClick={() => setConfirm('all')}>
                Promote for all
              </button>
              <button type="button" class="danger" onClick={() => setConfirm('rollback')} disabled={!doc || doc.generation < 2}>
                Roll back
              </button>
            </div>
          )}
          {replay && <ReplayResult r={replay} />}
        </div>
      )}

      <h3>Audit</h3>
      <ErrorBox error={audit.error} onRetry={audit.reload} />
      <div data-testid="audit-table">
        <Table
          class="compact"
          columns={[
            { key: 'at', label: 'when', render: (a) => when(Date.parse(a.at)) },
            { key: 'actor', label: 'who' },
            { key: 'action', label: 'action' },
            { key: 'name', label: 'policy' },
            { key: 'generation', label: 'generation', num: true },
            { key: 'detail', label: 'what changed' },
          ]}
          rows={audit.data?.data || []}
          empty={<Empty title="No change yet.">Changes made here are listed with who made them.</Empty>}
        />
      </div>
      {confirm && (
        <Confirm
          title={confirm === 'all' ? `Promote ${name} for every request?` : `Roll back ${name}?`}
          confirmLabel={confirm === 'all' ? 'Promote for all' : 'Roll back'}
          danger={confirm === 'rollback'}
          onConfirm={() => (confirm === 'all' ? act('promote', {}, 'Live for every request') : act('rollback', {}, 'Rolled back'))}
          onClose={() => setConfirm(null)}
        >
          {confirm === 'all'
            ? 'It will decide for every request on every gateway, beside the config file\u2019s plugins.'
            : `Generation ${doc ? doc.generation - 1 : ''}'s source, config and groups come back, on every gateway.`}
        </Confirm>
      )}
    </section>
  );
}
