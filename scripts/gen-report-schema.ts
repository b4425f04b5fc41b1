// Writes docs/report-schema.json from the joi schema that validates report.json (domain/schemas/report.ts), so
// the documented schema cannot drift from the code: `npx tsx scripts/gen-report-schema.ts` after a change;
// test/pipeline/manifest.test.ts fails when the file is stale.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { toJsonSchema } from '../platform/openapi';
import { reportSchema } from '../domain/schemas/report';

export const REPORT_SCHEMA_FILE = path.join(__dirname, '..', 'docs', 'report-schema.json');

export function reportJsonSchema(): string {
  return JSON.stringify({ $schema: 'http://json-schema.org/draft-07/schema#', title: 'Ferry pipeline report (report.json) 1.0', ...toJsonSchema(reportSchema) }, null, 2) + '\n';
}

if (require.main === module) writeFileSync(REPORT_SCHEMA_FILE, reportJsonSchema());
