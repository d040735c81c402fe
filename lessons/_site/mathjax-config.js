// MathJax 3, served from the site itself: lessons/_site/hooks.py copies MathJax and this file to
// assets/mathjax/. What is typeset:
//   - Markdown pages: pymdownx.arithmatex wraps math in .arithmatex, as \( \) and \[ \];
//   - notebooks: markdown cells and Markdown/LaTeX outputs, with Jupyter's $ and $$.
// Everything else is left alone, code and outputs above all: they may well contain dollar signs.
// An element with any class is ignored unless its class is one of those; an element without a class
// follows its parent. (Material's suggested ".*|" also matches "no class" and so would skip the
// paragraphs inside a notebook's markdown cell.)
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".+",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown|jp-RenderedLatex",
  },
};
