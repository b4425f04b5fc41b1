// The test boot's verdict at its timeout (domain/converter/boot-judge.ts timeoutVerdict), on console text as
// guests print it: a stall is called failed, and the detail says what the console last showed, including the
// kernel's hung-task report when a task waited on I/O that never completed (seen once under TCG: the first read
// of the virtio disk never answered, and the boot sat there until the timeout).
import { expect } from 'chai';
import { timeoutVerdict } from '../../domain/converter/boot-judge';

const MARKER = /FERRY-GUEST-READY/;

describe('the test boot at its timeout', () => {
  it("a kernel stuck on I/O: failed, naming the blocked task and the console's last line", () => {
    const text = [
      '[    7.255238] virtio_blk virtio1: [vda] 6291456 512-byte logical blocks (3.22 GB/3.00 GiB)',
      '[  363.403979] INFO: task (udev-worker):109 blocked for more than 120 seconds.',
      '[  363.409395] Call Trace:',
      '[ 1450.891072] INFO: task (udev-worker):109 blocked for more than 1208 seconds.',
      '[ 1450.943082]  </TASK>',
    ].join('\n');
    const v = timeoutVerdict(text, MARKER, false, 1800, 'bios');
    expect(v.status).to.equal('failed');
    expect(v.detail).to.include('the guest kernel reported task (udev-worker) blocked for more than 1208 s, waiting on I/O that did not complete');
    expect(v.detail).to.include('its last line: "[ 1450.943082]  </TASK>"');
  });

  it('without a hung task the detail says nothing of one; a userspace line makes it inconclusive', () => {
    const v = timeoutVerdict('[    1.0] Run /init as init process\n[  OK  ] Started Journal Service.\n', MARKER, false, 60, 'bios');
    expect(v.status).to.equal('inconclusive');
    expect(v.detail).to.not.include('blocked');
    expect(timeoutVerdict('', MARKER, false, 60, 'uefi')).to.deep.include({ status: 'failed' });
  });
});
