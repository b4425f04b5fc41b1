// Warm migration's prediction rule (domain/warm-predict.ts, docs/plans.md "Warm migration"): the downtime of a
// cutover now from a VM's measured rounds and recent migrations' measured stages. Pure arithmetic on figures a user
// can recompute by hand; the end-to-end figures are test/vsphere/warm.test.ts's and bench:warm's.
import { expect } from 'chai';
import { DEFAULT_STAGE_SECONDS, predictDowntime, type WarmRound } from '../../domain/warm-predict';

const MIB = 2 ** 20;
const t0 = Date.parse('2026-11-29T10:00:00Z');
const round = (n: number, atSeconds: number, changed: number, copied: number, copySeconds: number, overhead = 2): WarmRound => ({
  round: n, snapshot_at: new Date(t0 + atSeconds * 1000).toISOString(), changed_bytes: changed, bytes_copied: copied, copy_seconds: copySeconds, overhead_seconds: overhead, seconds: copySeconds + overhead,
});

describe('warm migration: the downtime prediction (issue 37 item 3)', () => {
  it('no round yet: no prediction', () => {
    expect(predictDowntime({ rounds: [], now: t0, stages: [], powerOffSeconds: 1 })).to.equal(null);
  });

  it('after one round the change rate is unknown (0): the last delta is a round\'s overhead, the stages the defaults, named', () => {
    const p = predictDowntime({ rounds: [round(1, 0, 1000 * MIB, 1000 * MIB, 100, 3)], now: t0 + 60_000, stages: [], powerOffSeconds: 1 })!;
    expect(p.change_rate_bytes_per_second).to.equal(0);
    expect(p.copy_rate_bytes_per_second).to.equal(10 * MIB);
    expect(p.parts).to.deep.equal({ power_off: 1, last_delta: 3, ...DEFAULT_STAGE_SECONDS });
    expect(p.seconds).to.equal(1 + 3 + DEFAULT_STAGE_SECONDS.repair + DEFAULT_STAGE_SECONDS.import + DEFAULT_STAGE_SECONDS.boot);
    expect(p.basis).to.match(/defaults, no migration measured/);
  });

  it('the last round\'s change rate over the time since its snapshot, at the rounds\' copy rate, plus the median stages', () => {
    // round 1: 1000 MiB in 100 s; round 2, 300 s later: 30 MiB changed (0.1 MiB/s), copied in 5 s; cutover 200 s after round 2
    const rounds = [round(1, 0, 1000 * MIB, 1000 * MIB, 100, 4), round(2, 300, 30 * MIB, 30 * MIB, 5, 2)];
    const stages = [{ repair: 50, import: 5, boot: 20 }, { repair: 70, import: 7, boot: 30 }, { repair: 60, import: 6, boot: 25 }];
    const p = predictDowntime({ rounds, now: t0 + 500_000, stages, powerOffSeconds: 1 })!;
    const copyRate = (1030 * MIB) / 105;
    expect(p.change_rate_bytes_per_second).to.equal(Math.round((30 * MIB) / 300));
    expect(p.expected_delta_bytes).to.equal(Math.round(((30 * MIB) / 300) * 200));
    expect(p.parts.last_delta).to.be.closeTo((20 * MIB) / copyRate + 2, 0.01);
    expect([p.parts.repair, p.parts.import, p.parts.boot]).to.deep.equal([60, 6, 25]);
    expect(p.seconds).to.be.closeTo(1 + (20 * MIB) / copyRate + 2 + 91, 0.02);
    expect(p.basis).to.match(/median of the 3 most recent migrations/);
  });

  it('the repair from warm cutovers\' own repairs when any are recorded (a cold repair ran beside its copy); import and boot from all', () => {
    const rounds = [round(1, 0, 1000 * MIB, 1000 * MIB, 100, 4), round(2, 300, 0, 0, 0, 2)];
    const cold = [{ repair: 100, import: 1, boot: 2, from: 'cold' as const }, { repair: 110, import: 3, boot: 4 }];
    const onlyCold = predictDowntime({ rounds, now: t0 + 300_000, stages: cold, powerOffSeconds: 0 })!;
    expect(onlyCold.parts.repair, 'no warm cutover yet: the cold repairs\' whole spans').to.equal(105);
    expect(onlyCold.basis).to.match(/median of the 2 cold migrations' whole repairs \(no warm cutover measured yet\)/);
    const warm = [{ repair: 40, import: 5, boot: 6, from: 'warm' as const }, { repair: 44, import: 7, boot: 8, from: 'warm' as const }];
    const p = predictDowntime({ rounds, now: t0 + 300_000, stages: [...warm, ...cold], powerOffSeconds: 0 })!;
    expect([p.parts.repair, p.parts.import, p.parts.boot]).to.deep.equal([42, 4, 5]);
    expect(p.basis).to.match(/repair: median of the 2 warm cutovers' repairs; import and boot: median of the 4 most recent migrations/);
  });
});
