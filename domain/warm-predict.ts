// Warm migration's prediction (issue 37 item 3): the downtime of a cutover now, from what this VM's rounds measured
// (how fast its disks change, how fast Ferry copies) and what recent migrations measured for the stages after the
// copy (repair, import, boot). Pure: the worker feeds it, the job result, the plan view and the metrics show it.

/** One copy round of a warm migration (round 1 is the full copy). */
export interface WarmRound {
  round: number;
  /** when its snapshot was taken */
  snapshot_at: string;
  /** bytes QueryChangedDiskAreas listed (round 1: every allocated area) */
  changed_bytes: number;
  /** bytes fetched into the target volumes */
  bytes_copied: number;
  copy_seconds: number;
  /** snapshot, query and removal of the previous snapshot: what any round costs besides its copy */
  overhead_seconds: number;
  seconds: number;
}

/** Measured seconds of the stages after the copy, of one migration. `from`: a warm cutover's (the repair whole, after
 *  the last delta, reading the local volumes) or a cold migration's (the repair's whole span, beside the copy, reading
 *  the source through nbdkit: slower, so only a fallback for a warm repair); none recorded: cold. */
export interface StageSeconds { repair: number; import: number; boot: number; from?: 'warm' | 'cold' }

export interface Prediction {
  seconds: number;
  /** its parts: power-off, the last delta's copy and the round's own overhead, repair, import, boot */
  parts: { power_off: number; last_delta: number; repair: number; import: number; boot: number };
  change_rate_bytes_per_second: number;
  copy_rate_bytes_per_second: number;
  /** bytes the last delta would copy if cut over now */
  expected_delta_bytes: number;
  /** where repair, import and boot came from: "measured: median of N recent migrations" or the defaults */
  basis: string;
  at: string;
}

export interface WarmState {
  status: 'copying' | 'cutting_over' | 'completed' | 'failed' | 'cancelled';
  rounds: WarmRound[];
  prediction: Prediction | null;
  /** why and when the cutover began, the last delta, and the measured downtime (power-off to the boot milestone) */
  cutover?: { reason: string; powered_off_at?: string; last_delta_bytes?: number; last_delta_seconds?: number };
  downtime?: { seconds: number; parts: { power_off: number; last_delta: number; repair: number; import: number; boot: number } };
}

/** With no migration measured yet on this Ferry: conservative guesses, named as such in `basis`. */
export const DEFAULT_STAGE_SECONDS: StageSeconds = { repair: 120, import: 15, boot: 90 };

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};

/** The downtime of a cutover now: the power-off (a forced one is about a second; a guest shutdown as the VM's
 *  shutdown took before, else its timeout's tenth), the changes since the last snapshot at the last round's change
 *  rate copied at the rounds' copy rate plus a round's overhead, and the stages after it. */
export function predictDowntime(o: { rounds: WarmRound[]; now: number; stages: StageSeconds[]; powerOffSeconds: number }): Prediction | null {
  const r = o.rounds;
  if (!r.length) return null;
  const last = r[r.length - 1];
  const copied = r.reduce((a, x) => a + x.bytes_copied, 0);
  const copySec = r.reduce((a, x) => a + x.copy_seconds, 0);
  const copyRate = copySec > 0 ? copied / copySec : 0;
  // The change rate: the last delta round's listed bytes over the time between its snapshot and the one before.
  let changeRate = 0;
  if (r.length >= 2) {
    const span = (Date.parse(last.snapshot_at) - Date.parse(r[r.length - 2].snapshot_at)) / 1000;
    changeRate = span > 0 ? last.changed_bytes / span : 0;
  }
  const since = Math.max(0, (o.now - Date.parse(last.snapshot_at)) / 1000);
  const delta = Math.round(changeRate * since);
  const overheads = r.slice(1).map((x) => x.overhead_seconds).concat(r.length === 1 ? [last.overhead_seconds] : []);
  const lastDelta = (copyRate > 0 ? delta / copyRate : 0) + median(overheads);
  const stages = stageTerms(o.stages);
  const parts = { power_off: o.powerOffSeconds, last_delta: lastDelta, repair: stages.repair, import: stages.import, boot: stages.boot };
  const round2 = (x: number) => Math.round(x * 100) / 100;
  return {
    seconds: round2(parts.power_off + parts.last_delta + parts.repair + parts.import + parts.boot),
    parts: {
      power_off: round2(parts.power_off), last_delta: round2(parts.last_delta), repair: round2(parts.repair), import: round2(parts.import),
      boot: round2(parts.boot),
    },
    change_rate_bytes_per_second: Math.round(changeRate), copy_rate_bytes_per_second: Math.round(copyRate), expected_delta_bytes: delta,
    basis: stages.basis,
    at: new Date(o.now).toISOString(),
  };
}

/** Repair, import and boot from recent migrations: the repair from warm cutovers' own repairs when there are any (a
 *  cold repair ran beside its copy reading the source: 102.8 s against a warm 39.8 s in bench:warm), import and
 *  boot from every migration; the defaults before any. */
function stageTerms(all: StageSeconds[]): StageSeconds & { basis: string } {
  const d = DEFAULT_STAGE_SECONDS;
  if (!all.length) return { ...d, basis: `repair ${d.repair} s, import ${d.import} s, boot ${d.boot} s: defaults, no migration measured yet on this Ferry` };
  const warm = all.filter((s) => s.from === 'warm');
  const repairs = warm.length ? warm : all;
  return {
    repair: median(repairs.map((s) => s.repair)), import: median(all.map((s) => s.import)), boot: median(all.map((s) => s.boot)),
    basis: `repair: median of ${warm.length ? `the ${warm.length} warm cutovers'` : `the ${all.length} cold migrations' whole`} repairs`
      + `${warm.length ? '' : ' (no warm cutover measured yet)'}; import and boot: median of the ${all.length} most recent migrations `
      + 'measured on this Ferry',
  };
}
