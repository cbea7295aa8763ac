// Memstore admin console: a client of the admin API like any other.
//
// The admin key lives in this script's memory only (never in storage or a cookie), and goes out as a
// bearer key on calls to this same origin. Everything shown is built with textContent, never parsed
// as HTML, so stored text (a memory, a message, a model's output) cannot run as script here.
"use strict";

(() => {
  let key = null;
  const view = document.getElementById("view");
  const status = document.getElementById("status");
  const nav = document.getElementById("nav");
  const signInForm = document.getElementById("sign-in");

  class ApiError extends Error {
    constructor(status, body) {
      const error = (body && body.error) || {};
      super(error.message || `HTTP ${status}`);
      this.status = status;
      this.code = error.code || "http_error";
      this.details = error.details || {};
    }
  }

  async function api(method, path, { params, body } = {}) {
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
    }
    const headers = { Authorization: `Bearer ${key}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
    const text = await response.text();
    const data = text ? JSON.parse(text) : null;
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  // --- DOM helpers: text only ---------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "onclick" || name === "onsubmit" || name === "onchange" || name === "oninput") {
        node.addEventListener(name.slice(2), value);
      } else if (name === "class") {
        node.className = value;
      } else if (value === true) {
        node.setAttribute(name, "");
      } else {
        node.setAttribute(name, String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function say(message, isError = false) {
    status.textContent = message;
    status.className = isError ? "error" : "";
  }

  function when(value) {
    return value ? new Date(value).toISOString().replace(".000Z", "Z") : "—";
  }

  // A valid-time bound: the day alone when it is midnight UTC (most dates said in words), else the time.
  function moment(value) {
    const shown = when(value);
    return shown.endsWith("T00:00:00Z") ? shown.slice(0, 10) : shown;
  }

  // When a memory's fact held in the user's world (valid time), or null where neither bound is known.
  function held(item) {
    if (item.valid_from && item.valid_to) return `held ${moment(item.valid_from)} → ${moment(item.valid_to)}`;
    if (item.valid_from) return `held since ${moment(item.valid_from)}`;
    if (item.valid_to) return `held until ${moment(item.valid_to)}`;
    return null;
  }

  function show(title, ...content) {
    view.replaceChildren(el("h2", { id: "view-title" }, title), ...content);
    view.focus();
  }

  function failed(error) {
    const code = error instanceof ApiError ? ` (${error.code})` : "";
    say(`${error.message}${code}`, true);
  }

  function wordDiff(before, after) {
    const out = el("span", { class: "diff" });
    for (const part of window.Diff.diffWordsWithSpace(before || "", after || "")) {
      out.append(part.added ? el("ins", {}, part.value) : part.removed ? el("del", {}, part.value) : part.value);
    }
    return out;
  }

  function messagesList(messages, label) {
    return el(
      "ol",
      { class: "messages", "aria-label": label },
      (messages || []).map((m) =>
        el("li", {}, el("strong", {}, `${m.role}${m.name ? ` (${m.name})` : ""}: `), m.content)
      )
    );
  }

  // --- dry run, then confirm ------------------------------------------------------------------------

  // Shows what `path` would change (dry run), then lets the admin confirm or cancel. Nothing changes
  // before the confirmation; `done` runs after a confirmed change.
  async function previewThenConfirm(box, what, path, body, done) {
    box.replaceChildren(el("p", {}, `Working out what ${what} would change…`));
    let preview;
    try {
      preview = await api("POST", path, { body: { ...body, dry_run: true } });
    } catch (error) {
      box.replaceChildren(el("p", { class: "error", role: "alert" }, `${error.message} (${error.code})`));
      return;
    }
    const force = el("input", { type: "checkbox", id: `force-${Date.now()}` });
    const conflicts = preview.conflicts || [];
    const confirm = el(
      "button",
      {
        type: "button",
        class: "primary danger",
        onclick: async () => {
          confirm.disabled = true;
          try {
            const result = await api("POST", path, {
              body: { ...body, dry_run: false, ...(conflicts.length ? { force: force.checked } : {}) },
            });
            box.replaceChildren();
            if (done) await done(result);
            say(`Done: ${what} wrote ${result.diff.length} new version(s).`);
          } catch (error) {
            confirm.disabled = false;
            failed(error);
          }
        },
      },
      `Confirm ${what}`
    );
    const cancel = el("button", { type: "button", onclick: () => box.replaceChildren() }, "Cancel");
    box.replaceChildren(
      ...[
      el("h3", {}, `Preview: ${what}`),
      diffTable(preview.diff),
      conflicts.length
        ? el(
            "div",
            { class: "panel" },
            el("p", { class: "error" }, `${conflicts.length} later change(s) conflict:`),
            el(
              "ul",
              {},
              conflicts.map((c) =>
                el("li", {}, `memory ${c.memory_id} v${c.version} (${c.op}) by ${c.actor} at ${when(c.created_at)}`)
              )
            ),
            el("div", { class: "row" }, force, el("label", { for: force.id }, "Overwrite them (force)"))
          )
        : null,
      preview.diff.length
        ? el("div", { class: "row" }, confirm, cancel)
        : el("div", { class: "row" }, el("span", {}, "Nothing would change."), cancel),
      ].filter(Boolean)
    );
    confirm.focus();
  }

  // A button that previews `what` (a dry run of `path` with `body`) in `box`, then asks to confirm it.
  function undoButton(label, box, what, path, body, done, className) {
    return el(
      "button",
      { type: "button", class: className, onclick: () => previewThenConfirm(box, what, path, body, done) },
      label
    );
  }

  function brief(state) {
    return state ? `v${state.version} ${state.status}` : "—";
  }

  function diffTable(diff) {
    return el(
      "table",
      { class: "diff-table" },
      el("caption", {}, `${diff.length} memory change(s)`),
      el("thead", {}, el("tr", {}, ["Memory", "Before", "After", "Words"].map((h) => el("th", { scope: "col" }, h)))),
      el(
        "tbody",
        {},
        diff.map((d) =>
          el(
            "tr",
            {},
            el("td", {}, el("a", { href: `#/memory/${d.memory_id}`, class: "mono" }, d.memory_id.slice(0, 8))),
            el("td", {}, brief(d.before)),
            el("td", {}, brief(d.after)),
            el("td", {}, wordDiff(d.before ? d.before.content : "", d.after ? d.after.content : ""))
          )
        )
      )
    );
  }

  // --- users ----------------------------------------------------------------------------------------

  async function usersView(params) {
    const prefix = params.get("prefix") || "";
    const input = el("input", { id: "user-prefix", type: "search", value: prefix, autocomplete: "off" });
    const table = el("tbody");
    const more = el("button", { type: "button", hidden: true }, "More users");
    let cursor = null;
    async function load() {
      const page = await api("GET", "/v1/admin/users", { params: { prefix: input.value, limit: 50, cursor } });
      for (const u of page.items) {
        table.append(
          el(
            "tr",
            {},
            el("td", {}, el("a", { href: `#/user/${encodeURIComponent(u.user_id)}` }, u.user_id)),
            el("td", {}, String(u.active_memories)),
            el("td", {}, String(u.chunks)),
            el("td", {}, when(u.created_at))
          )
        );
      }
      cursor = page.next_cursor;
      more.hidden = !cursor;
      say(`${table.children.length} user(s) shown.`);
    }
    more.addEventListener("click", () => load().catch(failed));
    const form = el(
      "form",
      {
        class: "row",
        role: "search",
        onsubmit: (event) => {
          event.preventDefault();
          window.location.hash = `#/users?prefix=${encodeURIComponent(input.value)}`;
        },
      },
      el("label", { for: "user-prefix" }, "User id starts with"),
      input,
      el("button", { type: "submit" }, "Find")
    );
    show(
      "Users",
      form,
      el(
        "table",
        {},
        el("caption", {}, "Users of this tenant"),
        el("thead", {}, el("tr", {}, ["User", "Active memories", "Chunks", "First seen"].map((h) => el("th", { scope: "col" }, h)))),
        table
      ),
      more
    );
    input.focus();
    await load();
  }

  // --- one user's bank, now or as of a time ---------------------------------------------------------

  function localInputValue(iso) {
    const d = new Date(iso);
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`
    );
  }

  async function userView(userId, params) {
    const asOf = params.get("as_of");
    const counts = await api("GET", "/v1/admin/changesets/counts", { params: { user_id: userId } });
    const first = counts.items.reduce((m, c) => (!m || c.first_at < m ? c.first_at : m), null);
    const last = counts.items.reduce((m, c) => (!m || c.last_at > m ? c.last_at : m), null);

    const timeInput = el("input", {
      id: "as-of",
      type: "datetime-local",
      step: "0.001",
      value: asOf ? localInputValue(asOf) : "",
    });
    const slider = el("input", {
      id: "as-of-slider",
      type: "range",
      min: first ? Date.parse(first) : 0,
      max: last ? Date.parse(last) + 1 : 1,
      step: 1,
      value: asOf ? Date.parse(asOf) : last ? Date.parse(last) + 1 : 1,
      "aria-label": "Time in this user's history",
      disabled: !first,
    });
    slider.addEventListener("input", () => {
      timeInput.value = localInputValue(new Date(Number(slider.value)).toISOString());
    });
    slider.addEventListener("change", () => goAsOf(new Date(Number(slider.value)).toISOString()));
    function goAsOf(iso) {
      const query = iso ? `?as_of=${encodeURIComponent(iso)}` : "";
      window.location.hash = `#/user/${encodeURIComponent(userId)}${query}`;
    }
    const timeForm = el(
      "form",
      {
        class: "row",
        onsubmit: (event) => {
          event.preventDefault();
          if (timeInput.value) goAsOf(new Date(timeInput.value).toISOString());
        },
      },
      el("label", { for: "as-of" }, "Bank as of"),
      timeInput,
      el("button", { type: "submit", id: "as-of-apply" }, "Show"),
      el("button", { type: "button", onclick: () => goAsOf(null) }, "Now"),
      slider
    );

    const restoreBox = el("div", { id: "restore-box", "aria-live": "polite" });
    const restore = asOf
      ? undoButton(
          "Restore the bank to this time…",
          restoreBox,
          "restore",
          `/v1/admin/users/${encodeURIComponent(userId)}/restore`,
          { as_of: asOf, reason: "restored from the admin console" },
          () => goAsOf(null),
          "danger"
        )
      : null;

    const statusSelect = el(
      "select",
      { id: "bank-status" },
      ["active", "all"].map((s) => el("option", { value: s, selected: (params.get("status") || "active") === s }, s))
    );
    statusSelect.addEventListener("change", () => {
      const query = new URLSearchParams(params);
      query.set("status", statusSelect.value);
      window.location.hash = `#/user/${encodeURIComponent(userId)}?${query}`;
    });

    const body = el("tbody");
    const prev = el("button", { type: "button", disabled: true }, "Previous page");
    const next = el("button", { type: "button", disabled: true }, "Next page");
    const pageInfo = el("span", { class: "muted" });
    const cursors = [null];
    let at = 0;
    async function load() {
      const page = await api("GET", "/v1/memories", {
        params: { user_id: userId, as_of: asOf, status: params.get("status") || "active", limit: 50, cursor: cursors[at] },
      });
      body.replaceChildren(
        ...page.items.map((m) =>
          el(
            "tr",
            {},
            el("td", {}, el("a", { href: `#/memory/${m.id}` }, m.content)),
            el("td", {}, el("span", { class: "badge" }, m.status)),
            el("td", {}, `v${m.version}`),
            el("td", {}, held(m) || "—"),
            el("td", { class: "language" }, m.language || "—"),
            el("td", {}, when(m.updated_at))
          )
        )
      );
      cursors[at + 1] = page.next_cursor;
      prev.disabled = at === 0;
      next.disabled = !page.next_cursor;
      pageInfo.textContent = `Page ${at + 1}, ${page.items.length} memories`;
      say(asOf ? `Bank of ${userId} as of ${when(asOf)}.` : `Bank of ${userId} now.`);
    }
    prev.addEventListener("click", () => { at -= 1; load().catch(failed); });
    next.addEventListener("click", () => { at += 1; load().catch(failed); });

    show(
      `User ${userId}`,
      el("div", { class: "panel" }, timeForm, el("div", { class: "row" }, restore), restoreBox),
      el("div", { class: "row" }, el("label", { for: "bank-status" }, "Show"), statusSelect),
      el(
        "table",
        { id: "bank" },
        el("caption", {}, asOf ? `Memories as of ${when(asOf)}` : "Memories now"),
        el("thead", {}, el("tr", {}, ["Memory", "Status", "Version", "Held", "Language", "Written"].map((h) => el("th", { scope: "col" }, h)))),
        body
      ),
      el("div", { class: "row" }, prev, next, pageInfo),
      el("p", {}, el("a", { href: `#/changesets?user_id=${encodeURIComponent(userId)}` }, "This user's changesets"))
    );
    await load();
  }

  // --- one memory: timeline, word diffs, provenance, rollback and revert ---------------------------

  async function memoryView(memoryId) {
    const explained = await api("GET", `/v1/memories/${memoryId}/explain`);
    const memory = explained.memory;
    const head = memory.version;
    const versions = explained.versions;
    const items = versions.map((entry, index) => {
      const v = entry.version;
      const previous = index > 0 ? versions[index - 1].version.content : "";
      const box = el("div", { "aria-live": "polite" });
      const actions = el("div", { class: "row" });
      if (v.version !== head) {
        actions.append(
          undoButton(
            `Roll back to v${v.version}…`,
            box,
            `rollback to v${v.version}`,
            `/v1/admin/memories/${memoryId}/rollback`,
            { to_version: v.version, reason: "rolled back from the admin console" },
            () => memoryView(memoryId)
          )
        );
      }
      if (entry.changeset && entry.changeset.status === "applied") {
        actions.append(
          undoButton(
            "Revert this whole changeset…",
            box,
            `revert of changeset ${v.changeset_id.slice(0, 8)}`,
            `/v1/admin/changesets/${v.changeset_id}/revert`,
            { reason: "reverted from the admin console" },
            () => memoryView(memoryId)
          )
        );
      }
      const raw = el("div");
      if (entry.changeset && (entry.changeset.kind === "writer" || entry.changeset.kind === "review")) {
        actions.append(
          el(
            "button",
            {
              type: "button",
              onclick: async () => {
                try {
                  const changeset = await api("GET", `/v1/admin/changesets/${v.changeset_id}`);
                  raw.replaceChildren(el("h4", {}, "Raw writer output"), el("pre", {}, changeset.raw_output || "(none)"));
                } catch (error) {
                  failed(error);
                }
              },
            },
            "Show raw output (audited)"
          )
        );
      }
      const source = entry.source;
      const guards = (entry.changeset && entry.changeset.guards) || [];
      return el(
        "li",
        { "data-version": v.version },
        el(
          "h3",
          {},
          `v${v.version} · ${v.op} · `,
          el("span", { class: "badge" }, v.status),
          ` · ${when(v.created_at)}`
        ),
        el("p", { class: "content" }, wordDiff(previous, v.content)),
        el(
          "dl",
          { class: "facts" },
          held(v) ? [el("dt", {}, "Held"), el("dd", { class: "held" }, held(v))] : null,
          v.language ? [el("dt", {}, "Language"), el("dd", { class: "language" }, v.language)] : null,
          el("dt", {}, "Changed by"),
          el("dd", {}, `${v.actor}${entry.changeset ? ` (${entry.changeset.kind}, ${entry.changeset.status})` : ""}`),
          el("dt", {}, "Writer"),
          el("dd", {}, `${v.writer || "—"} · model ${v.model || "—"} · profile ${v.profile || "—"}`),
          el("dt", {}, "Prompt hash"),
          el("dd", { class: "mono" }, v.prompt_hash || "—"),
          el("dt", {}, "Changeset"),
          el("dd", { class: "mono" }, v.changeset_id),
          v.reason ? [el("dt", {}, "Reason"), el("dd", {}, v.reason)] : null
        ),
        source
          ? el(
              "section",
              { class: "source" },
              el("h4", {}, `Source messages (chunk ${source.seq}, ${source.chunk_id.slice(0, 8)})`),
              messagesList(source.messages, "Source messages"),
              source.context && source.context.length
                ? el(
                    "details",
                    {},
                    el("summary", {}, `Earlier messages the writer was given (${source.context.length})`),
                    messagesList(source.context, "Earlier messages")
                  )
                : el("p", { class: "muted" }, "The writer was given no earlier messages.")
            )
          : null,
        entry.candidates
          ? el(
              "details",
              {},
              el("summary", {}, `Memories the writer was shown (${entry.candidates.length})`),
              el(
                "ul",
                {},
                entry.candidates.map((c) =>
                  el("li", {}, `[${c.local_id}] `, el("a", { href: `#/memory/${c.memory_id}` }, c.content || "(gone)"), ` (v${c.version}${held(c) ? `, ${held(c)}` : ""})`)
                )
              )
            )
          : null,
        guards.length
          ? el(
              "details",
              {},
              el("summary", {}, `Guards that fired (${guards.length})`),
              el("ul", {}, guards.map((g) => el("li", {}, `${g.guard}: ${g.detail}`)))
            )
          : null,
        actions,
        raw,
        box
      );
    });
    show(
      "Memory",
      el(
        "dl",
        { class: "facts" },
        el("dt", {}, "Now"),
        el("dd", { id: "memory-now" }, memory.content),
        el("dt", {}, "Status"),
        el("dd", {}, `${memory.status}, v${memory.version}`),
        el("dt", {}, "Held"),
        el("dd", { id: "memory-held" }, held(memory) || "— (not known)"),
        el("dt", {}, "Language"),
        el("dd", { id: "memory-language" }, memory.language || "—"),
        el("dt", {}, "User"),
        el("dd", {}, el("a", { href: `#/user/${encodeURIComponent(memory.user_id)}` }, memory.user_id))
      ),
      el("h3", {}, "Timeline (oldest first)"),
      el("ol", { class: "timeline" }, items)
    );
    say(`${versions.length} version(s) of this memory.`);
  }

  // --- changesets by writer and model; bulk revert ---------------------------------------------------

  async function changesetsView(params) {
    const userId = params.get("user_id") || "";
    const counts = await api("GET", "/v1/admin/changesets/counts", { params: { user_id: userId } });
    const box = el("div", { id: "bulk-box", "aria-live": "polite" });
    const rows = counts.items.map((c, index) => {
      const since = el("input", {
        id: `since-${index}`,
        type: "datetime-local",
        step: "0.001",
        value: localInputValue(c.first_at),
        "aria-label": `Since, for ${c.writer || "no writer"} ${c.model || ""}`,
      });
      const canRevert = c.kind === "writer" && c.status === "applied";
      return el(
        "tr",
        {},
        el("td", {}, c.kind),
        el("td", {}, c.writer || "—"),
        el("td", {}, c.model || "—"),
        el("td", {}, c.status),
        el("td", {}, String(c.count)),
        el("td", {}, `${when(c.first_at)} – ${when(c.last_at)}`),
        el(
          "td",
          {},
          canRevert
            ? el(
                "div",
                { class: "row" },
                since,
                el(
                  "button",
                  {
                    type: "button",
                    class: "danger",
                    onclick: () =>
                      previewThenConfirm(
                        box,
                        `bulk revert of ${c.writer || "any writer"} / ${c.model || "any model"}`,
                        "/v1/admin/revert",
                        {
                          writer: c.writer || undefined,
                          model: c.model || undefined,
                          user_id: userId || undefined,
                          since: new Date(since.value).toISOString(),
                          reason: "bulk revert from the admin console",
                        },
                        () => changesetsView(params)
                      ),
                  },
                  "Revert everything since…"
                )
              )
            : null
        )
      );
    });
    show(
      userId ? `Changesets of ${userId}` : "Changesets",
      el(
        "table",
        {},
        el("caption", {}, "Changesets by writer and model"),
        el(
          "thead",
          {},
          el("tr", {}, ["Kind", "Writer", "Model", "Status", "Count", "From – to", "Undo"].map((h) => el("th", { scope: "col" }, h)))
        ),
        el("tbody", {}, rows)
      ),
      box
    );
    say(`${counts.items.length} group(s) of changesets.`);
  }

  // --- reviews --------------------------------------------------------------------------------------

  async function reviewsView() {
    const page = await api("GET", "/v1/admin/reviews", { params: { status: "pending", limit: 100 } });
    const decide = (review, verdict) => async () => {
      try {
        await api("POST", `/v1/admin/reviews/${review.id}/${verdict}`, { body: { reason: `${verdict} in the admin console` } });
        say(`Review ${review.id.slice(0, 8)} ${verdict === "approve" ? "approved" : "rejected"}.`);
        await reviewsView();
      } catch (error) {
        failed(error);
      }
    };
    show(
      "Pending reviews",
      page.items.length
        ? el(
            "ul",
            {},
            page.items.map((r) =>
              el(
                "li",
                { class: "panel" },
                el("p", {}, el("strong", {}, r.op.op), ` for ${r.user_id} by ${r.writer || "?"} / ${r.model || "?"} at ${when(r.created_at)}`),
                el(
                  "ul",
                  {},
                  r.targets.map((t) =>
                    el("li", {}, el("a", { href: `#/memory/${t.memory_id}` }, t.current_content || t.memory_id), ` (v${t.version}, now ${t.current_status})`)
                  )
                ),
                r.op.content ? el("p", {}, "Proposed: ", r.op.content) : null,
                el(
                  "div",
                  { class: "row" },
                  el("button", { type: "button", class: "primary", onclick: decide(r, "approve") }, "Approve"),
                  el("button", { type: "button", class: "danger", onclick: decide(r, "reject") }, "Reject")
                )
              )
            )
          )
        : el("p", {}, "No review is pending.")
    );
  }

  // --- failed chunks ----------------------------------------------------------------------------------

  async function chunksView() {
    const page = await api("GET", "/v1/admin/chunks", { params: { status: "failed", limit: 100 } });
    show(
      "Failed chunks",
      page.items.length
        ? el(
            "ul",
            {},
            page.items.map((c) =>
              el(
                "li",
                { class: "panel" },
                el("p", {}, el("strong", {}, `${c.user_id} · chunk ${c.seq}`), ` · ${c.attempts} attempt(s) · received ${when(c.received_at)}`),
                el("p", { class: "error" }, c.error || ""),
                messagesList(c.messages, "Messages"),
                c.raw_output ? el("details", {}, el("summary", {}, "Raw output of the last attempt"), el("pre", {}, c.raw_output)) : null,
                el(
                  "button",
                  {
                    type: "button",
                    onclick: async () => {
                      try {
                        await api("POST", `/v1/admin/chunks/${c.chunk_id}/retry`, { body: {} });
                        say(`Chunk ${c.seq} of ${c.user_id} queued again.`);
                        await chunksView();
                      } catch (error) {
                        failed(error);
                      }
                    },
                  },
                  "Retry"
                )
              )
            )
          )
        : el("p", {}, "No chunk has failed.")
    );
  }

  // --- webhooks ----------------------------------------------------------------------------------------

  async function webhooksView() {
    const page = await api("GET", "/v1/admin/webhooks");
    const panels = [];
    for (const hook of page.items) {
      const log = await api("GET", `/v1/admin/webhooks/${hook.id}/deliveries`, { params: { status: "all", limit: 20 } });
      const rows = log.items.map((d) =>
        el(
          "tr",
          {},
          el("td", {}, d.event_type),
          el("td", {}, d.user_id),
          el("td", {}, d.status),
          el("td", {}, String(d.attempts)),
          el("td", {}, d.status === "pending" ? when(d.next_attempt_at) : "—"),
          el("td", { class: d.last_error ? "error" : "" }, d.last_error || (d.response_status ? `HTTP ${d.response_status}` : "")),
          el(
            "td",
            {},
            d.status === "delivered"
              ? null
              : el(
                  "button",
                  {
                    type: "button",
                    "aria-label": `Redeliver ${d.event_type} of ${d.user_id}`,
                    onclick: async () => {
                      try {
                        await api("POST", `/v1/admin/webhooks/${hook.id}/deliveries/${d.id}/redeliver`);
                        say(`The ${d.event_type} event of ${d.user_id} is sent again.`);
                        await webhooksView();
                      } catch (error) {
                        failed(error);
                      }
                    },
                  },
                  "Redeliver"
                )
          )
        )
      );
      panels.push(
        el(
          "section",
          { class: "panel" },
          el("h3", { class: "mono" }, hook.url),
          el(
            "p",
            {},
            hook.enabled ? "Enabled" : "Disabled",
            ` · events: ${hook.event_types.length ? hook.event_types.join(", ") : "all"}`,
            hook.include_content ? " · with content" : "",
            hook.description ? ` · ${hook.description}` : ""
          ),
          rows.length
            ? el(
                "table",
                {},
                el("caption", {}, "Deliveries, newest event first"),
                el(
                  "thead",
                  {},
                  el("tr", {}, ["Event", "User", "Status", "Attempts", "Next attempt", "Last answer", ""].map((h) => el("th", { scope: "col" }, h)))
                ),
                el("tbody", {}, rows)
              )
            : el("p", {}, "Nothing delivered yet.")
        )
      );
    }
    show("Webhooks", ...(panels.length ? panels : [el("p", {}, "No webhook endpoint. Create one with POST /v1/admin/webhooks.")]));
  }

  // --- usage and writer share -------------------------------------------------------------------------

  async function usageView() {
    const [settings, usage, queued] = await Promise.all([
      api("GET", "/v1/admin/settings"),
      api("GET", "/v1/admin/usage", { params: { limit: 100 } }),
      api("GET", "/v1/admin/chunks", { params: { status: "queued", limit: 20 } }),
    ]);
    const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en"));
    const budget = settings.daily_token_budget;
    const spent = budget !== null && usage.tokens_today >= budget;
    const field = (name, label, value, hint) =>
      el(
        "p",
        {},
        el("label", { for: `share-${name}` }, label),
        el("input", { id: `share-${name}`, name, type: "number", min: name === "write_weight" ? "0.001" : "0", step: "any", value: value ?? "", placeholder: hint })
      );
    const form = el(
      "form",
      {
        class: "panel",
        onsubmit: async (event) => {
          event.preventDefault();
          const body = {};
          for (const name of ["write_weight", "max_writer_concurrency", "daily_token_budget"]) {
            const raw = form.elements[name].value.trim();
            body[name] = raw === "" ? null : Number(raw);
          }
          try {
            await api("PATCH", "/v1/admin/settings", { body });
            say("The writer share is saved.");
            await usageView();
          } catch (error) {
            failed(error);
          }
        },
      },
      el("h3", {}, "Writer share"),
      field("write_weight", "Weight (1: an equal share)", settings.write_weight, "1"),
      field("max_writer_concurrency", "Writer calls in flight at most", settings.max_writer_concurrency, "no cap"),
      field("daily_token_budget", "Writer tokens a UTC day", budget, "no budget"),
      el("button", { type: "submit" }, "Save")
    );
    const moving = settings.embedder_switching_to;
    const embedderForm = el(
      "form",
      {
        class: "panel",
        onsubmit: async (event) => {
          event.preventDefault();
          const raw = embedderForm.elements.embedder.value.trim();
          try {
            await api("PATCH", "/v1/admin/settings", { body: { embedder: raw === "" ? null : raw } });
            say("The tenant's embedder is saved.");
            await usageView();
          } catch (error) {
            failed(error);
          }
        },
      },
      el("h3", {}, "Embedder"),
      el(
        "p",
        { id: "embedder-now" },
        moving
          ? `Moving to ${moving}: the memories are being re-embedded; searches answer again, and chunks are written, once that is done.`
          : `Memories are embedded by ${settings.embedder || "the deployment's embedder"}.`
      ),
      el(
        "p",
        {},
        el("label", { for: "embedder" }, "Embedder (empty: the deployment's)"),
        el("input", { id: "embedder", name: "embedder", type: "text", value: moving || settings.embedder || "" })
      ),
      el("button", { type: "submit" }, "Move")
    );
    const rows = usage.items.map((r) =>
      el(
        "tr",
        {},
        el("td", {}, r.day || ""),
        el("td", {}, r.writer || ""),
        el("td", {}, number(r.chunks_applied)),
        el("td", {}, number(r.model_calls)),
        el("td", {}, number(r.prompt_tokens)),
        el("td", {}, number(r.completion_tokens)),
        el("td", {}, number(r.embedder_texts))
      )
    );
    const waiting = queued.items.filter((c) => c.waiting_for);
    show(
      "Usage",
      el(
        "p",
        { id: "budget-today", class: spent ? "error" : "" },
        `Writer tokens today: ${number(usage.tokens_today)}`,
        budget === null ? " (no daily budget)." : ` of ${number(budget)}${spent ? ": spent — chunks wait until the UTC day turns or the budget is raised." : "."}`
      ),
      form,
      embedderForm,
      el(
        "table",
        {},
        el("caption", {}, `Writes ${usage.since} to ${usage.until} (UTC), by day and writer`),
        el(
          "thead",
          {},
          el("tr", {}, ["Day", "Writer", "Chunks", "Model calls", "Prompt tokens", "Completion tokens", "Texts embedded"].map((h) => el("th", { scope: "col" }, h)))
        ),
        el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: "7" }, "Nothing written in this window."))])
      ),
      waiting.length
        ? el(
            "section",
            { class: "panel" },
            el("h3", {}, "Chunks waiting for the budget"),
            el("ul", {}, waiting.map((c) => el("li", {}, `${c.user_id} · chunk ${c.seq} · received ${when(c.received_at)} · waiting for ${c.waiting_for}`)))
          )
        : null
    );
  }

  // --- audit log ---------------------------------------------------------------------------------------

  async function auditView() {
    const body = el("tbody");
    const more = el("button", { type: "button", hidden: true }, "More events");
    const verdict = el("p", { id: "verify-result", "aria-live": "polite" });
    let cursor = null;
    async function load() {
      const page = await api("GET", "/v1/admin/audit", { params: { limit: 100, cursor } });
      for (const e of page.items) {
        body.append(
          el(
            "tr",
            {},
            el("td", {}, e.seq === null ? "…" : String(e.seq)),
            el("td", {}, when(e.created_at)),
            el("td", { class: "mono" }, e.actor),
            el("td", {}, e.action),
            el("td", { class: "mono" }, `${e.target_type || ""} ${e.target_id || ""}`)
          )
        );
      }
      cursor = page.next_cursor;
      more.hidden = !cursor;
    }
    more.addEventListener("click", () => load().catch(failed));
    const verify = el(
      "button",
      {
        type: "button",
        onclick: async () => {
          try {
            const result = await api("GET", "/v1/admin/audit/verify");
            verdict.textContent = result.ok
              ? `The chain holds: ${result.checked} event(s) checked.`
              : `Broken at event ${result.broken_at_seq}: ${result.reason}`;
            verdict.className = result.ok ? "" : "error";
          } catch (error) {
            failed(error);
          }
        },
      },
      "Verify the chain"
    );
    show(
      "Audit log",
      el("div", { class: "row" }, verify, verdict),
      el(
        "table",
        {},
        el("caption", {}, "Events, oldest first"),
        el("thead", {}, el("tr", {}, ["#", "When", "Actor", "Action", "Target"].map((h) => el("th", { scope: "col" }, h)))),
        body
      ),
      more
    );
    await load();
  }

  // --- routing ----------------------------------------------------------------------------------------

  async function route() {
    if (!key) return;
    const [path, query] = (window.location.hash.slice(1) || "/users").split("?");
    const params = new URLSearchParams(query || "");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    for (const link of nav.querySelectorAll("a")) {
      link.toggleAttribute("aria-current", link.getAttribute("href") === `#/${parts[0]}`);
      if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
    }
    say("Loading…");
    try {
      if (parts[0] === "user" && parts[1]) await userView(parts[1], params);
      else if (parts[0] === "memory" && parts[1]) await memoryView(parts[1]);
      else if (parts[0] === "changesets") await changesetsView(params);
      else if (parts[0] === "reviews") await reviewsView();
      else if (parts[0] === "chunks") await chunksView();
      else if (parts[0] === "webhooks") await webhooksView();
      else if (parts[0] === "audit") await auditView();
      else if (parts[0] === "usage") await usageView();
      else await usersView(params);
    } catch (error) {
      failed(error);
    }
  }

  signInForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = document.getElementById("admin-key");
    const error = document.getElementById("sign-in-error");
    key = input.value.trim();
    try {
      await api("GET", "/v1/admin/users", { params: { limit: 1 } });
    } catch (failure) {
      key = null;
      error.textContent =
        failure instanceof ApiError && failure.status === 403
          ? "This key is not an admin key."
          : `Sign-in failed: ${failure.message}`;
      input.focus();
      return;
    }
    input.value = "";
    nav.hidden = false;
    await route();
  });

  document.getElementById("sign-out").addEventListener("click", () => {
    key = null;
    window.location.hash = "";
    window.location.reload();
  });

  window.addEventListener("hashchange", () => route());
})();
