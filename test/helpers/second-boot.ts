// The guest tests' second boot (issue 34): Ferry's output boots first with the initramfs images it appended virtio
// to, and its first-boot unit rebuilds them with the guest's own generator; the next boot is on the generator's own
// image. Both boots run on a copy-on-write overlay of the output (the output itself is never written), the first
// until the unit says it is done, the second until the marker; then the overlay is read back in a read-only
// appliance: the units (the initramfs rebuild, the tools' removal), their scripts and links are gone, no source
// hypervisor package is installed, and each kernel's image (now the generator's, run on the
// booted guest after the repair: what the next kernel update does) holds every virtio module, read archive by
// archive as the kernel unpacks it. What it returns is evidence for a reused proof (plain data).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { testBoot, type TestBootOptions, type TestBootResult } from '../../domain/converter/testboot';
import { effectiveTree, InitrdParseError, readInitrd } from '../../domain/converter/initrd-image';
import { initrdProblems, moduleClosure, moduleName } from '../../domain/converter/linux/initrd-check';
import { REBUILD_DONE, REBUILD_FILES } from '../../domain/converter/linux/initrd-firstboot';
import { HV_PURGE } from '../../domain/converter/linux/hv-tools';
import { unitFiles } from '../../domain/converter/linux/firstboot-unit';
import { HV_TOOL_PACKAGES, VIRTIO_MODULES } from '../../domain/converter/linux/tools';

export interface Boot { result: TestBootResult; console: string }
/** One kernel's image after the second boot: its archives' compressions, whether the last one is the generator's
 *  (it holds /init; Ferry's appended archive never does), and what it lacks. */
export interface ImageAfter { kernel: string; image: string; compressions: string[]; lastHasInit: boolean; problems: string[]; modules: string[] }
/** `hvInstalled`: source hypervisor packages dpkg still lists as installed after both boots (the repair leaves their
 *  removal to the first boot). */
export interface TwoBoots { first: Boot; second: Boot; left: string[]; images: ImageAfter[]; hvInstalled: string[] }

/** A guest file's bytes through a temp file, or undefined when it is not a file. */
async function bytesOf(s: GuestSession, p: string, dir: string): Promise<Buffer | undefined> {
  if (!(await s.isFile(p))) return undefined;
  const local = path.join(dir, 'f');
  await s.cmd('download', p, local);
  return readFileSync(local);
}

/** Each kernel's image read back as the kernel unpacks it (an open session with the guest mounted). */
export async function imagesAfter(s: GuestSession, dir: string): Promise<ImageAfter[]> {
  const out: ImageAfter[] = [];
  for (const k of s.lines(await s.cmd('ls', '/lib/modules'))) {
    let image: string | undefined;
    for (const p of [`/boot/initrd.img-${k}`, `/boot/initramfs-${k}.img`]) if (!image && await s.isFile(p)) image = p;
    const img = image ? await bytesOf(s, image, dir) : undefined;
    if (!image || !img) { out.push({ kernel: k, image: image || '', compressions: [], lastHasInit: false, problems: ['no image'], modules: [] }); continue; }
    try {
      const archives = await readInitrd(img);
      const dep = (await bytesOf(s, `/lib/modules/${k}/modules.dep`, dir))?.toString('utf8') ?? '';
      const builtin = (await bytesOf(s, `/lib/modules/${k}/modules.builtin`, dir))?.toString('utf8') ?? '';
      const tree = effectiveTree(archives);
      out.push({ kernel: k, image, compressions: archives.map((a) => a.compression), lastHasInit: archives[archives.length - 1].entries.some((e) => e.name === 'init'),
        problems: initrdProblems(tree, k, moduleClosure(dep, builtin, VIRTIO_MODULES).files), modules: [...tree.keys()].filter((n) => /\.ko(\.\w+)?$/.test(n)).map(moduleName).sort() });
    } catch (e) {
      if (!(e instanceof InitrdParseError)) throw e;
      out.push({ kernel: k, image, compressions: [], lastHasInit: false, problems: [e.message], modules: [] });
    }
  }
  return out;
}

