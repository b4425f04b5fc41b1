// A test boot's serial log is the only record of why a guest did not boot: kept in test/artifacts/ when a check
// on that boot fails (the boots themselves run in temp dirs that the tests remove).
import { copyFileSync, existsSync, mkdirSync } from 'node:fs';
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
