// The manifest-driven pipeline: inspect -> convert -> fix (on the converted output, one appliance for all
// disks) -> validate, then rename the outputs into place and write report.json (also when a stage fails).
// Sources are only ever read.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../errors';
import { checkOutputFree, OutputClaims, placeOutput } from '../roots';
import { check, compare, convert as qemuConvert, imageInfo, run, sha256File, QEMU_IMG } from '../qemu';
import type { Manifest, ManifestDisk } from '../schemas/manifest';
import { outputExtension } from '../schemas/common';
import { GuestDisk, GuestSession } from './guestfs';
import { testBoot, TestBootOptions, TestBootResult } from './testboot';
import { fixGuest, FixResult, GuestInfo, inspectAndMount } from './guest';
import { ignoreError, awaitedLater } from '../log';

export type StageName = 'inspect' | 'convert' | 'fix' | 'validate';
export const STAGES: StageName[] = ['inspect', 'convert', 'fix', 'validate'];
const WEIGHT: Record<StageName, [number, number]> = { inspect: [0, 5], convert: [5, 65], fix: [65, 90], validate: [90, 100] };

export interface PipelineOptions {
  /** Used when the manifest has no output.directory. */
  outputDir?: string;
  signal?: AbortSignal;
  /** Stage progress; pct is overall 0-100. */
  onProgress?: (stage: StageName, pct: number, message: string, details?: Record<string, string | number>) => void;
  log?: (level: number, message: string) => void;
  /** qemu-img convert -m (parallel coroutines); the config file's parallel_streams. */
  parallelStreams?: number;
  tool?: string;
  /** Replace existing outputs (default true: the command line's behaviour); a migrate job passes its
   *  parameters.overwrite (default false) and its claims, so a retry may replace only its own outputs. */
  overwrite?: boolean;
  claims?: OutputClaims;
  /** virt_test: boot the outputs once (snapshot=on, nothing written to them) after they are in place. */
  testBoot?: Omit<TestBootOptions, 'disks' | 'signal'>;
}

interface StageReport { enabled: boolean; success: boolean | null; started_at?: string; duration_seconds?: number; result?: Record<string, unknown>; error?: string; skipped_reason?: string }
interface Work {
  disk: ManifestDisk; out: string; tmp: string; overlay: boolean; sourceFormat: string; sourceVirtual?: number;
  sourceSha?: string; modified: boolean; artifact: Record<string, unknown>;
  /** Side by side with convert: the qcow2 overlay (backed by the read-only source) the repair writes to. */
  fixOverlay?: string;
  /** From validate: the finished output's info and sha256, so they are not read again after the rename. */
  outInfo?: { 'virtual-size': number }; outSha?: string;
}

/** Stage settings with the pipeline's rule: without `pipeline`, inspect+convert+validate run and fix does not. */
export function stagesOf(m: Manifest) {
  const p = m.pipeline;
  if (!p) return { inspect: { enabled: true, collect_guest_info: false }, convert: { enabled: true, compress: false } as NonNullable<Manifest['pipeline']>['convert'] & object, fix: undefined, validate: { enabled: true, check_image_integrity: true } };
  return { inspect: p.inspect, convert: p.convert, fix: p.fix, validate: p.validate };
}

/** Output file per disk: output.filename for one disk; with several, "<stem>-<disk id>.<ext>". */
export function outputNames(m: Manifest, dir: string): Map<string, string> {
  const fmt = m.output.format;
  const names = new Map<string, string>();
  for (const d of m.disks) {
    let name: string;
    if (m.output.filename && m.disks.length === 1) name = m.output.filename;
    else if (m.output.filename) name = `${m.output.filename.replace(/\.[^.]+$/, '')}-${d.id}.${outputExtension(fmt)}`;
    else name = `${d.id}.${outputExtension(fmt)}`;
    names.set(d.id, path.join(dir, name));
  }
  return names;
}

let zstdSupport: Promise<boolean> | undefined;
/** qemu-img >= 5.1 has qcow2 compression_type=zstd; asked once per process. */
function supportsZstd(): Promise<boolean> {
  zstdSupport ??= run(QEMU_IMG, ['create', '-f', 'qcow2', '-o', 'help', '/dev/null']).then((r) => /compression_type/.test(r.stdout + r.stderr), () => false);
  return zstdSupport;
}

