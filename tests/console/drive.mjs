// Drives hark's web console in Debian's chromium, as a person would: signs in, sees a question
// arrive live, answers it, sees the task complete, and does the playground's round trip.
// Run by tests/tests/console.rs, which starts hark and checks the outcome again over gRPC.
//
// Environment: CONSOLE_URL (http://127.0.0.1:port/), CONSOLE_TOKEN, SHOTS (a directory for the
// screenshots), CHROMIUM (default /usr/bin/chromium), UNDELIVERED_TASK (a task whose question's
// chat message nobody pulled yet) and GATEWAY_URL (where the gateway's HTTP adapter listens).
// Prints one JSON line of what it saw.

import { chromium } from "playwright-core";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.env.CONSOLE_URL;
const token = process.env.CONSOLE_TOKEN;
const shots = process.env.SHOTS;
const WAIT = 30_000;
mkdirSync(shots, { recursive: true });

// Pulls the lost task's question from the gateway's HTTP adapter, as an app would, and reports
// that it can never be sent; whether the gateway set it aside.
async function failLostQuestion() {
  const base = `${process.env.GATEWAY_URL}/api/v1/outbound`;
  const until = Date.now() + WAIT;
  while (Date.now() < until) {
    const pulled = await fetch(`${base}?platform=web&bot_id=playground&wait_ms=2000`).then((r) => r.json());
    const question = (pulled.messages || []).find((m) => m.question_id);
    if (!question) continue;
    const acked = await fetch(`${base}/ack`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        platform: "web",
        bot_id: "playground",
        acks: [{ ack: question.ack, failed: "private:lost is gone", retry: false }],
      }),
    }).then((r) => r.json());
    return acked.acks[0].set_aside === true;
  }
  throw new Error("the lost question's chat message was never handed out");
}

const profile = mkdtempSync(join(tmpdir(), "hark-chromium-"));
// A new, empty profile (Chromium's --user-data-dir) for each run.
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  locale: "en-GB",
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const seen = {};
let step = 0;
const shot = async (page, name) => page.screenshot({ path: join(shots, `${String(++step).padStart(2, "0")}-${name}.png`), fullPage: true });

