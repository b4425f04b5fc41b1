// Judging a boot from its serial console text, kept apart from how the VM is run (qemu directly in
// testboot.ts; a libvirt domain's console elsewhere) so every boot runner calls the same verdict. A failed boot
// is recognised as soon as the console shows it, not after the timeout: under TCG a boot stuck in the
// initramfs shell would otherwise cost the whole wait and then be called "inconclusive".

/** Console signs that a boot has failed for good, with a short reason each. Order: most specific first. */
export const FAILURE_SIGNS: { re: RegExp; reason: string }[] = [
  { re: /ALERT!\s+\S+ does not exist\.?\s+Dropping to a shell!?/, reason: 'the initramfs could not find the root device' },
  { re: /Gave up waiting for (?:root|suspend\/resume) (?:file system )?device/i, reason: 'the initramfs gave up waiting for the root device' },
  { re: /dracut-initqueue\[\d+\]: Warning: dracut-initqueue: starting timeout scripts|dracut(?:-initqueue)?\[\d+\]: Warning: Could not boot\.|Entering emergency mode\. Exit the shell to continue\./, reason: 'dracut could not boot the root device' },
  { re: /Dropping to a shell!?/, reason: 'the initramfs dropped to a shell' },
  { re: /^\(initramfs\)\s?/m, reason: 'the console stopped at the initramfs shell prompt' },
  { re: /Kernel panic - not syncing/, reason: 'kernel panic' },
  { re: /You are in emergency mode|Welcome to emergency mode!|Cannot open access to console, the root account is locked/, reason: 'systemd emergency mode' },
  { re: /You are in rescue mode|Welcome to rescue mode!/, reason: 'systemd rescue mode' },
  // A storage device only: a serial port that udev announces late (dev-ttyS0.device on a starved host) costs a
  // getty, not the boot, and the guest goes on to its milestones.
  { re: /Timed out waiting for device [^\n]*(?:root|\/dev\/(?:disk\/|mapper\/|[shv]d[a-z]|xvd|nvme|dm-|md\d))/, reason: 'systemd timed out waiting for a device' },
  { re: /^grub rescue> ?/m, reason: 'the GRUB rescue prompt (GRUB could not find its files)' },
  { re: /^grub> ?/m, reason: 'the GRUB command prompt (no usable menu entry)' },
  { re: /error: (?:no such (?:device|partition)|unknown filesystem|file '[^']+' not found)[^\n]*\n(?:[^\n]*\n)*?Press any key to continue/, reason: 'GRUB could not load the kernel' },
  { re: /No bootable device|Boot failed: not a bootable disk|No operating system found/i, reason: 'the firmware found no bootable disk' },
  // OVMF's own entry for a disk (named "UEFI <device>", unlike the guest's NVRAM entries, which it tries first)
  // starts \EFI\BOOT\BOOTX64.EFI: "Not Found" there means no loader the firmware can start on that disk (network
  // entries, "UEFI PXEv4 ..."/"UEFI HTTPv4 ...", are left out; no lookahead, for linear-time engines).
  { re: /BdsDxe: failed to load Boot[0-9A-F]{4} "UEFI (?:[^PH"]|P[^X"]|H[^T"])[^"]*" from [^\n]*: Not Found|UEFI Interactive Shell v[\d.]+|^Shell> ?|BdsDxe: No bootable option or device was found/m, reason: 'the UEFI firmware found no boot loader to start (no working NVRAM boot entry, no \\EFI\\BOOT\\BOOTX64.EFI)' },
];

/** The console with terminal escapes and non-printable bytes removed, as the judge and the report see it. */
export function printableConsole(raw: string): string {
  // eslint-disable-next-line no-control-regex -- matching terminal escapes and control bytes is this function's job
  return raw.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '').replace(/\x1b[()][A-Za-z0-9]/g, '').replace(/\r\n?/g, '\n').replace(/[^\x09\x0a\x20-\x7e]/g, '');
}

export type BootVerdict =
  | { status: 'passed'; matched: string; detail: string }
  | { status: 'failed'; matched: string; detail: string }
  | { status: 'running' };

