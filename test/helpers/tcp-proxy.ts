// A TCP proxy on a free loopback port in front of a server, for fault tests: it can cut connections after a
// number of bytes sent to the client, slow them down, and says how many bytes went through and how many
// connections are open. TLS passes through untouched (the client still verifies the server's certificate).
import net from 'node:net';

export interface ProxyControl {
  port: number;
  /** Bytes sent from the server to clients so far. */
  readonly bytesDown: number;
  readonly openConnections: number;
  readonly cuts: number;
  /** Cut each connection once it has carried this many bytes to the client, for the next `times` cuts. */
  cutAfter(bytes: number, times: number): void;
  /** Bytes per second per connection (0 = unlimited). */
  throttle(bytesPerSecond: number): void;
  close(): Promise<void>;
}

export async function startProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<ProxyControl> {
  let bytesDown = 0;
  let open = 0;
  let cuts = 0;
  let cutAt = 0;
  let cutsLeft = 0;
  let rate = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    open++;
    let carried = 0;
    const upstream = net.connect(targetPort, targetHost);
    sockets.add(client); sockets.add(upstream);
    const end = () => { client.destroy(); upstream.destroy(); };
    let closed = false;
    const onClose = () => { if (!closed) { closed = true; open--; } sockets.delete(client); sockets.delete(upstream); end(); };
    client.on('close', onClose); upstream.on('close', onClose);
    client.on('error', end); upstream.on('error', end);
    client.pipe(upstream);
    upstream.on('data', (chunk: Buffer) => {
      if (cutsLeft > 0 && carried + chunk.length > cutAt) {
        const keep = Math.max(0, cutAt - carried);
        if (keep) { client.write(chunk.subarray(0, keep)); bytesDown += keep; }
        cutsLeft--; cuts++;
        end();
        return;
      }
      carried += chunk.length;
      bytesDown += chunk.length;
      if (!client.write(chunk)) { upstream.pause(); client.once('drain', () => upstream.resume()); }
      if (rate > 0) {
        upstream.pause();
        setTimeout(() => { if (!upstream.destroyed) upstream.resume(); }, (chunk.length / rate) * 1000);
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as net.AddressInfo).port,
    get bytesDown() { return bytesDown; },
    get openConnections() { return open; },
    get cuts() { return cuts; },
    cutAfter(bytes, times) { cutAt = bytes; cutsLeft = times; },
    throttle(bps) { rate = bps; },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
