// ringserve's chat page. Plain DOM, no build step, nothing fetched but this
// server's API. Model text is rendered by md.js (text nodes only); this file
// never assigns HTML either: every string goes through textContent.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const KEY = { convs: 'rs.convs', cur: 'rs.cur', settings: 'rs.settings', key: 'rs.key' };
  const DEFAULTS = { system: '', temperature: 0.8, top_k: 40, top_p: 0.95, max_tokens: -1 };
  const NUM = ['temperature', 'top_k', 'top_p', 'max_tokens'];

  const load = (k, d) => { try { const v = JSON.parse(localStorage.getItem(k)); return v == null ? d : v; } catch (e) { return d; } };
  const S = {
    convs: load(KEY.convs, []),            // [{id, title, named, t, msgs: [{role, content, stats?, error?, stopped?}]}]
    cur: load(KEY.cur, null),
    settings: Object.assign({}, DEFAULTS, load(KEY.settings, {})),
    key: load(KEY.key, ''),
    busy: null,                            // {ctrl, conv, msg} while a request runs
    editing: -1,                           // index of the user message being edited
  };
  const save = () => {
    try {
      localStorage.setItem(KEY.convs, JSON.stringify(S.convs));
      localStorage.setItem(KEY.cur, JSON.stringify(S.cur));
    } catch (e) { status('Could not save to this browser\'s storage: ' + e.message); }
  };
  const conv = () => S.convs.find((c) => c.id === S.cur) || null;
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  function status(text) {
    const s = $('status');
    s.textContent = text || '';
    s.hidden = !text;
  }

  // ---------------------------------------------------------------- sidebar
  function renderConvs() {
    const ul = $('convs');
    ul.replaceChildren();
    for (const c of [...S.convs].sort((a, b) => b.t - a.t)) {
      const li = el('li', c.id === S.cur ? 'conv cur' : 'conv');
      li.dataset.id = c.id;
      const name = el('button', 'name', c.title || 'New chat');
      name.type = 'button';
      name.title = c.title || 'New chat';
      name.addEventListener('click', () => { select(c.id); closeSide(); });
      const ren = el('button', 'icon rename', '\u270e');
      ren.type = 'button'; ren.title = 'Rename'; ren.setAttribute('aria-label', 'Rename');
      ren.addEventListener('click', () => rename(li, c));
      const del = el('button', 'icon delete', '\u2715');
      del.type = 'button'; del.title = 'Delete'; del.setAttribute('aria-label', 'Delete');
      del.addEventListener('click', () => remove(c.id));
      li.append(name, ren, del);
      ul.append(li);
    }
  }

  function rename(li, c) {
    const inp = el('input', 'renaming');
    inp.value = c.title || '';
    li.replaceChildren(inp);
    inp.focus(); inp.select();
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      const v = inp.value.trim();
      if (keep && v) { c.title = v; c.named = true; save(); }
      renderConvs(); renderTitle();
    };
    inp.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      if (e.key === 'Escape') finish(false);
    });
    inp.addEventListener('blur', () => finish(true));
  }

  function remove(id) {
    if (S.busy && S.busy.conv.id === id) S.busy.ctrl.abort();
    S.convs = S.convs.filter((c) => c.id !== id);
    if (S.cur === id) S.cur = S.convs.length ? [...S.convs].sort((a, b) => b.t - a.t)[0].id : null;
    save(); renderAll();
  }

  function select(id) {
    S.cur = id; S.editing = -1;
    save(); renderAll();
  }

  function newChat() {
    const c = conv();
    if (c && !c.msgs.length) { closeSide(); $('input').focus(); return; } // already on an empty one
    S.cur = null; S.editing = -1;
    save(); renderAll(); closeSide(); $('input').focus();
  }

  const openSide = () => { document.body.classList.add('side-open'); $('scrim').hidden = false; };
  const closeSide = () => { document.body.classList.remove('side-open'); $('scrim').hidden = true; };

  // ---------------------------------------------------------------- messages
  function renderTitle() {
    const c = conv();
    $('title').textContent = (c && c.title) || 'New chat';
    document.title = ((c && c.title) ? c.title + ' - ' : '') + 'ringserve';
  }

  function statsLine(st) {
    const parts = [];
    if (st.tps != null) parts.push(st.tps.toFixed(1) + ' tokens/s');
    if (st.n != null) parts.push(st.n + ' generated');
    if (st.prompt != null) parts.push('prompt ' + st.prompt + ' tokens');
    if (st.cached != null) parts.push(st.cached + ' cached');
    return parts.join(' \u00b7 ');
  }

  function paintBody(body, m) {
    body.replaceChildren(m.role === 'assistant' ? window.renderMarkdown(m.content) : document.createTextNode(m.content));
  }

  function renderMsg(c, m, i) {
    const box = el('div', 'msg ' + m.role);
    box.dataset.i = i;
    const body = el('div', 'body');
    if (S.editing === i) {
      const ta = el('textarea', 'editbox');
      ta.value = m.content;
      ta.rows = Math.min(12, m.content.split('\n').length + 1);
      const ok = el('button', 'primary', 'Send'), no = el('button', '', 'Cancel');
      ok.type = no.type = 'button';
      ok.addEventListener('click', () => resend(c, i, ta.value));
      no.addEventListener('click', () => { S.editing = -1; renderMsgs(); });
      ta.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); resend(c, i, ta.value); }
        if (e.key === 'Escape') { S.editing = -1; renderMsgs(); }
      });
      const bar = el('div', 'actions');
      bar.append(ok, no);
      box.append(ta, bar);
      setTimeout(() => ta.focus(), 0);
      return box;
    }
    paintBody(body, m);
    box.append(body);
    if (m.error) box.append(el('div', 'error', m.error));
    const foot = el('div', 'foot');
    const stats = el('span', 'stats', m.stats ? statsLine(m.stats) : (m.stopped ? 'stopped' : ''));
    if (m.stats && m.stopped) stats.textContent += ' \u00b7 stopped';
    foot.append(stats);
    const idle = !S.busy;
    const last = i === c.msgs.length - 1;
    if (m.role === 'user' && idle) {
      const b = el('button', 'act edit', 'Edit'); b.type = 'button';
      b.addEventListener('click', () => { S.editing = i; renderMsgs(); });
      foot.append(b);
    }
    if (m.role === 'assistant' && idle && last) {
      const b = el('button', 'act regen', 'Regenerate'); b.type = 'button';
      b.addEventListener('click', regenerate);
      foot.append(b);
    }
    if (m.role === 'assistant' && idle && m.content) {
      const b = el('button', 'act copy', 'Copy'); b.type = 'button';
      b.addEventListener('click', () => navigator.clipboard && navigator.clipboard.writeText(m.content));
      foot.append(b);
    }
    box.append(foot);
    return box;
  }

  function renderMsgs() {
    const c = conv(), box = $('msgs');
    box.replaceChildren();
    if (!c || !c.msgs.length) {
      box.append(el('div', 'empty', 'Ask anything. Conversations stay in this browser.'));
      return;
    }
    c.msgs.forEach((m, i) => box.append(renderMsg(c, m, i)));
    box.scrollTop = box.scrollHeight;
  }

  function renderAll() { renderConvs(); renderTitle(); renderMsgs(); }

  function setBusy(on) {
    $('send').hidden = on;
    $('stop').hidden = !on;
  }

  // ---------------------------------------------------------------- requests
  function headers() {
    const h = { 'Content-Type': 'application/json' };
    if (S.key) h.Authorization = 'Bearer ' + S.key;
    return h;
  }

  function needKey() {
    $('keybar').hidden = false;
    $('s-keyrow').hidden = false;
    $('key').value = S.key;
    $('key').focus();
  }

  function send(text) {
    if (S.busy || !text.trim()) return;
    let c = conv();
    if (!c) {
      c = { id: newId(), title: '', named: false, t: Date.now(), msgs: [] };
      S.convs.push(c); S.cur = c.id;
    }
    const last = c.msgs[c.msgs.length - 1];
    if (last && last.role === 'assistant' && !last.content) c.msgs.pop(); // a failed or empty answer: roles must alternate
    c.msgs.push({ role: 'user', content: text });
    if (!c.named) c.title = text.trim().split('\n')[0].slice(0, 48);
    $('input').value = '';
    autosize();
    generate(c);
  }

  function resend(c, i, text) {
    if (S.busy || !text.trim()) return;
    c.msgs = c.msgs.slice(0, i);
    c.msgs.push({ role: 'user', content: text });
    if (!c.named && i === 0) c.title = text.trim().split('\n')[0].slice(0, 48);
    S.editing = -1;
    generate(c);
  }

  function regenerate() {
    const c = conv();
    if (S.busy || !c) return;
    while (c.msgs.length && c.msgs[c.msgs.length - 1].role === 'assistant') c.msgs.pop();
    if (c.msgs.length) generate(c);
  }

  function requestBody(c) {
    const st = S.settings, msgs = [];
    if (st.system.trim()) msgs.push({ role: 'system', content: st.system });
    for (const m of c.msgs) if (m.content || m.role === 'user') msgs.push({ role: m.role, content: m.content });
    const body = { messages: msgs, stream: true, cache_prompt: true };
    for (const k of ['temperature', 'top_k', 'top_p']) if (Number.isFinite(st[k])) body[k] = st[k];
    if (Number.isFinite(st.max_tokens) && st.max_tokens >= 0) body.max_tokens = st.max_tokens;
    return body;
  }

  async function errorText(r) {
    try { const j = await r.json(); return (j.error && j.error.message) || JSON.stringify(j); }
    catch (e) { return r.status + ' ' + r.statusText; }
  }

  // Streams one answer into c: each network chunk's SSE events are applied,
  // then the message is repainted once (a chunk usually holds one token).
  async function generate(c) {
    const msg = { role: 'assistant', content: '' };
    c.msgs.push(msg);
    c.t = Date.now();
    const ctrl = new AbortController();
    S.busy = { ctrl, conv: c, msg };
    setBusy(true);
    save(); renderAll();
    const node = () => (S.cur === c.id ? $('msgs').querySelector('.msg[data-i="' + c.msgs.indexOf(msg) + '"] .body') : null);
    const sent = S.key;
    try {
      const r = await fetch('v1/chat/completions', {
        method: 'POST', headers: headers(), body: JSON.stringify(requestBody(c)), signal: ctrl.signal,
      });
      if (r.status === 401) {
        c.msgs.splice(c.msgs.indexOf(msg), 1);
        // A key entered while this request was out: it was refused with the old
        // key, so send again with the new one (after finally clears S.busy).
        if (S.key !== sent) { setTimeout(() => { if (!S.busy && S.convs.includes(c)) generate(c); }, 0); return; }
        S.retry = c;
        needKey();
        return;
      }
      if (!r.ok) { msg.error = await errorText(r); return; }
      $('keybar').hidden = true;
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r/g, '');
        let k, grew = false;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (!data || data === '[DONE]') continue;
            const j = JSON.parse(data);
            if (j.error) msg.error = j.error.message || 'error';
            const d = j.choices && j.choices[0] && j.choices[0].delta;
            if (d && d.content) { msg.content += d.content; grew = true; }
            if (j.timings) {
              const t = j.timings;
              msg.stats = { tps: t.predicted_per_second, n: t.predicted_n, prompt: (t.prompt_n || 0) + (t.cache_n || 0), cached: t.cache_n || 0 };
            }
          }
        }
        const b = grew && node();
        if (b) { paintBody(b, msg); const box = $('msgs'); box.scrollTop = box.scrollHeight; }
      }
    } catch (e) {
      if (e.name === 'AbortError') msg.stopped = true;
      else msg.error = 'Request failed: ' + e.message;
    } finally {
      S.busy = null;
      setBusy(false);
      save(); renderAll();
    }
  }

  // ---------------------------------------------------------------- settings
  function fillSettings() {
    const st = S.settings;
    $('s-system').value = st.system;
    for (const k of NUM) $('s-' + k).value = st[k];
    $('s-key').value = S.key;
    if (S.key) $('s-keyrow').hidden = false;
  }

  function readSettings() {
    const st = S.settings;
    st.system = $('s-system').value;
    for (const k of NUM) {
      const v = parseFloat($('s-' + k).value);
      st[k] = Number.isFinite(v) ? v : DEFAULTS[k];
    }
    localStorage.setItem(KEY.settings, JSON.stringify(st));
    setKey($('s-key').value.trim());
  }

  function setKey(k) {
    S.key = k;
    localStorage.setItem(KEY.key, JSON.stringify(k));
  }

  // ---------------------------------------------------------------- start
  function autosize() {
    const t = $('input');
    t.style.height = 'auto';
    t.style.height = Math.min(t.scrollHeight, 200) + 'px';
  }

  async function probe(tries) {
    try {
      const sent = S.key;
      const r = await fetch('v1/models', { headers: headers() });
      if (r.status === 401) { if (S.key === sent) needKey(); return; }  // a stale key's answer asks nothing
      if (r.status === 503 && tries > 0) { status('Loading model\u2026'); setTimeout(() => probe(tries - 1), 1000); return; }
      if (!r.ok) return;
      status('');
      const j = await r.json();
      $('model').textContent = (j.data && j.data[0] && j.data[0].id) || '';
    } catch (e) { /* the page still works; errors show on send */ }
  }

  function start() {
    if (S.cur && !conv()) S.cur = null;
    fillSettings();
    renderAll();
    $('composer').addEventListener('submit', (e) => { e.preventDefault(); send($('input').value); });
    $('input').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send($('input').value); }
    });
    $('input').addEventListener('input', autosize);
    $('stop').addEventListener('click', () => { if (S.busy) S.busy.ctrl.abort(); });
    $('new').addEventListener('click', newChat);
    $('menu').addEventListener('click', openSide);
    $('scrim').addEventListener('click', closeSide);
    $('gear').addEventListener('click', () => {
      const f = $('settings');
      f.hidden = !f.hidden;
      $('gear').setAttribute('aria-expanded', String(!f.hidden));
    });
    $('settings').addEventListener('input', readSettings);
    $('settings').addEventListener('submit', (e) => e.preventDefault());
    $('s-reset').addEventListener('click', () => { Object.assign(S.settings, DEFAULTS); fillSettings(); readSettings(); });
    const useKey = () => {
      setKey($('key').value.trim());
      $('s-key').value = S.key;
      $('keybar').hidden = true;
      probe(0);
      const c = S.retry;
      S.retry = null;
      if (c && S.convs.includes(c) && !S.busy && c.msgs.length && c.msgs[c.msgs.length - 1].role === 'user') {
        S.cur = c.id;
        generate(c);
      }
    };
    $('keyok').addEventListener('click', useKey);
    $('key').addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); useKey(); } });
    window.addEventListener('storage', () => { if (!S.busy) { S.convs = load(KEY.convs, []); renderAll(); } });
    probe(30);
    $('input').focus();
  }

  start();
})();
