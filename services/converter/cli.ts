// ferry-convert --config file.yaml | --manifest file.json [--output-dir DIR]
// Modes: local, fetch-and-fix (disk fetched over SSH first), manager_export (VM exported from vSphere first);
// batch files.
// Exit codes: 0 all migrations succeeded; 1 a migration failed; 2 bad usage, configuration or manifest;
// 3 the requested mode is not available in this build. See docs/pipeline.md for precedence rules.
import { linearRegExp } from '../../platform/linear-regex';
import { promises as fs, appendFileSync, readFileSync } from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import { inspectImage } from '../../domain/image-format';
import { imageInfo } from '../../domain/qemu';
import { ConfigError, ConverterConfig, MigrationEntry, MigrationSettings, validateBatch, validateConfig } from '../../domain/schemas/converter-config';
import { Manifest, ManifestError, validateManifest } from '../../domain/schemas/manifest';
import { runPipeline, StageName } from '../../domain/converter/pipeline';
import { explainSteps, FAMILIES } from '../../domain/converter/families';
import type { PipelineReport } from '../../domain/converter/stages/report';
import { errorText } from '../../platform/errors';
import { fetchRemote } from './fetch';
import { exportForConvert, withExport } from './manager-export';
import { logoutAll } from '../../domain/vsphere/client';

export const EXIT = { ok: 0, failed: 1, usage: 2, unavailable: 3 } as const;

const FORMAT_BY_EXT: Record<string, string> = {
  '.vmdk': 'vmdk', '.qcow2': 'qcow2', '.raw': 'raw', '.img': 'raw', '.vhd': 'vhd', '.vhdx': 'vhdx', '.vdi': 'vdi',
};
const VERBOSE: Record<string, number> = { DEBUG: 3, INFO: 1, WARNING: 1, ERROR: 0 };


interface Out { line(s: string): void; progress(label: string, pct: number, msg: string): void; done(): void }

/** A live bar on a terminal, plain lines (stage changes and every 10%) otherwise. */
function output(stream: NodeJS.WriteStream, logFile?: string): Out {
  const tty = !!stream.isTTY;
  let last = '';
  let barShown = false;
  const file = (s: string) => { if (logFile) appendFileSync(logFile, `${new Date().toISOString()} ${s}\n`); };
  return {
    line(s) { if (barShown) { stream.write('\r\x1b[K'); barShown = false; } stream.write(s + '\n'); file(s); },
    progress(label, pct, msg) {
      if (tty) {
        const w = 30;
        const n = Math.round((pct / 100) * w);
        stream.write(`\r\x1b[K${label} [${'#'.repeat(n)}${'.'.repeat(w - n)}] ${String(pct).padStart(3)}% ${msg.slice(0, 50)}`);
        barShown = true;
      } else {
        const key = `${label} ${msg.split(' ')[0]} ${Math.floor(pct / 10)}`;
        if (key !== last) { last = key; stream.write(`${label} ${pct}% ${msg}\n`); }
      }
    },
    done() { if (barShown) stream.write('\n'); barShown = false; },
  };
}

