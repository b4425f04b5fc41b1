import { useLibvirt, releaseLibvirt, defineGuest } from '../test/helpers/libvirt';
import { openConsole, Virsh } from '../shared/libvirt';
(async () => {
  const lv = await useLibvirt();
  try {
    await defineGuest(lv, 'c1');
    await lv.virsh(['start', 'c1', '--paused']);
    const v = new Virsh(lv.uri);
    const con = openConsole(v, 'c1');
    let text = '';
    con.on('ready', () => console.log('READY'));
    con.on('data', (t: string) => { text += t; });
    con.on('close', (c: any, e: any) => console.log('CLOSE', c, e));
    await new Promise((r) => setTimeout(r, 2000));
    await v.run(['resume', 'c1']);
    const t0 = Date.now();
    while (!text.includes('FERRY-GUEST-READY') && Date.now() - t0 < 90000) await new Promise((r) => setTimeout(r, 200));
    console.log('marker after', Date.now() - t0);
    await new Promise((r) => setTimeout(r, 1000));
    con.write('echo hi\r');
    await new Promise((r) => setTimeout(r, 3000));
    console.log(JSON.stringify(text.slice(-600)));
    con.close();
  } finally { await releaseLibvirt(); }
})();
