"""Streamlit glue for the app: the shared configuration and its URL, cached estimator
calls, Altair charts and the export builders. Pages import from here; numbers come from
`estimator`, never from this package.

`ui.fields`, `ui.charts`, `ui.exports` and `ui.search_pool` (the pool of planner search processes)
do not import Streamlit, so they can be tested (and used by scripts) as plain functions; `ui.state`,
`ui.compute`, `ui.searches` (the pool's page side) and `ui.widgets` are the Streamlit side.
"""
