// Warm migration of a shape B job (issue 37, docs/plans.md "Warm migration"): while the VM runs, changed-block
// tracking on (when options.warm.enable_cbt allows), a snapshot and the whole disk as of that snapshot copied into
// the job's raw target volume (one pass's volume, shared with the cold path); then each round a new snapshot, only
// the areas QueryChangedDiskAreas lists since the previous round's change id copied into the same volume, and the
// previous snapshot removed, so a VM never carries more than the two snapshots one round needs. At cutover (a time,
// a manual request, or the predicted downtime within the budget inside the plan's window) the VM is powered off as
// options.power_off says, the last delta copied from a snapshot taken after the power-off, every snapshot removed,
// and the repair, import and boot run as in a cold migration. Every snapshot is recorded (orchestration/warm.ts) by its
// managed object id the moment it exists and removed by that id on success, cancel and failure, and by the next
// attempt of a job that died. The source's own disks are only read.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { dropped } from '../../../platform/log';
import type { WarmOptions } from '../../../domain/schemas/warm';
import { predictDowntime, type StageSeconds, type WarmRound, type WarmState } from '../../../domain/warm-predict';
import { managerFor, type Manager } from '../../../domain/vsphere/client';
import { jobPassword, resolveCredentials } from '../../../domain/vsphere/credentials';
import { vmDetail, type VmDetail } from '../../../domain/vsphere/inventory';
import { cbtEnabled, changedAreas, copyAreas, createSnapshot, enableCbt, removeSnapshot, type Snapshot } from '../../../domain/vsphere/cbt';
import { powerOff, shutdownGuest, waitForTask, waitPoweredOff } from '../../../domain/vsphere/actions';
import { VsphereError } from '../../../domain/vsphere/errors';
import { buildWarmManifest } from '../../../domain/vsphere/warm-manifest';
import type { PlannedDisk } from '../../../domain/vsphere/export-manifest';
import type { ExportResult } from '../../../domain/vsphere/export';
import { parseDatastorePath } from '../../../domain/vsphere/vmdk';
import { el, moref, type MoRef } from '../../../domain/vsphere/xml';
import { cutoverRequest, forgetSnapshot, recentStageTimes, recordSnapshot, recordStageTimes, warmSnapshots, writeWarmState } from '../../../orchestration/warm';
import type { PlanParams } from '../../../orchestration/plan-slots';
import type { ExportParameters } from './export';
import { asOperationError } from './export';
import type { OpContext } from './types';
import type { besideCopyResult } from './repair-beside-copy';

export type WarmParameters = ExportParameters & { warm: WarmOptions; plan?: PlanParams };
type After = (ctx: OpContext, exported: ExportResult) => Promise<Record<string, unknown>>;

/** A running warm migration: the source, its disks and their target volumes, the snapshot the next round's delta
 *  is measured from, each disk's change id at it, and the state the job record shows. */
interface Run {
  ctx: OpContext; p: WarmParameters; m: Manager; vm: MoRef; d: VmDetail; dir: string;
  targets: string[]; prev: Snapshot | null; changeIds: string[]; state: WarmState; stages: StageSeconds[];
  cbtByFerry: boolean;
}

const STOP_TIMEOUT_MS = 120_000;
const gone = (e: unknown) => e instanceof VsphereError && (e.kind === 'not_found' || e.fault === 'ManagedObjectNotFound');
const sleep = (ms: number, signal: AbortSignal) => new Promise<void>((resolve, reject) => {
  const t = setTimeout(() => { signal.removeEventListener('abort', stop); resolve(); }, ms);
  const stop = () => { clearTimeout(t); reject(signal.reason as Error); };
  if (signal.aborted) stop(); else signal.addEventListener('abort', stop, { once: true });
});

