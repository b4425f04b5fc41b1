// The end of every run, also a failed one: temporary files removed when nothing is placed, and report.json
// (docs/report-schema.json) built and written beside the outputs.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { placeOutput } from '../../../platform/roots';
import { expectedError } from '../../../platform/log';
import { errorText } from '../../../platform/errors';
import type { GuestSession } from '../guestfs';
import { STAGES, Run, Work } from './run';

/** Removes what a run left under temporary names (outputs, repair overlays), closing the appliance first. */
export async function cleanup(work: Work[], session?: GuestSession) {
  if (session && !session.closed) await session.close();
  for (const w of work) { await fs.rm(w.tmp, { force: true }); if (w.fixOverlay) await fs.rm(w.fixOverlay, { force: true }); }
}

export function buildReport(run: Run) {
  const { m, stages, work, errors, failed, dry, written } = run;
  const ran = STAGES.filter((s) => stages[s].success !== null);
  return {
    report_version: '1.0', manifest_version: m.manifest_version, tool: run.opts.tool || 'ferry-convert',
    started_at: new Date(run.t0).toISOString(), finished_at: new Date().toISOString(), duration_seconds: (Date.now() - run.t0) / 1000,
    dry_run: dry, success: !failed, ...(failed ? { retryable: run.retryable, failures: run.failures } : {}), source: m.source || {}, stages,
    artifacts: written ? work.map((w) => w.artifact) : [],
    ...(run.firmware ? { firmware: run.firmware } : {}),
    ...(run.testBootResult ? { test_boot: run.testBootResult } : {}),
    warnings: [...(m.warnings || []).map((x) => `export ${x.stage}: ${x.message}`), ...run.warnings], errors,
    summary: {
      disks: work.length, stages_run: ran, stages_failed: ran.filter((s) => stages[s].success === false),
      total_source_bytes: work.reduce((a, w) => a + (w.sourceVirtual || 0), 0),
      total_output_bytes: !written ? 0 : work.reduce((a, w) => a + Number(w.artifact.file_size || 0), 0),
      timings: Object.fromEntries(Object.entries(run.timings).map(([k, v]) => [k, Math.round(v * 1000) / 1000])),
      message: failed ? `failed: ${errors[0]}`
        : dry ? `dry run: ${work.length} disk(s) would be converted; nothing written` : `${work.length} disk(s) migrated`,
    },
  };
}

/** report.json under options.report.path (not for a dry run); a write that fails is one more error in it. */
/** What runPipeline answers: report.json's content, with where it was written. */
export type PipelineReport = ReturnType<typeof buildReport> & { report_path?: string };

export async function writeReport(run: Run, report: PipelineReport) {
  const { m, dir, opts } = run;
  if (!m.options.report.enabled || run.dry || !dir) return;
  const rp = path.resolve(dir, m.options.report.path);
  await fs.mkdir(path.dirname(rp), { recursive: true }).catch(expectedError('the report write below fails with the cause, which goes into the report errors'));
  const tmp = path.join(path.dirname(rp), `.${path.basename(rp)}.partial`);
  await fs.writeFile(tmp, JSON.stringify(report, null, 2) + '\n')
    .then(() => placeOutput(tmp, rp, { field: 'report', overwrite: opts.overwrite !== false, claims: opts.claims }))
    .catch(async (e: unknown) => { await fs.rm(tmp, { force: true }); report.errors.push(`report: cannot write ${rp}: ${errorText(e)}`); });
  report.report_path = rp;
}
