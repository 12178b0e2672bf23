import streamlit as st

st.title("Presets")
