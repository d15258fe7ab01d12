/**
 * house.layers: the include rule of core/src/README.md holds. The rule is read from the
 * README's table (layer, may include), so the written rule is the checked one; every
 * `#include "..."` line of core/src/<layer>/ and core/include/tollgate/ is checked
 * against it. A second case plants violations in a copy of the tree and expects each
 * one reported, so the checker cannot pass by reading nothing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** The layers table and the header-only modules of <root>/core/src/README.md. */
function readRule(root) {
    const text = fs.readFileSync(path.join(root, 'core/src/README.md'), 'utf8');
    const layers = new Map();
    for (const line of text.split('\n')) {
        const m = /^\| `([a-z]+)` \|.*\| ((?:`[a-z]+` ?)+)\|$/.exec(line);
        if (m)
            layers.set(m[1], new Set([...m[2].matchAll(/`([a-z]+)`/g)].map((x) => x[1])));
    }
    const headerOnly = new Map();
    for (const m of text.matchAll(/`(tg_[a-z_]+\.h)` belongs to `([a-z]+)`/g))
        headerOnly.set(m[1], m[2]);
    return { layers, headerOnly };
}

/** Every rule violation under <root>, as "file:line: message" strings. */
export function check(root) {
    const { layers, headerOnly } = readRule(root);
    const problems = [];
    if (layers.size === 0)
        return ['core/src/README.md: no layer table found'];
    const src = path.join(root, 'core/src');
    const inc = path.join(root, 'core/include/tollgate');
    const moduleLayer = new Map(); // "tg_x" -> layer
    const files = []; // [relative path, layer, folder]
    for (const ent of fs.readdirSync(src, { withFileTypes: true })) {
        if (!ent.isDirectory()) {
            if (/\.[ch]$/.test(ent.name))
                problems.push(`core/src/${ent.name}: a source file outside a layer folder`);
            continue;
        }
        if (!layers.has(ent.name)) {
            problems.push(`core/src/${ent.name}/: a folder that is not a layer of core/src/README.md`);
            continue;
        }
        if (!fs.existsSync(path.join(src, ent.name, 'README.md')))
            problems.push(`core/src/${ent.name}/: no README.md saying what lives there and what it may use`);
        for (const f of fs.readdirSync(path.join(src, ent.name))) {
            if (!/\.[ch]$/.test(f))
                continue;
            files.push([`core/src/${ent.name}/${f}`, ent.name, ent.name]);
            if (f.endsWith('.c'))
                moduleLayer.set(f.slice(0, -2), ent.name);
        }
    }
    for (const l of layers.values())
        for (const x of l)
            if (!layers.has(x))
                problems.push(`core/src/README.md: "may include" names \`${x}\`, which is not a layer`);
    /* A public header belongs to the layer of its module: tg_x.h to tg_x.c, else to the
     * longest tg_x_*.c prefix match, else to the README's header-only list. */
    const headerLayer = (h) => {
        if (headerOnly.has(h))
            return headerOnly.get(h);
        const stem = h.slice(0, -2);
        if (moduleLayer.has(stem))
            return moduleLayer.get(stem);
        for (const [mod, layer] of moduleLayer)
            if (mod.startsWith(stem + '_'))
                return layer;
        return null;
    };
    for (const h of fs.readdirSync(inc)) {
        if (!h.endsWith('.h'))
            continue;
        const layer = headerLayer(h);
        if (!layer)
            problems.push(`core/include/tollgate/${h}: no module of core/src/<layer>/ owns this header`);
        else
            files.push([`core/include/tollgate/${h}`, layer, null]);
    }
    for (const [rel, layer, folder] of files) {
        const lines = fs.readFileSync(path.join(root, rel), 'utf8').split('\n');
        lines.forEach((line, i) => {
            const m = /^\s*#\s*include\s*([<"])([^>"]+)[>"]/.exec(line);
            if (!m)
                return;
            const where = `${rel}:${i + 1}`;
            const name = m[2];
            const pub = /^tollgate\/(tg_[a-z_0-9]+\.h)$/.exec(name);
            if (pub) {
                const to = headerLayer(pub[1]);
                if (!to)
                    problems.push(`${where}: includes ${name}, which no layer owns`);
                else if (!layers.get(layer).has(to))
                    problems.push(`${where}: ${layer} includes ${name} (layer ${to}); ${layer} may include ${[...layers.get(layer)].join(', ')}`);
                return;
            }
            if (m[1] === '<')
                return; /* system and third-party headers */
            if (/^tg_[a-z_0-9]+_internal\.h$/.test(name) && folder &&
                fs.existsSync(path.join(src, folder, name)))
                return;
            problems.push(`${where}: includes "${name}": only "tollgate/tg_<module>.h" or an internal header of its own folder`);
        });
    }
    return problems;
}

test('every #include under core/ follows the layer rule of core/src/README.md', () => {
    const problems = check(ROOT);
    assert.deepEqual(problems, [], '\n' + problems.join('\n'));
});

test('the checker reports a planted upward include, a foreign internal header, a stray folder and file, a missing README', () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-layers-'));
    try {
        fs.cpSync(path.join(ROOT, 'core/src'), path.join(tmp, 'core/src'), { recursive: true });
        fs.cpSync(path.join(ROOT, 'core/include'), path.join(tmp, 'core/include'), { recursive: true });
        const add = (rel, text) => fs.appendFileSync(path.join(tmp, rel), text);
        add('core/src/http/tg_server.c', '\n#include "tollgate/tg_admin.h"\n');
        add('core/src/domain/tg_state.c', '\n#include "tg_plugin_internal.h"\n');
        add('core/include/tollgate/tg_common.h', '\n#include "tollgate/tg_redis.h"\n');
        fs.mkdirSync(path.join(tmp, 'core/src/misc'));
        fs.rmSync(path.join(tmp, 'core/src/io/README.md'));
        fs.writeFileSync(path.join(tmp, 'core/src/tg_loose.c'), '');
        const problems = check(tmp).join('\n');
        assert.match(problems, /core\/src\/http\/tg_server\.c:\d+: http includes tollgate\/tg_admin\.h \(layer app\)/);
        assert.match(problems, /core\/src\/domain\/tg_state\.c:\d+: includes "tg_plugin_internal\.h"/);
        assert.match(problems, /core\/include\/tollgate\/tg_common\.h:\d+: base includes tollgate\/tg_redis\.h \(layer io\)/);
        assert.match(problems, /core\/src\/misc\/: a folder that is not a layer/);
        assert.match(problems, /core\/src\/tg_loose\.c: a source file outside a layer folder/);
        assert.match(problems, /core\/src\/io\/: no README\.md/);
    } finally {
        fs.rmSync(tmp, { recursive: true, force: true });
    }
});
