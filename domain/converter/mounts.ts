// Mounting the guest's file systems in the appliance, in one place: after inspection, and again after a step that
// had to unmount them (new XFS UUIDs, the file system checks).
import type { GuestSession } from './guestfs';
import { ignoreError } from '../../platform/log';

/** Mounts the guest's mount points, shortest first (/ before /boot). */
export async function mountGuest(g: GuestSession, mountpoints: Record<string, string>, readonly: boolean): Promise<void> {
  for (const mp of Object.keys(mountpoints).sort((a, b) => a.length - b.length)) {
    // A mount point the appliance cannot mount (a swap or foreign filesystem listed there) is left out; the
    // repairs read what they need and report what they could not find.
    await g.cmd(readonly ? 'mount-ro' : 'mount', mountpoints[mp], mp)
      .catch(ignoreError('could not mount a guest mount point in the appliance; inspection and repair go on without what it holds', { mountpoint: mp }));
  }
}
