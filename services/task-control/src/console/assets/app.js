// hark's web console: the inbox of open questions, the tasks and their timelines, and the
// playground. Plain DOM, no framework and no build step; every text from the server is put in
// with textContent, never as HTML.

const TEXTS = {
  en: {
    inbox: "Inbox", tasks: "Tasks", playground: "Playground", signout: "Sign out", lang: "中文",
    live: "live", offline: "reconnecting…",
    signin_title: "Sign in to hark", token: "API token (one of control.api_tokens)", signin: "Sign in",
    bad_token: "That token is not one of control.api_tokens.",
    no_questions: "No open questions. New ones appear here as tasks ask them.",
    owner: "Owner", asked_by: "Asked by", task_owner: "Owner", task_deadline: "Deadline", deadline_fail: "then it fails", deadline_cancel: "then it is cancelled", chat: "Chat", task: "Task", asked: "asked {0} ago", no_deadline: "no deadline",
    closes_in: "closes in {0}", closed: "deadline passed", no_chat: "no chat",
    send: "Send", answer_placeholder: "Your answer", yes: "Yes", no: "No",
    pass_on: "Pass on", pass_on_to: "Pass this question on to (platform:user_id, e.g. qq:10002):", passed_on: "Passed on to",
    approval_placeholder: "Or deny with a reason (\"deny: too risky\"), or change arguments and approve: one `key: value` per line",
    remind: "Remind now", reminded: "Reminded.", cancel: "Cancel task", cancel_reason: "Cancelled from the console",
    confirm_cancel: "Cancel this task?",
    state: "State", any_state: "any state", goal: "Goal", updated: "Updated", filter: "Filter",
    no_tasks: "No tasks match.", more: "More",
    pause: "Pause", resume: "Resume", tell: "Tell", tell_placeholder: "An instruction for the task",
    told: "The task sees it at its next round or when it resumes.",
    output: "Output", error: "Error", timeline: "Timeline", round: "Round {0}",
    q_asked: "Asked #{0}", q_answered: "Answered by {0}", q_expired: "No answer in time", q_cancelled: "Closed: the task was cancelled",
    q_superseded: "Replaced by a newer question", q_reminded: "Reminder sent", via: "in {0}", raw: "raw answer",
    q_asked_of: "Asked #{0} of {1}", q_answered_elsewhere: "Closed: someone else asked answered first",
    escalates: "asks {0} too at {1}", undelivered: "Never reached the chat: {0}",
    transition: "{0} → {1}", by: "by {0}", instructions: "Instructions not read yet",
    tool_call: "calls {0}", tool_result: "result of {0}", not_found: "No such task.",
    pg_intro: "Talk to hark as a chat user does: start a task, answer its questions (or quote them), see the result.",
    pg_user: "You are", pg_goal: "Start a task: what should it do?", pg_start: "Start", pg_say: "Write to hark…",
    pg_quote: "Quote", pg_quoting: "Quoting: {0}", pg_unquote: "×", pg_off: "The playground is off: {0}",
    new_task: "New task (without a chat)", create: "Create",
  },
  zh: {
    inbox: "待回答", tasks: "任务", playground: "试用", signout: "退出", lang: "English",
    live: "实时", offline: "重新连接中…",
    signin_title: "登录 hark", token: "API 令牌（control.api_tokens 之一）", signin: "登录",
    bad_token: "这个令牌不在 control.api_tokens 里。",
    no_questions: "没有待回答的问题。任务提问时会出现在这里。",
    owner: "提问对象", asked_by: "提问方", task_owner: "所有者", task_deadline: "截止", deadline_fail: "届时任务失败", deadline_cancel: "届时任务取消", chat: "会话", task: "任务", asked: "{0}前提问", no_deadline: "无截止时间",
    closes_in: "{0}后截止", closed: "已过截止时间", no_chat: "无会话",
    send: "发送", answer_placeholder: "你的回答", yes: "是", no: "否",
    pass_on: "转交", pass_on_to: "把这个问题转交给（平台:用户号，如 qq:10002）：", passed_on: "已转交给",
    approval_placeholder: "或者拒绝并写上理由（“拒绝：太冒险”），或者改参数后批准：每行一项 `参数: 值`",
    remind: "立即提醒", reminded: "已提醒。", cancel: "取消任务", cancel_reason: "在控制台取消",
    confirm_cancel: "取消这个任务？",
    state: "状态", any_state: "全部状态", goal: "目标", updated: "更新", filter: "筛选",
    no_tasks: "没有符合条件的任务。", more: "更多",
    pause: "暂停", resume: "继续", tell: "告诉它", tell_placeholder: "给任务的指示",
    told: "任务会在下一轮或继续时看到。",
    output: "结果", error: "错误", timeline: "时间线", round: "第 {0} 轮",
    q_asked: "提问 #{0}", q_answered: "{0} 回答", q_expired: "超时未回答", q_cancelled: "已关闭：任务被取消",
    q_superseded: "被新问题取代", q_reminded: "已发送提醒", via: "在 {0}", raw: "原文",
    q_asked_of: "向 {1} 提问 #{0}", q_answered_elsewhere: "已关闭：另一位被问的人先回答了",
    escalates: "{1} 起也会问 {0}", undelivered: "没能发到会话：{0}",
    transition: "{0} → {1}", by: "由 {0}", instructions: "尚未读取的指示",
    tool_call: "调用 {0}", tool_result: "{0} 的结果", not_found: "没有这个任务。",
    pg_intro: "像聊天用户一样和 hark 对话：发起任务，回答（或引用）它的问题，查看结果。",
    pg_user: "你的身份", pg_goal: "发起任务：要做什么？", pg_start: "开始", pg_say: "对 hark 说…",
    pg_quote: "引用", pg_quoting: "引用：{0}", pg_unquote: "×", pg_off: "试用不可用：{0}",
    new_task: "新任务（无会话）", create: "创建",
  },
};

