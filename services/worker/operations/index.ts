// What each operation named in domain/operations.ts runs on a worker.
import type { Admit, Operation } from './types';
import type { JobStore } from '../../../queue/store';
import type { JobSpec } from '../../../domain/schemas/job';
import { convert, cleanupConvert } from './convert';
import { noop } from './noop';
import { migrate, cleanupMigrate } from './migrate';
import { cleanupImport, importKvm } from './import';
import { admitExport, cleanupExport, runExportOp } from './export';
import { admitMigration, migrateVm } from './migrate-vm';
import { guestPreflightOp } from './guest-preflight';
import { vmPower } from './vm-power';
import { removeSource, rollbackKvm } from './plan-effects';
import { virshCall } from './virsh-call';
import { virtClone } from './virt-clone';
import { virtFiles } from './virt-files';
import { virtConsole } from './virt-console';

export const IMPLEMENTATIONS: Record<string, {
  run: Operation; cleanup?: (spec: JobSpec, includeOutput: boolean, store: JobStore) => Promise<void>; admit?: Admit;
}> = {
  convert: { run: convert, cleanup: cleanupConvert },
  noop: { run: noop },
  import_kvm: { run: importKvm, cleanup: cleanupImport },
  migrate: { run: migrate, cleanup: cleanupMigrate },
  export: { run: runExportOp, cleanup: cleanupExport, admit: admitExport },
  migrate_vm: { run: migrateVm, cleanup: cleanupImport, admit: admitMigration },
  guest_preflight: { run: guestPreflightOp },
  vm_power: { run: vmPower },
  rollback_kvm: { run: rollbackKvm },
  remove_source: { run: removeSource },
  virsh_call: { run: virshCall },
  virt_clone: { run: virtClone },
  virt_files: { run: virtFiles, cleanup: cleanupImport },
  virt_console: { run: virtConsole },
};
