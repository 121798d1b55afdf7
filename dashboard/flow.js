// The live picture (flow.go): stages as boxes, messages as dots moving
// between them, one following order's journey, and the crash lesson. The
// server sends the data every second (event "flow"); this script draws it.
(() => {
  const svg = 'http://www.w3.org/2000/svg';
  const W = 170, H = 90, X = [20, 250, 480, 740, 990], TOP = 30, BOTTOM = 215;

  // Each stage: its box, the count it shows, and a line under it.
  const nodes = [
    {id: 'orders-paid', x: X[0], y: TOP, title: 'orders · paid'},
    {id: 'orders-outbox', x: X[1], y: TOP, title: "orders' outbox"},
    {id: 'orders-topic', x: X[2], y: TOP, title: 'orders.events', topic: 'orders.events'},
    {id: 'inventory-inbox', x: X[3], y: TOP, title: "inventory's inbox", inbox: 'inventory'},
    {id: 'inventory-decided', x: X[4], y: TOP, title: 'inventory · decided'},
    {id: 'inventory-outbox', x: X[4], y: BOTTOM, title: "inventory's outbox"},
    {id: 'inventory-topic', x: X[3], y: BOTTOM, title: 'inventory.events', topic: 'inventory.events'},
    {id: 'orders-inbox', x: X[2], y: BOTTOM, title: "orders' inbox", inbox: 'orders'},
    {id: 'orders-settled', x: X[1], y: BOTTOM, title: 'orders · settled'},
    {id: 'left', x: X[0], y: BOTTOM, title: 'left the flow'},
  ];
  const byId = Object.fromEntries(nodes.map((n) => [n.id, n]));
  // Each edge: from, to, its label, the stage whose growth moves dots along
  // it, and the inbox whose suppressed copies travel it as red dots.
  const edges = [
    {from: 'orders-paid', to: 'orders-outbox', label: 'same tx', stage: 'orders-outbox'},
    {from: 'orders-outbox', to: 'orders-topic', label: 'relay', stage: 'orders-topic'},
    {from: 'orders-topic', to: 'inventory-inbox', label: 'consume', stage: 'inventory-inbox', dups: 'inventory'},
    {from: 'inventory-inbox', to: 'inventory-decided', label: 'same tx', stage: 'inventory-decided'},
    {from: 'inventory-decided', to: 'inventory-outbox', label: 'same tx', stage: 'inventory-outbox'},
    {from: 'inventory-outbox', to: 'inventory-topic', label: 'relay', stage: 'inventory-topic'},
    {from: 'inventory-topic', to: 'orders-inbox', label: 'consume', stage: 'orders-inbox', dups: 'orders'},
    {from: 'orders-inbox', to: 'orders-settled', label: 'same tx', stage: 'orders-settled'},
  ];

  const el = (name, attrs, parent) => {
    const e = document.createElementNS(svg, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  };
  const text = (parent, x, y, cls, id, t) => {
    const e = el('text', {x, y, class: cls}, parent);
    if (id) e.id = id;
    e.textContent = t || '';
    return e;
  };

  let drawn = false;
  function draw() {
    if (drawn) return;
    drawn = true;
    const g = document.getElementById('nodes'), ge = document.getElementById('edges');
    for (const n of nodes) {
      const box = el('g', {class: 'node' + (n.topic ? ' topic' : ''), id: 'node-' + n.id, transform: `translate(${n.x},${n.y})`}, g);
      el('rect', {width: W, height: H}, box);
      text(box, 10, 18, 'title', null, n.title);
      if (n.id === 'left') {
        text(box, 10, 40, 'sub', 'left-inventory', 'inventory: none');
        text(box, 10, 58, 'sub', 'left-orders', 'orders: none');
        text(box, 10, 80, 'sub', null, 'quarantined, dead-lettered, held');
        continue;
      }
      text(box, 10, 46, 'count', 'st-' + n.id, '…');
      text(box, 10, 64, 'sub', 'sub-' + n.id, '');
      if (n.inbox) text(box, 10, 82, 'dup', 'dup-' + n.inbox, '');
      if (n.topic) el('g', {id: 'parts-' + n.topic, transform: 'translate(10,72)'}, box);
    }
    for (const e of edges) {
      const a = byId[e.from], b = byId[e.to];
      let d;
      if (a.y === b.y) {
        const y = a.y + H / 2, x1 = a.x < b.x ? a.x + W : a.x, x2 = a.x < b.x ? b.x : b.x + W;
        d = `M${x1},${y} L${x2},${y}`;
        text(ge, (x1 + x2) / 2, y - 8, 'edge-label', null, e.label).setAttribute('text-anchor', 'middle');
        e.rate = text(ge, (x1 + x2) / 2, y + 16, 'edge-label', 'rate-' + e.stage, '');
        e.rate.setAttribute('text-anchor', 'middle');
      } else {
        const x = a.x + W / 2, y1 = a.y + H, y2 = b.y;
        d = `M${x},${y1} L${x},${y2}`;
        text(ge, x + 8, (y1 + y2) / 2, 'edge-label', null, e.label);
        e.rate = text(ge, x + 8, (y1 + y2) / 2 + 14, 'edge-label', 'rate-' + e.stage, '');
      }
      e.path = el('path', {d, class: 'edge'}, ge);
    }
  }

  // Dots: each moves along its edge for 900ms, starting within the second.
  const moving = [];
  function spawn(edge, n, dup) {
    // A hidden tab runs no animation frames: draw nothing rather than pile
    // up dots that never move.
    if (document.hidden || moving.length > 400) return;
    const now = performance.now();
    for (let i = 0; i < Math.min(n, 24); i++) {
      const dot = el('circle', {r: 4, class: 'dot' + (dup ? ' dup' : '')}, document.getElementById('dots'));
      dot.style.display = 'none';
      moving.push({dot, path: edge.path, start: now + (i * 900) / Math.min(n, 24), dup});
    }
  }
  function animate(now) {
    for (let i = moving.length - 1; i >= 0; i--) {
      const m = moving[i], t = (now - m.start) / 900;
      if (t < 0) continue;
      if (t >= 1 || (m.dup && t >= 0.85)) { m.dot.remove(); moving.splice(i, 1); continue; }
      const len = m.path.getTotalLength(), p = m.path.getPointAtLength(t * len);
      m.dot.style.display = '';
      m.dot.setAttribute('cx', p.x);
      m.dot.setAttribute('cy', p.y);
    }
    requestAnimationFrame(animate);
  }

  let last = null;
  const set = (id, t) => { const e = document.getElementById(id); if (e) e.textContent = t; };
  const rate = (r) => (r >= 10 ? Math.round(r) : r.toFixed(1)) + '/s';

  function update(pic) {
    draw();
    const f = pic.flow, st = f.stages || {};
    for (const n of nodes) {
      if (n.id === 'left') continue;
      set('st-' + n.id, n.id in st ? st[n.id] : '—');
    }
    for (const svc of ['orders', 'inventory']) {
      const pub = st[svc + '-relay'];
      set(`sub-${svc}-outbox`, `${f.pending[svc] ?? '—'} pending · ${pub ?? '—'} published`);
    }
    for (const svc of ['orders', 'inventory']) {
      const d = (f.duplicates || {})[svc] || 0;
      set('dup-' + svc, d ? `✕ ${d} duplicate${d === 1 ? '' : 's'} suppressed` : 'no duplicates yet');
      const q = (f.quarantined || {})[svc] || {};
      const parts = Object.entries(q).map(([k, v]) => `${k.replace('_', ' ')} ${v}`);
      const h = (f.held || {})[svc];
      if (h && h.Keys) parts.push(`${h.Keys} key${h.Keys === 1 ? '' : 's'} held, ${h.Parked} parked`);
      set('left-' + svc, `${svc}: ${parts.length ? parts.join(', ') : 'none'}`);
    }
    for (const [topic, parts] of Object.entries(f.partitions || {})) {
      const g = document.getElementById('parts-' + topic);
      if (!g) continue;
      g.replaceChildren();
      const w = Math.floor(150 / Math.max(parts.length, 1)) - 2;
      let lag = 0;
      parts.forEach((p, i) => {
        const behind = p.acked < 0 ? p.end : p.end - p.acked;
        lag += behind;
        const r = el('rect', {x: i * (w + 2), y: 0, width: w, height: 8, class: 'part' + (behind > 0 ? ' lag' : '')}, g);
        el('title', {}, r).textContent = `partition ${p.partition}: ${p.end} records, acked to ${p.acked}`;
      });
      set('sub-' + (topic === 'orders.events' ? 'orders-topic' : 'inventory-topic'), `${parts.length} partitions · ${lag} not acked`);
    }
    if (last) {
      const dt = Math.max((pic.at - last.at) / 1000, 0.001);
      for (const e of edges) {
        // Only between two readings of the stage: one that comes back
        // after an error is not a burst of messages.
        const known = e.stage in st && e.stage in last.flow.stages;
        const grew = known ? Math.max(st[e.stage] - last.flow.stages[e.stage], 0) : 0;
        e.rate.textContent = grew > 0 ? rate(grew / dt) : '';
        if (grew > 0) spawn(e, grew, false);
        if (e.dups && e.dups in f.duplicates && e.dups in last.flow.duplicates) {
          const d = Math.max(f.duplicates[e.dups] - last.flow.duplicates[e.dups], 0);
          if (d > 0) spawn(e, d, true);
        }
      }
    }
    last = pic;
    document.getElementById('flow-card').dataset.updates = Number(document.getElementById('flow-card').dataset.updates || 0) + 1;
    crash(pic);
  }

  // Follow one order.
  const when = (at) => (at ? new Date(at).toISOString().slice(11, 23) : '—');
  function li(list, kind, t, what, where) {
    const item = document.createElement('li');
    item.dataset.kind = kind;
    const w = document.createElement('span'); w.className = 'when'; w.textContent = t;
    const s = document.createElement('span'); s.className = 'what'; s.textContent = what;
    item.append(w, s);
    if (where) { const p = document.createElement('div'); p.className = 'where'; p.textContent = where; item.append(p); }
    list.append(item);
  }
  let following = 0; // the latest follow() wins, whatever order answers come in
  async function follow(id) {
    const box = document.getElementById('journey'), mine = ++following;
    document.getElementById('order-id').value = id;
    let res, j;
    try {
      res = await fetch('journey.json?order=' + encodeURIComponent(id));
      j = await res.json();
    } catch (err) {
      if (mine === following) { box.textContent = 'the page could not read that journey: ' + err; box.dataset.status = 'error'; }
      return;
    }
    if (mine !== following) return;
    box.replaceChildren();
    box.dataset.order = id;
    if (!res.ok) { box.textContent = j.error; box.dataset.status = 'error'; return; }
    box.dataset.status = j.status;
    const head = document.createElement('div');
    head.textContent = `order ${j.order}: ${j.status}`;
    if (j.trace_id) {
      const t = document.createElement(j.trace_url ? 'a' : 'span');
      t.id = 'trace-id';
      t.textContent = ' · trace ' + j.trace_id;
      if (j.trace_url) t.href = j.trace_url;
      head.append(t);
    }
    const ol = document.createElement('ol');
    ol.className = 'steps';
    ol.id = 'journey-steps';
    for (const s of j.steps) li(ol, s.kind, when(s.at), s.what, s.where);
    box.append(head, ol);
  }
  async function recent() {
    let list;
    try {
      const res = await fetch('recent.json');
      if (!res.ok) return;
      list = await res.json();
    } catch (err) { return; }
    const box = document.getElementById('recent');
    box.replaceChildren('newest: ');
    for (const o of list || []) {
      const a = document.createElement('a');
      a.textContent = o.id.slice(0, 8);
      a.title = `${o.id} (${o.status})`;
      a.dataset.order = o.id;
      a.onclick = () => follow(o.id);
      box.append(a);
    }
  }

  // Crash it now.
  let windowsShown = false, lessonShown = '';
  function crash(pic) {
    if (!pic.windows) return;
    const card = document.getElementById('crash-card'), sel = document.getElementById('crash-window');
    if (!windowsShown) {
      for (const w of pic.windows) {
        const o = document.createElement('option');
        o.value = w.name; o.textContent = `${w.name} (kills ${w.victim})`; o.title = w.where;
        sel.append(o);
      }
      sel.onchange = () => { const w = pic.windows.find((x) => x.name === sel.value); set('crash-where', w ? w.where : ''); };
      sel.onchange();
      card.hidden = false;
      windowsShown = true;
    }
    const l = pic.lesson, key = JSON.stringify(l || null);
    if (key === lessonShown) return;
    lessonShown = key;
    const box = document.getElementById('lesson');
    box.replaceChildren();
    if (!l) return;
    box.dataset.window = l.window;
    box.dataset.done = l.done ? 'true' : 'false';
    const head = document.createElement('div');
    head.textContent = `${l.window}: ${l.done ? (l.failed ? 'failed: ' + l.failed : 'done') : 'running…'}`;
    const ol = document.createElement('ol');
    ol.className = 'steps';
    ol.id = 'lesson-steps';
    for (const s of l.steps) li(ol, s.kind, when(s.at), s.text);
    box.append(head, ol);
    document.getElementById('crash-now').disabled = !l.done;
    if (l.order && l.done) follow(l.order);
  }

  window.addEventListener('DOMContentLoaded', () => {
    draw();
    requestAnimationFrame(animate);
    recent();
    setInterval(recent, 5000);
    document.getElementById('follow-form').onsubmit = (e) => { e.preventDefault(); follow(document.getElementById('order-id').value.trim()); };
    document.getElementById('crash-form').onsubmit = async (e) => {
      e.preventDefault();
      const body = JSON.stringify({window: document.getElementById('crash-window').value});
      const res = await fetch('crash', {method: 'POST', body, headers: {'X-Crash-It-Now': '1', 'Content-Type': 'application/json'}});
      if (!res.ok) set('crash-where', (await res.json().catch(() => ({error: res.statusText}))).error);
      else document.getElementById('crash-now').disabled = true;
    };
  });
  window.flowUpdate = update;
  window.followOrder = follow;
})();