/** One migration's settings (config keys, then the batch entry's overrides) as a manifest. */
export async function manifestFromSettings(s: MigrationSettings, baseDir: string, extraWarnings: string[] = []): Promise<Manifest> {
  const src = path.resolve(baseDir, s.vmdk!);
  // The format from the header, read by Ferry: qemu-img is told it, never left to probe (docs/security.md).
  const bad = (e: Error) => { throw new ConfigError(`vmdk: ${e.message}`, [{ path: 'vmdk', message: e.message }]); };
  const header = await inspectImage(src).catch(bad);
  const info = await imageInfo(src, header.format).catch(bad);
  const fmt = FORMAT_BY_EXT[path.extname(src).toLowerCase()] || (header.format === 'vpc' ? 'vhd' : header.format);
  const stem = String(s.to_output).replace(/\.[^.]+$/, '');
  const warnings = [...extraWarnings];
  // With every guest change switched off there is nothing to open the guest for: no appliance is launched (and
  // so no guest inspection either); the run is a checked conversion.
  const fixWanted = wantsGuestChange(s);
  const doc = {
    manifest_version: '1.0',
    source: { provider: 'ferry-convert', vm_name: s.vm_name, export_method: s.command },
    disks: [{ id: stem.replace(/[^a-zA-Z0-9_-]/g, '_') || 'disk', source_format: fmt, bytes: info['virtual-size'], local_path: src, boot_order_hint: 0, disk_type: 'boot' }],
    pipeline: {
      inspect: { enabled: true, collect_guest_info: fixWanted },
      convert: { enabled: true, compress: !!s.compress, ...(s.compress && s.compression_level ? { compress_level: s.compression_level } : {}) },
      fix: {
        enabled: fixWanted, backup: true, fstab_mode: 'stabilize-all', update_grub: s.update_grub ?? true, regen_initramfs: s.regen_initramfs ?? true,
        remove_source_hv_tools: !!s.remove_source_hv_tools,
      },
      validate: { enabled: true, check_image_integrity: true },
    },
    output: { directory: path.resolve(baseDir, s.output_dir!), format: s.out_format || 'qcow2', filename: s.to_output },
    options: { dry_run: !!s.dry_run, verbose: VERBOSE[s.log_level || 'INFO'], report: { enabled: true, path: s.report_path || 'report.json' } },
    warnings: warnings.map((message) => ({ stage: 'config', message })),
  };
  const m = validateManifest(doc);
  applyConfigOnlyFix(m, s, baseDir);
  return m;
}

/** Whether any guest change is switched on (fstab, grub, initramfs, xfs UUIDs, Windows drivers, source tools). */
function wantsGuestChange(s: MigrationSettings): boolean {
  return (s.fstab_mode ?? 'stabilize-all') !== 'preserve' || s.update_grub !== false || s.regen_initramfs !== false
    || !!s.xfs_regenerate_uuid || !!s.inject_virtio_drivers || !!s.remove_source_hv_tools;
}

/** Sets on `m`'s fix stage the settings the manifest schema has no key for. */
function applyConfigOnlyFix(m: Manifest, s: MigrationSettings, baseDir: string): void {
  // Config-only settings the manifest schema has no key for: uuid-only/preserve modes, xfs, Windows drivers.
  const fix = m.pipeline!.fix!;
  fix.fstab_mode = s.fstab_mode === 'preserve' ? 'noop' : s.fstab_mode || 'stabilize-all';
  if (s.xfs_regenerate_uuid) fix.xfs_regenerate_uuid = true;
  if (s.inject_virtio_drivers) {
    fix.inject_virtio_drivers = true;
    fix.windows_version = s.windows_version !== undefined ? String(s.windows_version) : undefined;
    if (s.virtio_win) fix.virtio_win = path.resolve(baseDir, s.virtio_win);
  }
}

/** Fetches a fetch-and-fix migration's remote disk into its conversion directory; returns the local path. */
async function fetchSource(label: string, s: MigrationSettings, baseDir: string, out: Out): Promise<string> {
  const dir = path.resolve(baseDir, s.conversion_dir || path.join(s.output_dir!, '.ferry-fetch'));
  out.line(`${label}: fetching ${s.user}@${s.host}:${s.remote}`);
  const r = await fetchRemote({
    host: s.host!, port: s.port, user: s.user!, identity: s.identity && path.resolve(baseDir, s.identity), remote: s.remote!, destDir: dir,
    destName: `${String(s.to_output).replace(/[^A-Za-z0-9._-]/g, '_')}--${path.posix.basename(s.remote!)}`,
    timeoutSeconds: s.timeout, retries: s.network_retry,
  }, (bytes) => out.progress(label, 0, `fetched ${(bytes / 1048576).toFixed(1)} MiB`));
  out.line(`${label}: fetched ${r.bytes} bytes in ${r.attempts} attempt(s)`);
  return r.path;
}