const STATE_NAMES = {
  en: { pending: "pending", running: "running", waiting_input: "waiting", paused: "paused", completed: "completed", failed: "failed", cancelled: "cancelled" },
  zh: { pending: "排队中", running: "运行中", waiting_input: "等待回答", paused: "已暂停", completed: "已完成", failed: "失败", cancelled: "已取消" },
};

const app = {
  session: null,
  lang: "en",
  token: sessionStorage.getItem("hark.token") || "",
  questions: new Map(),
  questionsNext: "",
  tasks: [],
  filter: { state: "", owner: "", chat: "" },
  detail: null,
  live: false,
  playground: null,
};

function t(key, ...args) {
  const text = (TEXTS[app.lang] && TEXTS[app.lang][key]) || TEXTS.en[key] || key;
  return text.replace(/\{(\d)\}/g, (_, i) => String(args[Number(i)] ?? ""));
}

function stateName(s) {
  return (STATE_NAMES[app.lang] || STATE_NAMES.en)[s] || s;
}

// h("div", {class: "x", onclick: f}, "text", child, [more]) builds an element.
function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === undefined || kid === null || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function headers(extra) {
  const all = { ...extra };
  if (app.token) all.Authorization = "Bearer " + app.token;
  return all;
}

async function api(path, body) {
  const init = { headers: headers() };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch("/api" + path, init);
  const data = await response.json().catch(() => ({}));
  if (response.status === 401 && app.session && app.session.token_required) signOut();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

// Reads server-sent events from a fetch response; calls on(event, data, id) for each.
async function readEvents(response, on) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message", data = [], id = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (data.length) on(event, data.join("\n"), id);
        event = "message"; data = []; id = null;
      } else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("id:")) id = line.slice(3).trim();
    }
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function short(id) { return (id || "").slice(0, 8); }

function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  const zh = app.lang === "zh";
  if (s < 60) return zh ? `${s}秒` : `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return zh ? `${m}分${s % 60}秒` : `${m}m ${s % 60}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return zh ? `${hrs}小时${m % 60}分` : `${hrs}h ${m % 60}m`;
  return zh ? `${Math.floor(hrs / 24)}天` : `${Math.floor(hrs / 24)}d`;
}

function when(ms) { return ms ? new Date(ms).toLocaleString(app.lang === "zh" ? "zh-CN" : "en-GB") : ""; }

function chatName(chat) { return chat ? `${chat.platform} ${chat.stream}` : t("no_chat"); }

// Texts that tick: ages and deadlines, refreshed every second from the clock alone.
function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Number(el.dataset.deadline) - now;
    el.textContent = left > 0 ? t("closes_in", span(left)) : t("closed");
  }
  for (const el of document.querySelectorAll("[data-asked]")) {
    el.textContent = t("asked", span(now - Number(el.dataset.asked)));
  }
}

// --- the live stream of task events ------------------------------------------------------

