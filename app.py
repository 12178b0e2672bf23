"""Streamlit entry point: page config and navigation over the four pages."""

import streamlit as st

st.set_page_config(page_title="LLM GPU memory estimator", page_icon=":material/memory:", layout="wide")

pages = [
    st.Page("pages/memory.py", title="Memory", icon=":material/memory:", default=True),
    st.Page("pages/roofline.py", title="Roofline", icon=":material/speed:"),
    st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("pages/presets.py", title="Presets", icon=":material/list:"),
]
st.navigation(pages).run()
