// A test boot's serial log is the only record of why a guest did not boot: kept in test/artifacts/ when a check
// on that boot fails (the boots themselves run in temp dirs that the tests remove).
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

export const ARTIFACTS = path.resolve(__dirname, '..', 'artifacts');

/** Runs `check`; when it throws, `consoleLog` is copied to test/artifacts/<name>.log and the error says where. */
export function keepOnFailure(name: string, consoleLog: string | undefined, check: () => void) {
  try { check(); } catch (e) {
    if (consoleLog && existsSync(consoleLog)) {
      mkdirSync(ARTIFACTS, { recursive: true });
      const kept = path.join(ARTIFACTS, `${name}.log`);
      copyFileSync(consoleLog, kept);
      (e as Error).message += `\n(serial log kept in ${kept})`; // check() throws chai's AssertionError
    }
    throw e;
  }
}

/** As keepOnFailure, for a serial log held as text (a reused proof's stored console): written to
 *  test/artifacts/<name>.log when `check` throws. */
export function keepTextOnFailure(name: string, consoleText: string | undefined, check: () => void) {
  try { check(); } catch (e) {
    if (consoleText) {
      mkdirSync(ARTIFACTS, { recursive: true });
      const kept = path.join(ARTIFACTS, `${name}.log`);
      writeFileSync(kept, consoleText, 'latin1');
      (e as Error).message += `\n(serial log kept in ${kept})`;
    }
    throw e;
  }
}
