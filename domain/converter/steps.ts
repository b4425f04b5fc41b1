// The converter's shape (virt-v2v's, one interface per OS family): a family is one ordered list of named steps,
// pre-checks first, each step able to hold because the ones before it are done. families.ts picks the family for a
// guest and runs its list; `ferry-convert --explain` prints the lists. Types only, plus the run of one list.
import type { GuestSession } from './guestfs';
import type { FixAction, FixOptions, FixResult, GuestInfo } from './types';
import type { FstabContext, FstabMode } from './fstab';

/** What every step of one repair sees: the guest, what was asked, the result so far and how to write. */
export interface FixRun {
  g: GuestSession; info: GuestInfo; o: FixOptions; r: FixResult; mode: FstabMode;
  act: (a: FixAction) => void; write: (p: string, t: string) => Promise<void>; backup: (p: string) => Promise<string | undefined>;
  log: (m: string) => void;
  /** Linux: every filesystem's identifiers (the device_ids step), for the fstab and the other rewrites. */
  ctx?: FstabContext;
  /** Linux: files the initramfs must carry (disk pins, NIC names), gathered by the steps before regen_initramfs. */
  baked: string[];
}

export interface ConverterStep {
  name: string;
  /** One line: what the step does (ferry-convert --explain). */
  does: string;
  /** A pre-check: it writes no file of the guest (a checker's preen mode may mend file system metadata, on the
   *  output, as the guest's own boot would), and a failure refuses the guest before any change. */
  precheck?: boolean;
  run(x: FixRun): Promise<void> | void;
}

export interface ConverterFamily {
  os: 'linux' | 'windows';
  title: string;
  steps: ConverterStep[];
}

/** Runs the family's steps in order; each one's name goes into r.steps as it starts, so a failed run's report
 *  says how far it went. */
export async function runSteps(family: ConverterFamily, x: FixRun): Promise<void> {
  for (const s of family.steps) {
    x.r.steps.push(s.name);
    await s.run(x);
  }
}
