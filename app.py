"""Streamlit entry point: page config, navigation over the four pages, the shared configuration.

The configuration's widgets are created here, after ``st.navigation`` and before ``pg.run()``,
so that they keep their values and their URL parameters across page switches (Streamlit 1.67).
"""

import streamlit as st

from ui import state

st.set_page_config(page_title="LLM GPU memory estimator", page_icon=":material/memory:", layout="wide")

pages = [
    st.Page("pages/memory.py", title="Memory", icon=":material/memory:", default=True,
            help="Will it fit? Totals, memory per pipeline stage, breakdown, fit on every GPU"),
    st.Page("pages/roofline.py", title="Roofline", icon=":material/speed:",
            help="Per-operation roofline and step time"),
    st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:",
            help="Up to six scenarios side by side"),
    st.Page("pages/presets.py", title="Presets", icon=":material/list:",
            help="Bundled models, training recipes and your own presets"),
]
pg = st.navigation(pages, position="top")
state.render_config()
pg.run()
