// The browser half of tests/serve_browser.rs: drives Debian's headless chromium with
// playwright-core (from $LAYERCACHE_PLAYWRIGHT, installed by scripts/test.sh) through the pages
// of a running `layercache serve`, and saves a screenshot of each step.
//
// usage: node check.cjs BASE_URL OUTDIR LOGIN_URL (the URL `layercache serve` printed)
// stdout: `CHROMIUM_PID <pid>` first (the Rust side kills that pid if this script dies), then
// `ok <step>` lines and `RESULT <json>`; exit 0 when every check passed.
'use strict';
const path = require('path');
const { chromium } = require(process.env.LAYERCACHE_PLAYWRIGHT || 'playwright-core');

const [base, outdir, loginUrl] = process.argv.slice(2);
const shot = (page, name) => page.screenshot({ path: path.join(outdir, name), fullPage: true });
const expect = (cond, what) => {
  if (!cond) throw new Error('check failed: ' + what);
};

const GOOD_SPEC = 'project = "web-demo"\n\n[[cache]]\nid = "npm"\npreset = "npm"\n';
// Two bad fields of one cache: both are listed (issue 24), the mountpoint as `run` refuses it.
const BAD_SPEC = GOOD_SPEC.replace('preset = "npm"', 'preset = "nope"\nmountpoint = "/etc"');