export async function runPipeline(m: Manifest, opts: PipelineOptions = {}): Promise<Record<string, any>> {
  const t0 = Date.now();
  const dry = m.options.dry_run;
  const log = (lvl: number, msg: string) => { if (m.options.verbose >= lvl) opts.log?.(lvl, msg); };
  const st = stagesOf(m);
  const warnings: string[] = [];
  const errors: string[] = [];
  const stages: Record<StageName, StageReport> = {} as any;
  for (const s of STAGES) stages[s] = { enabled: !!st[s]?.enabled, success: null };
  const dir = m.output.directory || opts.outputDir;
  const disks = [...m.disks].sort((a, b) => a.boot_order_hint - b.boot_order_hint);
  const work: Work[] = [];
  const progress = (s: StageName, frac: number, msg: string, details?: Record<string, string | number>) => {
    const [a, b] = WEIGHT[s];
    opts.onProgress?.(s, Math.min(100, Math.floor(a + (b - a) * Math.max(0, Math.min(1, frac)))), msg, details);
  };
  let session: GuestSession | undefined;
  let guest: GuestInfo | undefined;
  let failed = false;
  /** The outputs are renamed into place; the report lists them even if a later step (the test boot) fails. */
  let written = false;
  let testBootResult: (TestBootResult & { console_log: string }) | undefined;
  // Seconds spent per kind of work, for the report's summary and scripts/bench/convert.ts.
  const timings: Record<string, number> = {};
  const timed = async <T>(k: string, fn: () => Promise<T>): Promise<T> => {
    const t = process.hrtime.bigint();
    try { return await fn(); } finally { timings[k] = (timings[k] || 0) + Number(process.hrtime.bigint() - t) / 1e9; }
  };

  const stage = async (s: StageName, fn: (r: StageReport) => Promise<Record<string, unknown> | void>) => {
    const r = stages[s];
    if (!r.enabled) { r.skipped_reason = 'stage not enabled'; return; }
    if (failed) { r.skipped_reason = 'an earlier stage failed'; return; }
    r.started_at = new Date().toISOString();
    const t = Date.now();
    progress(s, 0, `${s} started`);
    log(1, `${s}: started`);
    try {
      r.result = (await fn(r)) || {};
      r.success = true;
      log(1, `${s}: done in ${((Date.now() - t) / 1000).toFixed(1)} s`);
    } catch (e) {
      if (opts.signal?.aborted) throw e;
      r.success = false;
      r.error = (e as Error).message;
      errors.push(`${s}: ${r.error}`);
      failed = true;
      log(0, `${s}: FAILED: ${r.error}`);
    } finally {
      r.duration_seconds = (Date.now() - t) / 1000;
      progress(s, 1, `${s} ${r.success ? 'done' : 'failed'}`);
    }
  };

  const stopEarly = new AbortController();
  let early: Promise<{ guest: GuestInfo; res: FixResult }> | undefined;
  try {
    if (!dir) throw new OperationError('$.output.directory is required (or give the tool an output directory)', false);
    const names = outputNames(m, dir);
    for (const d of disks) {
      const out = names.get(d.id)!;
      if (path.resolve(out) === path.resolve(d.local_path)) throw new OperationError(`$.disks: output ${out} is the source of disk ${d.id}; sources are never modified`, false);
      const overlay = !st.convert?.enabled && !!st.fix?.enabled;
      const final = overlay ? out.replace(/\.[^.]+$/, '') + '.overlay.qcow2' : out;
      work.push({
        disk: d, out: final, tmp: path.join(path.dirname(final), `.${path.basename(final)}.partial`), overlay, sourceFormat: d.source_format, modified: false,
        artifact: { disk_id: d.id, path: final, format: overlay ? 'qcow2' : m.output.format, boot_order: d.boot_order_hint, source_path: d.local_path, source_format: d.source_format },
      });
    }
    if (!dry) {
      await fs.mkdir(dir, { recursive: true });
      for (const w of work) await checkOutputFree(w.out, `output of disk ${w.disk.id}`, opts.overwrite !== false, opts.claims);
      if (m.options.report.enabled) await checkOutputFree(path.resolve(dir, m.options.report.path), 'report', opts.overwrite !== false, opts.claims);
    }
    const verifyDuringConvert = !!st.convert?.enabled && !dry;

    await stage('inspect', async () => {
      const disksOut: Record<string, unknown>[] = [];
      for (const [i, w] of work.entries()) {
        const d = w.disk;
        await fs.access(d.local_path).catch(() => { throw new Error(`disk ${d.id}: ${d.local_path} does not exist or cannot be read`); });
        const detected = await timed('qemu_img_info', () => imageInfo(d.local_path));
        const entry: Record<string, unknown> = { disk_id: d.id, detected_format: detected.format, virtual_size: detected['virtual-size'], actual_size: detected['actual-size'] };
        if (detected.format !== d.source_format) throw new Error(`disk ${d.id}: source_format is ${d.source_format} but ${d.local_path} is ${detected.format}`);
        w.sourceVirtual = detected['virtual-size'];
        if (detected['virtual-size'] !== d.bytes) warnings.push(`inspect: disk ${d.id}: bytes ${d.bytes} differs from the image's virtual size ${detected['virtual-size']}`);
        if (detected['backing-filename']) {
          entry.backing_chain = detected['full-backing-filename'] || detected['backing-filename'];
          warnings.push(`inspect: disk ${d.id} has a backing file ${entry.backing_chain}; the output is flattened`);
        }
        const snaps = detected.snapshots as unknown[] | undefined;
        if (snaps?.length) { entry.snapshots = snaps.length; warnings.push(`inspect: disk ${d.id} has ${snaps.length} internal snapshot(s); only the active layer is converted`); }
        if (d.checksum && !verifyDuringConvert) {
          const sha = await sha256File(d.local_path, undefined, opts.signal);
          if (`sha256:${sha}` !== d.checksum) throw new Error(`disk ${d.id}: checksum mismatch: manifest ${d.checksum}, file sha256:${sha}`);
          w.sourceSha = sha;
          entry.checksum = 'verified';
        } else if (d.checksum) entry.checksum = 'verified during convert (same read)';
        disksOut.push(entry);
        progress('inspect', (i + 1) / work.length, `inspected ${d.id}`);
      }
      const r: Record<string, unknown> = { disks: disksOut };
      if (st.inspect?.collect_guest_info && !st.fix?.enabled) {
        // No fix session to share: a read-only appliance on the sources.
        session = await GuestSession.open(work.map((w) => ({ path: w.disk.local_path, format: w.sourceFormat })), { readonly: true, signal: opts.signal });
        guest = await inspectAndMount(session, true);
        r.guest = guest;
        await session.close();
      }
      return r;
    });

    // The repair: one appliance on `disks` (the outputs, their overlays, or the read-only sources of a dry run).
    const repair = async (disks: GuestDisk[], signal?: AbortSignal): Promise<{ guest: GuestInfo; res: FixResult }> => {
      const s = await GuestSession.open(disks, { readonly: dry, signal });
      session = s;
      try {
        const gi = await inspectAndMount(s, dry);
        const nicMacs = (m.nics || []).map((n) => n.mac).filter((x): x is string => !!x);
        const res = await fixGuest(s, gi, { ...st.fix!, dry_run: dry, configuration: m.configuration, nic_macs: nicMacs }, (msg) => log(1, msg));
        return { guest: gi, res };
      } finally { await s.close(); }
    };
    // With convert and fix both on, the repair does not wait for the conversion: it runs in its own appliance
    // on a qcow2 overlay of each disk whose backing file is the source (opened read-only by qemu, never
    // written), while qemu-img converts the same source. The overlay then holds exactly the repair's writes and
    // is committed into the converted output, which has the source's content: the output ends up as
    // source + repair, as if the repair had run on it, and the appliance launch and the guest's own
    // update-initramfs under TCG no longer add to the conversion's time.
    const sideBySide = !dry && !!st.convert?.enabled && stages.fix.enabled && !failed;
    if (sideBySide) {
      for (const w of work) {
        w.fixOverlay = path.join(path.dirname(w.out), `.${path.basename(w.out)}.fix.qcow2`);
        await fs.rm(w.fixOverlay, { force: true });
        const r = await run(QEMU_IMG, ['create', '-f', 'qcow2', '-b', path.resolve(w.disk.local_path), '-F', w.sourceFormat, w.fixOverlay]);
        if (r.code !== 0) throw new OperationError(`qemu-img create overlay: ${r.stderr.trim()}`, false);
      }
      const signal = opts.signal ? AbortSignal.any([opts.signal, stopEarly.signal]) : stopEarly.signal;
      log(1, 'fix: started side by side with convert, on overlays of the sources');
      early = timed('fix_side_by_side', () => repair(work.map((w) => ({ path: w.fixOverlay!, format: 'qcow2' })), signal));
      awaitedLater(early);
    }

    await stage('convert', async () => {
      const c = st.convert!;
      const fmt = m.output.format;
      const notes: string[] = [];
      const options: string[] = [];
      let compress = false;
      if (c.compress && fmt !== 'qcow2') warnings.push(`convert: compress applies to qcow2 output only; ${fmt} output is not compressed`);
      else if (c.compress) {
        compress = true;
        if (await supportsZstd()) options.push('compression_type=zstd');
        else notes.push('qemu-img has no zstd support here; zlib compression used');
      }
      if (c.compress_level !== undefined) {
        warnings.push(`convert: compress_level ${c.compress_level} is not honoured: qemu-img has no compression-level setting${compress ? ' (zstd/zlib default level used)' : ''}`);
      }
      const extra = opts.parallelStreams && opts.parallelStreams > 1 ? ['-m', String(Math.min(16, opts.parallelStreams))] : [];
      const total = work.reduce((a, w) => a + (w.sourceVirtual || w.disk.bytes), 0) || 1;
      let doneBytes = 0;
      const files: Record<string, unknown>[] = [];
      for (const w of work) {
        const size = w.sourceVirtual || w.disk.bytes;
        if (dry) { files.push({ disk_id: w.disk.id, would_write: w.out, from: w.disk.local_path, format: fmt, compress }); continue; }
        await fs.rm(w.tmp, { force: true });
        const t = Date.now();
        // The checksum is computed while qemu-img reads the same file: one pass through the page cache.
        const sha = w.disk.checksum ? sha256File(w.disk.local_path, undefined, opts.signal) : undefined;
        if (sha) awaitedLater(sha);
        try {
          await timed('qemu_img_convert', () => qemuConvert({ src: w.disk.local_path, srcFormat: w.sourceFormat, dest: w.tmp, destFormat: fmt, compress, options, extra }, (pct) => {
            progress('convert', (doneBytes + (pct / 100) * size) / total, `converting ${w.disk.id} ${pct.toFixed(1)}%`, { disk_id: w.disk.id, bytes_processed: Math.round(doneBytes + (pct / 100) * size), total_bytes: total });
          }, opts.signal));
          if (sha) {
            w.sourceSha = await timed('source_sha256_wait', () => sha);
            if (`sha256:${w.sourceSha}` !== w.disk.checksum) throw new Error(`disk ${w.disk.id}: checksum mismatch: manifest ${w.disk.checksum}, file sha256:${w.sourceSha}`);
          }
        } catch (e) { await fs.rm(w.tmp, { force: true }); throw e; }
        doneBytes += size;
        Object.assign(w.artifact, { compressed: compress });
        files.push({ disk_id: w.disk.id, output: w.out, format: fmt, compressed: compress, seconds: (Date.now() - t) / 1000, checksum_verified: !!sha });
      }
      return { format: fmt, compression: compress ? (options.length ? 'zstd' : 'zlib') : 'none', files, notes };
    });

    // Fix without convert works on a qcow2 overlay whose backing file is the (untouched) source.
    if (stages.fix.enabled && !failed && !dry && work.some((w) => w.overlay)) {
      for (const w of work) {
        await fs.rm(w.tmp, { force: true });
        const r = await run(QEMU_IMG, ['create', '-f', 'qcow2', '-b', path.resolve(w.disk.local_path), '-F', w.sourceFormat, w.tmp]);
        if (r.code !== 0) throw new OperationError(`qemu-img create overlay: ${r.stderr.trim()}`, false);
      }
    }

    // The convert stage failed: the repair running beside it has nothing to go into.
    if (early && stages.convert.success !== true) { stopEarly.abort(); await early.catch(ignoreError('the repair beside a failed conversion was stopped: its abort is expected')); }

    await stage('fix', async (fixReport) => {
      const disksFor = dry ? work.map((w) => ({ path: w.disk.local_path, format: w.sourceFormat })) : work.map((w) => ({ path: w.tmp, format: w.overlay ? 'qcow2' : m.output.format }));
      if (!early) progress('fix', 0.05, `launching the guest appliance for ${work.length} disk(s)`);
      else progress('fix', 0.05, 'waiting for the repair running beside the conversion');
      const { guest: gi, res } = early ? await early : await repair(disksFor, opts.signal);
      guest = gi;
      if (stages.inspect.result && st.inspect?.collect_guest_info) stages.inspect.result.guest = gi;
      const result = { guest: { os: gi.os, distro: gi.distro, version: gi.version, root_device: gi.root_device, lvm: gi.lvm }, ...res, dry_run: dry, ...(early ? { side_by_side_with_convert: true } : {}) };
      for (const wmsg of res.warnings) warnings.push(`fix: ${wmsg}`);
      // A repair the read-back found undone fails the stage; the actions stay in the report for a look.
      if (res.failures.length) { fixReport.result = result; throw new Error(`repairs that did not hold: ${res.failures.join('; ')}`); }
      if (early && res.modified) {
        progress('fix', 0.8, 'writing the repairs into the outputs');
        for (const w of work) {
          // The overlay's backing becomes the output (same content as the source, so -u is exact), then commit.
          const steps = [['rebase', '-u', '-f', 'qcow2', '-b', path.resolve(w.tmp), '-F', m.output.format, w.fixOverlay!], ['commit', '-q', '-f', 'qcow2', w.fixOverlay!]];
          for (const a of steps) {
            const r = await timed('qemu_img_commit', () => run(QEMU_IMG, a, { signal: opts.signal }));
            if (r.code !== 0) throw new Error(`disk ${w.disk.id}: qemu-img ${a[0]} of the repair overlay: ${r.stderr.trim()}`);
          }
        }
      }
      for (const w of work) { if (w.fixOverlay) await fs.rm(w.fixOverlay, { force: true }); w.modified = res.modified; w.artifact.modified_by_fix = res.modified; }
      return result;
    });

    await stage('validate', async () => {
      const v = st.validate!;
      const checks: Record<string, unknown>[] = [];
      if (dry) return { skipped: 'dry_run: no output to validate' };
      for (const [i, w] of work.entries()) {
        const file = w.tmp;
        const fmt = w.overlay ? 'qcow2' : m.output.format;
        await fs.access(file).catch(() => { throw new Error(`disk ${w.disk.id}: no output to validate (was convert enabled?)`); });
        const c: Record<string, unknown> = { disk_id: w.disk.id };
        // The output is final from here on (fix ran before): its sha256 is read alongside check and compare,
        // which read the same file, instead of in a second pass after the rename.
        const outSha = timed('output_sha256', () => sha256File(file, undefined, opts.signal));
        awaitedLater(outSha);
        if (v.check_image_integrity) {
          const r = await timed('qemu_img_check', () => check(file, fmt));
          c.integrity = r.ok ? (/not support/i.test(r.output) ? 'not supported by format' : 'ok') : 'errors';
          if (!r.ok) throw new Error(`disk ${w.disk.id}: qemu-img check found problems: ${r.output.slice(0, 2000)}`);
        }
        const info = await timed('qemu_img_info', () => imageInfo(file, fmt));
        w.outInfo = info;
        c.virtual_size = info['virtual-size'];
        if (w.sourceVirtual !== undefined && info['virtual-size'] !== w.sourceVirtual) throw new Error(`disk ${w.disk.id}: output virtual size ${info['virtual-size']} differs from the source's ${w.sourceVirtual}`);
        if (!w.modified && !w.overlay) {
          const cmp = await timed('qemu_img_compare', () => compare(w.disk.local_path, w.sourceFormat, file, fmt));
          c.compare = cmp.identical ? 'identical to source' : 'differs';
          if (!cmp.identical) throw new Error(`disk ${w.disk.id}: output content differs from the source: ${cmp.output}`);
        } else c.compare = 'skipped: the fix stage modified the output';
        w.outSha = await outSha;
        checks.push(c);
        progress('validate', (i + 0.5) / work.length, `validated ${w.disk.id}`);
      }
      return { checks };
    });

    if (!failed && !dry) {
      for (const w of work) {
        // Durable before visible: the data reaches the disk, then the name, then the directory entry.
        await timed('fsync_rename', async () => {
          const h = await fs.open(w.tmp, 'r');
          try { await h.sync(); } finally { await h.close(); }
          await placeOutput(w.tmp, w.out, { field: `output of disk ${w.disk.id}`, overwrite: opts.overwrite !== false, claims: opts.claims });
          const d = await fs.open(path.dirname(w.out), 'r');
          try { await d.sync(); } finally { await d.close(); }
        });
        const s = await fs.stat(w.out);
        const info = w.outInfo || await timed('qemu_img_info', () => imageInfo(w.out, w.overlay ? 'qcow2' : m.output.format));
        const sha = w.outSha || await timed('output_sha256', () => sha256File(w.out, undefined, opts.signal));
        Object.assign(w.artifact, { virtual_size: info['virtual-size'], file_size: s.size, actual_size: s.blocks * 512, sha256: sha });
        if (w.sourceSha) w.artifact.source_sha256 = w.sourceSha;
      }
      written = true;
    }
    if (!failed && !dry && opts.testBoot) {
      progress('validate', 1, 'test boot of the outputs');
      // The whole serial console is kept beside the outputs (the report has its tail), for a look after a failure.
      const consoleLog = path.join(path.dirname(work[0].out), `${path.basename(work[0].out)}.virt-test.log`);
      const mac = opts.testBoot.mac ?? (m.nics?.length === 1 ? m.nics[0].mac?.toLowerCase().replace(/-/g, ':') : undefined);
      const tb = await timed('test_boot', () => testBoot({ ...opts.testBoot, mac, consoleLog, disks: work.map((w) => ({ path: w.out, format: w.overlay ? 'qcow2' : m.output.format })), signal: opts.signal }));
      testBootResult = { ...tb, console_log: consoleLog };
      log(1, `test boot (${tb.accelerator}): ${tb.status}: ${tb.detail}`);
      if (tb.status === 'inconclusive') warnings.push(`virt_test: inconclusive: ${tb.detail}`);
      if (tb.status === 'failed') { errors.push(`virt_test: the test boot failed: ${tb.detail}`); failed = true; }
    }
  } catch (e) {
    if (opts.signal?.aborted) { await cleanup(work, session); throw e; }
    errors.push((e as Error).message);
    failed = true;
  } finally {
    // Whatever ended the run, the repair beside the conversion does not outlive it.
    if (early) { stopEarly.abort(); await early.catch(ignoreError('the repair beside the conversion: its outcome went into the fix stage, or it was stopped')); }
    if (session && !session.closed) await session.close();
  }
  if (failed || dry) await cleanup(work, undefined);

  const ran = STAGES.filter((s) => stages[s].success !== null);
  const report = {
    report_version: '1.0', manifest_version: m.manifest_version, tool: opts.tool || 'ferry-convert',
    started_at: new Date(t0).toISOString(), finished_at: new Date().toISOString(), duration_seconds: (Date.now() - t0) / 1000,
    dry_run: dry, success: !failed, source: m.source || {}, stages,
    artifacts: written ? work.map((w) => w.artifact) : [],
    ...(testBootResult ? { test_boot: testBootResult } : {}),
    warnings: [...(m.warnings || []).map((x) => `export ${x.stage}: ${x.message}`), ...warnings], errors,
    summary: {
      disks: work.length, stages_run: ran, stages_failed: ran.filter((s) => stages[s].success === false),
      total_source_bytes: work.reduce((a, w) => a + (w.sourceVirtual || 0), 0),
      total_output_bytes: !written ? 0 : work.reduce((a, w) => a + Number(w.artifact.file_size || 0), 0),
      timings: Object.fromEntries(Object.entries(timings).map(([k, v]) => [k, Math.round(v * 1000) / 1000])),
      message: failed ? `failed: ${errors[0]}` : dry ? `dry run: ${work.length} disk(s) would be converted; nothing written` : `${work.length} disk(s) migrated`,
    },
  };
  if (m.options.report.enabled && !dry && dir) {
    const rp = path.resolve(dir, m.options.report.path);
    await fs.mkdir(path.dirname(rp), { recursive: true }).catch(ignoreError('the report write below fails with the cause, which goes into the report errors'));
    const tmp = path.join(path.dirname(rp), `.${path.basename(rp)}.partial`);
    await fs.writeFile(tmp, JSON.stringify(report, null, 2) + '\n')
      .then(() => placeOutput(tmp, rp, { field: 'report', overwrite: opts.overwrite !== false, claims: opts.claims }))
      .catch(async (e) => { await fs.rm(tmp, { force: true }); report.errors.push(`report: cannot write ${rp}: ${e.message}`); });
    (report as any).report_path = rp;
  }
  return report;
}

async function cleanup(work: Work[], session?: GuestSession) {
  if (session && !session.closed) await session.close();
  for (const w of work) { await fs.rm(w.tmp, { force: true }); if (w.fixOverlay) await fs.rm(w.fixOverlay, { force: true }); }
}
