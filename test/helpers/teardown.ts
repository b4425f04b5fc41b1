// Set-up and teardown steps on what may already be there, or may never have been made (a before hook that
// stopped early, a run interrupted before): libvirt's answers for exactly that case pass quietly; any other
// error is printed with the step that failed, and the hook goes on to its next step.
const EXPECTED = /not found|no (domain|network|storage pool) with matching|is not active|not running|already exists|already active|already in use|Target closed|has been closed/i;

/** A catch handler for a step whose thing may be absent (or present): `.catch(tolerate('net-destroy x'))`. */
export const tolerate = (step: string) => (e: Error): void => {
  if (!EXPECTED.test(e.message)) console.warn(`      (${step}: ${e.message.trim()})`);
};