/**
 * Boots `output` (one disk or several, in order) twice on overlays in `dir` with `opts` (disks, firmware, NIC as the test's own boot): the first
 * until the first-boot unit is done, the second until `opts.expect`; `mount` mounts the guest's filesystems in the
 * read-only appliance that reads the overlay back.
 */
export async function bootTwice(output: string | string[], opts: Omit<TestBootOptions, 'disks'> & { expect: RegExp }, mount: (s: GuestSession) => Promise<void>, dir: string): Promise<TwoBoots> {
  // One overlay per disk (qcow2 outputs), in the outputs' order.
  const disks = (Array.isArray(output) ? output : [output]).map((o, i) => {
    const overlay = path.join(dir, `second-boot-${i}.qcow2`);
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', o, overlay]);
    return { path: overlay, format: 'qcow2' as const };
  });
  const boot = async (expect: RegExp, name: string): Promise<Boot> => {
    const log = path.join(dir, `${name}.log`);
    const result = await testBoot({ ...opts, disks, expect, persist: true, consoleLog: log });
    return { result, console: readFileSync(log, 'latin1') };
  };
  const first = await boot(new RegExp(REBUILD_DONE.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')), 'first-boot');
  const second = await boot(opts.expect, 'second-boot');
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'ferry-second-boot-'));
  const s = await GuestSession.open(disks, { readonly: true });
  try {
    await mount(s);
    const left: string[] = [];
    for (const f of [...REBUILD_FILES, ...unitFiles(HV_PURGE)]) if (await s.exists(f) || (await s.tryCmd('is-symlink', f))?.trim() === 'true') left.push(f);
    const status = (await bytesOf(s, '/var/lib/dpkg/status', tmp))?.toString('utf8') ?? '';
    const hvInstalled = HV_TOOL_PACKAGES.filter((p) => new RegExp(`^Package: ${p}\nStatus: install ok installed`, 'm').test(status));
    return { first, second, left, images: await imagesAfter(s, tmp), hvInstalled };
  } finally { await s.close(); rmSync(tmp, { recursive: true, force: true }); }
}

/** The assertions on bootTwice's evidence: the marker on both boots, the unit done on the first and gone after,
 *  every kernel's image the generator's own and holding every virtio module. */
export function checkTwoBoots(e: TwoBoots, marker: RegExp): void {
  expect(e.first.result, 'the first boot: the first-boot unit finished').to.include({ status: 'passed' });
  expect(e.first.console, 'the first boot printed the marker').to.match(marker);
  expect(e.second.result, 'the second boot, on the rebuilt image').to.include({ status: 'passed' });
  expect(e.second.result.matched).to.match(marker);
  expect(e.second.console, 'the unit ran once').not.to.contain('ferry-initramfs-rebuild');
  expect(e.second.console, 'the tools\' removal ran once').not.to.contain('ferry-hv-tools-purge');
  expect(e.left, 'the units, their scripts and their links are gone').to.deep.equal([]);
  expect(e.hvInstalled, 'the source hypervisor\'s tools removed at the first boot').to.deep.equal([]);
  expect(e.images.length, 'kernels read back').to.be.greaterThan(0);
  for (const i of e.images) {
    expect(i.problems, `${i.image} after the guest's own generator ran`).to.deep.equal([]);
    expect(i.lastHasInit, `${i.image} is the generator's own (no appended archive last): ${i.compressions.join(', ')}`).to.equal(true);
  }
}

/** The report's word that every kernel's image got the appended archive (none rebuilt in the appliance). */
export function expectAppended(actions: { action: string; [k: string]: unknown }[]): void {
  const regen = actions.filter((a) => a.action === 'regen_initramfs' && a.kernel);
  expect(regen.length, 'images handled').to.be.greaterThan(0);
  expect(regen.map((a) => [a.kernel, a.method, a.fallback])).to.deep.equal(regen.map((a) => [a.kernel, 'appended', undefined]));
}

/** The report's word that the source hypervisor's tools are removed at the first boot (checkTwoBoots sees them gone). */
export function expectHvRemovalAtBoot(actions: { action: string; [k: string]: unknown }[]): void {
  const at = actions.filter((a) => a.action === 'remove_source_hv_tools' && a.deferred_to_first_boot);
  expect(at.map((a) => a.status), 'the tools\' removal left to the first boot').to.deep.equal(['done']);
}
