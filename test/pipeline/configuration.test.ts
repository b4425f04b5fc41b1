// configuration.users and configuration.network as pure functions: account file edits, field checks that name
// their path, and the text every network renderer writes. The guest I/O is covered by pipeline.test.ts.
import { expect } from 'chai';
import { planUsers, readUserSpecs, cryptPassword } from '../../domain/converter/users';
import { readInterfaces, render, disableIfupdownStanzas } from '../../domain/converter/network';

const PASSWD = 'root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\nbob:x:1000:1000:Bob:/home/bob:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n';
const SHADOW = 'root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\nbob:$6$old$hash:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n';
const GROUP = 'root:x:0:\nsudo:x:27:\nadm:x:4:bob\nbob:x:1000:\nnogroup:x:65534:\n';
const GSHADOW = 'root:*::\nsudo:*::\nadm:*::bob\nbob:!::\nnogroup:*::\n';

describe('configuration.users (pure)', () => {
  const collect = () => { const w: string[] = []; return { w, warn: (p: string, m: string) => w.push(`${p}: ${m}`) }; };

  it('creates a user with the next free uid, its own group, a locked password and group memberships', () => {
    const { w, warn } = collect();
    const specs = readUserSpecs({ alice: { groups: ['sudo', 'adm', 'missing'], ssh_authorized_keys: ['ssh-ed25519 AAAAC3Nza alice@laptop'] } }, warn);
    const { files, plans } = planUsers({ passwd: PASSWD, shadow: SHADOW, group: GROUP, gshadow: GSHADOW }, specs, {}, 20000, warn);
    expect(files.passwd).to.equal(`${PASSWD}alice:x:1001:1001::/home/alice:/bin/bash\n`);
    expect(files.shadow).to.equal(`${SHADOW}alice:!:20000:0:99999:7:::\n`);
    expect(files.group).to.equal('root:x:0:\nsudo:x:27:alice\nadm:x:4:bob,alice\nbob:x:1000:\nnogroup:x:65534:\nalice:x:1001:\n');
    expect(files.gshadow).to.equal('root:*::\nsudo:*::alice\nadm:*::bob,alice\nbob:!::\nnogroup:*::\nalice:!::\n');
    expect(plans[0]).to.deep.include({ name: 'alice', uid: 1001, gid: 1001, home: '/home/alice', created: true, group_created: true, groups_added: ['sudo', 'adm'] });
    expect(w).to.deep.equal(['configuration.users.alice.groups: group missing does not exist in the guest; not added']);
  });

  it('updates an existing user in place (password, shell) without a second line; leaves its uid alone with a warning', () => {
    const { w, warn } = collect();
    const hash = '$6$salt$abcdefghijklmnopqrstuv';
    const { files, plans } = planUsers({ passwd: PASSWD, shadow: SHADOW, group: GROUP }, readUserSpecs({ bob: { uid: 2000, shell: '/bin/zsh', password_hash: hash } }, warn), { bob: hash }, 20001, warn);
    expect(files.passwd.match(/^bob:/gm)).to.have.length(1);
    expect(files.passwd).to.contain('bob:x:1000:1000:Bob:/home/bob:/bin/zsh\n');
    expect(files.shadow).to.contain(`bob:${hash}:20001:0:99999:7:::\n`);
    expect(plans[0]).to.include({ created: false, uid: 1000 });
    expect(w).to.deep.equal(['configuration.users.bob.uid: bob exists with uid 1000; uid left unchanged']);
  });

  it('an explicit uid that is taken skips the account; a free one is used', () => {
    const { w, warn } = collect();
    const { files } = planUsers({ passwd: PASSWD, group: GROUP }, readUserSpecs({ carol: { uid: 1000 }, dave: { uid: 1500, home: '/srv/dave' } }, warn), {}, 1, warn);
    expect(files.passwd).not.to.contain('carol');
    expect(files.passwd).to.contain('dave:x:1500:1500::/srv/dave:/bin/bash\n');
    expect(w).to.deep.equal(['configuration.users.carol.uid: uid 1000 is taken by bob']);
  });

  it('rejects bad fields with their path and keeps the good accounts', () => {
    const { w, warn } = collect();
    const specs = readUserSpecs({
      'Bad Name': {}, ok: {}, e1: { uid: -1 }, e2: { groups: 'sudo' }, e3: { password: 'x', password_hash: '$6$a$b' }, e4: { password_hash: 'plaintext' },
      e5: { ssh_authorized_keys: ['not a key'] }, e6: { shell: 'bash' }, e7: 'yes', e8: { sudo: 'yes' },
    }, warn);
    expect(specs.map(([n]) => n)).to.deep.equal(['ok']);
    expect(w).to.deep.equal([
      'configuration.users.Bad Name: is not a valid user name (lower case letters, digits, _ and -, at most 32)',
      'configuration.users.e1.uid: must be a non-negative integer',
      'configuration.users.e2.groups: must be an array of strings',
      'configuration.users.e3.password: give password or password_hash, not both',
      'configuration.users.e4.password_hash: is not a crypt(3) hash ($6$..., $y$..., or ! / * to lock)',
      'configuration.users.e5.ssh_authorized_keys: every entry must be one public key line ("ssh-ed25519 AAAA... comment")',
      'configuration.users.e6.shell: must be an absolute path',
      'configuration.users.e7: must be an object',
      'configuration.users.e8.sudo: must be a boolean',
    ]);
    const w2: string[] = [];
    expect(readUserSpecs([{ name: 'x' }], (p, m) => w2.push(`${p}: ${m}`))).to.deep.equal([]);
    expect(w2).to.deep.equal(['configuration.users: must be an object keyed by user name']);
  });

  it('hashes a password with SHA-512 crypt through openssl (stdin, not argv)', async () => {
    const h = await cryptPassword('correct horse');
    expect(h).to.match(/^\$6\$[./A-Za-z0-9]+\$[./A-Za-z0-9]{86}$/);
    expect(await cryptPassword('correct horse')).not.to.equal(h); // salted
  });
});

