// What one pipeline run carries from stage to stage: the manifest and options, the work per disk, each stage's
// report, warnings, errors and timings. domain/converter/pipeline.ts runs the stages in order on one Run.
import path from 'node:path';
import type { Manifest, ManifestDisk } from '../../schemas/manifest';
import { outputExtension } from '../../schemas/common';
import type { OutputClaims } from '../../../platform/roots';
import type { GuestSession } from '../guestfs';
import type { TestBootOptions, TestBootResult } from '../testboot';
import type { FixResult, GuestInfo } from '../types';
import type { FirmwareChoice } from '../firmware';
import type { InspectionHint } from '../inspection-hint';
import { OperationError } from '../../../platform/errors';
import { ConverterError } from '../errors';

export type StageName = 'inspect' | 'convert' | 'fix' | 'validate';
export const STAGES: StageName[] = ['inspect', 'convert', 'fix', 'validate'];
/** Each stage's share of the overall 0-100 progress. */
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
  /** By disk id: a disk whose bytes are still being copied into its local_path (one pass, the repair beside the
   *  copy): inspect and the repair's overlay read it from this NBD reader of the source instead, and nothing
   *  opens local_path during the run. */
  sources?: Record<string, { qemuUri: string; format: string }>;
  /** A plan preflight's inspection of these disks (inspection-hint.ts): the repair takes it when the disks still
   *  hold what the preflight read, instead of running libguestfs's inspection again. */
  inspection?: InspectionHint;
  /** How much lower the appliance's CPU priority is than the worker's (the repair beside the copy: the copy, the
   *  longer of the two on a real disk, keeps the CPU it needs; the repair takes what the copy leaves). */
  applianceNice?: number;
}

export interface StageReport {
  enabled: boolean; success: boolean | null; started_at?: string; duration_seconds?: number; result?: Record<string, unknown>;
  error?: string; skipped_reason?: string;
}
export interface Work {
  disk: ManifestDisk; out: string; tmp: string; overlay: boolean; sourceFormat: string; sourceVirtual?: number;
  sourceSha?: string; modified: boolean; artifact: Record<string, unknown>;
  /** Side by side with convert: the qcow2 overlay (backed by the read-only source) the repair writes to. */
  fixOverlay?: string;
  /** From validate: the finished output's info and sha256, so they are not read again after the rename. */
  outInfo?: { 'virtual-size': number }; outSha?: string;
}
export interface Repair { guest: GuestInfo; res: FixResult; firmware: FirmwareChoice }

/** Stage settings with the pipeline's rule: without `pipeline`, inspect+convert+validate run and fix does not. */
export function stagesOf(m: Manifest) {
  const p = m.pipeline;
  if (!p) {
    return {
      inspect: { enabled: true, collect_guest_info: false },
      convert: { enabled: true, compress: false } as NonNullable<Manifest['pipeline']>['convert'] & object,
      fix: undefined,
      validate: { enabled: true, check_image_integrity: true },
    };
  }
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

export class Run {
  readonly t0 = Date.now();
  readonly dry: boolean;
  readonly st: ReturnType<typeof stagesOf>;
  readonly dir: string | undefined;
  readonly warnings: string[] = [];
  readonly errors: string[] = [];
  /** Each failure with its kind, beside `errors` (their messages): whether it may pass on a retry, and for the
   *  converter's typed errors (../errors.ts) whose fault it was and at which step. */
  readonly failures: { message: string; retryable: boolean; fault?: string; step?: string }[] = [];
  readonly stages = {} as Record<StageName, StageReport>;
  /** One entry per disk, in boot order. */
  readonly work: Work[] = [];
  /** Seconds spent per kind of work, for the report's summary and scripts/bench/convert.ts. */
  readonly timings: Record<string, number> = {};
  session?: GuestSession;
  guest?: GuestInfo;
  failed = false;
  /** Whether every failure so far says it may pass when tried again (an OperationError marked retryable, such as a
   *  hung or crashed appliance launch); a broken guest or a bad manifest does not. The job runner honours it. */
  retryable = true;
  /** The outputs are renamed into place; the report lists them even if a later step (the test boot) fails. */
  written = false;
  testBootResult?: TestBootResult & { console_log: string };
  /** The firmware the outputs need and why (firmware.ts), once the guest was inspected; the test boot uses it. */
  firmware?: FirmwareChoice;
  /** The repair started side by side with convert (fix.ts), and how to stop it. */
  early?: Promise<Repair>;
  readonly stopEarly = new AbortController();

  constructor(readonly m: Manifest, readonly opts: PipelineOptions) {
    this.dry = m.options.dry_run;
    this.st = stagesOf(m);
    this.dir = m.output.directory || opts.outputDir;
    for (const s of STAGES) this.stages[s] = { enabled: !!this.st[s]?.enabled, success: null };
  }

  readonly log = (lvl: number, msg: string) => { if (this.m.options.verbose >= lvl) this.opts.log?.(lvl, msg); };

  /** A warning for the report, said in the log as well (at level 0, so it is never lost to verbosity). */
  readonly warn = (msg: string) => { this.warnings.push(msg); this.log(0, msg); };

  readonly progress = (s: StageName, frac: number, msg: string, details?: Record<string, string | number>) => {
    const [a, b] = WEIGHT[s];
    this.opts.onProgress?.(s, Math.min(100, Math.floor(a + (b - a) * Math.max(0, Math.min(1, frac)))), msg, details);
  };

  async timed<T>(k: string, fn: () => Promise<T>): Promise<T> {
    const t = process.hrtime.bigint();
    try { return await fn(); } finally { this.timings[k] = (this.timings[k] || 0) + Number(process.hrtime.bigint() - t) / 1e9; }
  }

  /** The format the file of `w` is written in: the output format, or qcow2 for an overlay (fix without convert). */
  formatOf(w: Work): string {
    return w.overlay ? 'qcow2' : this.m.output.format;
  }

  /** Records a failure of the run: its message among the errors, and whether its kind may pass on a retry. */
  fail(message: string, e?: unknown) {
    this.errors.push(message);
    this.failed = true;
    const retryable = e instanceof OperationError && e.retryable;
    this.retryable &&= retryable;
    this.failures.push({ message, retryable, ...(e instanceof ConverterError ? { fault: e.fault, ...(e.step ? { step: e.step } : {}) } : {}) });
  }

  /** Runs stage `s` unless it is off or an earlier stage failed. A failure is recorded in its report and ends the
   *  run's stages (later ones are skipped), but is thrown on only when the run was aborted. */
  async stage(s: StageName, fn: (r: StageReport) => Promise<Record<string, unknown> | void>) {
    const r = this.stages[s];
    if (!r.enabled) { r.skipped_reason = 'stage not enabled'; return; }
    if (this.failed) { r.skipped_reason = 'an earlier stage failed'; return; }
    r.started_at = new Date().toISOString();
    const t = Date.now();
    this.progress(s, 0, `${s} started`);
    this.log(1, `${s}: started`);
    try {
      r.result = (await fn(r)) || {};
      r.success = true;
      this.log(1, `${s}: done in ${((Date.now() - t) / 1000).toFixed(1)} s`);
    } catch (e) {
      if (this.opts.signal?.aborted) throw e;
      r.success = false;
      r.error = (e as Error).message;
      this.fail(`${s}: ${r.error}`, e);
      this.log(0, `${s}: FAILED: ${r.error}`);
    } finally {
      r.duration_seconds = (Date.now() - t) / 1000;
      this.progress(s, 1, `${s} ${r.success ? 'done' : 'failed'}`);
    }
  }
}