async function watch() {
  let last = null;
  let pause = 500;
  for (;;) {
    try {
      const response = await fetch("/api/events", { headers: headers(last ? { "Last-Event-ID": last } : {}) });
      if (response.status === 410) { last = null; continue; }
      if (!response.ok) throw new Error(String(response.status));
      // The stream is open: nothing from here on is missed, so the lists are read now.
      if (!last) await reload();
      setLive(true);
      pause = 500;
      await readEvents(response, (event, data, id) => {
        if (id) last = id;
        if (event === "task") onEvent(JSON.parse(data));
      });
    } catch (e) {
      console.debug("event stream:", e);
    }
    setLive(false);
    await sleep(pause);
    pause = Math.min(pause * 2, 8000);
  }
}

function setLive(on) {
  app.live = on;
  const el = document.getElementById("live");
  el.className = "live " + (on ? "on" : "off");
  el.textContent = on ? t("live") : t("offline");
}

async function reload() {
  await Promise.all([loadQuestions(), loadTasks()]);
  if (app.detail) await loadDetail(app.detail.task.id);
  render();
}

function onEvent(e) {
  if (e.cause === "undelivered") {
    // Not a move: one question of the task learned that its chat never saw it; the task and its
    // other questions stand as they were.
    if (e.question) app.questions.set(e.question.id, e.question);
  } else {
    onMove(e);
  }
  if (app.detail && app.detail.task.id === e.task_id) {
    loadDetail(e.task_id).then(() => { if (route().view === "task") render(); });
  }
  render();
}

function onMove(e) {
  for (const [id, q] of app.questions) if (q.task_id === e.task_id) app.questions.delete(id);
  if (e.state === "waiting_input" && e.question) app.questions.set(e.question.id, e.question);
  const known = app.tasks.find((x) => x.id === e.task_id);
  if (known) {
    Object.assign(known, { state: e.state, updated_at: e.at, result: e.result || known.result, error: e.error });
  } else if (passes(e)) {
    api("/tasks/" + e.task_id).then((got) => {
      if (!inChat(got.task) || app.tasks.some((x) => x.id === got.task.id)) return;
      app.tasks.unshift(got.task);
      if (route().view === "tasks") render();
    }).catch(() => {});
  }
}

function passes(e) {
  const f = app.filter;
  if (f.state && !f.state.split(",").includes(e.state)) return false;
  return !f.owner || e.owner === f.owner;
}

// Whether a task is in the chat the list is filtered by (`qq:group:777`, or a stream alone).
function inChat(task) {
  const want = app.filter.chat;
  if (!want) return true;
  if (!task.chat) return false;
  return want === `${task.chat.platform}:${task.chat.stream}` || want === task.chat.stream;
}

// The inbox's first page; more on demand. Questions asked later come in as events.
async function loadQuestions() {
  const data = await api("/questions");
  app.questions = new Map(data.questions.map((q) => [q.id, q]));
  app.questionsNext = data.next_page_token;
}

async function moreQuestions() {
  const data = await api("/questions?" + new URLSearchParams({ page_token: app.questionsNext }));
  for (const q of data.questions) app.questions.set(q.id, q);
  app.questionsNext = data.next_page_token;
  render();
}

async function loadTasks() {
  const f = app.filter;
  const query = new URLSearchParams({ state: f.state, owner: f.owner, chat: f.chat });
  const data = await api("/tasks?" + query);
  app.tasks = data.tasks;
  app.next = data.next_page_token;
}

// The open task's page: one load at a time; events that arrive meanwhile make one more. A task
// already shown asks only for the rounds after its last one (a round never changes).
const detailLoad = { running: null, want: null };

function loadDetail(id) {
  detailLoad.want = id;
  if (!detailLoad.running) {
    detailLoad.running = (async () => {
      while (detailLoad.want !== null) {
        const next = detailLoad.want;
        detailLoad.want = null;
        app.detail = await fetchDetail(next);
      }
    })().finally(() => { detailLoad.running = null; });
  }
  return detailLoad.running;
}

async function fetchDetail(id) {
  const old = app.detail && !app.detail.error && app.detail.task.id === id ? app.detail : null;
  const last = old && old.rounds.length ? old.rounds[old.rounds.length - 1].round : null;
  try {
    const got = await api("/tasks/" + encodeURIComponent(id) + (last === null ? "" : "?after_round=" + last));
    if (last !== null) got.rounds = old.rounds.concat(got.rounds);
    return got;
  } catch (e) {
    return { error: e.message, task: { id } };
  }
}

// --- views -------------------------------------------------------------------------------

function route() {
  const [, view = "inbox", id] = location.hash.split("/");
  return { view: view || "inbox", id };
}