// A reader's first visit follows the browser's language, whatever chat.language says.
for (const [locale, lang] of [["zh-CN", "zh"], ["en-US", "en"]]) {
  const dir = mkdtempSync(join(tmpdir(), "hark-chromium-lang-"));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    locale,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", `--lang=${locale}`],
  });
  try {
    const first = context.pages()[0] || await context.newPage();
    await first.goto(url);
    await first.locator("input[name=token]").waitFor({ timeout: WAIT });
    seen[`browser_${lang}`] = {
      lang: await first.evaluate(() => document.documentElement.lang),
      nav: (await first.locator("header#top").textContent()).trim(),
    };
  } finally {
    await context.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const page = browser.pages()[0] || await browser.newPage();
try {
  page.on("pageerror", (e) => { seen.page_errors = [...(seen.page_errors || []), String(e)]; });
  // English, as this browser's locale (en-GB) says, until the page's own switch picks Chinese at
  // the end.

  // Sign in: a wrong token is refused, the right one lets in.
  await page.goto(url);
  await page.locator("input[name=token]").waitFor({ timeout: WAIT });
  await shot(page, "sign-in");
  await page.fill("input[name=token]", "not-the-token");
  await page.click("button:has-text('Sign in')");
  await page.locator("text=That token is not one of control.api_tokens").waitFor({ timeout: WAIT });
  seen.wrong_token_refused = true;
  await page.fill("input[name=token]", token);
  await page.click("button:has-text('Sign in')");
  await page.locator("h1:has-text('Inbox')").waitFor({ timeout: WAIT });
  await page.locator("#live.on").waitFor({ timeout: WAIT });
  await shot(page, "inbox-empty");

  // The question nobody saw: the app reports it can never send its chat message, and the open
  // inbox says why without a reload.
  const lostCard = page.locator(`[data-question][data-task="${process.env.UNDELIVERED_TASK}"]`);
  await lostCard.waitFor({ timeout: WAIT });
  seen.delivered_before = await lostCard.locator("[data-undelivered]").count();
  seen.set_aside = await failLostQuestion();
  const lost = lostCard.locator("[data-undelivered]");
  seen.undelivered = (await lost.textContent({ timeout: WAIT })).trim();

  // A task is created from outside the page; its question appears without a reload.
  const created = await fetch(new URL("/api/tasks", url), {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ owner: "web:ada", goal: "choose a colour" }),
  }).then((r) => r.json());
  const taskId = created.task.id;
  seen.task_id = taskId;
  const card = page.locator(`[data-question][data-task="${taskId}"]`);
  await card.waitFor({ timeout: WAIT });
  seen.question_text = (await card.locator(".qtext").textContent()).trim();
  seen.badge = (await page.locator("nav .badge").textContent()).trim();
  await shot(page, "inbox-question");

  // Answered in the browser, by its choice button; the card leaves when the task moves on.
  await card.locator("button.choice:has-text('green')").click();
  await card.waitFor({ state: "detached", timeout: WAIT });

  // The task list shows it completed (live), and its page shows the output and the timeline.
  await page.click("nav a:has-text('Tasks')");
  const row = page.locator(`tr[data-task="${taskId}"]`);
  await row.locator(".state.completed").waitFor({ timeout: WAIT });
  await shot(page, "tasks");
  await row.locator("a").click();
  const detail = page.locator(`section.task[data-task="${taskId}"][data-state="completed"]`);
  await detail.waitFor({ timeout: WAIT });
  seen.output = (await detail.locator(".output").first().textContent()).trim();
  seen.answered_line = (await detail.locator(".timeline li.answer").first().textContent()).trim();
  seen.rounds = await detail.locator(".timeline li.round").count();
  await shot(page, "task");

  // A task's own page, open while it waits, answered there: the page follows it live, adding
  // only the rounds that are new.
  const second = await fetch(new URL("/api/tasks", url), {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ owner: "web:ada", goal: "choose a colour again" }),
  }).then((r) => r.json());
  const secondId = second.task.id;
  await page.evaluate((id) => { location.hash = "#/task/" + id; }, secondId);
  const waitingPage = page.locator(`section.task[data-task="${secondId}"][data-state="waiting_input"]`);
  await waitingPage.locator("button.choice:has-text('blue')").waitFor({ timeout: WAIT });
  seen.live_rounds_waiting = await waitingPage.locator(".timeline li.round").count();
  await waitingPage.locator("button.choice:has-text('blue')").click();
  const donePage = page.locator(`section.task[data-task="${secondId}"][data-state="completed"]`);
  await donePage.locator(".output").waitFor({ timeout: WAIT });
  seen.live_output = (await donePage.locator(".output").first().textContent()).trim();
  seen.live_rounds_done = await donePage.locator(".timeline li.round").count();

  // The playground: a task started as a chat user, its question quoted and answered.
  await page.click("nav a:has-text('Playground')");
  await page.locator(".chat[data-listening]").waitFor({ timeout: WAIT });
  await page.fill("input[name=goal]", "greet me [script:pg]");
  await page.click("button:has-text('Start')");
  const question = page.locator(".bubble.hark", { hasText: "What is your name?" });
  await question.waitFor({ timeout: WAIT });
  await shot(page, "playground-question");
  await question.locator("button:has-text('Quote')").click();
  await page.locator(".quoting:not([hidden])").waitFor({ timeout: WAIT });
  await page.fill("input[name=say]", "Ada");
  await page.click("form:has(input[name=say]) button");
  const result = page.locator(".bubble.hark", { hasText: "Hello Ada" });
  await result.waitFor({ timeout: WAIT });
  seen.playground_result = (await result.textContent()).trim();
  seen.playground_user = (await page.locator(".playground b.mono").textContent()).trim();
  await shot(page, "playground-result");

  // In Chinese, as most of hark's users read it: the switch reloads the page and is kept.
  await page.click("#lang");
  await page.locator("nav a:has-text('任务')").waitFor({ timeout: WAIT });
  seen.zh_lang = await page.evaluate(() => document.documentElement.lang);
  seen.zh_nav = (await page.locator("header#top").textContent()).trim();
  await page.click("nav a:has-text('任务')");
  const zhState = page.locator(`tr[data-task="${taskId}"] .state.completed`);
  await zhState.waitFor({ timeout: WAIT });
  seen.zh_state = (await zhState.textContent()).trim();
  await shot(page, "tasks-zh");
  await page.click("nav a:has-text('待回答')");
  seen.zh_undelivered = (await lost.textContent({ timeout: WAIT })).trim();
  await shot(page, "inbox-zh");
  console.log(JSON.stringify(seen));
} catch (e) {
  console.error(String(e && e.stack || e));
  await shot(page, "failure").catch(() => {});
  console.log(JSON.stringify(seen));
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
