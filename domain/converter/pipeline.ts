// The manifest-driven pipeline: inspect -> convert -> fix (on the converted output, one appliance for all
// disks) -> validate, then rename the outputs into place and write report.json (also when a stage fails).
// Sources are only ever read. Each step is its own file under stages/; this file is their order.
import type { Manifest } from '../schemas/manifest';
import { Run, PipelineOptions } from './stages/run';
import { planOutputs } from './stages/plan';
import { inspect } from './stages/inspect';
import { convert } from './stages/convert';
import { fix, overlaysForRepairOnly, startRepairBesideConvert, stopRepairBesideConvert } from './stages/fix';
import { validate } from './stages/validate';
import { placeOutputs, testBootOutputs } from './stages/place';
import { buildReport, cleanup, PipelineReport, writeReport } from './stages/report';

export { outputNames, stagesOf, STAGES } from './stages/run';
export type { PipelineOptions, StageName } from './stages/run';

export async function runPipeline(m: Manifest, opts: PipelineOptions = {}): Promise<PipelineReport> {
  const run = new Run(m, opts);
  try {
    await planOutputs(run);
    await run.stage('inspect', () => inspect(run));
    await startRepairBesideConvert(run);
    await run.stage('convert', () => convert(run));
    await overlaysForRepairOnly(run);
    // The convert stage failed: the repair running beside it has nothing to go into.
    if (run.stages.convert.success !== true) await stopRepairBesideConvert(run, 'the repair beside a failed conversion was stopped: its abort is expected');
    await run.stage('fix', (r) => fix(run, r));
    await run.stage('validate', () => validate(run));
    await placeOutputs(run);
    await testBootOutputs(run);
  } catch (e) {
    if (opts.signal?.aborted) { await cleanup(run.work, run.session); throw e; }
    run.fail((e as Error).message, e);
  } finally {
    // Whatever ended the run, the repair beside the conversion does not outlive it.
    await stopRepairBesideConvert(run, 'the repair beside the conversion: its outcome went into the fix stage, or it was stopped');
    if (run.session && !run.session.closed) await run.session.close();
  }
  if (run.failed || run.dry) await cleanup(run.work, undefined);
  const report = buildReport(run);
  await writeReport(run, report);
  return report;
}
