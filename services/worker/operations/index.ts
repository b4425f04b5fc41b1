// What each operation named in shared/operations.ts runs on a worker.
import type { Operation } from './types';
import { convert, cleanupConvert } from './convert';
import { noop } from './noop';
import { migrate, cleanupMigrate } from './migrate';
import { remoteUnavailable } from './remote';
import { importKvm } from './import';

export const IMPLEMENTATIONS: Record<string, { run: Operation; cleanup?: (spec: any, includeOutput: boolean) => Promise<void> }> = {
  convert: { run: convert, cleanup: cleanupConvert },
  noop: { run: noop },
  import_kvm: { run: importKvm },
  migrate: { run: migrate, cleanup: cleanupMigrate },
  export: { run: remoteUnavailable },
  migrate_vm: { run: remoteUnavailable },
};
