// Headless Chromium for the dashboard tests: Debian's /usr/bin/chromium driven by playwright-core, a fresh
// profile in the test's temporary directory, nothing reaching outside (no sync, no component updates).
import path from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';

export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export const ARTIFACTS = path.resolve(__dirname, '..', 'artifacts');

export function launchChromium(profileDir: string, viewport = { width: 1360, height: 900 }): Promise<BrowserContext> {
  return chromium.launchPersistentContext(profileDir, { executablePath: '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS, viewport });
}
