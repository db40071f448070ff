// The dashboard with tokens on, in headless Chromium: the page asks for a token, refuses a
// wrong one, trades a right one for a session cookie (never putting it in a URL), and then
// shows keys and the live stream (whose EventSource can send no header: the cookie carries it).
// Usage: node dashboard-auth.mjs BASE_URL READ_TOKEN WRITE_TOKEN. Run by tests/it/browser.rs.
import { launch } from "./launch.mjs";
import { strict as assert } from "node:assert";

const [base, readToken, writeToken] = process.argv.slice(2);
const step = (what) => console.log("step:", what);

async function heartbeat(key) {
  const response = await fetch(base + "/v1/heartbeats", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer " + writeToken },
    body: JSON.stringify({ key, ttl_s: 600 }),
  });
  assert.equal(response.status, 200, await response.text());
}

const browser = await launch();
try {
  const page = await (await browser.newContext()).newPage();
  const urls = [];
  page.on("request", (request) => urls.push(request.url()));
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));

  step("the page asks for a token");
  await heartbeat("before-sign-in");
  await page.goto(base + "/");
  await page.waitForSelector("#signin:not([hidden])");

  step("a wrong token is refused");
  await page.fill("#signin-token", "ttlw_nobody_wrong");
  await page.click("#signin button");
  await page.waitForFunction(() => document.querySelector("#signin-error").textContent !== "");
  assert.equal(await page.isVisible("#signin"), true);

  step("a read token signs in: keys and the live stream appear");
  await page.fill("#signin-token", readToken);
  await page.click("#signin button");
  await page.waitForSelector("#signin", { state: "hidden" });
  await page.waitForSelector('#alive tr[data-key="before-sign-in"]');
  await page.waitForFunction(() => document.querySelector("#status").textContent === "live");
  await heartbeat("after-sign-in");
  await page.waitForSelector('#feed li[data-type="registered"][data-key="after-sign-in"]');

  assert.deepEqual(urls.filter((url) => url.includes("ttlw_")), [], "no token in any URL");
  const cookies = await page.context().cookies();
  const session = cookies.find((cookie) => cookie.name === "ttlwheel_session");
  assert.ok(session && session.httpOnly && session.sameSite === "Strict", JSON.stringify(cookies));
  assert.deepEqual(errors, [], "no script errors");
  console.log("ok: dashboard with auth works");
} finally {
  await browser.close();
}
