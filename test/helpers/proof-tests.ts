// Several tests over one reused proof (test/helpers/proofs.ts): the proof runs, or its record is taken, once in a
// before hook; each check is a test of its own on that evidence; and the proof's check is all of them, so a record is
// written only when every one passed and a reuse re-asserts every one under its own title. A first test says whether
// the run itself (or the record) was had, so an error outside the checks (a run that threw) is reported once.
import { errorText } from '../../platform/errors';
import { reusedProof, type ProofSpec } from './proofs';

/** One test's title and its assertions on the evidence. */
export type Check<E> = readonly [title: string, check: (e: E) => void | Promise<void>];
/** Checks under a describe of their own title (their own `@vm` is the enclosing describe's). */
export interface CheckGroup<E> { title: string; checks: readonly Check<E>[] }

class ChecksFailed extends Error {}

/** Every check on `e`; fails naming each that failed. */
async function checkAll<E>(checks: readonly Check<E>[], e: E): Promise<void> {
  const failed: string[] = [];
  for (const [title, check] of checks) {
    try { await check(e); } catch (err) { failed.push(`${title}: ${errorText(err).split('\n')[0]}`); }
  }
  if (failed.length) throw new ChecksFailed(`${failed.length} check(s) failed:\n${failed.join('\n')}`);
}

export interface ProofTests<E> {
  /** The proof's spec, computed when the hook runs (a fixture it names may be built first, in `prepare`). */
  spec: () => ProofSpec | Promise<ProofSpec>;
  /** The fresh run: the stack, the actions and what was read; it stops what it started before it returns. */
  produce: () => Promise<E>;
  /** The title of the first test, which fails when the run itself did. */
  runTitle: string;
  checks: readonly Check<E>[];
  groups?: readonly CheckGroup<E>[];
}

/** Registers, inside the caller's describe, the hook that runs or reuses the proof, then one test per check. */
export function proofTests<E>(o: ProofTests<E>): void {
  /** The evidence the last check saw (the record's, or the fresh run's when the record failed or was absent). */
  let evidence: E | undefined;
  /** Why the proof did not pass, when it did not. */
  let failure: unknown;
  const all = [...o.checks, ...(o.groups ?? []).flatMap((g) => g.checks)];

  before(async () => {
    const fresh = () => { evidence = undefined; return o.produce(); };
    // A failure is kept, not thrown: each test then reports its own check on the evidence (or the run's error).
    await reusedProof(await o.spec(), fresh, async (e) => { evidence = e; await checkAll(all, e); }).catch((err: unknown) => { failure = err; });
  });

  it(o.runTitle, () => {
    // The checks' own failures are reported by their tests; anything else (a run that threw, no record) here.
    if (failure && !(failure instanceof ChecksFailed)) throw failure instanceof Error ? failure : new Error(errorText(failure));
  });
  const each = ([title, check]: Check<E>) => it(title, async () => {
    if (!evidence) throw failure instanceof Error ? failure : new Error(`no evidence: ${errorText(failure)}`);
    await check(evidence);
  });
  o.checks.forEach(each);
  for (const g of o.groups ?? []) describe(g.title, () => { g.checks.forEach(each); });
}