async function runOne(
  label: string, s: MigrationSettings, baseDir: string, out: Out, inBatch = false,
): Promise<{ ok: boolean; report?: PipelineReport; error?: string }> {
  let fetched: string | undefined;
  try {
    const warn: string[] = [];
    if (s.command === 'fetch-and-fix') {
      fetched = await fetchSource(label, s, baseDir, out);
      s = { ...s, vmdk: fetched };
    }
    let exported: Awaited<ReturnType<typeof exportForConvert>> | undefined;
    if (s.command === 'manager_export') {
      exported = await exportForConvert(s, baseDir, (pct, msg) => out.progress(label, pct, msg), (msg) => out.line(`${label}: ${msg}`));
      out.done();
      out.line(`${label}: exported ${exported.files.length} file(s), ${exported.total_bytes} bytes (manifest ${exported.manifest_path})`);
      // The export's manifest is the manifest seed (domain/vsphere/export-manifest.ts's buildManifest).
      const first = (exported.manifest as Manifest).disks[0];
      s = { ...s, vmdk: first.local_path, to_output: s.to_output ?? `${s.vm_name}.${s.out_format || 'qcow2'}` };
    }
    let m = await manifestFromSettings(s, baseDir, warn);
    if (exported) m = withExport(m, exported);
    const report = await runPipeline(m, {
      parallelStreams: s.parallel_streams,
      testBoot: s.virt_test ? {
        name: s.vm_name, memoryMiB: s.memory, vcpus: s.vcpus, expect: s.virt_test_expect ? linearRegExp(s.virt_test_expect) : undefined,
        timeoutSeconds: s.virt_test_timeout,
      } : undefined,
      onProgress: (stage: StageName, pct, msg) => out.progress(label, pct, `${stage}: ${msg}`),
      log: (_lvl, msg) => out.line(`${label}: ${msg}`),
    });
    out.done();
    if (fetched && !s.keep_original && report.success) await fs.rm(fetched, { force: true });
    for (const w of report.warnings) out.line(`${label}: warning: ${w}`);
    out.line(`${label}: ${report.success ? 'OK' : 'FAILED'}: ${report.summary.message}${report.report_path ? ` (report ${report.report_path})` : ''}`);
    return { ok: report.success, report };
  } catch (e) {
    out.done();
    // A single run's bad setting is a usage error (exit 2); in a batch it fails that entry only.
    if (!inBatch && (e instanceof ConfigError || e instanceof ManifestError)) throw e;
    out.line(`${label}: FAILED: ${(e as Error).message}`);
    return { ok: false, error: (e as Error).message };
  }
}

/** Runs `items` with at most `n` at a time; stops starting new ones when `stop()` says so. */
async function pool<T, R>(items: T[], n: number, fn: (x: T, i: number) => Promise<R>, stop: () => boolean): Promise<(R | undefined)[]> {
  const res = new Array<R | undefined>(items.length).fill(undefined);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, async () => {
    while (next < items.length && !stop()) { const i = next++; res[i] = await fn(items[i], i); }
  }));
  return res;
}

/** Each batch entry's settings. Precedence: batch entry > configuration file; each entry gets its own report file.
 *  Every entry is checked before any starts, so a structural mistake is exit 2 with nothing run. */