/**
 * The verdict on the console so far: whichever the console shows first, the expected text or a sign of failure,
 * decides (a runner streams the console and stops at the first verdict, so this is also what it would have seen
 * line by line). Without either it is still `running`.
 */
export function judgeConsole(text: string, expect: RegExp): BootVerdict {
  const clean = printableConsole(text);
  const ok = new RegExp(expect.source, expect.flags.replace('g', '')).exec(clean);
  let fail: { at: number; text: string; reason: string } | undefined;
  for (const s of FAILURE_SIGNS) {
    const m = s.re.exec(clean);
    if (m && (!fail || m.index < fail.at)) fail = { at: m.index, text: m[0].trim(), reason: s.reason };
  }
  if (fail && (!ok || fail.at < ok.index)) return { status: 'failed', matched: fail.text, detail: `${fail.reason}: the serial console showed "${fail.text}"` };
  if (ok) return { status: 'passed', matched: ok[0], detail: `the serial console showed "${ok[0]}"` };
  return { status: 'running' };
}

/** How much console before a new chunk is judged again with it (from the start of its line). */
export const JUDGE_OVERLAP = 8192;

/**
 * The verdict after `added` characters arrived at the end of `text`: the console before them had no verdict, so
 * one now needs the new text, and only it and the JUDGE_OVERLAP before it are judged (from a line's start when one
 * is that near), not the whole console again. Each chunk then costs a bounded amount whatever a caller's pattern
 * costs per character (issue 18: a long console must not hold the worker's event loop); a match longer than the
 * overlap is no boot milestone.
 */
export function judgeAdded(text: string, added: number, expect: RegExp): BootVerdict {
  let from = Math.max(0, text.length - added - JUDGE_OVERLAP);
  if (from > 0) {
    const nl = text.lastIndexOf('\n', from);
    if (nl >= 0 && from - nl <= JUDGE_OVERLAP) from = nl + 1;
  }
  return judgeConsole(from ? text.slice(from) : text, expect);
}

/** Console lines that only a running userspace prints (an init system starting units), though not a milestone. */
const USERSPACE_SIGNS: RegExp[] = [/\[\s*OK\s*\] (?:Started|Reached target|Finished|Mounted|Listening on) /, /systemd\[1\]: /, /^INIT: version /, /Run \/sbin\/init as init process/];

/**
 * The verdict when the timeout passes with no verdict from the console: `inconclusive` only when the console shows
 * the guest running userspace (the detail quotes the last such line); a console with no boot milestone at all is
 * `failed`, whatever the firmware did (stayed silent, a hung loader). With `strict` (the caller's own milestone)
 * it is always `failed`. Either way the detail says what the console showed last.
 */
export function timeoutVerdict(
  text: string, expect: RegExp, strict: boolean, seconds: number, firmware: string,
): { status: 'failed' | 'inconclusive'; detail: string } {
  const lines = printableConsole(text).split('\n').map((l) => l.trim()).filter(Boolean);
  const seen = lines.length ? `; its last line: "${lines[lines.length - 1].slice(0, 200)}"` : '; it showed nothing at all';
  const userspace = [...lines].reverse().find((l) => USERSPACE_SIGNS.some((re) => re.test(l)));
  const head = `the serial console did not show ${expect} within ${seconds} s (${firmware} firmware; the VM was still running)${hungTask(lines)}`;
  if (strict) return { status: 'failed', detail: `${head}${seen}` };
  if (!userspace) return { status: 'failed', detail: `${head}: no boot milestone at all${seen}` };
  return { status: 'inconclusive', detail: `${head}; the guest runs userspace: the console showed "${userspace.slice(0, 200)}"${seen}` };
}

/** The kernel's hung-task report, when the console has one: a task stuck in uninterruptible sleep (waiting on I/O
 *  that never completed, for example the first read of a disk) is what a boot that stalls silently shows. */
function hungTask(lines: string[]): string {
  let last: RegExpExecArray | null = null;
  for (const l of lines) last = /INFO: task (\S+?):\d+ blocked for more than (\d+) seconds/.exec(l) ?? last;
  return last ? `; the guest kernel reported task ${last[1]} blocked for more than ${last[2]} s, waiting on I/O that did not complete` : '';
}