function renderNav() {
  const { view } = route();
  // With more pages to load, the count is at least this.
  const count = app.questions.size ? app.questions.size + (app.questionsNext ? "+" : "") : 0;
  const nav = document.getElementById("nav");
  nav.replaceChildren(
    h("a", { href: "#/inbox", class: view === "inbox" ? "on" : "" }, t("inbox"), count ? h("span", { class: "badge", "data-count": count }, count) : null),
    h("a", { href: "#/tasks", class: view === "tasks" || view === "task" ? "on" : "" }, t("tasks")),
    // A person's key sees their own inbox; the playground, which speaks as anyone, is not theirs.
    app.session && app.session.as ? h("span", { class: "who" }, app.session.as)
      : h("a", { href: "#/playground", class: view === "playground" ? "on" : "" }, t("playground")),
  );
  document.getElementById("lang").textContent = t("lang");
  const out = document.getElementById("signout");
  out.hidden = !(app.session && (app.session.token_required || app.session.as));
  out.textContent = t("signout");
  setLive(app.live);
}

function render() {
  if (!app.session || (app.session.token_required && !app.token)) return;
  renderNav();
  const { view } = route();
  const main = document.getElementById("main");
  // The playground keeps its own state; it is built once and left alone by re-renders.
  if (view === "playground") {
    if (!main.querySelector(".playground")) main.replaceChildren(playgroundView());
    return;
  }
  if (app.playground) {
    app.playground.abort();
    app.playground = null;
  }
  const focused = document.activeElement;
  if (focused && main.contains(focused) && (focused.tagName === "TEXTAREA" || focused.tagName === "INPUT")) {
    // Someone is typing: leave the page as it is and only refresh what ticks.
    if (view === "inbox") patchInbox(main);
    return;
  }
  if (view === "tasks") main.replaceChildren(tasksView());
  else if (view === "task") main.replaceChildren(taskView());
  else main.replaceChildren(inboxView());
  tick();
}

// Drops the cards of questions that closed, and adds new ones, without touching the rest.
function patchInbox(main) {
  const list = main.querySelector(".inbox");
  if (!list) return;
  for (const card of list.querySelectorAll("[data-question]")) {
    if (!app.questions.has(card.dataset.question)) card.remove();
  }
  for (const q of sortedQuestions()) {
    if (!list.querySelector(`[data-question="${q.id}"]`)) list.append(questionCard(q));
  }
}

function sortedQuestions() {
  return [...app.questions.values()].sort((a, b) => a.asked_at - b.asked_at);
}

function inboxView() {
  const questions = sortedQuestions();
  return h("section", {},
    h("h1", {}, t("inbox")),
    questions.length ? null : h("p", { class: "muted empty" }, t("no_questions")),
    h("div", { class: "inbox" }, questions.map(questionCard)),
    app.questionsNext ? h("button", { type: "button", class: "more", onclick: moreQuestions }, t("more")) : null,
  );
}

function questionCard(q) {
  const note = h("div", { class: "error", role: "alert" });
  const done = (promise) => promise.then(() => { note.textContent = ""; }).catch((e) => { note.textContent = e.message; });
  const send = (body) => done(api(`/questions/${q.id}/answer`, body));
  return h("article", { class: "card question", "data-question": q.id, "data-task": q.task_id },
    h("div", { class: "meta" },
      h("span", {}, t("owner"), ": ", h("b", {}, q.owner)),
      h("span", {}, t("chat"), ": ", chatName(q.chat)),
      h("span", {}, t("task"), ": ", h("a", { href: "#/task/" + q.task_id, class: "mono" }, short(q.task_id)), " #", q.handle),
      h("span", { "data-asked": q.asked_at }),
      q.deadline ? h("span", { "data-deadline": q.deadline }) : h("span", {}, t("no_deadline")),
      q.escalate_at && q.escalate_to.length ? h("span", { "data-escalates": q.escalate_at }, t("escalates", q.escalate_to.join(", "), when(q.escalate_at))) : null,
    ),
    h("div", { class: "qtext" }, q.text),
    q.context ? h("div", { class: "context" }, q.context) : null,
    q.undelivered ? h("div", { class: "error", "data-undelivered": "" }, t("undelivered", q.undelivered)) : null,
    answerForm(q, send),
    note,
    h("div", { class: "row" },
      q.chat ? h("button", { type: "button", class: "link", onclick: () => api(`/questions/${q.id}/remind`, {}).then(() => { note.textContent = t("reminded"); }).catch((e) => { note.textContent = e.message; }) }, t("remind")) : null,
      h("button", { type: "button", class: "link", onclick: () => { const to = prompt(t("pass_on_to")); if (to && to.trim()) api(`/questions/${q.id}/delegate`, { to: to.trim() }).then((r) => { note.textContent = `${t("passed_on")} ${r.question.owner}`; }).catch((e) => { note.textContent = e.message; }); } }, t("pass_on")),
      h("button", { type: "button", class: "link danger", onclick: () => { if (confirm(t("confirm_cancel"))) done(api(`/tasks/${q.task_id}/cancel`, { reason: t("cancel_reason") })); } }, t("cancel")),
    ),
  );
}

