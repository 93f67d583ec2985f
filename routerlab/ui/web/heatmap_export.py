"""The Explore heatmap as a standalone HTML file, made in the visitor's browser when they click its download button.

The file is what the page shows (the finished run's heatmap, or its what-if view): the plot's own data and layout
as the page holds them, and plotly.js, fetched once from the app (http_guard.PLOTLY_ROUTE, the installed plotly
package's) and kept by the browser. It works offline, as a page of its own. The server writes nothing for it: a
page with plotly.js embedded is ~5 MB, and writing one per run let one client fill the disk.
Knows nothing about runs or traces.
"""

from __future__ import annotations

from routerlab.ui.web.http_guard import PLOTLY_ROUTE

LABEL = "Download heatmap (HTML)"
FILE_NAME = "routerlab-heatmap.html"

# Typed arrays (plotly's decoded base64 columns) are written as plain arrays, NaN as null (a gap). "<", ">" and "&"
# are JSON escapes, so a token the model wrote ("</script>") cannot end the script.
EXPORT_HEATMAP_JS = """
async () => {
  try {
    const gd = document.querySelector('#rl-heatmap .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return;
    const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\\/$/, '');
    if (!window.routerlabPlotlyJs) {
      const answer = await fetch(root + '%(route)s');
      if (!answer.ok) throw new Error('plotly.js: HTTP ' + answer.status);
      window.routerlabPlotlyJs = await answer.text();
    }
    const plain = (key, value) => (ArrayBuffer.isView(value) ? Array.from(value) : value);
    const figure = JSON.stringify({data: gd.data, layout: gd.layout}, plain)
      .replace(/</g, '\\\\u003c').replace(/>/g, '\\\\u003e').replace(/&/g, '\\\\u0026');
    const page = '<!doctype html>\\n<html>\\n<head>\\n<meta charset="utf-8" />\\n<title>RouterLab heatmap</title>\\n'
      + '<style>html, body {height: 100%%; margin: 0;}</style>\\n</head>\\n<body>\\n'
      + '<script>window.PlotlyConfig = {MathJaxConfig: "local"};</script>\\n'
      + '<script>' + window.routerlabPlotlyJs + '</script>\\n'
      + '<div id="routerlab-figure" style="height:100%%; width:100%%;"></div>\\n<script>\\nconst figure = ' + figure + ';\\n'
      + 'figure.layout.autosize = true; delete figure.layout.width; delete figure.layout.height;\\n'
      + 'Plotly.newPlot("routerlab-figure", figure.data, figure.layout, {displaylogo: false, responsive: true});\\n'
      + '</script>\\n</body>\\n</html>\\n';
    const link = document.createElement('a');
    link.href = URL.createObjectURL(new Blob([page], {type: 'text/html'}));
    link.download = '%(name)s';
    document.body.appendChild(link);
    link.click();
    setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 5000);
  } catch (err) {
    console.warn('RouterLab heatmap export:', err);
    alert('The heatmap could not be saved: ' + err.message + '. Reload the page and try again.');
  }
}
""" % {"route": PLOTLY_ROUTE, "name": FILE_NAME}
