// xterm.js writes its rules (cell sizes, theme colours) into <style> elements it creates at run time, which the
// page's Content-Security-Policy (no inline styles; docs/security.md) refuses. Loaded before xterm.js, this hands
// it elements that put the same text into constructable stylesheets instead: CSSOM, which the CSP allows.
(() => {
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function (tag, opts) {
    if (String(tag).toLowerCase() !== 'style') return create.call(this, tag, opts);
    const el = create.call(this, 'xterm-style', opts);
    el.hidden = true;
    const sheet = new CSSStyleSheet();
    this.adoptedStyleSheets = [...this.adoptedStyleSheets, sheet];
    let text = '';
    const write = { configurable: true, get: () => text, set: (v) => { text = String(v ?? ''); sheet.replaceSync(text); } };
    Object.defineProperty(el, 'textContent', write);
    Object.defineProperty(el, 'innerText', write);
    Object.defineProperty(el, 'sheet', { get: () => sheet });
    const remove = el.remove.bind(el);
    el.remove = () => { this.adoptedStyleSheets = this.adoptedStyleSheets.filter((s) => s !== sheet); remove(); };
    return el;
  };
})();