// The way to answer a question, by what it accepts.
function answerForm(q, send) {
  if (q.kind === "confirm") {
    return h("div", { class: "row answer" },
      h("button", { type: "button", class: "primary", onclick: () => send({ value: true }) }, t("yes")),
      h("button", { type: "button", onclick: () => send({ value: false }) }, t("no")));
  }
  if (q.kind === "choice" && !q.multiple) {
    return h("div", { class: "row answer" },
      q.choices.map((c) => h("button", { type: "button", class: "choice", onclick: () => send({ value: c }) }, c)));
  }
  if (q.kind === "choice") {
    const boxes = q.choices.map((c) => h("input", { type: "checkbox", value: c }));
    return h("form", { class: "answer", onsubmit: (ev) => { ev.preventDefault(); send({ value: boxes.filter((b) => b.checked).map((b) => b.value) }); } },
      h("div", { class: "row" }, q.choices.map((c, i) => h("label", {}, boxes[i], " ", c))),
      h("button", { class: "primary" }, t("send")));
  }
  if (q.kind === "approval") {
    const text = h("textarea", { placeholder: t("approval_placeholder"), name: "answer" });
    return h("div", { class: "answer" },
      h("div", { class: "row" },
        q.choices.map((c) => h("button", { type: "button", class: "choice", onclick: () => send({ value: c }) }, c))),
      h("form", { onsubmit: (ev) => { ev.preventDefault(); if (text.value.trim()) send({ answer: text.value }); } },
        text, h("div", { class: "row" }, h("button", { class: "primary" }, t("send")))));
  }
  if (q.kind === "form") {
    const inputs = q.fields.map((f) => [f, fieldInput(f)]);
    const submit = (ev) => {
      ev.preventDefault();
      const value = {};
      for (const [f, input] of inputs) {
        if (f.type === "boolean") value[f.key] = input.checked;
        else if (f.multiple) value[f.key] = [...input.selectedOptions].map((o) => o.value);
        else if (input.value === "") continue;
        else if (f.type === "integer" || f.type === "number") value[f.key] = Number(input.value);
        else value[f.key] = input.value;
      }
      send({ value });
    };
    return h("form", { class: "answer", onsubmit: submit },
      inputs.map(([f, input]) => h("div", { class: "field" }, h("label", {}, f.title || f.key, f.required ? " *" : ""), input)),
      h("button", { class: "primary" }, t("send")));
  }
  const text = h("textarea", { placeholder: t("answer_placeholder"), name: "answer" });
  return h("form", { class: "answer", onsubmit: (ev) => { ev.preventDefault(); if (text.value.trim()) send({ answer: text.value }); } },
    text, h("div", { class: "row" }, h("button", { class: "primary" }, t("send"))));
}

function fieldInput(f) {
  const name = f.key;
  if (f.type === "boolean") return h("input", { type: "checkbox", name, checked: f.default === true });
  if (f.choices.length) {
    return h("select", { name, multiple: f.multiple },
      f.multiple ? null : h("option", { value: "" }, ""),
      f.choices.map((c, i) => h("option", { value: c, selected: f.default === c }, f.labels[i] || c)));
  }
  const type = f.type === "integer" || f.type === "number" ? "number" : "text";
  return h("input", { type, name, value: f.default ?? "", step: f.type === "number" ? "any" : null });
}

