// Typesets the math of every page with KaTeX, served from the site itself (docs/javascripts/katex/:
// KaTeX 0.16.47 from npm's katex package, MIT licence in katex/LICENSE; the fonts are its woff2
// files), so that the site needs no network, at build or at view time.
//
// pymdownx.arithmatex (generic: true, in mkdocs.yml) leaves each formula as its TeX in a
// <span class="arithmatex">\( ... \)</span> (inline) or <div class="arithmatex">\[ ... \]</div>
// (display); only those elements are rendered, so a stray delimiter elsewhere stays text.
// document$ is mkdocs-material's page observable: it fires on every page, instant loading included.
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
