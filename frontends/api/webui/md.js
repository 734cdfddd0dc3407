// A small Markdown renderer that never parses text as HTML.
// Every piece of model text reaches the page through createTextNode or
// textContent; the only attribute taken from the text is a link's href, and
// only for http(s) and mailto URLs. So "<img src=x onerror=...>" shows as
// those characters. Blocks: fenced code (an unclosed fence, as while
// streaming, runs to the end), headings, rules, quotes, lists, tables,
// paragraphs. Inline: code, bold, italic, strike, links, bare URLs.
'use strict';
(function () {
  const el = (tag, cls) => { const e = document.createElement(tag); if (cls) e.className = cls; return e; };
  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
  const HEAD = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}>\s?/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TROW = /^\s*\|.*\|\s*$/;
  const TSEP = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;
  const INLINE = new RegExp([
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source,                 // 1,2 code
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source,                          // 3 bold
    /__(?=\S)([\s\S]*?\S)__(?!\w)/.source,                        // 4 bold
    /\*(?=[^\s*])([\s\S]*?[^\s*])\*/.source,                      // 5 italic
    /(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/.source,           // 6 italic
    /~~(?=\S)([\s\S]*?\S)~~/.source,                              // 7 strike
    /\[([^\]\n]+)\]\(\s*<?([^\s()<>]+)>?\s*\)/.source,            // 8,9 link
    /(https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"*_~])/.source,         // 10 bare URL
  ].join('|'), 'g');

  function safeHref(url) {
    try {
      const u = new URL(url, document.baseURI);
      return ['http:', 'https:', 'mailto:'].includes(u.protocol) ? u.href : null;
    } catch (e) { return null; }
  }

  function link(parent, text, url, bare) {
    const href = safeHref(url);
    if (!href) { parent.append(text); return; }
    const a = el('a');
    a.href = href; a.target = '_blank'; a.rel = 'noopener noreferrer nofollow';
    if (bare) a.textContent = text; else inline(a, text); // a bare URL would match itself again
    parent.append(a);
  }

  function inline(parent, text) {
    let last = 0, m;
    const re = new RegExp(INLINE.source, 'g'); // one per call: inline() recurses
    while ((m = re.exec(text))) {
      if (m.index > last) parent.append(text.slice(last, m.index));
      last = re.lastIndex;
      let e;
      if (m[1]) { e = el('code'); e.textContent = m[2]; }
      else if (m[3] || m[4]) { e = el('strong'); inline(e, m[3] || m[4]); }
      else if (m[5] || m[6]) { e = el('em'); inline(e, m[5] || m[6]); }
      else if (m[7]) { e = el('del'); inline(e, m[7]); }
      else if (m[8]) { link(parent, m[8], m[9]); continue; }
      else { link(parent, m[10], m[10], true); continue; }
      parent.append(e);
    }
    if (last < text.length) parent.append(text.slice(last));
  }

  // paragraph text: single newlines become line breaks
  function lines(parent, text) {
    text.split('\n').forEach((ln, i) => { if (i) parent.append(el('br')); inline(parent, ln); });
  }

  function codeBlock(lang, body) {
    const wrap = el('div', 'code');
    const bar = el('div', 'codebar');
    const name = el('span'); name.textContent = lang || 'text';
    const copy = el('button', 'copy'); copy.type = 'button'; copy.textContent = 'Copy';
    copy.addEventListener('click', () => {
      if (navigator.clipboard) navigator.clipboard.writeText(body).then(() => { copy.textContent = 'Copied'; }, () => {});
    });
    bar.append(name, copy);
    const pre = el('pre'), code = el('code');
    code.textContent = body;
    pre.append(code);
    wrap.append(bar, pre);
    return wrap;
  }

  function cells(row) {
    return row.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
  }

  function list(ls, i, out) {
    const first = ITEM.exec(ls[i]);
    const ordered = /\d/.test(first[2]);
    const box = el(ordered ? 'ol' : 'ul');
    if (ordered && parseInt(first[2], 10) !== 1) box.start = parseInt(first[2], 10);
    const indent = first[1].length;
    let li = null, buf = [];
    const flush = () => { if (li) { blocks(li, buf); box.append(li); } };
    while (i < ls.length) {
      const m = ITEM.exec(ls[i]);
      if (m && m[1].length <= indent && /\d/.test(m[2]) === ordered) {
        flush(); li = el('li'); buf = [m[3]]; i++; continue;
      }
      if (m && m[1].length <= indent) break;                 // the other kind of list
      if (!ls[i].trim()) {                                     // a blank line ends the list unless it goes on
        const n = ls[i + 1];
        if (n === undefined || !(ITEM.test(n) || /^\s{2,}\S/.test(n))) break;
        buf.push(''); i++; continue;
      }
      if (!m && !/^\s/.test(ls[i]) && isBlockStart(ls[i])) break;
      buf.push(ls[i].replace(new RegExp('^\\s{0,' + (indent + 4) + '}'), '')); i++;
    }
    flush();
    out.append(box);
    return i;
  }

  function isBlockStart(l) {
    return FENCE.test(l) || HEAD.test(l) || RULE.test(l) || QUOTE.test(l) || ITEM.test(l);
  }

  function blocks(out, ls) {
    let i = 0;
    while (i < ls.length) {
      const l = ls[i];
      let m;
      if (!l.trim()) { i++; continue; }
      if ((m = FENCE.exec(l))) {
        const close = new RegExp('^ {0,3}' + m[1][0] + '{' + m[1].length + ',}\\s*$');
        const body = [];
        i++;
        while (i < ls.length && !close.test(ls[i])) body.push(ls[i++]);
        i++;
        out.append(codeBlock(m[2], body.join('\n')));
      } else if ((m = HEAD.exec(l))) {
        const h = el('h' + Math.min(m[1].length + 2, 6)); // h1 is the page's
        inline(h, m[2]); out.append(h); i++;
      } else if (RULE.test(l)) {
        out.append(el('hr')); i++;
      } else if (QUOTE.test(l)) {
        const q = el('blockquote'), body = [];
        while (i < ls.length && QUOTE.test(ls[i])) body.push(ls[i++].replace(QUOTE, ''));
        blocks(q, body); out.append(q);
      } else if (ITEM.test(l)) {
        i = list(ls, i, out);
      } else if (TROW.test(l) && i + 1 < ls.length && TSEP.test(ls[i + 1])) {
        const t = el('table'), hr = el('tr');
        cells(l).forEach((c) => { const th = el('th'); inline(th, c); hr.append(th); });
        const thead = el('thead'), tb = el('tbody');
        thead.append(hr); t.append(thead, tb);
        i += 2;
        while (i < ls.length && TROW.test(ls[i])) {
          const tr = el('tr');
          cells(ls[i++]).forEach((c) => { const td = el('td'); inline(td, c); tr.append(td); });
          tb.append(tr);
        }
        const w = el('div', 'table'); w.append(t); out.append(w);
      } else {
        const p = el('p'), body = [l];
        i++;
        while (i < ls.length && ls[i].trim() && !isBlockStart(ls[i])) body.push(ls[i++]);
        lines(p, body.join('\n')); out.append(p);
      }
    }
  }

  // Markdown text -> a DocumentFragment of safe nodes.
  window.renderMarkdown = function (text) {
    const f = document.createDocumentFragment();
    blocks(f, String(text).replace(/\r\n?/g, '\n').split('\n'));
    return f;
  };
})();