async function connect(ctx: OpContext, p: WarmParameters): Promise<Manager> {
  const password = await jobPassword(ctx.store.redis, ctx.store.k, ctx.spec.job_id, p.credentials).catch((e) => { throw asOperationError(e); });
  return managerFor(resolveCredentials({ manager_url: p.manager_url, username: p.username, password, insecure: p.insecure }));
}

/** Removes every snapshot the job recorded it made (any attempt), by its reference; one already gone is fine.
 *  Runs with its own time limit, so it works after a cancel aborted the job's signal. Returns what it did. */
export async function removeRecordedSnapshots(ctx: Pick<OpContext, 'store' | 'spec' | 'log'>, m: Manager): Promise<string[]> {
  const did: string[] = [];
  for (const s of await warmSnapshots(ctx.store.redis, ctx.store.k, ctx.spec.job_id)) {
    try {
      await removeSnapshot(m, { type: 'VirtualMachineSnapshot', value: s.snapshot }, AbortSignal.timeout(STOP_TIMEOUT_MS));
      did.push(`snapshot ${s.snapshot} of round ${s.round} removed`);
    } catch (e) {
      if (!gone(e)) throw e;
      did.push(`snapshot ${s.snapshot} of round ${s.round} was already gone`);
    }
    await forgetSnapshot(ctx.store.redis, ctx.store.k, ctx.spec.job_id, s.snapshot);
  }
  return did;
}

/** The VM checked (running, no snapshot Ferry did not make), CBT on, each disk's raw target volume placed by one
 *  pass's rule (a local dir pool, the space checked, the volume in the ledger before it exists) and created sparse. */
async function prepare(ctx: OpContext, p: WarmParameters, m: Manager, dir: string, place: (disks: PlannedDisk[]) => Promise<void>) {
  const d = await vmDetail(m, p.vm_path);
  if (d.power_state !== 'poweredOn') {
    throw new OperationError(`${p.vm_path} is ${d.power_state}: a warm migration copies a running VM; migrate it cold (without options.warm)`, false);
  }
  if (d.snapshots.length) {
    throw new OperationError(`${p.vm_path} has ${d.snapshots.length} snapshot(s) Ferry did not make (${d.snapshots.map((s) => s.name).join(', ')}): `
      + 'its disks are delta chains, which a warm round cannot copy by changed areas; remove them first (preflight rule warm_snapshots)', false);
  }
  let cbtByFerry = false;
  if (!(await cbtEnabled(m, d.moref))) {
    if (!p.warm.enable_cbt) {
      throw new OperationError(`changed-block tracking is off on ${p.vm_path} and options.warm.enable_cbt is false: `
        + 'enable it on the VM, or let Ferry (enable_cbt true)', false);
    }
    await enableCbt(m, d.moref, ctx.signal);
    cbtByFerry = true;
    await ctx.progress('preparing', 0, `enabled changed-block tracking on ${p.vm_path} (options.warm.enable_cbt)`);
  }
  const planned: PlannedDisk[] = d.disks.map((disk, i) => {
    const at = parseDatastorePath(disk.file_path);
    const f = { ...at, dcPath: d.datacenter, size: disk.capacity_bytes, local: path.join(dir, `disk${i}.warm`) };
    return { disk, top: f, files: [], chainLength: disk.chain.length, extent: { ...f } };
  });
  await place(planned);
  const targets = planned.map((x) => {
    if (!x.extent?.target) {
      throw new OperationError(`disk ${x.disk.label}: a warm migration writes its rounds into a raw volume in a local dir pool, `
        + `and ${x.fallback ?? 'this pool is not one'}`, false);
    }
    return x.extent.target;
  });
  for (const [i, t] of targets.entries()) {
    const fh = await fs.open(t, 'a');
    try { await fh.truncate(d.disks[i].capacity_bytes); } finally { await fh.close(); }
  }
  return { d, targets, cbtByFerry };
}