function batchSettings(migrations: MigrationEntry[], common: MigrationSettings, baseDir: string) {
  const settings = migrations.map((entry, i) => {
    const s: MigrationSettings = { ...common, ...entry, report_path: `${String(entry.to_output).replace(/\.[^.]+$/, '')}.report.json` };
    if (!s.output_dir) {
      throw new ConfigError(`migrations[${i}]: output_dir is required (in the entry or the configuration file)`,
        [{ path: `migrations[${i}].output_dir`, message: 'is required' }]);
    }
    if (s.command === 'local' && !entry.vmdk) {
      throw new ConfigError(`migrations[${i}].vmdk is required in mode local`, [{ path: `migrations[${i}].vmdk`, message: 'is required' }]);
    }
    if (s.command === 'fetch-and-fix' && !entry.remote) {
      throw new ConfigError(`migrations[${i}].remote is required in mode fetch-and-fix`,
        [{ path: `migrations[${i}].remote`, message: 'is required' }]);
    }
    return s;
  });
  // Two entries writing one file would overwrite each other's output (and, side by side, corrupt it).
  const seen = new Map<string, number>();
  settings.forEach((s, i) => {
    const target = path.resolve(baseDir, String(s.output_dir), String(s.to_output));
    const j = seen.get(target);
    if (j !== undefined) {
      throw new ConfigError(`migrations[${i}].to_output: ${target} is also the output of migrations[${j}]`,
        [{ path: `migrations[${i}].to_output`, message: `same output file as migrations[${j}]` }]);
    }
    seen.set(target, i);
  });
  return settings;
}

/** The command: its exit status. The vSphere sessions a manager_export opened are logged out at the end, however
 *  the run ended, rather than left to expire on the manager. */
export async function main(argv: string[], stdout = process.stdout, stderr = process.stderr): Promise<number> {
  try {
    return await run(argv, stdout, stderr);
  } finally {
    await logoutAll();
  }
}

/** The converter's steps per OS family, in the order they run; no disk is opened. */
function explain(os: string | undefined, stdout: typeof process.stdout, stderr: typeof process.stderr): number {
  if (os !== undefined && !FAMILIES.some((f) => f.os === os)) {
    stderr.write(`ferry-convert: --os: "${os}" is not one of ${FAMILIES.map((f) => f.os).join(', ')}\n`);
    return EXIT.usage;
  }
  stdout.write(explainSteps(os));
  return EXIT.ok;
}

/** Runs one manifest file (--manifest) and writes its report to stdout; returns the exit status. */
async function runManifest(
  manifestPath: string, outputDir: string | undefined, stdout: typeof process.stdout, stderr: typeof process.stderr,
): Promise<number> {
  const doc: unknown = JSON.parse(readFileSync(manifestPath, 'utf8')); // checked by validateManifest
  const m = validateManifest(doc);
  const out = output(stderr);
  const report = await runPipeline(m, {
    outputDir, onProgress: (s, p, msg) => out.progress('manifest', p, `${s}: ${msg}`), log: (_l, msg) => out.line(msg),
  });
  out.done();
  stdout.write(JSON.stringify(report, null, 2) + '\n');
  return report.success ? EXIT.ok : EXIT.failed;
}

