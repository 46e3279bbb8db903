// costgate operator dashboard.
//
// The page fetches data.json every REFRESH_MS with the admin token (or the
// read-only one) as a bearer token and redraws everything from it. The token
// comes from the URL fragment (#token=...), which browsers never send to the
// server, or from the login form; it is kept in sessionStorage, so it lives
// as long as the tab.
//
// Money arrives as integer nano-dollars in decimal strings and is formatted
// with BigInt arithmetic, so no amount is ever rounded through a float.
// Floats are used only for pixel positions.
//
// Every piece of data is put into the page with textContent or as an SVG
// attribute value, never parsed as markup.
'use strict';

(function () {
  const REFRESH_MS = 5000;
  const TOKEN_KEY = 'costgate.adminToken';
  const WINDOW_MIN = 60;
  const MAX_SERIES = 7; // tenants drawn as their own line; the rest are summed
  const SHADOW_HIGH = 0.10; // a shadow share from which a row is highlighted
  const MAX_ROWS = 20; // rows shown in the throttled and shadow tables
  // The SVG namespace, taken from the HTML parser so that no asset has to
  // spell out a URL.
  const SVGNS = new DOMParser().parseFromString('<svg></svg>', 'text/html').querySelector('svg').namespaceURI;
  // Okabe-Ito colours, distinguishable with the common colour-vision deficiencies.
  const PALETTE = ['#0072b2', '#e69f00', '#009e73', '#cc79a7', '#56b4e9', '#d55e00', '#332288'];
  const OTHER_COLOUR = '#8a8f98';
  const KINDS = [
    { key: 'allow', label: 'Allow', colour: '#2e7d32' },
    { key: 'soft', label: 'Soft (friction)', colour: '#f2a900' },
    { key: 'hard', label: 'Hard (blocked)', colour: '#c62828' },
    { key: 'shadow', label: 'Shadow (would block)', colour: '#7b3fa0' },
  ];

  const $ = (id) => document.getElementById(id);
  const counts = new Intl.NumberFormat('en-US');
  let timer = 0;
  let last = null; // the last data drawn, redrawn on resize

  // ---- money, counts and times ----

  function nano(v) {
    try {
      return BigInt(v === undefined || v === null || v === '' ? 0 : v);
    } catch (e) {
      return 0n;
    }
  }

  function groupDigits(s) {
    return s.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  }

  // usd formats n nano-dollars (a BigInt) as dollars with the given number
  // of decimals (0 to 9), rounding half away from zero in integer arithmetic.
  function usd(n, decimals) {
    const neg = n < 0n;
    let a = neg ? -n : n;
    const unit = 10n ** BigInt(9 - decimals);
    a = (a + unit / 2n) / unit;
    const scale = 10n ** BigInt(decimals);
    let s = '$' + groupDigits((a / scale).toString());
    if (decimals > 0) s += '.' + (a % scale).toString().padStart(decimals, '0');
    return (neg && a !== 0n ? '-' : '') + s;
  }

  // money picks a precision that shows small LLM amounts: cents from a
  // dollar up, then more decimals the smaller the amount.
  function money(n) {
    const a = n < 0n ? -n : n;
    if (a === 0n || a >= 1000000000n) return usd(n, 2);
    if (a >= 10000000n) return usd(n, 4);
    if (a >= 1000n) return usd(n, 6);
    return usd(n, 9);
  }

  function exactMoney(n) {
    return usd(n, 9);
  }

  function count(v) {
    const n = Number(v);
    return Number.isFinite(n) ? counts.format(n) : '–';
  }

  function percent(f) {
    if (!Number.isFinite(f)) return '–';
    return (Math.min(Math.max(f, 0), 1) * 100).toFixed(1) + '%';
  }

  // parseTime reads an RFC 3339 time; Go may send nanoseconds, which not
  // every Date parser accepts, so the fraction is cut to milliseconds.
  function parseTime(s) {
    if (typeof s !== 'string') return NaN;
    return Date.parse(s.replace(/(\.\d{3})\d+/, '$1'));
  }

  function hhmm(ms) {
    const d = new Date(ms);
    return String(d.getUTCHours()).padStart(2, '0') + ':' + String(d.getUTCMinutes()).padStart(2, '0');
  }

  function hhmmss(ms) {
    return hhmm(ms) + ':' + String(new Date(ms).getUTCSeconds()).padStart(2, '0');
  }

  // ---- DOM helpers ----

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function title(text) {
    return svg('title', { text });
  }

  function cell(text, cls, titleText) {
    const td = el('td', { text });
    if (cls) td.className = cls;
    if (titleText) td.title = titleText;
    return td;
  }

  // fillTable puts rows into the table's body, at most `limit` of them and
  // then a row that says how many more there are.
  function fillTable(id, rows, limit) {
    const table = $(id);
    table.hidden = rows.length === 0;
    if (limit && rows.length > limit) {
      const more = rows.length - limit;
      const td = el('td', { class: 'more', text: `… and ${count(more)} more not shown` });
      td.colSpan = table.tHead.rows[0].cells.length;
      rows = rows.slice(0, limit).concat(el('tr', {}, td));
    }
    table.tBodies[0].replaceChildren(...rows);
  }

  function swatch(colour) {
    const s = el('span', { class: 'swatch', 'aria-hidden': 'true' });
    s.style.backgroundColor = colour; // CSSOM, allowed by the page's CSP
    return s;
  }

  function chartBox(id) {
    const box = $(id);
    return { box, width: Math.max(320, Math.floor(box.clientWidth || 600)) };
  }

  // ---- time buckets ----

  // minutes returns the start (ms) of each minute in the window that ends
  // with the minute containing end.
  function minutes(end) {
    const last = Math.floor(end / 60000) * 60000;
    const out = [];
    for (let i = WINDOW_MIN - 1; i >= 0; i--) out.push(last - i * 60000);
    return out;
  }

  // bucket sums points into the window's minutes; value(p) gives a BigInt.
  function bucket(points, mins, value) {
    const index = new Map(mins.map((m, i) => [m, i]));
    const out = mins.map(() => 0n);
    for (const p of points || []) {
      const t = parseTime(p.t);
      if (!Number.isFinite(t)) continue;
      const i = index.get(Math.floor(t / 60000) * 60000);
      if (i !== undefined) out[i] += value(p);
    }
    return out;
  }

  // niceStep returns a step of 1, 2 or 5 times a power of ten (a BigInt) so
  // that about `ticks` steps cover max.
  function niceStep(max, ticks) {
    let raw = max / BigInt(ticks);
    if (raw < 1n) raw = 1n;
    let pow = 1n;
    while (pow * 10n <= raw) pow *= 10n;
    for (const m of [1n, 2n, 5n, 10n]) if (m * pow >= raw) return m * pow;
    return 10n * pow;
  }

  function trailingZeros(n) {
    let z = 0;
    while (n > 0n && n % 10n === 0n && z < 9) {
      n /= 10n;
      z++;
    }
    return z;
  }

  // ---- header ----

  function badge(id, text, tone, label) {
    const dd = $(id);
    dd.textContent = text;
    dd.className = 'badge ' + tone;
    if (label) dd.setAttribute('aria-label', label);
  }

  function renderHealth(store, generated) {
    store = store || {};
    badge('store-kind', store.kind || 'unknown', 'neutral');
    badge('store-healthy', store.healthy ? 'healthy' : 'unhealthy', store.healthy ? 'ok' : 'bad');
    const breaker = store.breaker || 'unknown';
    const tone = { closed: 'ok', half_open: 'warn', open: 'bad' }[breaker] || 'neutral';
    badge('store-breaker', breaker.replace('_', '-'), tone, 'circuit breaker ' + breaker.replace('_', ' '));
    const fo = Number(store.fail_open_total) || 0;
    badge('store-failopen', count(fo), fo > 0 ? 'warn' : 'ok');
    $('updated').textContent = 'Data at ' + hhmmss(generated) + ' UTC';
  }

  // ---- spend ----

  function spendSeries(spend, mins) {
    const all = (spend || []).map((s) => {
      const b = bucket(s.points, mins, (p) => nano(p.nano_usd));
      return { name: String(s.tenant || '(no tenant)'), buckets: b, total: b.reduce((x, y) => x + y, 0n) };
    });
    all.sort((a, b) => (a.total === b.total ? (a.name < b.name ? -1 : 1) : a.total > b.total ? -1 : 1));
    let shown = all;
    if (all.length > MAX_SERIES) {
      shown = all.slice(0, MAX_SERIES - 1);
      const rest = all.slice(MAX_SERIES - 1);
      const buckets = mins.map((_, i) => rest.reduce((x, s) => x + s.buckets[i], 0n));
      shown.push({
        name: rest.length + ' other tenants', buckets, colour: OTHER_COLOUR, other: true,
        total: buckets.reduce((x, y) => x + y, 0n),
      });
    }
    // Colours follow the names of the tenants drawn, so they stay put as
    // their totals change order.
    shown.filter((s) => !s.other)
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
      .forEach((s, i) => (s.colour = PALETTE[i % PALETTE.length]));
    return shown;
  }

  function renderSpend(spend, generated) {
    const mins = minutes(generated);
    const series = spendSeries(spend, mins);
    const { box, width } = chartBox('spend-chart');
    const empty = series.length === 0;
    $('spend-empty').hidden = !empty;
    box.hidden = empty;
    const rows = series.map((s) => {
      const peak = s.buckets.reduce((x, y) => (y > x ? y : x), 0n);
      const lastMin = s.buckets[s.buckets.length - 1];
      const th = el('th', { scope: 'row' }, swatch(s.colour), el('span', { text: s.name }));
      return el('tr', {}, th,
        cell(money(s.total), 'num', exactMoney(s.total)),
        cell(money(lastMin), 'num', exactMoney(lastMin)),
        cell(money(peak), 'num', exactMoney(peak)));
    });
    fillTable('spend-table', rows);
    if (empty) {
      box.replaceChildren();
      return;
    }

    const H = 210, L = 70, R = 6, T = 10, B = 24;
    const pw = width - L - R, ph = H - T - B;
    let max = 0n;
    for (const s of series) for (const v of s.buckets) if (v > max) max = v;
    const step = max === 0n ? 2500000n : niceStep(max, 5);
    const top = max === 0n ? 4n * step : ((max + step - 1n) / step) * step;
    const decimals = Math.max(2, 9 - trailingZeros(step));
    const y = (v) => T + ph - (Number(v) / Number(top)) * ph;
    const x = (i) => L + (i / (WINDOW_MIN - 1)) * pw;

    const summary = series.map((s) => s.name + ' ' + money(s.total)).join(', ');
    const chart = svg('svg', {
      width, height: H, viewBox: `0 0 ${width} ${H}`, role: 'img',
      'aria-labelledby': 'spend-svg-title spend-svg-desc',
    },
    svg('title', { id: 'spend-svg-title', text: 'Spend per tenant per minute, last 60 minutes' }),
    svg('desc', { id: 'spend-svg-desc', text: 'Total spend in the last hour: ' + summary + '.' }));

    const grid = svg('g', { class: 'grid' });
    for (let v = 0n; v <= top; v += step) {
      const yy = y(v);
      grid.append(svg('line', { x1: L, x2: L + pw, y1: yy, y2: yy }));
      grid.append(svg('text', { x: L - 6, y: yy + 4, 'text-anchor': 'end', text: usd(v, decimals) }));
    }
    // A label every ten minutes and one at the window's end; a round label
    // too close to the end one gives way to it.
    for (let i = 0; i < WINDOW_MIN; i++) {
      const m = mins[i];
      const end = i === WINDOW_MIN - 1;
      if (!end && (new Date(m).getUTCMinutes() % 10 !== 0 || WINDOW_MIN - 1 - i < 7)) continue;
      grid.append(svg('text', { x: x(i), y: H - 6, 'text-anchor': end ? 'end' : 'middle', text: hhmm(m) }));
      grid.append(svg('line', { class: 'tick', x1: x(i), x2: x(i), y1: T + ph, y2: T + ph + 4 }));
    }
    chart.append(grid);

    for (const s of series) {
      const d = s.buckets.map((v, i) => (i ? 'L' : 'M') + x(i).toFixed(1) + ' ' + y(v).toFixed(1)).join(' ');
      chart.append(svg('path', { d, fill: 'none', stroke: s.colour, 'stroke-width': 2, 'stroke-linejoin': 'round', class: 'series' }));
    }
    // One transparent band per minute carries a tooltip with every tenant's spend.
    const bands = svg('g', { class: 'bands' });
    for (let i = 0; i < WINDOW_MIN; i++) {
      const lines = series.map((s) => s.name + ': ' + money(s.buckets[i]));
      bands.append(svg('rect', { x: x(i) - pw / (2 * (WINDOW_MIN - 1)), y: T, width: pw / (WINDOW_MIN - 1), height: ph, fill: 'transparent' },
        title(hhmm(mins[i]) + ' UTC\n' + lines.join('\n'))));
    }
    chart.append(bands);
    box.replaceChildren(chart);
  }

  // ---- decisions ----

  function renderDecisions(decisions, generated) {
    const mins = minutes(generated);
    const list = (decisions || []).map((p) => {
      const c = {};
      for (const k of KINDS) c[k.key] = Math.max(0, Number(p[k.key]) || 0);
      c.total = c.allow + c.soft + c.hard + c.shadow;
      return { name: String(p.policy || '(no policy)'), c, perMin: bucket(p.points, mins, (q) => nano(q.count)) };
    });
    list.sort((a, b) => b.c.hard - a.c.hard || b.c.total - a.c.total || (a.name < b.name ? -1 : 1));
    const { box, width } = chartBox('decisions-chart');
    const empty = list.length === 0;
    $('decisions-empty').hidden = !empty;
    box.hidden = empty;

    fillTable('decisions-table', list.map((p) => {
      const blocked = p.c.total ? p.c.hard / p.c.total : 0;
      return el('tr', {},
        nameCell('th', p.name, 30, { scope: 'row' }),
        cell(count(p.c.allow), 'num'), cell(count(p.c.soft), 'num'),
        cell(count(p.c.hard), 'num' + (p.c.hard ? ' hard' : '')), cell(count(p.c.shadow), 'num'),
        cell(percent(blocked), 'num'),
        el('td', {}, sparkline(p.name, p.perMin, mins)));
    }));
    if (empty) {
      box.replaceChildren();
      return;
    }

    // Labels get the room their longest name needs, up to 40% of the width.
    const rowH = 20, gap = 7, R = 58, T = 2;
    const longest = list.reduce((n, p) => Math.max(n, p.name.length), 0);
    const L = Math.min(Math.round(width * 0.4), 16 + longest * 6.8);
    const maxChars = Math.floor((L - 16) / 6.8);
    const H = T + list.length * (rowH + gap);
    const pw = width - L - R;
    const chart = svg('svg', {
      width, height: H, viewBox: `0 0 ${width} ${H}`, role: 'img',
      'aria-labelledby': 'decisions-svg-title decisions-svg-desc',
    },
    svg('title', { id: 'decisions-svg-title', text: 'Decisions per policy as shares of its requests' }),
    svg('desc', {
      id: 'decisions-svg-desc',
      text: list.map((p) => p.name + ': ' + KINDS.map((k) => count(p.c[k.key]) + ' ' + k.key).join(', ')).join('; ') + '.',
    }));

    list.forEach((p, i) => {
      const yy = T + i * (rowH + gap);
      const g = svg('g', { class: 'bar' });
      g.append(svg('text', { x: L - 8, y: yy + rowH / 2 + 4, 'text-anchor': 'end', class: 'label', text: clipName(p.name, maxChars) }, title(p.name)));
      g.append(svg('rect', { x: L, y: yy, width: pw, height: rowH, class: 'track' }));
      let xx = L;
      for (const k of KINDS) {
        const v = p.c[k.key];
        if (!v) continue;
        const w = (v / p.c.total) * pw;
        g.append(svg('rect', { x: xx, y: yy, width: Math.max(w, 1), height: rowH, fill: k.colour },
          title(`${p.name}: ${k.label.toLowerCase()} ${count(v)} (${percent(v / p.c.total)})`)));
        xx += w;
      }
      g.append(svg('text', { x: L + pw + 8, y: yy + rowH / 2 + 4, class: 'total', text: count(p.c.total) }));
      chart.append(g);
    });
    const legend = el('ul', { class: 'legend', 'aria-label': 'Legend' },
      ...KINDS.map((k) => el('li', {}, swatch(k.colour), el('span', { text: k.label }))));
    box.replaceChildren(legend, chart);
  }

  // clipName shortens s to n characters by cutting its middle: the start,
  // which a reader looks for, stays, and so does the end, where names such
  // as policy ids that share a prefix differ.
  function clipName(s, n) {
    if (s.length <= n) return s;
    const tail = Math.min(8, Math.floor((n - 1) / 3));
    const head = n - 1 - tail;
    return s.slice(0, head) + '…' + (tail > 0 ? s.slice(s.length - tail) : '');
  }

  // nameCell is a cell for a name that may be long: shortened in its middle,
  // whole in its title.
  function nameCell(tag, s, n, props) {
    s = String(s || '');
    const c = el(tag, Object.assign({ class: 'name', text: clipName(s, n) }, props || {}));
    if (s.length > n) {
      c.title = s;
      c.dataset.full = s;
    }
    return c;
  }

  function sparkline(name, perMin, mins) {
    const W = 90, H = 20;
    let max = 0n, at = 0;
    perMin.forEach((v, i) => {
      if (v > max) {
        max = v;
        at = i;
      }
    });
    const label = max === 0n
      ? `${name}: nothing blocked in the last hour`
      : `${name}: blocked per minute, peak ${count(max)} at ${hhmm(mins[at])} UTC`;
    const s = svg('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, class: 'spark' }, title(label));
    const x = (i) => 1 + (i / (WINDOW_MIN - 1)) * (W - 2);
    const y = (v) => H - 2 - (max === 0n ? 0 : (Number(v) / Number(max)) * (H - 4));
    const d = perMin.map((v, i) => (i ? 'L' : 'M') + x(i).toFixed(1) + ' ' + y(v).toFixed(1)).join(' ');
    s.append(svg('path', { d, fill: 'none', stroke: max === 0n ? '#9aa1ab' : '#c62828', 'stroke-width': 1.5 }));
    return s;
  }

  // ---- top throttled ----

  function meter(fraction, tone, label) {
    const wrap = el('span', { class: 'meter ' + tone });
    const bar = el('span', { class: 'fill' });
    bar.style.width = (Math.min(Math.max(fraction, 0), 1) * 100).toFixed(1) + '%';
    wrap.append(bar);
    const m = el('span', { class: 'meter-row' }, wrap, el('span', { class: 'meter-label', text: label }));
    return m;
  }

  // keyText shows a limiter key in code type, breakable after each '|' that
  // separates its dimensions.
  function keyText(key) {
    const code = el('code');
    key.split('|').forEach((part, i, parts) => {
      code.append(part + (i < parts.length - 1 ? '|' : ''));
      if (i < parts.length - 1) code.append(el('wbr'));
    });
    return code;
  }

  function renderThrottled(top) {
    const list = [...(top || [])].sort((a, b) => (Number(b.count) || 0) - (Number(a.count) || 0));
    const max = list.length ? Number(list[0].count) || 0 : 0;
    $('throttled-empty').hidden = list.length > 0;
    fillTable('throttled-table', list.map((k, i) => {
      const n = Number(k.count) || 0;
      return el('tr', {},
        cell(String(i + 1), 'num rank'),
        el('th', { scope: 'row', class: 'key' }, keyText(String(k.key || ''))),
        nameCell('td', k.limit, 18), nameCell('td', k.tenant, 14),
        el('td', { class: 'num' }, meter(max ? n / max : 0, 'hard', count(n))));
    }), MAX_ROWS);
  }

  // ---- shadow ----

  function renderShadow(shadow) {
    const list = [...(shadow || [])].map((s) => ({ ...s, share: Number(s.share) }));
    list.sort((a, b) => (b.share || 0) - (a.share || 0) || (Number(b.would_block) || 0) - (Number(a.would_block) || 0));
    $('shadow-empty').hidden = list.length > 0;
    const worst = list.find((s) => s.share >= SHADOW_HIGH);
    const alert = $('shadow-alert');
    alert.hidden = !worst;
    if (worst) {
      const more = list.filter((s) => s.share >= SHADOW_HIGH).length - 1;
      alert.textContent = `If enforced, ${worst.policy || '(no policy)'} (limit ${worst.limit || 'none'}) would block ${percent(worst.share)} of tenant ${worst.tenant || '(no tenant)'}'s requests` +
        (more > 0 ? `, and ${more} more row${more > 1 ? 's' : ''} below are over ${percent(SHADOW_HIGH)}.` : '.');
    }
    fillTable('shadow-table', list.map((s) => {
      const high = s.share >= SHADOW_HIGH;
      const tr = el('tr', high ? { class: 'high' } : {},
        nameCell('th', s.policy, 30, { scope: 'row' }),
        nameCell('td', s.limit, 18), nameCell('td', s.tenant, 14),
        cell(count(s.would_block), 'num'),
        el('td', { class: 'share' }, meter(s.share || 0, high ? 'hard' : 'shadow', percent(s.share)),
          high ? el('span', { class: 'visually-hidden', text: ' (high)' }) : null));
      return tr;
    }), MAX_ROWS);
  }

  // ---- the last policy replay ----

  function renderReplay(r) {
    $('replay-empty').hidden = !!r;
    $('replay-summary').hidden = !r;
    $('replay-table').hidden = !r;
    if (!r) return;
    const files = (r.files || []).join(', ') || '(none)';
    const scope = (r.tenant ? ` of tenant ${r.tenant}` : '') + (r.since ? ` over the last ${r.since}` : '');
    const at = parseTime(r.at);
    const when = Number.isFinite(at) ? new Date(at).toISOString() : '(time unknown)';
    $('replay-summary').textContent = `Candidate ${files}, run ${when}: ` +
      `${count(r.changed)} of ${count(r.replayed)} captured requests${scope} would be decided otherwise ` +
      `(${money(nano(r.changed_nano_usd))} of estimated spend).`;
    const rows = [];
    for (const [kind, list] of [['change', r.transitions], ['policy', r.policies], ['tenant', r.tenants]]) {
      for (const c of list || []) {
        rows.push(el('tr', {}, cell(kind), nameCell('th', c.name, 30, { scope: 'row' }),
          cell(count(c.count), 'num'), cell(money(nano(c.nano_usd)), 'num')));
      }
    }
    fillTable('replay-table', rows, MAX_ROWS);
  }

  // ---- limits: mode and leases; the region ----

  function renderLimits(limits, region) {
    const list = [...(limits || [])];
    list.sort((a, b) => (b.leases || 0) - (a.leases || 0) || String(a.name).localeCompare(String(b.name)));
    $('limits-empty').hidden = list.length > 0;
    fillTable('limits-table', list.map((l) => el('tr', {},
      nameCell('th', l.name, 30, { scope: 'row' }),
      cell((l.mode || 'strict') + (l.budget ? ' budget' : '')),
      cell(count(l.keys), 'num'), cell(count(l.leases), 'num'), cell(count(l.unspent), 'num'))), MAX_ROWS);
    const r = $('region');
    r.hidden = !region;
    if (!region) return;
    const ok = parseTime(region.last_reconciliation);
    const when = Number.isFinite(ok) && ok > 0 ? new Date(ok).toISOString() : 'never';
    r.textContent = `Region ${region.region} of ${(region.regions || []).join(', ')}: last reconciliation ${when}` +
      (region.last_error ? `; last error: ${region.last_error}` : '.');
  }

  // ---- budgets of teams and keys, and a key's levels ----

  function keyFromFragment() {
    const m = /(?:^|&)key=([^&]*)/.exec(location.hash.slice(1));
    return m ? decodeURIComponent(m[1]) : '';
  }

  function renderBudgets(budgets) {
    const list = [...(budgets || [])].map((b) => {
      const amount = nano(b.amount_nano_usd);
      const spent = nano(b.spent_nano_usd);
      return { ...b, amount, spent, used: amount > 0n ? Number((spent * 10000n) / amount) / 10000 : 0 };
    });
    list.sort((a, b) => b.used - a.used);
    $('budgets-empty').hidden = list.length > 0;
    fillTable('budgets-table', list.map((b) => {
      const name = b.kind === 'key'
        ? el('a', { href: '#key=' + encodeURIComponent(b.id), text: 'key ' + b.name })
        : document.createTextNode('team ' + b.name);
      const tone = b.used >= 1 ? 'hard' : b.used >= 0.8 ? 'soft' : 'allow';
      return el('tr', {},
        el('th', { scope: 'row' }, name),
        nameCell('td', b.tenant, 14), nameCell('td', b.budget + ' (' + b.period + ')', 18),
        cell(money(b.spent), 'num'), cell(money(b.amount), 'num'),
        el('td', { class: 'share' }, meter(b.used, tone, percent(b.used))));
    }), 50);
  }

  async function renderKey(token) {
    const id = keyFromFragment();
    $('key-card').hidden = !id;
    if (!id) return;
    $('key-id').textContent = id;
    const err = $('key-error');
    try {
      const res = await fetch('v1/keys/' + encodeURIComponent(id) + '/levels', { headers: { Authorization: 'Bearer ' + token }, cache: 'no-store' });
      const body = await res.json();
      if (!res.ok) throw new Error((body.error && body.error.message) || res.status);
      err.hidden = true;
      const levels = body.levels || [];
      if (levels.length === 0) {
        err.hidden = false;
        err.textContent = 'No level of this key has a budget or limit.';
      }
      fillTable('key-table', levels.map((l) => {
        const used = (Number(l.used_percent) || 0) / 100;
        const unit = l.budget ? 'usd' : l.unit;
        const fmt = (v) => (l.budget ? money(nano(v)) : count(v) + ' ' + unit);
        return el('tr', l.closest ? { class: 'high' } : {},
          el('th', { scope: 'row', text: l.level + (l.closest ? ' (closest to refusing)' : '') }),
          nameCell('td', l.name, 30), cell(fmt(l.remaining), 'num'), cell(fmt(l.capacity), 'num'),
          el('td', { class: 'share' }, meter(used, used >= 1 ? 'hard' : l.closest ? 'soft' : 'allow', percent(used))));
      }));
    } catch (e) {
      err.hidden = false;
      err.textContent = 'Could not load the key: ' + e.message;
      $('key-table').hidden = true;
    }
  }

  // ---- loading ----

  function render(d) {
    const generated = parseTime(d.generated_at);
    const end = Number.isFinite(generated) && generated > 0 ? generated : Date.now();
    $('main').hidden = false;
    renderHealth(d.store, end);
    renderSpend(d.spend, end);
    renderDecisions(d.decisions, end);
    renderThrottled(d.top_throttled);
    renderShadow(d.shadow);
    renderBudgets(d.budgets);
    renderReplay(d.replay);
    renderLimits(d.limits, d.region);
    document.documentElement.dataset.loaded = String(end);
  }

  function showError(msg) {
    const e = $('error');
    e.textContent = msg;
    e.hidden = !msg;
  }

  function showLogin(reason) {
    clearTimeout(timer);
    $('main').hidden = true;
    $('health').hidden = true;
    $('status').hidden = true;
    $('signout').hidden = true;
    $('login').hidden = false;
    $('login-reason').textContent = reason || 'Enter the admin token (COSTGATE_ADMIN_TOKEN) or the read-only token (control.read_token) to see the dashboard.';
    $('token-input').focus();
  }

  function tokenFromFragment() {
    const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
    if (!m) return;
    let t = m[1];
    try {
      t = decodeURIComponent(t);
    } catch (e) {
      // keep it as written
    }
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    // Take the token out of the address bar and the history.
    history.replaceState(null, '', location.pathname + location.search);
  }

  async function refresh() {
    clearTimeout(timer);
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) {
      showLogin();
      return;
    }
    $('login').hidden = true;
    $('signout').hidden = false;
    $('health').hidden = false;
    $('status').hidden = false;
    try {
      const res = await fetch('data.json', { headers: { Authorization: 'Bearer ' + token }, cache: 'no-store' });
      if (res.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        showError('');
        showLogin('That token was not accepted. Enter the admin token.');
        return;
      }
      if (!res.ok) {
        let msg = res.status + ' ' + res.statusText;
        try {
          msg = (await res.json()).error.message || msg;
        } catch (e) {
          // not JSON: keep the status line
        }
        throw new Error(msg);
      }
      const d = await res.json();
      last = d;
      render(d);
      await renderKey(token);
      showError('');
    } catch (e) {
      showError('Could not load data: ' + e.message + (last ? '. Showing the last data received.' : '.') + ' Retrying every 5 s.');
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  function start() {
    tokenFromFragment();
    $('login').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const t = $('token-input').value.trim();
      if (!t) return;
      sessionStorage.setItem(TOKEN_KEY, t);
      $('token-input').value = '';
      refresh();
    });
    $('signout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      last = null;
      showLogin('Signed out.');
    });
    window.addEventListener('hashchange', () => {
      tokenFromFragment();
      refresh();
    });
    let resize = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resize);
      resize = setTimeout(() => last && !$('main').hidden && render(last), 150);
    });
    refresh();
  }

  start();
})();