async function main() {
  // A fresh temporary profile (--user-data-dir) is made by playwright for every launch and
  // removed on close.
  const server = await chromium.launchServer({
    executablePath: process.env.LAYERCACHE_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  console.log('CHROMIUM_PID ' + server.process().pid);
  const result = {};
  try {
    const browser = await chromium.connect(server.wsEndpoint());
    const ctx = await browser.newContext({ viewport: { width: 1100, height: 800 } });
    const page = await ctx.newPage();

    // Without the token a page is the login form (401); the printed login URL logs in, sets an
    // HttpOnly, SameSite=Strict cookie (not the token) and lands on a URL without the token.
    const anon = await browser.newContext({ viewport: { width: 1100, height: 800 } });
    const ap = await anon.newPage();
    const refused = await ap.goto(base + '/projects/web-demo');
    expect(refused.status() === 401, 'a page without the token answers 401: ' + refused.status());
    expect((await ap.locator('h1').innerText()) === 'Log in', 'the login form is shown');
    expect((await ap.locator('section[data-cache]').count()) === 0, 'nothing of the project shows');
    await shot(ap, 'login.png');
    await anon.close();
    const token = new URL(loginUrl).searchParams.get('token');
    expect(token && token.length === 64, 'the login URL holds the token');
    await page.goto(loginUrl);
    expect(page.url() === base + '/', 'the login URL lands on the projects without the token: ' + page.url());
    const cookies = await ctx.cookies();
    expect(cookies.length === 1 && cookies[0].name.startsWith('layercache_session_') &&
      cookies[0].httpOnly && cookies[0].sameSite === 'Strict' && cookies[0].path === '/' &&
      cookies[0].value !== token, 'one HttpOnly SameSite=Strict session cookie: ' +
      JSON.stringify(cookies.map((c) => ({ ...c, value: c.value === token ? 'TOKEN' : '…' }))));
    console.log('ok login');

    // The project page: clear one key of node_modules, confirm, see it gone.
    await page.goto(base + '/projects/web-demo');
    const rows = page.locator('section[data-cache="node_modules"] tr[data-key]');
    expect((await rows.count()) === 2, 'two node_modules keys listed');
    await shot(page, 'project.png');
    const key = await rows.first().getAttribute('data-key');
    result.cleared_key = key;
    await rows.first().locator('a', { hasText: 'clear' }).click();
    await page.waitForURL(/\/clear\?/);
    expect((await page.locator('h1').innerText()).includes(key), 'confirmation names the key');
    await shot(page, 'confirm.png');
    await page.locator('button', { hasText: 'Clear' }).click();
    await page.locator('.notice').waitFor();
    expect((await page.locator('.notice').innerText()).includes('removed 1 layer'), 'notice');
    expect((await page.locator(`tr[data-key="${key}"]`).count()) === 0, 'the key is gone');
    expect((await rows.count()) === 1, 'one node_modules key left');
    await shot(page, 'cleared.png');
    console.log('ok clear');

    // The spec editor: a bad preset is shown next to its line; a good spec is saved.
    await page.goto(base + '/projects/web-demo/spec');
    await page.locator('textarea#spec').fill(BAD_SPEC);
    await page.locator('button[value="validate"]').click();
    const err = page.locator('.field-error[data-field="cache[0].preset"]');
    await err.waitFor();
    result.field_error = await err.innerText();
    expect(result.field_error.includes('unknown preset "nope"'), 'field error text');
    const marked = await page.locator('div.lines .err').allInnerTexts();
    expect(marked.length === 2 && marked[0].includes('preset = "nope"') &&
      marked[1].includes('mountpoint = "/etc"'), 'both erroneous lines are marked: ' + marked);
    const mp = page.locator('.field-error[data-field="cache[0].mountpoint"]');
    expect((await mp.count()) === 1 && (await mp.innerText()).includes('"/etc" is refused'),
      'the system-directory mountpoint is listed too');
    await shot(page, 'spec-error.png');
    await page.locator('textarea#spec').fill(GOOD_SPEC);
    await page.locator('button[value="save"]').click();
    await page.locator('.notice').waitFor();
    expect((await page.locator('.notice').innerText()).includes('Saved as version 1'), 'saved');
    console.log('ok spec');

    // The runs page and its chart, on a desktop and on a phone.
    await page.goto(base + '/projects/web-demo/runs');
    expect((await page.locator('svg#chart rect.prep').count()) >= 1, 'chart has bars');
    expect((await page.locator('svg#chart rect.saved').count()) >= 1, 'chart has saved bars');
    result.run_rows = await page.locator('table#runs tbody tr').count();
    await shot(page, 'runs.png');
    // A run's own page, from its link in the runs table (issue 24).
    const link = page.locator('table#runs a.run').first();
    const runId = await link.getAttribute('data-run');
    await link.click();
    await page.waitForURL(new RegExp('/runs/' + runId + '$'));
    expect((await page.locator('h1').innerText()).includes(runId), 'the run page names its run');
    const prepRows = page.locator('table#preparation tbody tr');
    result.run_caches = await prepRows.count();
    const first = prepRows.first();
    result.run_first_result = await first.locator('td[data-label="result"]').innerText();
    result.run_first_key = await first.locator('td[data-label="key"]').innerText();
    result.run_total = await page.locator('#run-total').innerText();
    result.run_id = runId;
    await shot(page, 'run.png');
    // At ~900 px a key breaks only at its '-'s (a few lines at most, never a column of letters)
    // and the table scrolls in its box, not the page.
    const mid = await browser.newContext({ viewport: { width: 900, height: 900 } });
    const p3 = await mid.newPage();
    await p3.goto(loginUrl);
    await p3.goto(base + '/projects/web-demo/runs/' + runId);
    const keySpan = p3.locator('table#preparation td[data-label="key"] .key').first();
    const keyBox = await keySpan.boundingBox();
    const lineH = await keySpan.evaluate((e) => parseFloat(getComputedStyle(e).lineHeight) || 20);
    result.run_key_lines_900 = keyBox ? Math.round(keyBox.height / lineH) : -1;
    expect(keyBox && keyBox.height <= 3 * lineH + 2, 'a key takes at most 3 lines at 900 px: ' + JSON.stringify(keyBox) + ' line ' + lineH);
    const midWidth = await p3.evaluate(() => document.documentElement.scrollWidth);
    expect(midWidth <= 900, 'the run page scrolls in its table box, not the page: ' + midWidth);
    await shot(p3, 'run-900.png');
    await mid.close();
    console.log('ok run');
    const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true });
    const p2 = await phone.newPage();
    await p2.goto(loginUrl);
    await p2.goto(base + '/projects/web-demo/runs');
    const box = await p2.locator('svg#chart').boundingBox();
    expect(box && box.width <= 390, 'the chart fits a phone');
    const overflow = await p2.evaluate(() => document.documentElement.scrollWidth);
    expect(overflow <= 390, 'the page does not scroll sideways on a phone: ' + overflow);
    await shot(p2, 'runs-phone.png');
    for (const [url, name] of [['/projects/web-demo', 'project-phone.png'], ['/', 'projects-phone.png'],
      ['/projects/web-demo/spec', 'spec-phone.png'], ['/projects/web-demo/runs/' + result.run_id, 'run-phone.png']]) {
      await p2.goto(base + url);
      const width = await p2.evaluate(() => document.documentElement.scrollWidth);
      expect(width <= 390, url + ' does not scroll sideways on a phone: ' + width);
      await shot(p2, name);
    }
    console.log('ok runs');
    await browser.close();
  } finally {
    await server.close();
  }
  console.log('RESULT ' + JSON.stringify(result));
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e && e.stack ? e.stack : e);
    process.exit(1);
  },
);
