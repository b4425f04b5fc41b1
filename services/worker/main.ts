// Worker process. Options (or environment):
//   --capabilities img_tool,nbd_access   FERRY_WORKER_CAPABILITIES (default img_tool)
//   --execution-mode PROCESS             FERRY_EXECUTION_MODE (PROCESS, CONTAINER, PRIVILEGED_CONTAINER)
//   --id NAME                            FERRY_WORKER_ID (default <hostname>-<pid>)
//   --concurrency N                      FERRY_WORKER_CONCURRENCY (default 1)
//   --call-slots N                       FERRY_WORKER_CALL_SLOTS (default 2: the daemon's virsh_call, beside the jobs)
//   --metrics-port N                     FERRY_WORKER_METRICS_PORT (0 = any free port; unset = none)
import '../../platform/check-settings'; // first: a bad setting stops the process before anything reads it
import os from 'node:os';
import { parseArgs } from 'node:util';
import { startWorker } from './runner';
import { config } from '../../platform/config';
import { onShutdown } from '../../platform/process';
import { allowedCapabilities, CAPABILITY_PATTERN, EXECUTION_MODES } from '../../platform/capabilities';
import { errorText } from '../../platform/errors';
import { logoutAll } from '../../domain/vsphere/client';
import { missingTools } from './tools';
import { setting } from '../../platform/settings';
import { missingWorkerFlags } from '../../platform/node-flags';

const { values } = parseArgs({
  options: {
    capabilities: { type: 'string' }, 'execution-mode': { type: 'string' }, id: { type: 'string' },
    concurrency: { type: 'string' }, 'call-slots': { type: 'string' }, 'metrics-port': { type: 'string' },
  },
});
// Options override the settings (platform/settings.ts: validated before this module runs, platform/check-settings.ts).
const caps = values.capabilities !== undefined ? values.capabilities.split(',').map((s) => s.trim()).filter(Boolean) : setting('FERRY_WORKER_CAPABILITIES');
const mode = values['execution-mode'] ?? setting('FERRY_EXECUTION_MODE');
const concurrency = values.concurrency !== undefined ? Number(values.concurrency) : setting('FERRY_WORKER_CONCURRENCY');
const callSlots = values['call-slots'] !== undefined ? Number(values['call-slots']) : setting('FERRY_WORKER_CALL_SLOTS');
const mp = values['metrics-port'] ?? setting('FERRY_WORKER_METRICS_PORT');

function die(msg: string): never { process.stderr.write(`worker: ${msg}\n`); process.exit(2); }
// Started some other way than Ferry's launchers (platform/node-flags.ts says why each flag is there): it runs, slower.
const unflagged = missingWorkerFlags(process.execArgv);
if (unflagged.length) {
  process.stderr.write(`worker: warning: started without ${unflagged.join(' ')}, so a disk copy costs V8 a full collection `
    + `every few MB received; run it as \`node ${unflagged.join(' ')} dist/services/worker/main.js\` (platform/node-flags.ts)\n`);
}
const unknown = caps.filter((c) => !CAPABILITY_PATTERN.test(c) || !allowedCapabilities().includes(c));
if (unknown.length) {
  die(`unknown capabilit${unknown.length > 1 ? 'ies' : 'y'} ${unknown.map((c) => `"${c}"`).join(', ')}: known are ${allowedCapabilities().join(', ')} `
    + '(others with FERRY_EXTRA_CAPABILITIES)');
}
if (!(EXECUTION_MODES as readonly string[]).includes(mode)) die(`--execution-mode must be one of ${EXECUTION_MODES.join(', ')}`);
if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 64) die('--concurrency must be an integer from 1 to 64');
if (!Number.isInteger(callSlots) || callSlots < 1 || callSlots > 16) die('--call-slots must be an integer from 1 to 16');

// What the capabilities need is checked before registering: a worker without it would take jobs and fail each.
const missing = missingTools(caps);
if (missing.length) {
  die('refusing to start: this host lacks what the declared capabilities need:\n'
    + `${missing.map((m) => `  - ${m.what}, needed by ${m.capability}`).join('\n')}\n`
    + '(install them, see scripts/programs.txt, or drop the capability from FERRY_WORKER_CAPABILITIES)');
}

// Running jobs get the grace period to finish (runner.stop); the exit is bounded 10 s after it. The vSphere
// sessions the jobs opened (exports, power actions) are logged out once the jobs are done.
startWorker({
  workerId: values.id ?? setting('FERRY_WORKER_ID') ?? `${os.hostname()}-${process.pid}`,
  capabilities: caps,
  executionMode: mode,
  concurrency,
  callSlots,
  metricsPort: mp === undefined || mp === '' ? undefined : Number(mp),
}).then((w) => onShutdown(async () => { try { await w.stop(); } finally { await logoutAll(); } }, (config.shutdownGraceSeconds + 10) * 1000))
  .catch((e: unknown) => die(`failed to start: ${errorText(e)}`));
