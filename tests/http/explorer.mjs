// A headless-Chromium check of the page linattn-server serves at / (the
// reassociation explorer and the playground, server/assets/explorer.html).
//
//   node explorer.mjs BASE_URL SCREENSHOT_DIR
//   node explorer.mjs http://127.0.0.1:8080 /tmp/shots
//
// It drives the page as a person would and checks what the page shows:
//   - explorer, preset general, feature map elu1, prefix 1: #output is "1",
//     and the keys table marks the 3 other keys as outside the prefix;
//   - explorer, preset negative, feature map relu, every key: #output is
//     "Unavailable" and #denominator is "0";
//   - playground: a new session, a streamed generation of 8 tokens, the
//     session's position past 0; a fork, a generation on the fork, the
//     parent's position unchanged; both sessions deleted.
// Screenshots: explorer-general.png, explorer-negative.png, playground.png.
// Needs Debian's chromium (/usr/bin/chromium, or CHROMIUM=path) and
// `npm install` in this directory. Exits 0 when every check passed, 1 with
// the failed check otherwise; the whole run is bounded by 60 s.

import fs from 'node:fs';
import path from 'node:path';
import process from 'node:process';
import { chromium } from 'playwright-core';

const TOTAL_TIMEOUT_MS = 60_000;
const STEP_TIMEOUT_MS = 15_000;

const [baseArg, shotArg] = process.argv.slice(2);
if (!baseArg || !shotArg) {
  console.error('usage: node explorer.mjs BASE_URL SCREENSHOT_DIR');
  process.exit(2);
}
const base = baseArg.endsWith('/') ? baseArg : `${baseArg}/`;
const shots = path.resolve(shotArg);
fs.mkdirSync(shots, { recursive: true });

let browser = null;
const watchdog = setTimeout(() => {
  console.error(`FAIL: the check did not finish within ${TOTAL_TIMEOUT_MS / 1000} s`);
  if (browser) browser.close().catch(() => {});
  process.exit(1);
}, TOTAL_TIMEOUT_MS);

class CheckFailed extends Error {}

function check(condition, message) {
  if (!condition) throw new CheckFailed(message);
  console.log(`ok    ${message}`);
}

async function text(page, selector) {
  return (await page.locator(selector).textContent({ timeout: STEP_TIMEOUT_MS }))?.trim() ?? '';
}

// Sets the explorer's controls and waits until the page shows the result for
// exactly them (the section's data-query names what is shown).
async function explain(page, preset, featureMap, prefix) {
  await page.selectOption('#preset', preset);
  await page.selectOption('#feature-map', featureMap);
  const max = Number(await page.locator('#prefix').getAttribute('max'));
  const wanted = prefix === 'all' ? max : prefix;
  await page.locator('#prefix').evaluate((input, value) => {
    input.value = String(value);
    input.dispatchEvent(new Event('input', { bubbles: true }));
    input.dispatchEvent(new Event('change', { bubbles: true }));
  }, wanted);
  const query = new URLSearchParams({ preset, feature_map: featureMap, prefix: String(wanted) }).toString();
  await page.waitForFunction((q) => {
    const section = document.querySelector('#explorer');
    return section.dataset.query === q && section.dataset.state !== 'loading';
  }, query, { timeout: STEP_TIMEOUT_MS });
  const state = await page.locator('#explorer').getAttribute('data-state');
  if (state !== 'ready') {
    throw new CheckFailed(`explorer ${query}: the page shows an error: ${await text(page, '#explain-error')}`);
  }
  return { max, prefix: wanted };
}

async function sessionPosition(page) {
  const raw = await text(page, '#session-position');
  const position = Number(raw);
  if (!Number.isInteger(position)) throw new CheckFailed(`#session-position is not a whole number: "${raw}"`);
  return position;
}

// Fills the prompt, clicks Generate and waits for the stream to end.
async function generate(page, prompt) {
  await page.fill('#prompt', prompt);
  await page.fill('#max-tokens', '8');
  await page.fill('#temperature', '0');
  await page.click('#generate');
  // Busy first (or already done, for a very fast server), then idle again.
  await page.waitForFunction(() => document.querySelector('#playground').dataset.state === 'idle' &&
    document.querySelector('#generate').disabled === false, null, { timeout: STEP_TIMEOUT_MS });
  const error = await page.locator('#playground-error').isVisible()
    ? await text(page, '#playground-error') : '';
  if (error) throw new CheckFailed(`playground: generation failed: ${error}`);
  const completion = await page.locator('#completion').textContent();
  check(completion.length > 0, `playground: #completion streamed ${JSON.stringify(completion)}`);
  const status = await text(page, '#generation-status');
  check(status.startsWith('Done'), `playground: the generation finished (${status})`);
  return completion;
}