/** One round: a snapshot (recorded the moment it exists), each disk's changed areas since the previous round's
 *  change id ("*" in round 1: every allocated area), only those copied into its volume, then the previous snapshot
 *  removed by its recorded reference. */
async function copyRound(r: Run, n: number): Promise<WarmRound> {
  const { ctx, m } = r;
  const t0 = Date.now();
  const snap = await createSnapshot(m, r.vm, `ferry-warm-${ctx.spec.job_id}-round-${n}`, {
    signal: ctx.signal,
    onCreated: (ref) => recordSnapshot(ctx.store.redis, ctx.store.k, ctx.spec.job_id, {
      vm: r.vm.value, snapshot: ref.value, round: n, at: new Date().toISOString(),
    }),
  });
  const snapshotAt = new Date().toISOString();
  let overhead = (Date.now() - t0) / 1000, copySeconds = 0, changed = 0, copied = 0;
  for (const [i, disk] of r.d.disks.entries()) {
    const sd = snap.disks.find((x) => x.key === disk.key);
    if (!sd?.change_id) {
      throw new OperationError(`round ${n}: the snapshot of ${r.p.vm_path} has no change id for disk ${disk.label}: `
        + 'changed-block tracking is not active on it', false);
    }
    const q0 = Date.now();
    const { areas } = await changedAreas(m, r.vm, snap.ref, sd, n === 1 ? '*' : r.changeIds[i]);
    overhead += (Date.now() - q0) / 1000;
    changed += areas.reduce((a, x) => a + x.length, 0);
    const c0 = Date.now();
    copied += (await copyAreas(m, {
      dcPath: r.d.datacenter, disk: sd, areas, target: r.targets[i], streams: r.p.parallel_downloads, signal: ctx.signal,
    })).bytes_fetched;
    copySeconds += (Date.now() - c0) / 1000;
    r.changeIds[i] = sd.change_id;
  }
  if (r.prev) {
    const x0 = Date.now();
    await removeSnapshot(m, r.prev.ref, ctx.signal);
    await forgetSnapshot(ctx.store.redis, ctx.store.k, ctx.spec.job_id, r.prev.ref.value);
    overhead += (Date.now() - x0) / 1000;
  }
  r.prev = snap;
  return {
    round: n, snapshot_at: snapshotAt, changed_bytes: changed, bytes_copied: copied, copy_seconds: copySeconds, overhead_seconds: overhead,
    seconds: (Date.now() - t0) / 1000,
  };
}

/** A forced power-off takes about a second; a guest shutdown, as long as it takes (a tenth of its timeout guessed). */
const powerOffGuess = (p: WarmParameters) => (p.power_off === 'force' ? 1 : Math.min(60, (p.shutdown_timeout_seconds ?? 300) / 10));

const predictNow = (r: Run) => predictDowntime({ rounds: r.state.rounds, now: Date.now(), stages: r.stages, powerOffSeconds: powerOffGuess(r.p) });

/** Why to cut over now, or null: a manual request (POST /plans/{id}/cutover), options.warm.cutover_at reached, or
 *  (after two rounds, so that a change rate was measured) the predicted downtime within the budget, inside the
 *  plan's window when the job has one. */
async function cutoverDue(r: Run): Promise<string | null> {
  const req = await cutoverRequest(r.ctx.store.redis, r.ctx.store.k, r.ctx.spec.job_id);
  if (req) return `cutover requested${req.by ? ` by ${req.by}` : ''} at ${req.at}`;
  const w = r.p.warm;
  if (w.cutover_at && Date.now() >= Date.parse(w.cutover_at)) return `options.warm.cutover_at ${w.cutover_at} reached`;
  if (w.downtime_budget_seconds === undefined || r.state.rounds.length < 2) return null;
  const pr = predictNow(r);
  r.state.prediction = pr;
  if (!pr || pr.seconds > w.downtime_budget_seconds) return null;
  const until = r.p.plan?.not_after;
  if (until && Date.now() + pr.seconds * 1000 > until) return null;
  return `predicted downtime ${pr.seconds} s is within options.warm.downtime_budget_seconds ${w.downtime_budget_seconds} s`;
}