function tasksView() {
  const f = app.filter;
  const stateSelect = h("select", { name: "state" },
    h("option", { value: "" }, t("any_state")),
    Object.keys(STATE_NAMES.en).map((s) => h("option", { value: s, selected: f.state === s }, stateName(s))));
  const owner = h("input", { name: "owner", placeholder: "qq:12345", value: f.owner });
  const chat = h("input", { name: "chat", placeholder: "qq:group:777", value: f.chat });
  const note = h("div", { class: "error" });
  const apply = (ev) => {
    ev.preventDefault();
    app.filter = { state: stateSelect.value, owner: owner.value.trim(), chat: chat.value.trim() };
    loadTasks().then(render).catch((e) => { note.textContent = e.message; });
  };
  const goal = h("input", { name: "goal", placeholder: t("goal"), size: 40 });
  const who = h("input", { name: "new-owner", placeholder: "web:me", value: "web:console" });
  const create = (ev) => {
    ev.preventDefault();
    api("/tasks", { owner: who.value.trim(), goal: goal.value }).then((got) => { location.hash = "#/task/" + got.task.id; })
      .catch((e) => { note.textContent = e.message; });
  };
  return h("section", {},
    h("h1", {}, t("tasks")),
    h("form", { class: "filters", onsubmit: apply }, stateSelect, owner, chat, h("button", {}, t("filter"))),
    note,
    app.tasks.length ? h("table", { class: "tasks" },
      h("thead", {}, h("tr", {}, h("th", {}, t("task")), h("th", {}, t("goal")), h("th", {}, t("state")), h("th", {}, t("task_owner")), h("th", {}, t("chat")), h("th", {}, t("updated")))),
      h("tbody", {}, app.tasks.map((x) => h("tr", { "data-task": x.id },
        h("td", {}, h("a", { href: "#/task/" + x.id, class: "mono" }, short(x.id))),
        h("td", { class: "goal", title: x.goal }, x.goal),
        h("td", {}, h("span", { class: "state " + x.state }, stateName(x.state))),
        h("td", {}, x.owner),
        h("td", {}, chatName(x.chat)),
        h("td", { class: "muted" }, when(x.updated_at)))))) : h("p", { class: "muted" }, t("no_tasks")),
    h("h2", {}, t("new_task")),
    h("form", { class: "row", onsubmit: create }, who, goal, h("button", { class: "primary" }, t("create"))),
  );
}

function taskView() {
  const { id } = route();
  if (!app.detail || app.detail.task.id.indexOf(id) !== 0) {
    loadDetail(id).then(render);
    return h("p", { class: "muted" }, "…");
  }
  if (app.detail.error) return h("p", { class: "error" }, app.detail.error);
  const { task, questions, rounds, transitions, instructions } = app.detail;
  const note = h("div", { class: "error", role: "alert" });
  const act = (action, body = {}) => api(`/tasks/${task.id}/${action}`, body).then((r) => { note.textContent = action === "tell" ? t("told") : ""; return r; })
    .catch((e) => { note.textContent = e.message; });
  const ended = ["completed", "failed", "cancelled"].includes(task.state);
  const tell = h("input", { name: "tell", placeholder: t("tell_placeholder"), size: 40 });
  return h("section", { class: "task", "data-task": task.id, "data-state": task.state },
    h("h1", {}, task.goal || short(task.id)),
    h("div", { class: "meta" },
      h("span", { class: "state " + task.state }, stateName(task.state)),
      h("span", { class: "mono" }, task.id),
      h("span", {}, t("task_owner"), ": ", task.owner),
      task.asked_by ? h("span", { "data-asked-by": task.asked_by }, t("asked_by"), ": ", task.asked_by) : null,
      h("span", {}, t("chat"), ": ", chatName(task.chat)),
      h("span", {}, when(task.created_at)),
      task.deadline && !ended ? h("span", { class: "deadline" }, t("task_deadline"), ": ", new Date(task.deadline).toLocaleString(), " (", t(task.on_deadline === "cancel" ? "deadline_cancel" : "deadline_fail"), ")") : null),
    ended ? null : h("div", { class: "row" },
      task.state === "paused" ? h("button", { type: "button", onclick: () => act("resume") }, t("resume"))
        : h("button", { type: "button", onclick: () => act("pause") }, t("pause")),
      h("button", { type: "button", class: "danger", onclick: () => { if (confirm(t("confirm_cancel"))) act("cancel", { reason: t("cancel_reason") }); } }, t("cancel")),
      h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); if (tell.value.trim()) act("tell", { text: tell.value }).then(() => { tell.value = ""; }); } }, tell, h("button", {}, t("tell")))),
    note,
    task.state === "waiting_input" && task.open_question ? h("div", {}, questionCard(task.open_question)) : null,
    task.result ? h("div", { class: "card" }, h("h2", {}, t("output")), h("div", { class: "output" }, task.result)) : null,
    task.error ? h("div", { class: "card" }, h("h2", {}, t("error")), h("div", { class: "output error" }, task.error)) : null,
    instructions.length ? h("div", { class: "card" }, h("h2", {}, t("instructions")), instructions.map((i) => h("div", { class: "msg" }, h("span", { class: "role" }, i.author), i.text))) : null,
    h("h2", {}, t("timeline")),
    h("ol", { class: "timeline" }, timeline(questions, rounds, transitions)),
  );
}

