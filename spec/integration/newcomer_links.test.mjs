// newcomer: every relative link of the repository's Markdown files leads somewhere
// (issue #23). The README is the front door and the deep material lives next to its code
// (core/, sql/, plugins/, admin-ui/, spec/, examples/), so a reader follows links from
// file to file: each [text](target) and ![alt](target) whose target is a path must name a
// file or folder of the checkout, and a #fragment must be a heading of the file it points
// into (GitHub's anchors: lowercase, punctuation dropped, spaces as hyphens, a repeated
// heading numbered -1, -2, ...). The README's front door keeps its shape: the two
// commands, the five-minute tour, and a map of where to read next.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { REPO } from './lib/harness.mjs';

/** The Markdown files of the checkout (git's list; without git, a walk that skips build output). */
function markdownFiles() {
  try {
    return execFileSync('git', ['-C', REPO, 'ls-files', '--cached', '--others', '--exclude-standard', '*.md'], { encoding: 'utf8' })
      .split('\n')
      .filter((f) => f && fs.existsSync(path.join(REPO, f)));
  } catch {
    const out = [];
    const walk = (d) => {
      for (const e of fs.readdirSync(path.join(REPO, d), { withFileTypes: true })) {
        if (/^(\.git|node_modules|var)$|^build/.test(e.name)) continue;
        const rel = path.join(d, e.name);
        if (e.isDirectory()) walk(rel);
        else if (e.name.endsWith('.md')) out.push(rel);
      }
    };
    walk('');
    return out;
  }
}

/** GitHub's anchor of each heading of a Markdown text (outside code blocks). */
export function anchors(text) {
  const seen = new Map();
  const out = new Set();
  let code = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) code = !code;
    if (code) continue;
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = m[1]
      .toLowerCase()
      .replace(/<[^>]+>/g, '')
      .replace(/[^\p{L}\p{N}_\- ]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) || 0;
    seen.set(base, n + 1);
    out.add(n ? `${base}-${n}` : base);
  }
  return out;
}

/** The relative links of a Markdown text: [{target, line}] (code spans and blocks skipped). */
export function links(text) {
  const out = [];
  let code = false;
  text.split('\n').forEach((line, i) => {
    if (/^\s*(```|~~~)/.test(line)) code = !code;
    if (code) return;
    const bare = line.replace(/`[^`]*`/g, '');
    for (const m of bare.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, mailto:, ...
      out.push({ target, line: i + 1 });
    }
  });
  return out;
}

function brokenLinks(root, files) {
  const problems = [];
  const cache = new Map();
  const anchorsOf = (f) => {
    if (!cache.has(f)) cache.set(f, anchors(fs.readFileSync(f, 'utf8')));
    return cache.get(f);
  };
  for (const file of files) {
    const abs = path.join(root, file);
    for (const { target, line } of links(fs.readFileSync(abs, 'utf8'))) {
      const [p, frag] = target.split('#');
      const dest = p ? path.resolve(path.dirname(abs), decodeURIComponent(p)) : abs;
      if (!dest.startsWith(root + path.sep) && dest !== root) {
        problems.push(`${file}:${line}: ${target} leaves the repository`);
        continue;
      }
      if (!fs.existsSync(dest)) {
        problems.push(`${file}:${line}: ${target}: no such file`);
        continue;
      }
      if (frag && dest.endsWith('.md') && !anchorsOf(dest).has(frag.toLowerCase())) {
        problems.push(`${file}:${line}: ${target}: no heading with that anchor in ${path.relative(root, dest)}`);
      }
    }
  }
  return problems;
}

test('every relative link in the Markdown files leads to a file, and every #anchor to a heading', () => {
  const files = markdownFiles();
  assert.ok(files.includes('README.md') && files.length > 10, files.join(' '));
  const n = files.reduce((a, f) => a + links(fs.readFileSync(path.join(REPO, f), 'utf8')).length, 0);
  assert.ok(n > 30, `only ${n} links found: the extraction is broken`);
  assert.deepEqual(brokenLinks(REPO, files), []);
});

test('the checker catches a missing file, a wrong anchor and a link out of the repository', () => {
  const tmp = fs.mkdtempSync(path.join(REPO, '.links-test-'));
  try {
    fs.mkdirSync(path.join(tmp, 'sub'));
    fs.writeFileSync(path.join(tmp, 'sub', 'b.md'), '# B\n\n## Two words — and more\n\n## Same\n\n## Same\n');
    fs.writeFileSync(path.join(tmp, 'a.md'), [
      '[ok](sub/b.md) [ok](sub/b.md#two-words--and-more) [ok](sub/b.md#same-1) [ok](#top) [web](https://example.com)',
      '`[not a link](nowhere.md)`',
      '```', '[in code](nowhere.md)', '```',
      '# Top',
      '[gone](sub/c.md) [bad anchor](sub/b.md#three) ![img](sub/x.png) [out](../../../etc/passwd)',
    ].join('\n'));
    const rel = path.relative(REPO, tmp);
    const problems = brokenLinks(REPO, [path.join(rel, 'a.md')]).map((p) => p.replace(`${rel}/`, ''));
    assert.deepEqual(problems, [
      'a.md:7: sub/c.md: no such file',
      'a.md:7: sub/b.md#three: no heading with that anchor in ' + path.join(rel, 'sub/b.md'),
      'a.md:7: sub/x.png: no such file',
      'a.md:7: ../../../etc/passwd leaves the repository',
    ]);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test('the README is the front door: what and why with figures, the two commands, a five-minute tour, where to read next', () => {
  const readme = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
  const h2 = [...readme.matchAll(/^## (.*)$/gm)].map((m) => m[1]);
  assert.deepEqual(h2, ['The two commands', 'A five-minute tour', 'Where to read next']);
  assert.match(readme, /\]\(spec\/bench\/RESULTS\.md\)/, 'the figures link their results');
  for (const step of ['A request', 'The console', 'A limit refusing', 'A balance running out', 'A plugin reloaded']) {
    assert.match(readme, new RegExp(`\\*\\*\\d\\. ${step}\\.\\*\\*`), step);
  }
  for (const f of ['core/README.md', 'sql/README.md', 'plugins/README.md', 'spec/README.md', 'examples/README.md', 'admin-ui/README.md']) {
    assert.match(readme, new RegExp(`\\]\\(${f.replace('.', '\\.')}\\)`), `the map links ${f}`);
  }
  assert.ok(readme.split('\n').length < 250, 'the front door stays short');
});
