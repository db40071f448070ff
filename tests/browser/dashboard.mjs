// Drives the real dashboard of a running ttlwheel in headless Chromium (Debian's package).
// Usage: node dashboard.mjs BASE_URL OUT_DIR. Exits non-zero, with the reason, on any failure.
// Run by tests/it/browser.rs, which starts the server.
import { launch } from "./launch.mjs";
import { strict as assert } from "node:assert";

const [base, outDir] = process.argv.slice(2);
const step = (what) => console.log("step:", what);

async function heartbeat(body) {
  const response = await fetch(base + "/v1/heartbeats", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 200, await response.text());
}

const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, colorScheme: "light" });
  const page = await context.newPage();
  const foreign = [];
  page.on("request", (request) => {
    if (!request.url().startsWith(base)) foreign.push(request.url());
  });
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));

  step("open the page; it connects to the event stream");
  await page.goto(base + "/");
  await page.waitForSelector("#status.live", { timeout: 10_000 });

  step("register keys; they appear without a reload");
  const fleet = [
    { key: "checkout/api-1", service: "checkout", ttl_s: 60 },
    { key: "checkout/api-2", service: "checkout", ttl_s: 45 },
    { key: "checkout/worker-1", service: "checkout", ttl_ms: 4000 },
    { key: "search/node-1", service: "search", ttl_s: 30 },
    { key: "search/node-2", service: "search", ttl_s: 30 },
    { key: "payments/gw-1", service: "payments", ttl_ms: 90_000 },
    { key: "cron/nightly", ttl_s: 120 },
  ];
  for (const body of fleet) await heartbeat(body);
  for (const { key } of fleet) {
    await page.waitForSelector(`#alive tr[data-key="${key}"]`, { timeout: 10_000 });
  }
  await page.waitForSelector('#services tr[data-service="checkout"]', { timeout: 10_000 });
  for (const { key } of fleet) {
    await page.waitForSelector(`#feed li[data-type="registered"][data-key="${key}"]`);
  }

  step("choose a service: only its keys, with a live countdown");
  await page.click('#services tr[data-service="checkout"]');
  await page.waitForFunction(() => document.querySelectorAll("#alive tr[data-key]").length === 3);
  const alive = await page.$$eval("#alive tr[data-key]", (rows) => rows.map((r) => r.dataset.key));
  assert.deepEqual(alive.sort(), ["checkout/api-1", "checkout/api-2", "checkout/worker-1"]);
  const countdown = () => page.$eval('#alive tr[data-key="checkout/api-1"] td.countdown',
                                     (cell) => parseFloat(cell.textContent));
  const before = await countdown();
  await page.waitForTimeout(1200);
  const after = await countdown();
  assert.ok(after < before, `the countdown runs: ${before} then ${after}`);

  step("let one key expire: it leaves the alive list for the expired list and the feed");
  await page.waitForSelector('#feed li[data-type="expired"][data-key="checkout/worker-1"]', { timeout: 15_000 });
  await page.waitForSelector('#expired li[data-key="checkout/worker-1"]');
  await page.waitForFunction(() => !document.querySelector('#alive tr[data-key="checkout/worker-1"]'));
  await page.waitForFunction(() =>
    document.querySelector('#services tr[data-service="checkout"]')?.cells[2]?.textContent === "1");
  // Every alive key counts in the header, the one without a service too, and says so.
  await page.waitForFunction(() => document.querySelector("#total-alive").textContent === "6");
  assert.equal(await page.textContent("#without-service"), "(1 without a service)");
  assert.equal(await page.$eval('#services tr[data-service=""]', (row) => row.cells[1].textContent), "6");

  step("the guard: armed; an operator engages it, the page shows it, its button releases it");
  await page.waitForFunction(() => document.querySelector("#guard").textContent === "guard armed");
  const engaged = await fetch(base + "/v1/guard/engage", { method: "POST" });
  assert.equal(engaged.status, 200, await engaged.text());
  await page.waitForSelector('#feed li[data-type="guard.engaged"]');
  await page.waitForFunction(() => document.querySelector("#guard").textContent.startsWith("guard ENGAGED"));
  await page.click("#guard-release");
  await page.waitForSelector('#feed li[data-type="guard.released"]');
  await page.waitForFunction(() => !document.querySelector("#guard").textContent.startsWith("guard ENGAGED"));
  assert.ok(await page.$eval("#guard-release", (button) => button.hidden), "the button hides");

  step("screenshots, light and dark");
  await page.screenshot({ path: `${outDir}/dashboard.png` });
  const lightBackground = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  await page.emulateMedia({ colorScheme: "dark" });
  const darkBackground = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  assert.notEqual(lightBackground, darkBackground, "the dark theme applies");
  await page.screenshot({ path: `${outDir}/dashboard-dark.png` });

  assert.deepEqual(foreign, [], "the page requests nothing from elsewhere");
  assert.deepEqual(errors, [], "no script errors");
  console.log("ok: dashboard works in", await browser.version());
} finally {
  await browser.close();
}