// Transitions, rounds, questions, reminders and answers, in the order they happened.
function timeline(questions, rounds, transitions) {
  const items = [];
  for (const tr of transitions) {
    items.push([tr.at, 0, h("li", { class: "transition" },
      h("div", { class: "when" }, when(tr.at)),
      h("div", {}, t("transition", stateName(tr.from || "—"), stateName(tr.to)), " · ", h("code", {}, tr.event),
        tr.actor ? [" · ", t("by", tr.actor)] : null),
      tr.detail ? h("div", { class: "muted" }, tr.detail) : null)]);
  }
  for (const r of rounds) {
    items.push([r.at, 1, h("li", { class: "round" },
      h("div", { class: "when" }, when(r.at), " · ", t("round", r.round)),
      (Array.isArray(r.messages) ? r.messages : []).filter((m) => m && m.role !== "hark").map(message))]);
  }
  for (const q of questions) {
    items.push([q.asked_at, 2, h("li", { class: "question" },
      h("div", { class: "when" }, when(q.asked_at), " · ", q.ask_group ? t("q_asked_of", q.handle, q.owner) : t("q_asked", q.handle), q.chat ? [" · ", t("via", chatName(q.chat))] : null),
      h("div", { class: "qtext" }, q.text),
      q.choices.length ? h("div", { class: "muted" }, q.choices.map((c, i) => `${i + 1}. ${c}`).join("  ")) : null)]);
    if (q.reminded_at) items.push([q.reminded_at, 3, h("li", {}, h("div", { class: "when" }, when(q.reminded_at)), t("q_reminded"))]);
    if (q.closed_at) {
      const what = { answered: t("q_answered", q.answerer), expired: t("q_expired"), cancelled: t("q_cancelled"), superseded: q.ask_group ? t("q_answered_elsewhere") : t("q_superseded") }[q.outcome] || q.outcome;
      items.push([q.closed_at, 3, h("li", { class: q.outcome === "answered" ? "answer" : "" },
        h("div", { class: "when" }, when(q.closed_at), " · #", q.handle),
        h("div", {}, what),
        q.answer ? h("div", { class: "msg" }, h("span", { class: "role" }, t("raw")), q.answer) : null)]);
    }
  }
  items.sort((a, b) => (a[0] - b[0]) || (a[1] - b[1]));
  return items.map((i) => i[2]);
}

function message(m) {
  const parts = [];
  const content = typeof m.content === "string" ? m.content : Array.isArray(m.content) ? m.content.map((c) => c.text || "").join("") : "";
  if (m.role === "tool") {
    parts.push(h("div", { class: "msg" }, h("span", { class: "role" }, t("tool_result", m.name || m.tool_call_id || "")), content));
  } else if (content) {
    parts.push(h("div", { class: "msg" }, h("span", { class: "role" }, m.role), content));
  }
  for (const call of m.tool_calls || []) {
    const fn = call.function || {};
    parts.push(h("div", { class: "msg" }, h("span", { class: "role" }, t("tool_call", fn.name || "?")), h("code", {}, typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments))));
  }
  return parts;
}

// --- the playground ------------------------------------------------------------------------

