// The dashboard of a cluster member (issue 28, section 4: "the dashboard shows the members and
// the leader"), in headless Chromium. Usage: node cluster.mjs MEMBER_BASE_URL LEADER_ID
// MEMBER_COUNT. Opens one member's page and checks that its header names every member and
// marks the leader that GET /v1/cluster names. Exits non-zero, with the reason, on any failure.
import { launch } from "./launch.mjs";
import { strict as assert } from "node:assert";

const [base, leaderId, count] = process.argv.slice(2);
const step = (what) => console.log("step:", what);

const browser = await launch();
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));

  step("open a member's page: the header shows the cluster");
  await page.goto(base + "/");
  await page.waitForSelector("#cluster:not([hidden])", { timeout: 10_000 });
  await page.waitForFunction(
    (n) => document.querySelectorAll("#cluster .member").length === n, Number(count), { timeout: 10_000 });

  step("the leader is marked, and only it");
  const roles = await page.$$eval("#cluster .member", (items) =>
    items.map((item) => [item.dataset.id, item.dataset.role]));
  const leaders = roles.filter(([, role]) => role === "leader").map(([id]) => id);
  assert.deepEqual(leaders, [leaderId], JSON.stringify(roles));
  assert.ok(roles.every(([id, role]) => id === leaderId || role === "follower"), JSON.stringify(roles));
  const term = Number(await page.textContent("#cluster b.term"));
  assert.ok(term >= 1, `term ${term}`);

  assert.deepEqual(errors, [], "no script errors");
  console.log("ok: the cluster's dashboard works");
} finally {
  await browser.close();
}
