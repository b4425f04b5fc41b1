// Loaded by .mocharc.json in mocha's main process and in each parallel worker: every reused or fresh proof
// (test/helpers/proofs.ts) appends a line to one log, FERRY_PROOF_LOG (set here once, inherited by the workers), and
// the main process prints the log as a summary when the run ends, before the reporter's closing line
// (`N passed, N failed, N skipped` stays the last line: the summary is written as the runner announces the end,
// ahead of the reporter's own listener on that event).
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Mocha from 'mocha';
import type { ProofLogLine } from './proofs';

process.env.FERRY_PROOF_LOG ||= path.join(mkdtempSync(path.join(os.tmpdir(), 'ferry-proofs-')), 'proofs.log');
const LOG = process.env.FERRY_PROOF_LOG;
// The process that loads this first is mocha's main one; the parallel workers inherit this and print nothing (each
// worker's runner ends once per file).
process.env.FERRY_PROOF_MAIN_PID ||= String(process.pid);
const MAIN = process.env.FERRY_PROOF_MAIN_PID === String(process.pid);

function logged(): ProofLogLine[] {
  try { return readFileSync(LOG, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as ProofLogLine); } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return []; // no proof ran
    throw e;
  }
}

/** The run's proofs: which were reused (from which commit and when), which ran fresh. */
export function proofSummary(lines: ProofLogLine[]): string {
  if (!lines.length) return '';
  const reused = lines.filter((l) => l.outcome === 'reused');
  const fresh = lines.filter((l) => l.outcome !== 'reused');
  const out = [`\nProofs: ${reused.length} reused from records (not run again), ${fresh.length} run fresh.`];
  for (const l of reused) out.push(`  reused ${l.name}: recorded ${l.at} at commit ${l.commit} (that run took ${l.seconds.toFixed(0)} s)`);
  for (const l of fresh) out.push(`  ${l.outcome} ${l.name}: ran in ${l.seconds.toFixed(0)} s at commit ${l.commit}, recorded`);
  if (reused.length) out.push('  (FERRY_FRESH_PROOFS=1 runs every proof fresh)');
  return `${out.join('\n')}\n`;
}

// The runner of the main process (serial or parallel) emits EVENT_RUN_END once; the summary goes out first.
const { EVENT_RUN_END } = Mocha.Runner.constants;
type Emit = (this: Mocha.Runner, event: string | symbol, ...args: unknown[]) => boolean;
const proto = Mocha.Runner.prototype as unknown as { emit: Emit; ferryProofSummary?: true };
if (!proto.ferryProofSummary) {
  const emit = proto.emit;
  proto.ferryProofSummary = true;
  proto.emit = function (this: Mocha.Runner, event: string | symbol, ...args: unknown[]) {
    if (event === EVENT_RUN_END && MAIN) process.stdout.write(proofSummary(logged()));
    return emit.call(this, event, ...args);
  };
}