function playgroundView() {
  const pg = app.session.playground;
  if (!pg.enabled) return h("section", { class: "playground" }, h("h1", {}, t("playground")), h("p", { class: "error" }, t("pg_off", pg.why)));
  let user = localStorage.getItem("hark.playground.user");
  if (!user) {
    user = "guest-" + Math.random().toString(36).slice(2, 8);
    localStorage.setItem("hark.playground.user", user);
  }
  const log = h("div", { class: "chat", "aria-live": "polite" });
  const note = h("div", { class: "error" });
  let quote = "";
  const quoting = h("div", { class: "quoting", hidden: true });
  const setQuote = (text) => {
    quote = text;
    quoting.hidden = !text;
    quoting.replaceChildren(text ? [t("pg_quoting", text.length > 60 ? text.slice(0, 60) + "…" : text), " ", h("button", { type: "button", class: "link", onclick: () => setQuote("") }, t("pg_unquote"))] : []);
  };
  const add = (who, text, quoted) => {
    const bubble = h("div", { class: "bubble " + who },
      quoted ? h("span", { class: "quote" }, quoted) : null,
      text,
      who === "hark" ? h("div", {}, h("button", { type: "button", class: "link", onclick: () => setQuote(text) }, t("pg_quote"))) : null);
    log.append(bubble);
    log.scrollTop = log.scrollHeight;
  };
  const say = (text) => {
    const quoted = quote;
    setQuote("");
    add("me", text, quoted);
    return api("/playground/messages", { user, text, quote: quoted }).then(() => { note.textContent = ""; })
      .catch((e) => { note.textContent = e.message; });
  };
  const goal = h("input", { name: "goal", placeholder: t("pg_goal"), size: 40 });
  const text = h("input", { name: "say", placeholder: t("pg_say"), size: 40 });
  // One listener at a time, for as long as the playground is shown.
  if (app.playground) app.playground.abort();
  const listening = new AbortController();
  app.playground = listening;
  const shown = new Set();
  const listen = async () => {
    while (!listening.signal.aborted) {
      try {
        const response = await fetch("/api/playground/stream?user=" + encodeURIComponent(user), { headers: headers(), signal: listening.signal });
        if (!response.ok) {
          const data = await response.json().catch(() => ({}));
          throw new Error(data.error || response.statusText);
        }
        note.textContent = "";
        log.dataset.listening = "yes";
        await readEvents(response, (event, data) => {
          if (event !== "message") return;
          // Each message is acknowledged once shown, so that hark hands it out no more; one
          // handed out again (its acknowledgement was lost) is shown once.
          const message = JSON.parse(data);
          if (!shown.has(message.id)) {
            shown.add(message.id);
            add("hark", message.text);
          }
          api("/playground/ack", { acks: [message.ack] }).catch(() => {});
        });
      } catch (e) {
        if (listening.signal.aborted) return;
        note.textContent = e.message;
      }
      delete log.dataset.listening;
      await sleep(1000);
    }
  };
  listen();
  return h("section", { class: "playground" },
    h("h1", {}, t("playground")),
    h("p", { class: "muted" }, t("pg_intro")),
    h("p", {}, t("pg_user"), ": ", h("b", { class: "mono" }, app.session.playground.platform + ":" + user)),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); if (goal.value.trim()) { say(`${app.session.command} new ${goal.value.trim()}`); goal.value = ""; } } },
      goal, h("button", { class: "primary" }, t("pg_start"))),
    h("h2", {}, ""),
    log,
    quoting,
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); if (text.value.trim()) { say(text.value.trim()); text.value = ""; } } },
      text, h("button", { class: "primary" }, t("send"))),
    note,
  );
}

// --- sign-in and start ---------------------------------------------------------------------

function signOut() {
  sessionStorage.removeItem("hark.token");
  app.token = "";
  location.reload();
}

function signInView(failed) {
  const token = h("input", { type: "password", name: "token", autocomplete: "current-password", size: 36 });
  const submit = async (ev) => {
    ev.preventDefault();
    app.token = token.value.trim();
    const session = await fetch("/api/session", { headers: headers() }).then((r) => r.json());
    if (session.signed_in) {
      sessionStorage.setItem("hark.token", app.token);
      app.session = session;
      boot();
    } else {
      app.token = "";
      document.getElementById("main").replaceChildren(signInView(true));
    }
  };
  return h("form", { class: "card signin", onsubmit: submit },
    h("h1", {}, t("signin_title")),
    h("div", { class: "field" }, h("label", {}, t("token")), token),
    failed ? h("p", { class: "error" }, t("bad_token")) : null,
    h("button", { class: "primary" }, t("signin")));
}

function boot() {
  window.addEventListener("hashchange", () => {
    if (route().view !== "task") app.detail = null;
    render();
  });
  render();
  watch();
  setInterval(tick, 1000);
}

// The reader's own language, as the browser says it, when the console speaks it: the first of
// navigator.languages that is Chinese or English.
function browserLang() {
  for (const tag of navigator.languages || [navigator.language || ""]) {
    const lang = String(tag).toLowerCase().split("-")[0];
    if (lang === "zh" || lang === "en") return lang;
  }
  return null;
}

async function start() {
  app.session = await fetch("/api/session", { headers: headers() }).then((r) => r.json());
  app.lang = localStorage.getItem("hark.lang") || browserLang() || app.session.language || "en";
  document.documentElement.lang = app.lang === "zh" ? "zh-CN" : "en";
  document.getElementById("lang").addEventListener("click", () => {
    localStorage.setItem("hark.lang", app.lang === "zh" ? "en" : "zh");
    location.reload();
  });
  document.getElementById("signout").addEventListener("click", signOut);
  renderNav();
  if (app.session.token_required && !app.session.signed_in) {
    app.token = "";
    document.getElementById("main").replaceChildren(signInView(false));
    return;
  }
  boot();
}

start();