/** Waits out the precopy interval (checking for a cutover every second); returns the cutover's reason, or null
 *  when the next round is due. */
async function waitForNext(r: Run): Promise<string | null> {
  const due = Date.now() + r.p.warm.precopy_interval * 1000;
  let shown = 0;
  for (;;) {
    const why = await cutoverDue(r);
    if (why) return why;
    if (Date.now() >= due) return null;
    if (Date.now() - shown >= 5000) {
      shown = Date.now();
      r.state.prediction = predictNow(r);
      await publish(r, `waiting ${Math.ceil((due - Date.now()) / 1000)} s for round ${r.state.rounds.length + 1}`);
    }
    await sleep(Math.min(1000, Math.max(0, due - Date.now())), r.ctx.signal);
  }
}

/** The state into the job record and a progress event (the plan view, the events and the metrics read them). */
async function publish(r: Run, message: string) {
  await writeWarmState(r.ctx.store.redis, r.ctx.store.k, r.ctx.spec.job_id, r.state);
  const last = r.state.rounds[r.state.rounds.length - 1];
  const pr = r.state.prediction;
  await r.ctx.progress('warm', 0, message, {
    rounds: r.state.rounds.length,
    ...(last ? {
      last_round_changed_bytes: last.changed_bytes, last_round_bytes_copied: last.bytes_copied, last_round_seconds: Math.round(last.seconds * 100) / 100,
    } : {}),
    ...(pr ? {
      predicted_downtime_seconds: pr.seconds, change_rate_bytes_per_second: pr.change_rate_bytes_per_second,
      copy_rate_bytes_per_second: pr.copy_rate_bytes_per_second,
    } : {}),
  });
}

/** The source powered off as options.power_off says (warm jobs never have "none"); already off is fine. */
async function powerOffSource(r: Run) {
  const { m, p, ctx } = r;
  const st = (await vmDetail(m, p.vm_path)).power_state;
  if (st === 'poweredOff') return `${p.vm_path} was already powered off`;
  if (p.power_off === 'shutdown') {
    await shutdownGuest(m, p.vm_path);
    await waitPoweredOff(m, r.vm, p.vm_path, (p.shutdown_timeout_seconds ?? 300) * 1000, ctx.signal);
    return `${p.vm_path} powered off after its guest shutdown (options.power_off=shutdown)`;
  }
  await powerOff(m, p.vm_path, ctx.signal);
  return `powered off ${p.vm_path} (options.power_off=${p.power_off}; it was ${st})`;
}

/** Cutover's copy: the power-off, the last delta from a snapshot taken after it, and no snapshot left. */
async function cutoverCopy(r: Run, reason: string) {
  r.state.status = 'cutting_over';
  r.state.prediction = predictNow(r);
  r.state.cutover = { reason };
  await publish(r, `cutover: ${reason}; predicted downtime ${r.state.prediction?.seconds ?? '?'} s`);
  const off0 = Date.now();
  const action = await powerOffSource(r);
  await r.ctx.progress('warm', 0, action);
  const offAt = Date.now();
  const last = await copyRound(r, r.state.rounds.length + 1);
  r.state.rounds.push(last);
  await removeRecordedSnapshots(r.ctx, r.m);
  r.prev = null;
  r.state.cutover = {
    reason, powered_off_at: new Date(offAt).toISOString(), last_delta_bytes: last.bytes_copied,
    last_delta_seconds: Math.round(((Date.now() - offAt) / 1000) * 100) / 100,
  };
  await publish(r, `last delta: ${last.bytes_copied} bytes after the power-off; every snapshot Ferry made is removed`);
  return { action, poweredOffAt: offAt, powerOffSeconds: (offAt - off0) / 1000 };
}

