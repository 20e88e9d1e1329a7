"""The HTML pages (``report -f html``, ``sweep -f html``): one self-contained file each, inline CSS and SVG.

- ``gather``: what the report page's charts need of the runs, gathered in the report's one pass (:class:`ChartInput`).
- ``page``: the report page and the sweep page: charts, then the tables.
- ``svg``: hand-built SVG charts (bars, lines), nothing fetched.
"""
