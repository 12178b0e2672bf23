"""Streamlit entry point: page config, navigation over the pages, the shared configuration.

The configuration's widgets are created here, after ``st.navigation`` and before ``pg.run()``,
so that they are the same widgets on every page (Streamlit 1.67); `ui.state` keeps the settings
and writes the URL. The pages are listed in `ui.state.PAGES`.
"""

import streamlit as st

from ui import searches, state

st.set_page_config(page_title="LLM GPU memory estimator", page_icon=":material/memory:", layout="wide")

pg = st.navigation(state.app_pages(), position="top")
searches.visiting(pg.title)  # a search started on another page ends when its session leaves that page
state.render_config()
pg.run()
