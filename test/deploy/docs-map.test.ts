// Issue 35, items 2 and 6: the docs describe the tree as it is. The README's "What is where" names every
// top-level folder of the repository and every folder under platform/, domain/, queue/, orchestration/ and services/ (and no folder that is
// gone); docs/glossary.md defines every capability, operation, state, role and execution mode the code declares,
// and the terms the docs use; a reference to a doc's section names a heading that exists. Each check is planted
// to fail in a temporary repository, then run on this one.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { KNOWN_CAPABILITIES, EXECUTION_MODES } from '../../platform/capabilities';
import { OPERATIONS } from '../../domain/operations';
import { STATES, DAEMON_STATUSES } from '../../domain/states';
import { PLAN_STATUSES, PLAN_VM_STATUSES } from '../../domain/plan-states';
import { ROLES } from '../../platform/auth';

const ROOT = path.resolve(__dirname, '../..');
/** The layers whose every folder, at any depth, the map describes. */
const LAYERS = ['platform', 'domain', 'queue', 'orchestration', 'services'];

/** Every folder holding a file git tracks, or would track (untracked and not ignored), relative to `root`. */
function gitFolders(root: string): string[] {
  const files = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: root, encoding: 'utf8' })
    .split('\0').filter(Boolean);
  const dirs = new Set<string>();
  for (const f of files) for (let d = path.posix.dirname(f); d !== '.'; d = path.posix.dirname(d)) dirs.add(d);
  return [...dirs].sort();
}

/** The folders the map must describe: the top level (no dot folders, no node_modules) and all under the layers. */
function foldersToDescribe(root: string): string[] {
  return gitFolders(root).filter((d) => {
    const top = d.split('/')[0];
    if (top.startsWith('.') || top === 'node_modules') return false;
    return !d.includes('/') || LAYERS.includes(top);
  });
}