describe('configuration.network (pure)', () => {
  const ifaces = () => readInterfaces({
    interfaces: [
      { mac: '00:50:56:AA:BB:01', addresses: ['10.0.0.5/24', 'fd00::5/64'], gateway4: '10.0.0.1', dns: ['10.0.0.2', '1.1.1.1'], mtu: 9000 },
      { name: 'eth1' },
    ],
  }, (p, m) => { throw new Error(`${p}: ${m}`); });

  it('reads interfaces: MAC normalised, dhcp4 defaults to true only without addresses', () => {
    expect(ifaces()).to.deep.equal([
      { name: undefined, mac: '00:50:56:aa:bb:01', dhcp4: false, addresses: ['10.0.0.5/24', 'fd00::5/64'], gateway4: '10.0.0.1', gateway6: undefined, dns: ['10.0.0.2', '1.1.1.1'], mtu: 9000 },
      { name: 'eth1', mac: undefined, dhcp4: true, addresses: [], gateway4: undefined, gateway6: undefined, dns: [], mtu: undefined },
    ]);
  });

  it('names every bad field by its path', () => {
    const w: string[] = [];
    const got = readInterfaces({ interfaces: [{}, { name: 'x'.repeat(16) }, { mac: 'zz' }, { name: 'a', addresses: ['10.0.0.5'] }, { name: 'b', dhcp4: false }, { name: 'c', gateway4: 'fd00::1' }, { name: 'd', dns: ['dns.example'] }, { name: 'e', mtu: 100 }, { name: 'ok' }] }, (p, m) => w.push(`${p}: ${m}`));
    expect(got.map((f) => f.name)).to.deep.equal(['ok']);
    expect(w).to.deep.equal([
      'configuration.network.interfaces[0].name: give name or mac (or both)',
      'configuration.network.interfaces[1].name: is not an interface name (at most 15 of A-Z a-z 0-9 _ . -)',
      'configuration.network.interfaces[2].mac: must look like 00:50:56:aa:bb:cc',
      'configuration.network.interfaces[3].addresses: must be an array of addresses with a prefix length ("10.0.0.5/24")',
      'configuration.network.interfaces[4].addresses: a static interface (dhcp4: false) needs at least one address',
      'configuration.network.interfaces[5].gateway4: must be an IPv4 address',
      'configuration.network.interfaces[6].dns: must be an array of IP addresses',
      'configuration.network.interfaces[7].mtu: must be an integer from 576 to 65535',
    ]);
  });

  it('netplan: one file, interfaces matched by MAC or name', () => {
    const [f] = render('netplan', ifaces());
    expect(f.path).to.equal('/etc/netplan/90-ferry.yaml');
    expect(f.mode).to.equal(0o600);
    expect(f.text).to.equal([
      "# Written by Ferry from the manifest's configuration.network.",
      'network:', '  version: 2', '  ethernets:',
      '    ferry0:', '      match:', '        macaddress: 00:50:56:aa:bb:01', '      dhcp4: false',
      '      addresses:', '        - 10.0.0.5/24', '        - fd00::5/64',
      '      routes:', '        - to: default', '          via: 10.0.0.1',
      '      nameservers:', '        addresses:', '          - 10.0.0.2', '          - 1.1.1.1', '      mtu: 9000',
      '    eth1:', '      match:', '        name: eth1', '      dhcp4: true', '',
    ].join('\n'));
  });

  it('systemd-networkd: a .network file per interface', () => {
    const fs = render('networkd', ifaces());
    expect(fs.map((f) => f.path)).to.deep.equal(['/etc/systemd/network/90-ferry-ferry0.network', '/etc/systemd/network/90-ferry-eth1.network']);
    expect(fs[0].text).to.contain('[Match]\nMACAddress=00:50:56:aa:bb:01\n\n[Network]\nAddress=10.0.0.5/24\nAddress=fd00::5/64\nGateway=10.0.0.1\nDNS=10.0.0.2\nDNS=1.1.1.1\n\n[Link]\nMTUBytes=9000\n');
    expect(fs[1].text).to.contain('[Match]\nName=eth1\n\n[Network]\nDHCP=ipv4\n');
  });

  it('NetworkManager: keyfiles (0600) with manual or auto ipv4', () => {
    const fs = render('networkmanager', ifaces());
    expect(fs[0]).to.include({ path: '/etc/NetworkManager/system-connections/ferry-ferry0.nmconnection', mode: 0o600 });
    expect(fs[0].text).to.match(/\[connection\]\nid=ferry-ferry0\nuuid=[0-9a-f-]{36}\ntype=ethernet\nautoconnect=true\n\n\[ethernet\]\nmac-address=00:50:56:AA:BB:01\nmtu=9000\n/);
    expect(fs[0].text).to.contain('[ipv4]\nmethod=manual\naddress1=10.0.0.5/24,10.0.0.1\ndns=10.0.0.2;1.1.1.1;\n\n[ipv6]\nmethod=manual\naddress1=fd00::5/64\n');
    expect(fs[1].text).to.contain('interface-name=eth1');
    expect(fs[1].text).to.contain('[ipv4]\nmethod=auto\n');
  });

  it('RHEL ifcfg: one file per interface', () => {
    const fs = render('ifcfg', ifaces());
    expect(fs[0].path).to.equal('/etc/sysconfig/network-scripts/ifcfg-ferry0');
    expect(fs[0].text).to.contain('DEVICE=ferry0\nHWADDR=00:50:56:aa:bb:01\nTYPE=Ethernet\nONBOOT=yes\nBOOTPROTO=none\nIPADDR=10.0.0.5\nPREFIX=24\nGATEWAY=10.0.0.1\nDNS1=10.0.0.2\nDNS2=1.1.1.1\nMTU=9000\nIPV6INIT=yes\nIPV6ADDR=fd00::5/64\n');
    expect(fs[1].text).to.contain('DEVICE=eth1\nTYPE=Ethernet\nONBOOT=yes\nBOOTPROTO=dhcp\n');
  });

  it('ifupdown: one interfaces.d file; clashing stanzas in /etc/network/interfaces are commented out', () => {
    const [f] = render('ifupdown', [{ name: 'ens3', dhcp4: false, addresses: ['10.0.0.5/24'], gateway4: '10.0.0.1', dns: ['10.0.0.2'] }, { name: 'ens4', dhcp4: true, addresses: [], dns: [] }]);
    expect(f.text).to.contain('auto ens3\nallow-hotplug ens3\niface ens3 inet static\n    address 10.0.0.5/24\n    gateway 10.0.0.1\n    dns-nameservers 10.0.0.2\n\nauto ens4\nallow-hotplug ens4\niface ens4 inet dhcp\n');
    const main = 'auto lo\niface lo inet loopback\n\nallow-hotplug ens3\niface ens3 inet dhcp\n    hostname old\n\nsource /etc/network/interfaces.d/*\n';
    const r = disableIfupdownStanzas(main, ['ens3']);
    expect(r.disabled).to.deep.equal(['ens3']);
    expect(r.text).to.equal('auto lo\niface lo inet loopback\n\n# ferry: allow-hotplug ens3\n# ferry: iface ens3 inet dhcp\n# ferry:     hostname old\n\nsource /etc/network/interfaces.d/*\n');
  });
});