/** Undoes what a warm job changed on the source when it does not complete: its snapshots removed, and CBT turned
 *  back off when Ferry turned it on (the VM keeps running, as it was). */
async function undoSource(r: Run | null, ctx: OpContext, m: Manager | null) {
  if (!m) return;
  const did: string[] = await removeRecordedSnapshots(ctx, m).catch((e) => {
    ctx.log.error(
      'a warm job\'s snapshots could not all be removed; its record (warm_snapshots) still lists them and its next attempt or rollback removes them',
      { job_id: ctx.spec.job_id, error: (e as Error).message },
    );
    return [];
  });
  if (r?.cbtByFerry) {
    const off = async () => waitForTask(
      m,
      moref(await m.call('ReconfigVM_Task', r.vm, `<spec>${el('changeTrackingEnabled', false)}</spec>`))!,
      `turning changed-block tracking back off on ${r.vm.value}`,
      AbortSignal.timeout(STOP_TIMEOUT_MS),
    );
    await off().then(() => did.push('changed-block tracking turned back off'), dropped(
      ctx.log, 'changed-block tracking stays on the source VM (harmless; turn it off by hand if unwanted)', { job_id: ctx.spec.job_id },
    ));
  }
  if (did.length) ctx.log.info('warm job ended without cutover; source restored', { job_id: ctx.spec.job_id, did });
}

/** Seconds of the stages after the copy, from when each phase was first seen. */
export function phaseClock(ctx: OpContext) {
  const first = new Map<string, number>();
  const wrapped: OpContext = {
    ...ctx,
    progress: (phase, pct, msg, det) => {
      if (!first.has(phase)) first.set(phase, Date.now());
      return ctx.progress(phase, pct, msg, det);
    },
  };
  return {
    ctx: wrapped,
    stages: (copied: number, end: number): StageSeconds | null => {
      const imp = first.get('import'), boot = first.get('boot');
      if (imp === undefined || boot === undefined) return null;
      return { repair: (imp - copied) / 1000, import: (boot - imp) / 1000, boot: (end - boot) / 1000 };
    },
  };
}

/** A cold migration, its repair, import and boot seconds recorded for warm migrations' predictions. */
export async function measured(ctx: OpContext, copy: (c: OpContext) => Promise<ExportResult>, after: After): Promise<Record<string, unknown>> {
  const clock = phaseClock(ctx);
  const exported = await copy(clock.ctx);
  const copied = Date.now();
  const res = await after(clock.ctx, exported);
  const st = clock.stages(copied, Date.now());
  const beside = (res as { repair_beside_copy?: ReturnType<typeof besideCopyResult> }).repair_beside_copy;
  // Beside the copy, the stage after it is only the repair's tail (16 s of 79 in bench:warm); a warm cutover runs
  // the repair whole after the last delta, so the whole repair is what a prediction needs.
  const span = beside?.repair;
  const whole = span?.finished_at ? Date.parse(span.finished_at) - Date.parse(span.started_at) : 0;
  if (st) Object.assign(st, { repair: Math.max(st.repair, whole / 1000), from: 'cold' as const });
  if (st) {
    await recordStageTimes(ctx.store.redis, ctx.store.k, st)
      .catch(dropped(ctx.log, 'this migration\'s stage times are left out of warm predictions', { job_id: ctx.spec.job_id }));
  }
  return { ...res, ...(st ? { stage_seconds: st } : {}) };
}

/** Rounds until a cutover is due. */
async function rounds(r: Run) {
  for (let n = 1; ; n++) {
    await r.ctx.progress('warm', 0, n === 1
      ? `round 1: the whole disk as of a snapshot, while ${r.p.vm_path} runs`
      : `round ${n}: the changes since round ${n - 1}`);
    r.state.rounds.push(await copyRound(r, n));
    r.state.prediction = predictNow(r);
    const last = r.state.rounds[n - 1];
    await publish(r, `round ${n} done: ${last.bytes_copied} bytes copied of ${last.changed_bytes} changed, in ${Math.round(last.seconds * 10) / 10} s`);
    const why = await waitForNext(r);
    if (why) return why;
  }
}

