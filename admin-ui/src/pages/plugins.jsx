// The plugin runtime: the generation serving, each plugin's version and hooks, the last
// reload's result, per-hook call and error counts, and the reload button; below them the
// policy workbench (workbench.jsx).
import { useState } from 'preact/hooks';

import { api } from '../api.js';
import { ActionButton, Badge, Empty, ErrorBox, Notice, PageHead, Spinner, useLoad } from '../components.jsx';
import { num, when } from '../format.js';
import { PolicyWorkbench } from './workbench.jsx';

export function Plugins() {
  const { data, error, loading, reload } = useLoad(() => api.get('/plugins'));
  const [result, setResult] = useState(null);
  const [reloadError, setReloadError] = useState(null);

  const doReload = async () => {
    setResult(null);
    setReloadError(null);
    try {
      const r = await api.post('/plugins/reload');
      setResult(r);
    } catch (e) {
      setReloadError(e);
    }
    await reload();
  };

  const st = data;
  const hooks = st?.hooks ? Object.entries(st.hooks) : [];
  const last = st?.last_reload;

  return (
    <div>
      <PageHead title="Plugins" sub="Lua policy plugins. A reload builds and checks a new generation; if it fails, the running one keeps serving.">
        <ActionButton class="primary" busyLabel="Reloading…" onClick={doReload} disabled={!st?.enabled}>
          Reload plugins
        </ActionButton>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {result && <Notice kind="ok">Reloaded: generation {result.generation} now serves.</Notice>}
      <ErrorBox error={reloadError} />
      {loading && !st ? (
        <Spinner label="Reading the plugin status…" />
      ) : st && !st.enabled ? (
        <Empty title="Plugins are not enabled on this gateway.">
          Add a <code>plugins</code> section to the config (see <code>plugins/README.md</code>) and restart the gateway.
        </Empty>
      ) : (
        st && (
          <>
            <div class="stats">
              <div class="stat card" data-testid="plugin-generation">
                <div class="stat-label">Generation</div>
                <div class="stat-value">{st.generation}</div>
                <div class="stat-sub">
                  workers: {(st.workers || []).map((w) => `#${w.worker} gen ${w.generation}`).join(', ') || '—'}
                </div>
              </div>
              <div class="stat card">
                <div class="stat-label">Reloads</div>
                <div class="stat-value">{num(st.reloads)}</div>
                <div class="stat-sub">{num(st.reload_failures)} refused</div>
              </div>
              <div class="stat card">
                <div class="stat-label">Last reload</div>
                <div class="stat-value">{last ? <Badge kind={last.ok ? 'ok' : 'bad'}>{last.ok ? 'ok' : 'failed'}</Badge> : '—'}</div>
                <div class="stat-sub">
                  {last?.at_ms ? `${when(last.at_ms)} (${last.trigger})` : 'none since start'}
                </div>
              </div>
              <div class="stat card">
                <div class="stat-label">Budget per hook</div>
                <div class="stat-value">{num(st.max_hook_ms)} ms</div>
                <div class="stat-sub">{st.max_instructions ? `${num(st.max_instructions)} instructions` : 'CPU time only (no instruction cap)'}</div>
              </div>
            </div>
            <PolicyWorkbench onChanged={reload} />
            {last && !last.ok && last.error && (
              <div class="error" role="alert" data-testid="last-reload-error">
                <strong>The last reload was refused</strong>; the generation before keeps serving. <pre class="mono">{last.error}</pre>
              </div>
            )}
            <section class="card">
              <h3>Loaded plugins</h3>
              {st.plugins?.length ? (
                <table class="compact">
                  <thead>
                    <tr>
                      <th>name</th>
                      <th>version</th>
                      <th class="num">priority</th>
                      <th>hooks</th>
                      <th>file</th>
                    </tr>
                  </thead>
                  <tbody>
                    {st.plugins.map((p) => (
                      <tr key={p.name}>
                        <td>
                          <strong>{p.name}</strong>
                        </td>
                        <td>{p.version || '—'}</td>
                        <td class="num">{p.priority}</td>
                        <td>{(p.hooks || []).join(', ')}</td>
                        <td>
                          <code class="clip" title={p.file}>
                            {p.file}
                          </code>
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              ) : (
                <Empty title="No plugin is loaded.">List plugins in the config's plugins section, then reload.</Empty>
              )}
            </section>
            <section class="card">
              <h3>Hooks since start</h3>
              <table class="compact" data-testid="hook-table">
                <thead>
                  <tr>
                    <th>hook</th>
                    <th class="num">calls</th>
                    <th class="num">errors</th>
                  </tr>
                </thead>
                <tbody>
                  {hooks.map(([h, c]) => (
                    <tr key={h}>
                      <td>{h}</td>
                      <td class="num">{num(c.calls)}</td>
                      <td class={`num ${c.errors > 0 ? 'bad' : ''}`}>{num(c.errors)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </section>
          </>
        )
      )}
    </div>
  );
}
