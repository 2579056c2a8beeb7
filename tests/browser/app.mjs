// Drives the specasr Gradio app in Debian's headless Chromium, as a person would: upload a
// file, switch the mode, click Transcribe (and Compare), read the results off the page, and
// save a screenshot. Prints one JSON object on stdout; exits 1 on any failure.
//
//   node app.mjs URL AUDIO MODE SCREENSHOT [--compare]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [url, audio, mode, screenshot, ...flags] = process.argv.slice(2);
if (!screenshot) {
  console.error('usage: node app.mjs URL AUDIO MODE SCREENSHOT [--compare]');
  process.exit(2);
}
const TIMEOUT = 120_000; // ms for one decode on a busy 2-core machine
const loopback = new Set(['127.0.0.1', 'localhost', '[::1]']);
const profile = mkdtempSync(join(tmpdir(), 'specasr-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 900 },
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
const result = { external: [], errors: [] };
try {
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.protocol.startsWith('http') && !loopback.has(u.hostname)) result.external.push(r.url());
  });
  page.on('pageerror', (e) => result.errors.push(String(e)));
  await page.goto(url);
  await page.locator('#audio').getByRole('button', { name: 'Upload file' }).click();
  await page.locator('#audio input[type=file]').setInputFiles(audio);
  await page.locator('#audio audio, #audio [data-testid=waveform-controls]').first().waitFor({ state: 'attached' });
  await page.locator('#mode').getByLabel(mode, { exact: true }).check();
  await page.locator('#transcribe').click();
  const transcript = page.locator('#transcript textarea');
  await page.waitForFunction((el) => el.value.trim().length > 0, await transcript.elementHandle());
  result.transcript = await transcript.inputValue();
  result.stats = await page.locator('#stats').innerText();
  result.speculation = await page.locator('#speculation').innerText();
  // the plot of accepted draft tokens per verify step renders after the values arrive
  await page.locator('#accepted canvas, #accepted svg').first().waitFor({ timeout: 15_000 }).catch(() => {});
  result.plot = (await page.locator('#accepted canvas, #accepted svg').count()) > 0;
  if (flags.includes('--compare')) {
    await page.locator('#compare').click();
    await page.locator('#speedup').getByText('Speedup').waitFor();
    result.speedup = await page.locator('#speedup').innerText();
    result.reference = await page.locator('#reference').innerText();
    result.candidate = await page.locator('#candidate').innerText();
  }
  await page.screenshot({ path: screenshot, fullPage: true });
} catch (e) {
  console.error(String(e));
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(result));
