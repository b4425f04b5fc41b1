// The fstab modes: one list, from which the manifest's and the converter config's joi schemas (and so their
// OpenAPI and error messages), the MigrationJob resource and the repair's TypeScript type all derive.
import Joi from 'joi';

/** Every mode, what it does, and which document accepts it (the manifest seed names three, the converter
 *  config three; `stabilize-all` is in both). `preserve` (config) means the same as `noop` (manifest). */
export const FSTAB_MODES = {
  'stabilize-all': { manifest: true, config: true, description: 'device names replaced by UUID=, else PARTUUID=, else LABEL=' },
  'bypath-only': { manifest: true, config: false, description: 'only /dev/disk/by-path entries replaced' },
  noop: { manifest: true, config: false, description: 'fstab left as it is' },
  'uuid-only': { manifest: false, config: true, description: 'device names replaced by UUID= only (left, with a warning, without one)' },
  preserve: { manifest: false, config: true, description: 'fstab left as it is (the manifest calls it noop)' },
} as const;
export type FstabMode = keyof typeof FSTAB_MODES;

const modes = (where: 'manifest' | 'config') => (Object.keys(FSTAB_MODES) as FstabMode[]).filter((m) => FSTAB_MODES[m][where]);
const describe = (list: FstabMode[]) => list.map((m) => `${m}: ${FSTAB_MODES[m].description}`).join('; ');

export const MANIFEST_FSTAB_MODES = modes('manifest');
export const CONFIG_FSTAB_MODES = modes('config');
/** `pipeline.fix.fstab_mode` of a manifest. */
export const manifestFstabMode = Joi.string().valid(...MANIFEST_FSTAB_MODES).description(describe(MANIFEST_FSTAB_MODES));
/** `fstab_mode` of the converter config file (and a MigrationJob's `spec.options.fstabMode`). */
export const configFstabMode = Joi.string().valid(...CONFIG_FSTAB_MODES).description(describe(CONFIG_FSTAB_MODES));
