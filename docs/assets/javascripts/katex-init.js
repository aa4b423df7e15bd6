// Typeset every formula that pymdownx.arithmatex (generic mode) left as \( \) or \[ \] text, with the KaTeX bundled
// under assets/katex: the site renders its maths offline.
function renderMath() {
  for (const el of document.querySelectorAll(".arithmatex")) {
    const tex = el.textContent.trim();
    katex.render(tex.slice(2, -2), el, { displayMode: tex.startsWith("\\["), throwOnError: false });
  }
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);  // Material: runs on every page load
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