/** Runs the batch manifest's migrations, writes batch-summary.json and the counts to stdout; returns the exit status. */
async function runBatch(
  batch_manifest: string, batch_parallel: ConverterConfig['batch_parallel'], batch_continue_on_error: ConverterConfig['batch_continue_on_error'],
  common: MigrationSettings, baseDir: string, out: Out, stdout: typeof process.stdout,
): Promise<number> {
  const batchPath = path.resolve(baseDir, batch_manifest);
  const batch = validateBatch(JSON.parse(readFileSync(batchPath, 'utf8')) as unknown);
  const settings = batchSettings(batch.migrations, common, baseDir);
  let failedOnce = false;
  const t0 = Date.now();
  const results = await pool(batch.migrations, batch_parallel, async (entry, i) => {
    const s = settings[i];
    const started = new Date().toISOString();
    const r = await runOne(`[${i + 1}/${batch.migrations.length}] ${entry.to_output}`, s, baseDir, out, true);
    if (!r.ok) failedOnce = true;
    return {
      index: i, to_output: entry.to_output, ok: r.ok, error: r.error || r.report?.errors?.[0], report: r.report?.report_path,
      output: r.report?.artifacts?.[0]?.path, seconds: r.report?.duration_seconds, started_at: started, finished_at: new Date().toISOString(),
    };
  }, () => failedOnce && !batch_continue_on_error);
  const summary = {
    total: results.length,
    succeeded: results.filter((r) => r?.ok).length,
    failed: results.filter((r) => r && !r.ok).length,
    not_run: results.filter((r) => !r).length,
    duration_seconds: (Date.now() - t0) / 1000,
    migrations: results.map((r, i) => r || {
      index: i, to_output: batch.migrations[i].to_output, ok: false,
      error: 'not run: an earlier migration failed and batch_continue_on_error is false',
    }),
  };
  const summaryDir = path.resolve(baseDir, String(common.output_dir || path.dirname(batchPath)));
  await fs.mkdir(summaryDir, { recursive: true });
  await fs.writeFile(path.join(summaryDir, 'batch-summary.json'), JSON.stringify(summary, null, 2) + '\n');
  out.line(`batch: ${summary.succeeded} succeeded, ${summary.failed} failed, ${summary.not_run} not run (${summary.duration_seconds.toFixed(1)} s)`);
  stdout.write(JSON.stringify({ total: summary.total, succeeded: summary.succeeded, failed: summary.failed, not_run: summary.not_run }) + '\n');
  return summary.succeeded === summary.total ? EXIT.ok : EXIT.failed;
}

/** Whether `e` is the user's mistake (a bad setting, manifest, JSON or YAML, or a missing file): exit 2, not 1. */
function isUsageError(e: unknown): boolean {
  return e instanceof ConfigError || e instanceof ManifestError || e instanceof SyntaxError
    || (e as { name?: unknown } | null)?.name === 'YAMLException' || (e as { code?: unknown } | null)?.code === 'ENOENT';
}

async function run(argv: string[], stdout: typeof process.stdout, stderr: typeof process.stderr): Promise<number> {
  const arg = (name: string) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
  if (argv.includes('--explain')) return explain(arg('--os'), stdout, stderr);
  const configPath = arg('--config');
  const manifestPath = arg('--manifest');
  if (argv.includes('--help') || (!configPath && !manifestPath)) {
    (configPath || manifestPath || argv.includes('--help') ? stdout : stderr).write('usage: ferry-convert --config file.yaml\n'
      + '       ferry-convert --manifest manifest.json [--output-dir DIR]\n'
      + '       ferry-convert --explain [--os linux|windows]\n');
    return argv.includes('--help') ? EXIT.ok : EXIT.usage;
  }
  try {
    if (manifestPath) return await runManifest(manifestPath, arg('--output-dir'), stdout, stderr);
    const baseDir = path.dirname(path.resolve(configPath!));
    const cfg: ConverterConfig = validateConfig(yaml.load(readFileSync(configPath!, 'utf8')));
    const out = output(stderr, cfg.log_file && path.resolve(baseDir, cfg.log_file));
    const { batch_manifest, batch_parallel, batch_continue_on_error, ...common } = cfg;
    if (!batch_manifest) {
      const r = await runOne(String(cfg.to_output ?? cfg.vm_name), { ...common }, baseDir, out);
      if (r.report) stdout.write(JSON.stringify(r.report.summary) + '\n');
      return r.ok ? EXIT.ok : EXIT.failed;
    }
    return await runBatch(batch_manifest, batch_parallel, batch_continue_on_error, common, baseDir, out, stdout);
  } catch (e) {
    if (isUsageError(e)) {
      stderr.write(`ferry-convert: ${(e as Error).message}\n`);
      return EXIT.usage;
    }
    stderr.write(`ferry-convert: ${(e as Error).message}\n`);
    return EXIT.failed;
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { process.stderr.write(`ferry-convert: ${errorText(e)}\n`); process.exit(1); });
}