/** The folders the README's "What is where" table names: each `code` span of a row's first cell, without a final /. */
function mapFolders(readme: string): string[] {
  const start = readme.indexOf('## What is where');
  if (start < 0) return [];
  const end = readme.indexOf('\n## ', start + 1);
  const rows = readme.slice(start, end < 0 ? undefined : end).split('\n').filter((l) => l.startsWith('| `'));
  return rows.flatMap((r) => [...r.split('|')[1].matchAll(/`([^`]+)`/g)].map((m) => m[1].replace(/\/$/, '')));
}

/** What is wrong with the map of the repository at `root`: folders it leaves out, and folders it names that are gone. */
function mapProblems(root: string): { undescribed: string[]; gone: string[] } {
  const named = mapFolders(readFileSync(path.join(root, 'README.md'), 'utf8'));
  const all = new Set(gitFolders(root));
  return { undescribed: foldersToDescribe(root).filter((d) => !named.includes(d)), gone: named.filter((d) => !all.has(d)) };
}

/** The names the code declares, each of which the glossary shows as `name`. */
function codeNames(): string[] {
  return [...KNOWN_CAPABILITIES, ...Object.keys(OPERATIONS), ...STATES, ...DAEMON_STATUSES, ...PLAN_STATUSES,
    ...PLAN_VM_STATUSES, ...ROLES, ...EXECUTION_MODES];
}
/** Terms the code and the docs use in prose, each of which the glossary defines in bold (**term**). */
const TERMS = ['seed', 'the two API dialects', 'the 8000 API', 'the 8080 API', 'shape A', 'shape B', 'JobSpec',
  'operation', 'capability', 'execution mode', 'requirement set', 'job states', 'daemon status', 'lease', 'claim',
  'bus', 'retention', 'sweep', 'leader', 'fence', 'outbox', 'ledger', 'rollback', 'source guard', 'source watch',
  'plan', 'plan status', 'plan VM status', 'selector', 'preflight', 'finding', 'override', 'placement', 'slots',
  'window', 'artifact manifest', 'pipeline', 'guest repair', 'appliance', 'overlay', 'firmware', 'virt_test', 'role',
  'caller', 'fixture', 'vcsim', 'tier', 'proof', 'source proof', 'layers'];

/** The names and terms the glossary text leaves out. */
function glossaryGaps(glossary: string, names = codeNames(), terms = TERMS): string[] {
  const bold = new Set([...glossary.matchAll(/\*\*([^*]+)\*\*/g)].map((m) => m[1].toLowerCase()));
  return [...new Set(names)].filter((n) => !glossary.includes('`' + n + '`')).concat(terms.filter((t) => !bold.has(t.toLowerCase())));
}

/** Section references such as (docs/testing.md, "Tiers and order") in the repository's text files whose
 *  document has no heading containing the quoted words. Line breaks in comments are joined first. */
function staleSectionRefs(root: string): string[] {
  const files = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8' }).split('\0')
    .filter((f) => /\.(ts|js|mjs|cjs|md|sh|lua|ya?ml|txt)$/.test(f) && !f.startsWith('node_modules/'));
  const headings = new Map<string, string[]>();
  const headingsOf = (doc: string) => {
    if (!headings.has(doc)) {
      let text = '';
      try { text = readFileSync(path.join(root, 'docs', `${doc}.md`), 'utf8'); } catch { /* a missing doc: no headings */ }
      headings.set(doc, text.split('\n').filter((l) => l.startsWith('#')).map((l) => l.replace(/^#+\s*/, '').toLowerCase()));
    }
    return headings.get(doc)!;
  };
  const stale: string[] = [];
  for (const f of files) {
    const text = readFileSync(path.join(root, f), 'utf8').replace(/\s*\n\s*(?:\/\/|\*|#|--)?\s*/g, ' ');
    for (const m of text.matchAll(/docs\/([\w-]+)\.md[,:]?\s*"([^"]+)"/g)) {
      if (!headingsOf(m[1]).some((h) => h.includes(m[2].toLowerCase()))) stale.push(`${f}: docs/${m[1]}.md "${m[2]}"`);
    }
  }
  return stale;
}

describe('the docs map the tree (README "What is where", docs/glossary.md)', function () {
  this.timeout(60_000);
  const roots: string[] = [];
  /** The planted repositories hold exactly the folders the README names, so these tests do not depend on the tree. */
  const mapped = mapFolders(readFileSync(path.join(ROOT, 'README.md'), 'utf8'));
  after(() => { for (const r of roots) rmSync(r, { recursive: true, force: true }); });

  /** A temporary git repository with this README and one file in each folder given. */
  function plant(folders: string[], readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8')): string {
    const root = mkdtempSync(path.join(os.tmpdir(), 'ferry-docs-map-'));
    roots.push(root);
    execFileSync('git', ['-c', 'init.defaultBranch=main', 'init', '-q'], { cwd: root });
    writeFileSync(path.join(root, 'README.md'), readme);
    for (const d of folders) {
      mkdirSync(path.join(root, d), { recursive: true });
      writeFileSync(path.join(root, d, 'x.ts'), '');
    }
    return root;
  }

  it('fails on an undocumented folder at the top level or under a layer, and ignores dot folders and ignored ones', () => {
    const root = plant([...mapped, 'planted', 'domain/planted-deep/inner', 'queue/planted', '.hidden', 'node_modules/x']);
    writeFileSync(path.join(root, '.gitignore'), 'ignored-out/\n');
    mkdirSync(path.join(root, 'ignored-out'));
    writeFileSync(path.join(root, 'ignored-out', 'x.ts'), '');
    expect(mapProblems(root)).to.deep.equal({
      undescribed: ['domain/planted-deep', 'domain/planted-deep/inner', 'planted', 'queue/planted'], gone: [],
    });
  });

  it('fails on a folder the map names that is not in the tree', () => {
    const root = plant(mapped.filter((d) => d !== 'services/cli'));
    expect(mapProblems(root)).to.deep.equal({ undescribed: [], gone: ['services/cli'] });
  });

  it('the repository: every top-level folder and every folder under platform/, domain/, queue/, orchestration/ and services/ is in the README map, and nothing else', () => {
    const tree = foldersToDescribe(ROOT);
    expect(tree, 'the tree as git sees it').to.include.members(['platform', 'domain', 'queue', 'services', 'docs', 'domain/plans', 'queue/commands']);
    expect(mapProblems(ROOT)).to.deep.equal({ undescribed: [], gone: [] });
  });

  it('the glossary check fails on a capability, an operation or a term it does not define', () => {
    const glossary = readFileSync(path.join(ROOT, 'docs/glossary.md'), 'utf8');
    const without = glossary.replaceAll('`lvm_tools`', 'lvm tools').replaceAll('`rollback_kvm`', 'rollback kvm').replaceAll('**fence**', 'fence');
    expect(glossaryGaps(without)).to.deep.equal(['lvm_tools', 'rollback_kvm', 'fence']);
  });

  it('docs/glossary.md defines every capability, operation, job and plan state, role and execution mode the code declares, and the terms the docs use', () => {
    expect(Object.keys(OPERATIONS), 'the operations are read from the code').to.include.members(['convert', 'migrate_vm']);
    expect(glossaryGaps(readFileSync(path.join(ROOT, 'docs/glossary.md'), 'utf8'))).to.deep.equal([]);
  });

  it('every reference to a section of a doc, such as (docs/testing.md, "Tiers and order"), names a heading that exists', () => {
    const root = plant(['docs'], '# A repository\n');
    writeFileSync(path.join(root, 'docs', 'a.md'), '# A\n\n## Tiers and order\n');
    const ref = (section: string) => `docs/a${'.md'} "${section}"`; // not written out, or this file would hold them
    writeFileSync(path.join(root, 'docs', 'x.ts'), `// see ${ref('Tiers and order')} and ${ref('Gone section')}\n`);
    execFileSync('git', ['add', '-A'], { cwd: root });
    expect(staleSectionRefs(root)).to.deep.equal([`docs/x.ts: ${ref('Gone section')}`]);
    expect(staleSectionRefs(ROOT)).to.deep.equal([]);
  });
});
