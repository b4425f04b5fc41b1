// What a browser fetches to show one of the dashboard's pages, read from the files themselves: the page names its
// stylesheets, scripts and module preloads; each module names its imports. The dashboard test checks the preloads
// against the imports, and scripts/bench/fleet-probe.ts loads the page in the same rounds a browser does.

/** The same-origin files a page names in its `<link href>` and `<script src>` tags, in order. */
export function pageAssets(html: string): { styles: string[]; scripts: string[]; modules: string[]; preloads: string[] } {
  const attr = (tag: string, name: string) => new RegExp(`\\s${name}="([^"]*)"`).exec(tag)?.[1];
  const out = { styles: [] as string[], scripts: [] as string[], modules: [] as string[], preloads: [] as string[] };
  for (const [tag] of html.matchAll(/<(?:link|script)\b[^>]*>/g)) {
    const href = attr(tag, 'href') ?? attr(tag, 'src');
    if (!href || /^[a-z]+:/i.test(href)) continue;
    if (tag.startsWith('<script')) (attr(tag, 'type') === 'module' ? out.modules : out.scripts).push(href);
    else if (attr(tag, 'rel') === 'stylesheet') out.styles.push(href);
    else if (attr(tag, 'rel') === 'modulepreload') out.preloads.push(href);
  }
  return out;
}

/** The relative modules a module imports statically (`import ... from './x.js'`, `import './x.js'`), as paths
 *  relative to the page's folder (the dashboard's modules all sit beside the page). */
export function moduleImports(js: string): string[] {
  return [...js.matchAll(/^\s*import\s+(?:[^'";]*?\s+from\s+)?['"](\.\/[^'"]+)['"]/gm)].map((m) => m[1].slice(2));
}

/** Every module `entries` reach through their static imports, entries excluded; `read` gives a module's text. */
export async function importClosure(entries: string[], read: (file: string) => Promise<string>): Promise<string[]> {
  const seen = new Set(entries);
  const found: string[] = [];
  for (let level = entries; level.length;) {
    const next: string[] = [];
    for (const text of await Promise.all(level.map(read))) {
      for (const m of moduleImports(text)) if (!seen.has(m)) { seen.add(m); found.push(m); next.push(m); }
    }
    level = next;
  }
  return found;
}