/** The warm job: rounds, cutover, then the stages after the copy (`after`, the cold path's), with the prediction
 *  and the measured downtime (power-off to the boot milestone) in the result. */
export async function migrateWarm(
  ctx: OpContext, o: { p: WarmParameters; dir: string; place: (disks: PlannedDisk[]) => Promise<void>; after: After },
): Promise<Record<string, unknown>> {
  const t0 = Date.now();
  let m: Manager | null = null;
  let r: Run | null = null;
  try {
    m = await connect(ctx, o.p);
    const earlier = await removeRecordedSnapshots(ctx, m);
    if (earlier.length) await ctx.progress('preparing', 0, `what an earlier attempt made on the source: ${earlier.join('; ')}`);
    const prep = await prepare(ctx, o.p, m, o.dir, o.place);
    const stages = await recentStageTimes(ctx.store.redis, ctx.store.k);
    r = {
      ctx, p: o.p, m, vm: prep.d.moref, d: prep.d, dir: o.dir, targets: prep.targets, prev: null, changeIds: [],
      state: { status: 'copying', rounds: [], prediction: null }, stages, cbtByFerry: prep.cbtByFerry,
    };
    const reason = await rounds(r);
    const cut = await cutoverCopy(r, reason);
    const exported = await buildWarmManifest({
      d: r.d, targets: r.targets, dir: o.dir, exportId: ctx.spec.job_id, actions: [cut.action],
      seconds: (Date.now() - t0) / 1000, bytes: r.state.rounds.reduce((a, x) => a + x.bytes_copied, 0),
    });
    return await finish(r, cut, exported, o.after);
  } catch (e) {
    if (r) r.state.status = ctx.signal.aborted ? 'cancelled' : 'failed';
    // Before the power-off the source only lost its snapshots; after it, a plan's rollback powers it back on.
    await undoSource(r?.state.cutover?.powered_off_at ? null : r, ctx, m);
    if (r) {
      await writeWarmState(ctx.store.redis, ctx.store.k, ctx.spec.job_id, r.state)
        .catch(dropped(ctx.log, 'the warm state shows the last round', { job_id: ctx.spec.job_id }));
    }
    throw asOperationError(e);
  }
}

/** Repair, import and boot; the downtime split measured. */
async function finish(r: Run, cut: { poweredOffAt: number; powerOffSeconds: number }, exported: ExportResult, after: After) {
  const copied = Date.now();
  const clock = phaseClock(r.ctx);
  const res = await after(clock.ctx, exported);
  const end = Date.now();
  const st = clock.stages(copied, end);
  if (st) st.from = 'warm';
  if (st) {
    await recordStageTimes(r.ctx.store.redis, r.ctx.store.k, st)
      .catch(dropped(r.ctx.log, 'this migration\'s stage times are left out of warm predictions', { job_id: r.ctx.spec.job_id }));
  }
  const round2 = (x: number) => Math.round(x * 100) / 100;
  r.state.status = 'completed';
  r.state.downtime = {
    seconds: round2((end - cut.poweredOffAt) / 1000 + cut.powerOffSeconds),
    parts: {
      power_off: round2(cut.powerOffSeconds), last_delta: round2((copied - cut.poweredOffAt) / 1000),
      repair: round2(st?.repair ?? 0), import: round2(st?.import ?? 0), boot: round2(st?.boot ?? 0),
    },
  };
  await publish(r, `downtime ${r.state.downtime.seconds} s (predicted ${r.state.prediction?.seconds ?? '?'} s)`);
  return { ...res, ...(st ? { stage_seconds: st } : {}), warm: r.state };
}
