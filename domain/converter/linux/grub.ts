// Step 6 (virt-v2v's bootloader#update after remap_block_devices): grub-mkconfig runs with the mended defaults
// (disk-pins.ts) where grub.cfg must list something new, and grub.cfg is read back and mended where it (or the
// generator) still names devices.
import type { LinuxFix } from './context';
import { edit } from './context';
import { rewriteKernelArgs } from '../fstab';
import { GRUB_TOOLS } from './tools';

/** grub-mkconfig with the mended defaults; then grub.cfg is read back and, if the generator still wrote device
 *  names (a GRUB_DEVICE it computed, a distribution script), the kernel lines are mended in place. */
export async function regenGrub(x: LinuxFix): Promise<void> {
  const { g, info, o, act } = x;
  const cfg = info.grub_config;
  const tool = GRUB_TOOLS.find((t) => t.cfg === cfg) || GRUB_TOOLS[0];
  const bin = await g.firstFile(tool.bin);
  // grub.cfg is generated again only when it must list something new (an image a kernel did not have, or no
  // grub.cfg at all): the images keep their names, and the kernel lines' device names are mended in place below,
  // which is what grub-mkconfig with the mended defaults writes (10-16 s of the repair under TCG otherwise).
  const cfgThere = !!cfg && (await g.isFile(cfg));
  if (bin && cfgThere && !x.initrdCreated) {
    act({ action: 'update_grub', status: 'skipped', detail: `${bin} not run: nothing ${tool.cfg} lists changed (every kernel keeps its image's name); `
      + "its root=/resume= arguments are mended in place, and the mended /etc/default/grub serves the guest's next grub-mkconfig" });
  } else if (!bin) {
    act({ action: 'update_grub', status: 'warning',
      detail: `grub-mkconfig is not installed in the guest (looked for ${tool.bin.join(', ')}); grub.cfg edited in place only` });
  } else if (o.dry_run) {
    act({ action: 'update_grub', status: 'would_do', detail: `would run ${bin} -o ${tool.cfg}` });
  } else {
    try {
      await g.cmd('command', `${bin} -o ${tool.cfg}`);
      x.r.modified = true;
      act({ action: 'update_grub', status: 'done', detail: `ran ${bin} -o ${tool.cfg}` });
    } catch (e) { act({ action: 'update_grub', status: 'warning', detail: `${bin} failed in the guest: ${(e as Error).message}` }); }
  }
  const final = cfg || (bin && (await g.isFile(tool.cfg)) ? tool.cfg : undefined);
  if (!final) { act({ action: 'update_grub', status: 'warning', detail: 'no GRUB configuration found (/boot/grub/grub.cfg, /boot/grub2/grub.cfg)' }); return; }
  const changed = await edit(x, final, 'update_grub', (t) => rewriteKernelArgs(t, 'stabilize-all', x.ctx));
  if (!changed && (!bin || cfgThere)) act({ action: 'update_grub', status: 'skipped', detail: `${final}: root=/resume= arguments are already stable` });
}