async function main() {
  const options = {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // As root Chromium's sandbox cannot start; /dev/shm is small in containers.
    args: [
      ...(typeof process.getuid === 'function' && process.getuid() === 0 ? ['--no-sandbox'] : []),
      '--disable-dev-shm-usage',
    ],
    timeout: STEP_TIMEOUT_MS,
  };
  browser = await chromium.launch(options);
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(error.message));
  page.on('console', (message) => {
    if (message.type() === 'error') console.log(`      (browser console) ${message.text()}`);
  });

  // ---- explorer
  const response = await page.goto(base, { waitUntil: 'load' });
  check(response && response.ok(), `GET ${base} answers ${response ? response.status() : 'nothing'}`);
  const type = response.headers()['content-type'] || '';
  check(type.startsWith('text/html'), `GET ${base} is text/html (${type})`);
  await page.waitForFunction(() => {
    const section = document.querySelector('#explorer');
    return section && section.dataset.state !== 'loading' && document.querySelector('#preset').options.length > 0;
  }, null, { timeout: STEP_TIMEOUT_MS });
  const presets = await page.locator('#preset option').evaluateAll((os) => os.map((o) => o.value));
  const maps = await page.locator('#feature-map option').evaluateAll((os) => os.map((o) => o.value));
  check(presets.includes('general') && presets.includes('negative'),
    `explorer: presets from /v1/explain/options: ${presets.join(', ')}`);
  check(maps.includes('elu1') && maps.includes('relu'), `explorer: feature maps: ${maps.join(', ')}`);

  const general = await explain(page, 'general', 'elu1', 1);
  check(general.max === 4, `explorer: general has 4 keys (the prefix range's max is ${general.max})`);
  check(await text(page, '#prefix-value') === '1', 'explorer: #prefix-value shows 1');
  const output = await text(page, '#output');
  check(output === '1', `explorer general/elu1/prefix 1: #output is "${output}" (expected "1")`);
  const numerator = await text(page, '#numerator');
  const denominator = await text(page, '#denominator');
  check(numerator === '5' && denominator === '5',
    `explorer general/elu1/prefix 1: numerator ${numerator}, denominator ${denominator} (expected 5 and 5)`);
  const reference = await text(page, '#reference');
  check(reference === '1', `explorer general/elu1/prefix 1: #reference is "${reference}"`);
  const softmax = await text(page, '#softmax-output');
  check(softmax === '1', `explorer general/elu1/prefix 1: #softmax-output is "${softmax}"`);
  const rows = await page.locator('#keys-table tbody tr').count();
  const outside = page.locator('#keys-table tbody tr.outside');
  const outsideTexts = await outside.allTextContents();
  check(rows === 4 && outsideTexts.length === 3 && outsideTexts.every((t) => t.includes('outside the prefix')),
    `explorer general/elu1/prefix 1: ${outsideTexts.length} of ${rows} key rows marked "outside the prefix" (expected 3 of 4)`);
  await page.locator('#explorer').screenshot({ path: path.join(shots, 'explorer-general.png') });

  const negative = await explain(page, 'negative', 'relu', 'all');
  check(negative.max === 3, `explorer: negative has 3 keys (the prefix range's max is ${negative.max})`);
  const negOutput = await text(page, '#output');
  check(negOutput === 'Unavailable', `explorer negative/relu/prefix 3: #output is "${negOutput}" (expected "Unavailable")`);
  const negDenominator = await text(page, '#denominator');
  check(negDenominator === '0', `explorer negative/relu/prefix 3: #denominator is "${negDenominator}" (expected "0")`);
  const negReference = await text(page, '#reference');
  check(negReference === 'Unavailable', `explorer negative/relu/prefix 3: #reference is "${negReference}"`);
  const negOutside = await page.locator('#keys-table tbody tr.outside').count();
  check(negOutside === 0, 'explorer negative/relu/prefix 3: no key row outside the prefix');
  await page.locator('#explorer').screenshot({ path: path.join(shots, 'explorer-negative.png') });

  // A link with the explorer's query opens there; an error answer (made up
  // here by intercepting one request) shows its message in #explain-error.
  const linkPage = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  linkPage.on('pageerror', (error) => pageErrors.push(error.message));
  await linkPage.goto(`${base}?preset=general&feature_map=elu1&prefix=2`, { waitUntil: 'load' });
  await linkPage.waitForFunction(() => document.querySelector('#explorer').dataset.state === 'ready',
    null, { timeout: STEP_TIMEOUT_MS });
  check(await text(linkPage, '#prefix-value') === '2', 'explorer: a link with ?prefix=2 opens at prefix 2');
  const message = 'prefix: made up by the test';
  await linkPage.route(/\/v1\/explain\?/, (route) => route.fulfill({
    status: 400,
    contentType: 'application/json',
    body: JSON.stringify({ error: { message, type: 'invalid_request_error', param: 'prefix', code: null } }),
  }));
  await linkPage.locator('#prefix').evaluate((input) => {
    input.value = '3';
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
  await linkPage.waitForFunction(() => document.querySelector('#explorer').dataset.state === 'error',
    null, { timeout: STEP_TIMEOUT_MS });
  const shown = await text(linkPage, '#explain-error');
  check(shown.includes(message), `explorer: a 400 answer shows in #explain-error ("${shown}")`);
  await linkPage.close();

  // ---- playground
  await page.waitForFunction(() => {
    const model = document.querySelector('#model');
    return model.options.length > 0 && model.value !== '';
  }, null, { timeout: STEP_TIMEOUT_MS });
  const model = await page.locator('#model').inputValue();
  check(model !== '', `playground: model "${model}" from /v1/models`);

  await page.click('#new-session');
  await page.waitForFunction(() => document.querySelector('#playground').dataset.session !== '' &&
    document.querySelector('#playground').dataset.state === 'idle', null, { timeout: STEP_TIMEOUT_MS });
  const first = await page.locator('#playground').getAttribute('data-session');
  check(first && (await text(page, '#session-id')) === first, `playground: new session ${first}`);
  check(await sessionPosition(page) === 0, 'playground: a new session stands at position 0');

  await generate(page, 'And God said, ');
  const firstPosition = await sessionPosition(page);
  check(firstPosition > 0, `playground: session ${first} stands at position ${firstPosition} after generating`);

  await page.click('#fork');
  await page.waitForFunction((parent) => {
    const section = document.querySelector('#playground');
    return section.dataset.session !== '' && section.dataset.session !== parent && section.dataset.state === 'idle';
  }, first, { timeout: STEP_TIMEOUT_MS });
  const fork = await page.locator('#playground').getAttribute('data-session');
  check(await sessionPosition(page) === firstPosition,
    `playground: fork ${fork} starts at its parent's position ${firstPosition}`);
  const radios = await page.locator('#sessions-list input[type="radio"]').count();
  check(radios === 3, `playground: the sessions list offers no session, ${first} and ${fork} (${radios} choices)`);

  await generate(page, ' And the earth');
  const forkPosition = await sessionPosition(page);
  check(forkPosition > firstPosition, `playground: the fork moved on to position ${forkPosition}`);
  await page.locator('#playground').screenshot({ path: path.join(shots, 'playground.png') });

  await page.locator(`#sessions-list input[value="${first}"]`).check();
  await page.waitForFunction((id) => document.querySelector('#playground').dataset.session === id &&
    document.querySelector('#playground').dataset.state === 'idle', first, { timeout: STEP_TIMEOUT_MS });
  const parentPosition = await sessionPosition(page);
  check(parentPosition === firstPosition,
    `playground: switched back to ${first}, still at position ${parentPosition} (the fork did not touch it)`);

  for (const id of [first, fork]) {
    await page.locator(`#sessions-list input[value="${id}"]`).check();
    await page.waitForFunction((want) => document.querySelector('#playground').dataset.session === want &&
      document.querySelector('#playground').dataset.state === 'idle', id, { timeout: STEP_TIMEOUT_MS });
    await page.click('#delete-session');
    await page.waitForFunction((gone) => document.querySelector('#playground').dataset.state === 'idle' &&
      !document.querySelector(`#sessions-list input[value="${gone}"]`), id, { timeout: STEP_TIMEOUT_MS });
    const error = await page.locator('#playground-error').isVisible() ? await text(page, '#playground-error') : '';
    check(error === '', `playground: deleted session ${id}${error ? ` (error: ${error})` : ''}`);
  }

  check(pageErrors.length === 0,
    `the page raised no uncaught exception${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
  console.log(`screenshots in ${shots}: explorer-general.png, explorer-negative.png, playground.png`);
}

try {
  await main();
  console.log('PASS');
  clearTimeout(watchdog);
  await browser.close();
  process.exit(0);
} catch (error) {
  console.error(`FAIL: ${error instanceof CheckFailed ? error.message : error.stack || error}`);
  clearTimeout(watchdog);
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
